# shellcheck shell=bash
# device-serve.sh's steps mode (sourced by it, never run): where a serve decode step's time goes,
# kiln's variants A B A B, every kernel under ncu, PyTorch's same step in the same run; tables last.
# Expects device-lib.sh's state (bin, out, summary) and root. Must not build anything or stop at a
# failing step: the summary always comes.
# shellcheck disable=SC2154 # bin, out, summary and root come from device-serve.sh
export KILN_SOURCE_DIR="$root" KILN_CACHE_DIR="$out/cache" # the cache is warm for round 2 and ncu
dev_info
t_start=$SECONDS
bstep() { # a step, unless past BUDGET_S (then skipped, so that the tables come within one call)
    if ((SECONDS - t_start > ${BUDGET_S:-470})); then dev_skip "$1" "past BUDGET_S"; return 0; fi
    step "$@"
}
ncu="$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)"

# variants: name, or name=VAR=1+VAR2=2 (pd: the coalesced paged split kernels, codegen.paged_decode)
# (pd48: the default's splits sized for waves of 48 one-warp blocks an SM instead of 24: 2 a row at 64 x 1024)
# (off: KILN_PAGED_DECODE=0, the lane-a-key kernel the coalesced one replaced as the default)
declare -A env_of=([base]="" [f16]="KILN_PRECISION=f16" [pd]="KILN_PAGED_DECODE=1" [pd16]="KILN_PAGED_DECODE=1 KILN_PRECISION=f16"
    [pd48]="KILN_PAGED_DECODE=48" [off]="KILN_PAGED_DECODE=0")
variants=()
for v in ${VARIANTS:-base off pd48 f16}; do
    n="${v%%=*}"
    [[ "$v" == *=* ]] && env_of[$n]="${v#*=}" && env_of[$n]="${env_of[$n]//+/ }"
    variants+=("$n")
done
# cases: name -> bench flags (llama-7b f16 weights, f16 pool in blocks of 16; the plan holds a
# 512-token chunk + the decoding sequences, as an engine compiles one plan for both)
cases=(s16 s64 s256 s64k4 s64rag)
declare -A args_of=(
    [s16]="--seqs 16 --ctx 1024 --only decode"
    [s64]="--seqs 64 --ctx 1024"
    [s256]="--seqs 256 --ctx 1024 --only decode"
    [s64k4]="--seqs 64 --ctx 4096 --only decode"
    [s64rag]="--seqs 64 --ctx 1024 --ragged --only decode"
)
common="--preset llama-7b --wtype f16 --mode serve --backend cuda --block 16 --chunk 512"

# bench_round R CASE...: each case of every variant (the ragged case: base and off only)
bench_round() {
    local c v r="$1"
    shift
    for c in "$@"; do
        for v in "${variants[@]}"; do
            [[ $c == s64rag && $v != base && $v != off ]] && continue
            [[ $v == pd48 && $c != s64 && $c != s16 ]] && continue
            # shellcheck disable=SC2086
            bstep "r${r}_${c}_$v" 120 env ${env_of[$v]} "$bin/kiln" bench $common ${args_of[$c]} --layers 2 --steps 16 --json
        done
    done
}
bench_round 1 "${cases[@]}"

# the variants' paged steps on cuda against the f64 reference (test_paged present)
if [[ -x "$bin/test_paged" ]]; then
    for v in "${variants[@]}"; do
        [[ $v == base || $v == off ]] || continue
        # shellcheck disable=SC2086
        bstep "paged_cuda_$v" 150 env ${env_of[$v]} "$bin/test_paged" --jobs 4 --filter 'paged/*cuda*'
    done
fi

# PyTorch in the same run (eager ops captured into one CUDA graph; TORCH_COMPILE=1 adds torch.compile's)
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    bstep torch_serve 240 python3 "$root/bench/torch_ref.py" serve 16x1024 64x1024 256x1024 64x4096 ${TORCH_COMPILE:+--compile}
else
    dev_skip torch_serve "python3 has no torch with CUDA"
fi

# ncu: one decode step of one layer (the second of two: the first warms up), every kernel
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__block_size,launch__registers_per_thread
ncu_run() { # NAME VARIANT BENCH-FLAGS...
    local name="$1" v="$2"
    shift 2
    # shellcheck disable=SC2086
    bstep "$name" 120 env ${env_of[$v]} KILN_NO_RECORD=1 "$ncu" --clock-control none --print-units base --csv --metrics "$metrics" \
        "$bin/kiln" bench $common "$@" --layers 1 --steps 1 --json
}
if [[ -n "$ncu" ]]; then
    for v in "${variants[@]}"; do ncu_run "ncu_s64_$v" "$v" --seqs 64 --ctx 1024 --only decode; done
else
    dev_skip ncu "ncu not found"
fi

bench_round 2 s64 s16

if [[ -n "$ncu" ]]; then
    # the mixed step (2 timed + 3 profiled steps after the first: the last fifth is one step)
    ncu_run "ncu_s64mixed_${variants[0]}" "${variants[0]}" --seqs 64 --ctx 1024 --only mixed
    for c in s16 s256 s64k4; do
        for v in "${variants[0]}" off; do
            [[ -n "${env_of[$v]+x}" ]] || continue
            # shellcheck disable=SC2086
            ncu_run "ncu_${c}_$v" "$v" ${args_of[$c]}
        done
    done
fi

# why: stall reasons of the 64 x 1024 decode step's attention and GEMM kernels (second step)
if [[ -n "$ncu" ]]; then
    for kn in kiln_attn_split regex:kiln_gemm kiln_attn_combine; do
        skip=1 cnt=1
        [[ $kn == regex:kiln_gemm ]] && skip=4 cnt=4
        # shellcheck disable=SC2086
        bstep "ncu_why_${kn#regex:}" 150 env ${env_of[${variants[0]}]} KILN_NO_RECORD=1 "$ncu" --clock-control none --kernel-name "$kn" \
            --launch-skip $skip --launch-count $cnt --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
            --section Occupancy --section LaunchStats "$bin/kiln" bench $common --seqs 64 --ctx 1024 --only decode --layers 1 --steps 1
    done
fi

# ---------------------------------------------------------------- summary
{
    echo
    echo "== steps"
    dev_steps
    echo
    OUT_DIR="$out" VARIANTS_L="${variants[*]}" CASES_L="${cases[*]}" python3 "$root/scripts/serve_tables.py"
} | tee -a "$summary"
