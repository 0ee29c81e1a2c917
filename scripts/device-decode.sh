#!/usr/bin/env bash
# Decode at the memory roof (issue #22) on the GPU machine: every knob variant of the decode kernels
# A/B'd in one run, interleaved (variants of a case back to back; ROUNDS=2 repeats in reverse order), on llama-7b f16/q8_0/q4_k
# at KV 1024 and f16 at KV 4096 (2 layers) and qwen2-0.5b f16/q8_0/q4_k (24 layers in one plan).
# Variants: the defaults; programmatic dependent launch with the gemv's L2 prefetch (pdl1, KILN_PDL=1,
# not in the default list), without it (pdl2), with the first weight chunks loaded into registers
# before the wait (pdl3); the gemv's chunk loop asking L2 for the weights 1 or 2 steps ahead (pf1;
# pf2 not in the default list: KILN_GEMV_PREFETCH); a fence after each step's loads so that ptxas
# issues them together (fence: KILN_GEMV_FENCE=1), with pf1, with pdl3; gemv's pair path for
# q8_0/q4_K (pair: KILN_GEMV_PAIR=1), with the fence, with pf1. Every `kiln bench` measures the
# copy bandwidth after its run (the roof); the floor is (weights + KV read per step) / that copy
# bandwidth. Then per-kernel profiles (achieved GB/s) of the default and pair variants, and ncu's
# warp stall reasons of the q4_k and q8_0 gemv when ncu is there. Builds nothing; never stops at a
# failure. Timed benches stop starting after BUDGET_S seconds (default 420), so that the profiles and
# the summary table (fraction of the floor, last) always come within a 10-minute run.
#
# usage: scripts/device-decode.sh [BIN_DIR]   (default devbin; BIN_DIR/kiln must exist: it is static)
# With $OUT set, every log and summary.txt go there (else a temp dir). ROUNDS (default 1), STEPS
# (default 32), LLAMA_LAYERS (2), QWEN_LAYERS (24), VARIANTS (names below), BUDGET_S narrow it.
set -u
# shellcheck source=scripts/device-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/device-lib.sh" # from scripts/ or a copy in devrun/
dev_bin "${1:-devbin}" "scripts/device-decode.sh [BIN_DIR]" kiln
dev_out decode
export KILN_CACHE=off
rounds="${ROUNDS:-1}" steps="${STEPS:-32}"

# variant name -> environment
declare -A env_of=(
    [base]=""
    [pdl1]="KILN_PDL=1"
    [pdl2]="KILN_PDL=2"
    [pdl3]="KILN_PDL=3"
    [pf1]="KILN_GEMV_PREFETCH=1"
    [pf2]="KILN_GEMV_PREFETCH=2"
    [fence]="KILN_GEMV_FENCE=1"
    [fence_pf1]="KILN_GEMV_FENCE=1 KILN_GEMV_PREFETCH=1"
    [fence_pdl3]="KILN_GEMV_FENCE=1 KILN_PDL=3"
    [pair]="KILN_GEMV_PAIR=1"
    [pair_fence]="KILN_GEMV_PAIR=1 KILN_GEMV_FENCE=1"
    [pair_pf1]="KILN_GEMV_PAIR=1 KILN_GEMV_PREFETCH=1"
    [pair_pf1_pdl3]="KILN_GEMV_PAIR=1 KILN_GEMV_PREFETCH=1 KILN_PDL=3"
)
variants=(${VARIANTS:-base pdl2 pdl3 pf1 fence fence_pf1 fence_pdl3 pair pair_fence pair_pf1})
# case name -> kiln bench arguments
cases=(llama_f16_1k llama_q8_0_1k llama_q4_k_1k llama_f16_4k qwen_f16 qwen_q8_0 qwen_q4_k)
declare -A args_of=(
    [llama_f16_1k]="--preset llama-7b --wtype f16 --ctx 1024 --layers ${LLAMA_LAYERS:-2}"
    [llama_q8_0_1k]="--preset llama-7b --wtype q8_0 --ctx 1024 --layers ${LLAMA_LAYERS:-2}"
    [llama_q4_k_1k]="--preset llama-7b --wtype q4_k --ctx 1024 --layers ${LLAMA_LAYERS:-2}"
    [llama_f16_4k]="--preset llama-7b --wtype f16 --ctx 4096 --layers ${LLAMA_LAYERS:-2}"
    [qwen_f16]="--preset qwen2-0.5b --wtype f16 --ctx 1024 --layers ${QWEN_LAYERS:-24}"
    [qwen_q8_0]="--preset qwen2-0.5b --wtype q8_0 --ctx 1024 --layers ${QWEN_LAYERS:-24}"
    [qwen_q4_k]="--preset qwen2-0.5b --wtype q4_k --ctx 1024 --layers ${QWEN_LAYERS:-24}"
)
# the pair path changes only q8_0/q4_k kernels: f16 cases skip its variants
applies() { [[ "$1" != pair* || "$2" != *f16* ]]; }

dev_info
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader >>"$summary" 2>/dev/null

# one timed bench: $out/r<round>_<case>_<variant>.log
t_start=$SECONDS
bench() {
    local r="$1" c="$2" v="$3"
    if ((SECONDS - t_start > ${BUDGET_S:-420})); then dev_skip "r$1_$2_$3" "past BUDGET_S"; return; fi
    # shellcheck disable=SC2086
    step "r$1_$2_$3" 120 env ${env_of[$v]} "$bin/kiln" bench ${args_of[$c]} --mode decode --backend cuda --steps "$steps" --json
}
for ((r = 1; r <= rounds; r++)); do
    for c in "${cases[@]}"; do
        order=("${variants[@]}")
        if ((r % 2 == 0)); then order=(); for ((i = ${#variants[@]} - 1; i >= 0; i--)); do order+=("${variants[$i]}"); done; fi
        for v in "${order[@]}"; do applies "$v" "$c" && bench "$r" "$c" "$v"; done
    done
done

# per-kernel profiles (kernel by kernel: achieved GB/s of each, not the overlap)
for c in llama_q4_k_1k llama_q8_0_1k llama_f16_1k qwen_q8_0; do
    for v in base fence pair_fence; do
        applies "$v" "$c" || continue
        # shellcheck disable=SC2086
        step "profile_${c}_$v" 120 env ${env_of[$v]} "$bin/kiln" bench ${args_of[$c]} --mode decode --backend cuda \
            --steps 8 --no-roof --profile
    done
done

# ncu: stall reasons of the quantized gemv (one layer), default and pair
ncu="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
if [[ -x "$ncu" ]]; then
    for w in q4_k q8_0; do
        for v in base fence pair_fence; do
            # shellcheck disable=SC2086
            step "ncu_llama_${w}_$v" 180 env ${env_of[$v]} KILN_NO_RECORD=1 "$ncu" --kernel-name kiln_gemv --launch-skip 8 --launch-count 4 \
                --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
                --section LaunchStats --section Occupancy \
                "$bin/kiln" bench --preset llama-7b --wtype "$w" --ctx 1024 --layers 1 --mode decode --backend cuda --steps 2 --no-roof
        done
    done
else
    echo "ncu absent: no stall reasons" | tee -a "$summary"
fi

# ---------------------------------------------------------------- summary
field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" "$2" | head -n 1 | tr -d '"'; }
{
    echo
    echo "== per-kernel profiles (base, fence, pair_fence), the gemv lines:"
    for f in "$out"/profile_*.log; do
        [[ -e "$f" ]] || continue
        echo "-- $(basename "$f" .log)"
        grep -E "gemv|attn|GB/s" "$f" | head -n 12
    done
    echo
    echo "== ncu (q4_k / q8_0 gemv, llama-7b layer): issue rate, stall reasons, achieved DRAM throughput"
    for f in "$out"/ncu_*.log; do
        [[ -e "$f" ]] || continue
        echo "-- $(basename "$f" .log)"
        grep -E "DRAM Throughput|Memory Throughput|Duration|Issued Warp Per Scheduler|No Eligible|Warp Cycles Per Issued|Stall|Registers Per|Achieved Occupancy" "$f" |
            sort | uniq -c | sort -rn | head -n 14
    done
    echo
    echo "== decode: ms per layer-step (median over rounds) and fraction of the floor (copy bandwidth of the same run)"
    printf '%-14s' variant
    for c in "${cases[@]}"; do printf ' %15s' "$c"; done
    echo
    for v in "${variants[@]}"; do
        printf '%-14s' "$v"
        for c in "${cases[@]}"; do
            if ! applies "$v" "$c"; then printf ' %15s' "-"; continue; fi
            ms=() fr=()
            for ((r = 1; r <= rounds; r++)); do
                f="$out/r${r}_${c}_$v.log"
                [[ -e "$f" ]] && grep -q '"ms_per_layer_step"' "$f" || continue
                ms+=("$(field ms_per_layer_step "$f")") fr+=("$(field fraction_of_bw "$f")")
            done
            if ((${#ms[@]} == 0)); then printf ' %15s' failed; continue; fi
            med_ms="$(printf '%s\n' "${ms[@]}" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')"
            med_fr="$(printf '%s\n' "${fr[@]}" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')"
            printf ' %10.4f %3.0f%%' "$med_ms" "$(awk -v x="$med_fr" 'BEGIN { print 100 * x }')"
        done
        echo
    done
    echo "(qwen columns: the issue's target is 0.020 ms per layer-step; llama: f16 >= 88%, q8_0 >= 80%, q4_k >= 75% of the floor)"
    echo "copy bandwidth (GB/s) measured by the runs: $(cat "$out"/r*_*.log 2>/dev/null | sed -n 's/.*"roof_gb_per_s":\([0-9.]*\).*/\1/p' | sort -g | awk '{ a[NR] = $1 } END { if (NR) printf "%.0f .. %.0f (%d runs)", a[1], a[NR], NR }')"
} | tee -a "$summary"
echo "logs: $out"
