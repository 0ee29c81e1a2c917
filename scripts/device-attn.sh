#!/usr/bin/env bash
# Prefill attention on the GPU machine (issues #19 and #21). Four modes, each fitting one 10-minute call:
#   ab (default): first the key split's correctness on cuda (split_ops: test_ops attention_prefill and
#       attention_softcap_and_window under KILN_FLASH_SPLIT=2, 4 and 64 rows + 2), then the warpgroup
#       kernel's variants A/B'd at f16 precision in one run: auto (the per-shape defaults), r128
#       (KILN_FLASH_ROWS=128 KILN_FLASH_SPLIT=1: 128-row blocks, no split: the defaults before session 6), r64
#       (KILN_FLASH_ROWS=64: 64-row blocks, two an SM), s2 / s4 (KILN_FLASH_SPLIT=2 / 4: key split
#       over a cluster), sauto (KILN_FLASH_SPLIT=auto: a split where the grid leaves SMs idle),
#       r64s2 (pp / nopp / pdl on request: VARIANTS); bench_attn at 512 and 4096
#       tokens, MHA 32/32, GQA 32/8, hd 64 (14/2), hd 256 (16/8); ROUNDS (default 2) rounds, the
#       variants in reverse order every other round (VARIANTS, SHAPES, STEPS narrow it), a
#       correctness pass of r64 between rounds 1 and 2; the short-prompt scaling (auto, s2, s4 at
#       128, 256, 384, 512, 1024 tokens: the critical block walks 1..4 key tiles, so the times split
#       into a fixed part and a part per tile); Nsight Compute's duration of the flash kernel alone
#       for auto, r64, s2, s4 at 512 tokens, and its sections (SOL, memory, warp states) at 128 and
#       512 tokens for auto;
#   split: split_ops alone, and compute-sanitizer racecheck / synccheck of s2 and s4 at 512 tokens;
#   check: correctness and sanitizers: test_ops attention on cuda (exact and f16 precision, the
#       first kernel), paged and tree cases, a CUDA graph over 100 serve steps, kiln check
#       paged_attention, racecheck/memcheck/synccheck of the warpgroup kernel (auto, r64, s2);
#   full: the earlier table (new vs first kernel, f16 wg vs mma), ncu sections, layer profiles,
#       the serve mixed step;
#   sass: where the warpgroup kernel's warps wait, per SASS instruction (ncu's SourceCounters, the
#       source page as CSV) at 128 and 512 tokens (MHA hd 128), L2 flushed and not, summarized by
#       scripts/ncu_sass.py (stall reasons, runs of 200 instructions, the top 25).
# Builds nothing; never stops at a failure; each step under a time limit; steps stop starting after
# BUDGET_S (default 420) seconds, so the summary (the tables last, on stdout) always comes.
#
# usage: scripts/device-attn.sh [BIN_DIR] [ab|split|check|full|sass]   (default devbin ab: a Release build's binaries)
# Run it from the repository root after `source .devdeps/env.sh`. Logs go to a temp dir, packed into
# $OUT/logs.tar.xz; summary.txt to $OUT (else the temp dir).
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/device-lib.sh
. "$root/scripts/device-lib.sh"
mode="${2:-ab}"
usage="scripts/device-attn.sh [BIN_DIR] [ab|split|check|full|sass]"
[[ "$mode" =~ ^(ab|split|check|full|sass)$ ]] || { echo "usage: $usage" >&2; exit 2; }
dev_bin "${1:-devbin}" "$usage" kiln test_ops bench_attn
final="${OUT:-}" # the logs stay in a temp dir (a device call brings back only a few files): $OUT gets summary.txt and logs.tar.xz
OUT="$(mktemp -d /tmp/device-attn.XXXXXX)" dev_out attn
logs="$out"
export KILN_SOURCE_DIR="$root" KILN_CACHE=off
# test_ops reads the tolerances from contracts/ under KILN_SOURCE_DIR: run from a checkout that has them
[[ -d "$root/contracts" ]] || echo "warning: $root/contracts is missing: the test_ops steps will fail (run from the repository root)" | tee -a "$summary"
dev_info
san="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
ncu_bin="$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)"
t_start=$SECONDS

# bstep NAME LIMIT CMD...: a step, unless the run is past BUDGET_S seconds (then skipped, so that the
# tables always come within one 10-minute call)
bstep() {
    if ((SECONDS - t_start > ${BUDGET_S:-420})); then dev_skip "$1" "past BUDGET_S"; return 0; fi
    step "$@"
}

# the warpgroup kernel's variants: name -> environment (all at KILN_PRECISION=f16)
declare -A env_of=(
    [auto]=""
    [pp]="KILN_FLASH_WG=3"
    [nopp]="KILN_FLASH_WG=2"
    [r64]="KILN_FLASH_ROWS=64"
    [s2]="KILN_FLASH_SPLIT=2"
    [s4]="KILN_FLASH_SPLIT=4"
    [r64s2]="KILN_FLASH_ROWS=64 KILN_FLASH_SPLIT=2"
    [sauto]="KILN_FLASH_SPLIT=auto"
    [r128]="KILN_FLASH_ROWS=128 KILN_FLASH_SPLIT=1"
    [pdl]="KILN_PDL=1"
)
# shellcheck disable=SC2206
variants=(${VARIANTS:-auto r128 r64 s2 s4 r64s2})
# bench_attn shapes: 0 512 32/32 hd128, 1 512 32/8, 3 4096 32/32, 4 4096 32/8, 6 512 14/2 hd64,
# 7 4096 14/2 hd64, 8 512 16/8 hd256, 9 4096 16/8 hd256; 14-17 32/32 hd128 at 128, 256, 384, 1024
shapes="${SHAPES:-0,1,3,4,6,8}"

# wgbench NAME VARIANT SECONDS [bench_attn args]: bench_attn under the variant's environment
wgbench() {
    local name="$1" v="$2" lim="$3"; shift 3
    # shellcheck disable=SC2086
    bstep "$name" "$lim" env KILN_PRECISION=f16 ${env_of[$v]} "$bin/bench_attn" cuda "$@"
}

# split_ops: the key split's correctness on cuda at f16 precision (the warpgroup kernel): the prefill
# shapes whose rank >= 1 starts at a tile some rows see no key of (28/4 heads; 8/2 with keys before the
# first query), and the soft-capped / windowed ones; splits 2 and 4, and 2 in 64-row blocks
split_ops() {
    for v in s2 s4 r64s2; do
        # shellcheck disable=SC2086
        bstep "split_ops_$v" 100 env KILN_TEST_BACKEND=cuda KILN_PRECISION=f16 ${env_of[$v]} "$bin/test_ops" --jobs 4 \
            --filter 'ops/attention_@(prefill|softcap_and_window)'
    done
}

if [[ "$mode" == split ]]; then
    split_ops
    if [[ -x "$san" ]]; then
        for tool in racecheck synccheck; do
            for v in s2 s4; do
                # shellcheck disable=SC2086
                bstep "${tool}_wg_${v}_shape0" 120 env KILN_PRECISION=f16 ${env_of[$v]} "$san" --tool "$tool" --error-exitcode 3 "$bin/bench_attn" cuda 1 512 0
            done
        done
    fi
fi

# ab_round R: one bench_attn run of every variant (reverse order in even rounds)
ab_round() {
    local r="$1" order=("${variants[@]}") i v sh
    if (($1 % 2 == 0)); then
        order=()
        for ((i = ${#variants[@]} - 1; i >= 0; i--)); do order+=("${variants[$i]}"); done
    fi
    for v in "${order[@]}"; do
        sh="$shapes"
        [[ $v == pdl ]] && sh=0,1,6,8 # launch overlap matters at 512 tokens only
        wgbench "ab_r${r}_$v" "$v" 90 "${STEPS:-20}" 1000000 "$sh"
    done
}

if [[ "$mode" == ab ]]; then # in order of need: correctness, round 1, where the time goes, then round 2 and the rest
    split_ops
    ab_round 1
    # short prompts: MHA hd 128 at 128 .. 1024 tokens (shapes 14, 15, 16, 0, 17), auto, s2 and s4
    for v in auto s2 s4; do
        wgbench "scale_$v" "$v" 90 "${STEPS:-20}" 1000000 14,15,16,0,17
    done
    if [[ -n "$ncu_bin" ]]; then # where its time goes at 128 and 512 tokens (one launch each, after warm-ups)
        for sh in 14 0; do
            bstep "ncu_sections_auto_shape$sh" 120 env KILN_PRECISION=f16 KILN_NO_RECORD=1 "$ncu_bin" --clock-control none \
                --kernel-name kiln_attn_flash_wg --launch-skip 2 --launch-count 1 --section SpeedOfLight --section LaunchStats \
                --section Occupancy --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis \
                "$bin/bench_attn" cuda 4 1024 "$sh"
        done
    fi
    for v in ${OPS_VARIANTS:-r64}; do # correctness of the other variants on cuda
        # shellcheck disable=SC2086
        bstep "ops_wg_$v" 100 env KILN_TEST_BACKEND=cuda KILN_PRECISION=f16 ${env_of[$v]} "$bin/test_ops" --jobs 4 --filter 'ops/attention*'
    done
    for ((r = 2; r <= ${ROUNDS:-2}; r++)); do ab_round "$r"; done
    # the flash kernel alone (Nsight Compute's gpu__time_duration at real clocks) at 512 tokens, MHA
    if [[ -n "$ncu_bin" ]]; then
        for v in ${NCU_VARIANTS:-auto r64 s2 s4}; do
            # shellcheck disable=SC2086
            bstep "ncu_$v" 100 env KILN_PRECISION=f16 KILN_NO_RECORD=1 ${env_of[$v]} "$ncu_bin" --clock-control none --kernel-name kiln_attn_flash_wg \
                --launch-skip 2 --launch-count 3 --metrics gpu__time_duration.sum "$bin/bench_attn" cuda 4 512 0
        done
    fi
fi

if [[ "$mode" == check ]]; then
    # correctness on cuda: the flash kernel (new, then the first) and the paged kernels
    bstep attn_ops_new 90 env KILN_TEST_BACKEND=cuda "$bin/test_ops" --jobs 4 --filter 'ops/attention*'
    bstep attn_ops_first 90 env KILN_TEST_BACKEND=cuda KILN_FLASH=0 "$bin/test_ops" --jobs 4 --filter 'ops/attention_prefill'
    bstep attn_ops_wg 120 env KILN_TEST_BACKEND=cuda KILN_PRECISION=f16 "$bin/test_ops" --jobs 4 --filter 'ops/attention*'
    bstep attn_ops_wg_nopp 120 env KILN_TEST_BACKEND=cuda KILN_PRECISION=f16 KILN_FLASH_WG=2 "$bin/test_ops" --jobs 4 --filter 'ops/attention*'
    [[ -x "$bin/test_paged" ]] && bstep paged_cuda 90 "$bin/test_paged" --jobs 4 --filter 'paged/*cuda*'
    # draft trees (split kernels at every size), a CUDA graph over 100 changing steps vs launched runs, kiln check
    [[ -x "$bin/test_tree" ]] && bstep tree_cuda 120 "$bin/test_tree" --jobs 4 --filter 'tree/*cuda*'
    [[ -x "$bin/test_replay" ]] && bstep replay_100_steps_cuda 300 "$bin/test_replay" --jobs 1 --filter 'replay/graph_replays_100*'
    bstep check_paged_cuda 240 "$bin/kiln" check --op paged_attention --backend cuda --quick
    [[ -x "$san" ]] && bstep racecheck_flash 120 "$san" --tool racecheck --error-exitcode 3 "$bin/kiln" bench --preset qwen2-0.5b \
        --mode prefill --tokens 300 --backend cuda --wtype f16 --layers 1 --steps 1 --no-roof
    if [[ -x "$san" ]]; then # llama-7b 512 (shape 0) and gemma hd 256 + soft-cap (shape 10); the variants at shape 0
        for tool in racecheck memcheck synccheck; do
            for sh in 0 10; do
                bstep "${tool}_wg_shape$sh" 120 env KILN_PRECISION=f16 "$san" --tool "$tool" --error-exitcode 3 "$bin/bench_attn" cuda 1 512 "$sh"
            done
            for v in r64 s2; do
                # shellcheck disable=SC2086
                bstep "${tool}_wg_${v}_shape0" 120 env KILN_PRECISION=f16 ${env_of[$v]} "$san" --tool "$tool" --error-exitcode 3 "$bin/bench_attn" cuda 1 512 0
            done
        done
    fi
fi

if [[ "$mode" == full ]]; then
    # attention alone: new kernel, then the first (same shapes)
    bstep bench_attn_new 60 "$bin/bench_attn" cuda 20
    bstep bench_attn_first 60 env KILN_FLASH=0 "$bin/bench_attn" cuda 20
    bstep bench_attn_wg 90 env KILN_PRECISION=f16 "$bin/bench_attn" cuda 20
    bstep bench_attn_wg_nopp 90 env KILN_PRECISION=f16 KILN_FLASH_WG=2 "$bin/bench_attn" cuda 20
    bstep bench_attn_mma_f16 90 env KILN_PRECISION=f16 KILN_FLASH_WG=0 "$bin/bench_attn" cuda 20
    # where the 512-token kernel's time goes: Nsight Compute on the warpgroup kernel of llama-7b 512
    # (shape 0) and 4096 tokens (shape 3)
    if [[ -n "$ncu_bin" ]]; then
        for sh in 0 3; do
            bstep "ncu_flash_wg_shape$sh" 180 env KILN_PRECISION=f16 KILN_NO_RECORD=1 "$ncu_bin" --kernel-name kiln_attn_flash_wg --launch-skip 1 --launch-count 1 \
                --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats \
                --section MemoryWorkloadAnalysis "$bin/bench_attn" cuda 2 4096 "$sh"
        done
    fi
    bstep prefill_profile_wg 60 env KILN_PRECISION=f16 "$bin/kiln" bench --preset llama-7b --mode prefill --tokens 512 --backend cuda \
        --wtype f16 --layers 1 --steps 5 --no-roof --profile
    bstep prefill_profile 60 "$bin/kiln" bench --preset llama-7b --mode prefill --tokens 512 --backend cuda --wtype f16 \
        --layers 1 --steps 5 --no-roof --profile
    # paged: the mixed step (a 512-token chunk + 63 decoding sequences at 1024), attention's share
    bstep serve_mixed 90 "$bin/kiln" bench --preset llama-7b --mode serve --seqs 64 --ctx 1024 --chunk 512 --layers 2 \
        --backend cuda --json
    bstep serve_mixed_first 90 env KILN_FLASH=0 "$bin/kiln" bench --preset llama-7b --mode serve --seqs 64 --ctx 1024 --chunk 512 \
        --layers 2 --backend cuda --json
fi

if [[ "$mode" == sass && -n "$ncu_bin" ]]; then
    for sh in 14 0; do
        for cc in all none; do
            bstep "sass_shape${sh}_$cc" 120 env KILN_PRECISION=f16 KILN_NO_RECORD=1 "$ncu_bin" --clock-control none --cache-control "$cc" \
                --kernel-name kiln_attn_flash_wg --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats \
                --page source --print-source sass --csv "$bin/bench_attn" cuda 4 1024 "$sh"
        done
    done
fi

# fields of bench_attn's JSON lines: n_tok heads kv_heads hd us tflop_per_s
fields() { sed -n 's/.*"n_tok": \([0-9]*\), "heads": \([0-9]*\), "kv_heads": \([0-9]*\), "hd": \([0-9]*\), "us": \([0-9.]*\), "tflop_per_s": \([0-9.]*\).*/\1 \2 \3 \4 \5 \6/p' "$@"; }

{
    echo
    echo "steps:"
    dev_steps
    echo
    if [[ "$mode" == ab ]]; then
        echo "warpgroup attention variants at f16 precision, f16 cache, causal: us per round (r1/r2...), the attention"
        echo "region's kernel time (the flash kernel; the idle row-guard kernels are not launched); targets: 512 MHA <= 15 us, 4096 >= 350 TFLOP/s"
        printf '%-6s %-6s %-4s' n_tok heads hd
        for v in "${variants[@]}"; do printf ' %13s' "$v"; done
        echo
        for s in $(fields "$logs"/ab_r1_auto.log 2>/dev/null | awk '{ print $1 "_" $2 "_" $3 "_" $4 }'); do
            IFS=_ read -r nt h kvh hd <<<"$s"
            printf '%-6s %-6s %-4s' "$nt" "$h/$kvh" "$hd"
            for v in "${variants[@]}"; do
                cell=""
                for f in "$logs"/ab_r*_"$v".log; do
                    [[ -f "$f" ]] || continue
                    u=$(fields "$f" | awk -v a="$nt" -v b="$h" -v c="$kvh" -v d="$hd" '$1 == a && $2 == b && $3 == c && $4 == d { print $5 }')
                    cell="${cell:+$cell/}${u:--}"
                done
                printf ' %13s' "${cell:--}"
            done
            echo
        done
        echo
        echo "TFLOP/s of causal work, round 1:"
        for v in "${variants[@]}"; do
            [[ -f "$logs/ab_r1_$v.log" ]] || continue
            printf '  %-6s' "$v"
            fields "$logs/ab_r1_$v.log" | awk '{ printf " %s/%s/%s:%s", $1, $3, $4, $6 } END { print "" }'
        done
        echo
        echo "short prompts, MHA 32/32 hd 128, us (the critical block walks n_tok / 128 key tiles; 1024: two waves):"
        for v in auto s2 s4; do
            [[ -f "$logs/scale_$v.log" ]] || continue
            printf '  %-6s' "$v"
            fields "$logs/scale_$v.log" | awk '{ printf " %s:%s", $1, $5 } END { print "" }'
        done
        for v in ${NCU_VARIANTS:-auto r64 s2 s4}; do
            f="$logs/ncu_$v.log"
            [[ -f "$f" ]] || continue
            echo "ncu flash kernel alone, 512 MHA, $v: $(grep -E 'gpu__time_duration.sum' "$f" | awk '{ printf "%s %s; ", $(NF - 1), $NF }')"
        done
        for f in "$logs"/ncu_sections_auto_shape*.log; do
            [[ -f "$f" ]] || continue
            echo "ncu $(basename "$f" .log):"
            grep -E "^ +(Duration|Elapsed Cycles|SM Active Cycles|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L2 Hit Rate|Registers Per Thread|Achieved Occupancy|No Eligible|Issued Warp Per Scheduler|Warp Cycles Per Issued Instruction)" "$f" | head -n 16
        done
    fi
    if [[ "$mode" == sass ]]; then
        for f in "$logs"/sass_shape*.log; do
            [[ -f "$f" ]] || continue
            echo "== $(basename "$f" .log) (shape 14: 128 tokens, 0: 512; all: L2 flushed, none: not)"
            python3 "$root/scripts/ncu_sass.py" "$f" 200 25 2>&1 | head -n 50
        done
    fi
    if [[ "$mode" == ab || "$mode" == split ]]; then
        echo
        echo "key split correctness on cuda (test_ops attention_prefill + attention_softcap_and_window, f16 precision):"
        for v in s2 s4 r64s2; do
            f="$logs/split_ops_$v.log"
            [[ -f "$f" ]] || continue
            echo "  $v: $(grep -hE 'Synthesis' "$f" | tail -n 1)"
            grep -hE "is -?nan|is -?inf|NMSE|FAIL" "$f" | head -n 3 | sed 's/^/    /'
        done
    fi
    if [[ "$mode" == full ]]; then
        echo "attention alone (f16 cache; us and TFLOP/s of causal work): new, first"
        paste -d' ' <(fields "$logs/bench_attn_new.log") <(fields "$logs/bench_attn_first.log") |
            awk '{ printf "%-6s %-6s %-4s %10s %8s %10s %8s\n", $1, $2 "/" $3, $4, $5, $6, $11, $12 }'
        echo
        echo "f16 precision: warpgroup kernel (auto ping-pong), without ping-pong, mma.sync kernel (us, TFLOP/s)"
        paste -d' ' <(fields "$logs/bench_attn_wg.log") <(fields "$logs/bench_attn_wg_nopp.log") <(fields "$logs/bench_attn_mma_f16.log") |
            awk '{ printf "%-6s %-6s %-4s %10s %8s %10s %8s %10s %8s\n", $1, $2 "/" $3, $4, $5, $6, $11, $12, $17, $18 }'
        for f in "$logs"/ncu_flash_wg_shape*.log; do
            [[ -f "$f" ]] || continue
            echo "ncu $(basename "$f" .log):"
            grep -E "^ +(Duration|Elapsed Cycles|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per Thread|Achieved Occupancy|No Eligible|Issued Warp Per Scheduler|Warp Cycles Per Issued Instruction)" "$f" | head -n 14
        done
        echo "llama-7b prefill layer, attention lines (f16 precision, then exact):"
        grep -i "attn" "$logs/prefill_profile_wg.log" "$logs/prefill_profile.log" 2>/dev/null | head -n 8
        echo "serve mixed step (new, then first):"
        grep -ho '"mixed[^}]*}' "$logs/serve_mixed.log" "$logs/serve_mixed_first.log" 2>/dev/null | head -n 2
    fi
} | tee -a "$summary"
if [[ -n "$final" ]]; then
    mkdir -p "$final"
    cp "$summary" "$final/summary.txt"
    tar -cJf "$final/logs.tar.xz" -C "$logs" . 2>/dev/null
fi
echo "logs: $logs${final:+ (packed into $final/logs.tar.xz)}"
