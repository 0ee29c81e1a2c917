#!/usr/bin/env bash
# Decode at the memory roof (issue #22) on the GPU machine: every knob variant of the decode kernels
# timed twice, interleaved A B A B within each case (round 1 of every variant of a case, then round 2,
# before the next case), on llama-7b f16/q8_0/q4_k at KV 1024 and f16 at KV 4096 (2 layers) and
# qwen2-0.5b f16/q8_0/q4_k (24 layers in one plan), so that the per-format defaults of the gemv knobs
# (kl_wfmt.gemv_auto in src/codegen/wfmt.c) are chosen on repeated numbers.
# Variants: the defaults (base); a fence after each step's loads so that ptxas issues them together
# (fence: KILN_GEMV_FENCE=1); gemv's pair path for q8_0/q4_K (pair: KILN_GEMV_PAIR=1), with the fence
# (pair_fence); decode attention as one kernel of thread block clusters (attn_cl: KILN_ATTN_CLUSTER=1)
# and, on qwen2-0.5b, that with programmatic dependent launch loading the first weight chunks into
# registers before the wait (attn_cl_pdl3: KILN_PDL=3). Not in the default list (VARIANTS adds them):
# pdl1/pdl2/pdl3 (KILN_PDL=1/2/3), pf1/pf2 (KILN_GEMV_PREFETCH), fence_pf1, fence_pdl3, pair_pf1,
# pair_pf1_pdl3, nofence/nopair (KILN_GEMV_FENCE=0 / KILN_GEMV_PAIR=0: the knob off where a format's
# default turned it on), reduce (KILN_GEMV_REDUCE=1: the gemv's split K summed for all accumulators
# at once, reduce_split, instead of one block reduction per accumulator), preload (KILN_GEMV_PRELOAD=1:
# the first step's weights loaded before x's prologue, KILN_PDL=3's loads without PDL), pipe / pipe_pf1 /
# pair_pipe (KILN_GEMV_PIPELINE=1: the next step's loads before this step's arithmetic; with
# KILN_GEMV_PREFETCH=1; with the pair path), xload / xload_pipe / xload_pdl3 (KILN_GEMV_XLOAD=1: the
# prologue's words of x loaded at once; with the pipeline; with KILN_PDL=3). Every `kiln
# bench` measures the copy bandwidth after its run (the roof); the
# floor is (weights + KV read per step) / that copy bandwidth. Then per-kernel profiles (achieved
# GB/s) of the default, fence, pair_fence and attn_cl variants, and ncu's warp stall reasons of the
# q4_k and q8_0 gemv when ncu is there (NCU=0 skips them). Builds nothing; never stops at a failure.
# Timed benches stop starting BUDGET_S seconds (default 430) after the script's start, profiles 500
# and ncu 540, so that the summary tables (both rounds, the best variant per weight format; last)
# always come within a 10-minute run.
#
# First (CHECKS=0 skips it), the cluster decode attention's correctness on the GPU: test_ops'
# attention cases when BIN_DIR has test_ops, kiln check, compute-sanitizer memcheck/racecheck of a
# qwen2-0.5b decode step.
#
# usage: scripts/device-decode.sh [BIN_DIR]   (default devbin; BIN_DIR/kiln must exist: it is static;
#        test_ops is optional)
# With $OUT set, every log and summary.txt go there (else a temp dir). ROUNDS (default 2), STEPS
# (default 32), LLAMA_LAYERS (2), QWEN_LAYERS (24), VARIANTS (names below), CASES, BUDGET_S narrow it;
# PROFILE_CASES and PROFILE_VARIANTS the per-kernel profiles.
set -u
# shellcheck source=scripts/device-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/device-lib.sh" # from scripts/ or a copy in devrun/
dev_bin "${1:-devbin}" "scripts/device-decode.sh [BIN_DIR]" kiln
dev_out decode
export KILN_CACHE=off
t_start=$SECONDS # BUDGET_S and the profile/ncu cut-offs count from here
rounds="${ROUNDS:-2}" steps="${STEPS:-32}"

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
    [nofence]="KILN_GEMV_FENCE=0"
    [nopair]="KILN_GEMV_PAIR=0"
    [attn_cl]="KILN_ATTN_CLUSTER=1"
    [reduce]="KILN_GEMV_REDUCE=1"
    [preload]="KILN_GEMV_PRELOAD=1"
    [pipe]="KILN_GEMV_PIPELINE=1"
    [pipe_pf1]="KILN_GEMV_PIPELINE=1 KILN_GEMV_PREFETCH=1"
    [pair_pipe]="KILN_GEMV_PAIR=1 KILN_GEMV_PIPELINE=1"
    [xload]="KILN_GEMV_XLOAD=1"
    [xload_pipe]="KILN_GEMV_XLOAD=1 KILN_GEMV_PIPELINE=1"
    [xload_pdl3]="KILN_GEMV_XLOAD=1 KILN_PDL=3"
    [attn_cl_pdl3]="KILN_ATTN_CLUSTER=1 KILN_PDL=3"
)
# shellcheck disable=SC2206
variants=(${VARIANTS:-base fence pair pair_fence attn_cl attn_cl_pdl3})
# case name -> kiln bench arguments
# shellcheck disable=SC2206
cases=(${CASES:-qwen_f16 qwen_q8_0 qwen_q4_k llama_f16_1k llama_q8_0_1k llama_q4_k_1k llama_f16_4k})
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
applies() { [[ "$1" != pair* && "$1" != nopair || "$2" != *f16* ]] && [[ "$1" != attn_cl_* || "$2" == qwen* ]]; }

dev_info
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader >>"$summary" 2>/dev/null

# correctness first: the cluster decode attention (KILN_ATTN_CLUSTER=1) on the GPU against the
# reference (test_ops' attention cases when BIN_DIR has test_ops; kiln check), and compute-sanitizer
# memcheck + racecheck of a qwen2-0.5b decode step with it when compute-sanitizer is there
if [[ "${CHECKS:-1}" != 0 && -x "$bin/test_ops" ]]; then
    step attn_cluster_ops 120 env KILN_TEST_BACKEND=cuda KILN_ATTN_CLUSTER=1 "$bin/test_ops" --jobs 4 --filter 'ops/attention*'
fi
[[ "${CHECKS:-1}" == 0 ]] || step attn_cluster_check 120 env KILN_ATTN_CLUSTER=1 "$bin/kiln" check --op attention --backend cuda --quick
san="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
if [[ "${CHECKS:-1}" != 0 && -x "$san" ]]; then
    for tool in memcheck racecheck; do
        step "attn_cluster_$tool" 120 env KILN_ATTN_CLUSTER=1 KILN_NO_RECORD=1 "$san" --tool "$tool" --error-exitcode 3 "$bin/kiln" bench \
            --preset qwen2-0.5b --wtype f16 --ctx 1024 --layers 1 --mode decode --backend cuda --steps 2 --no-roof
    done
fi

# one timed bench: $out/r<round>_<case>_<variant>.log
bench() {
    local r="$1" c="$2" v="$3"
    if ((SECONDS - t_start > ${BUDGET_S:-430})); then dev_skip "r$1_$2_$3" "past BUDGET_S"; return; fi
    # shellcheck disable=SC2086
    step "r$1_$2_$3" 120 env ${env_of[$v]} "$bin/kiln" bench ${args_of[$c]} --mode decode --backend cuda --steps "$steps" --json
}
# A B A B: both rounds of a case back to back, so that a drifting clock or a warm-up shows as the
# spread between a variant's rounds rather than as a gap between variants
for c in "${cases[@]}"; do
    for ((r = 1; r <= rounds; r++)); do
        for v in "${variants[@]}"; do applies "$v" "$c" && bench "$r" "$c" "$v"; done
    done
done

# per-kernel profiles (kernel by kernel: achieved GB/s of each, not the overlap)
# shellcheck disable=SC2206
for c in ${PROFILE_CASES:-llama_q4_k_1k llama_q8_0_1k llama_f16_1k qwen_q8_0 qwen_f16}; do
    for v in ${PROFILE_VARIANTS:-base fence pair_fence attn_cl}; do
        applies "$v" "$c" || continue
        [[ "$v" != attn_cl || "$c" == qwen* ]] || continue
        if ((SECONDS - t_start > 500)); then dev_skip "profile_${c}_$v" "past 500 s"; continue; fi
        # shellcheck disable=SC2086
        step "profile_${c}_$v" 120 env ${env_of[$v]} "$bin/kiln" bench ${args_of[$c]} --mode decode --backend cuda \
            --steps 8 --no-roof --profile
    done
done

# ncu: stall reasons of the quantized gemv (one layer), default and pair
ncu="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
if [[ "${NCU:-1}" == 0 ]]; then
    echo "NCU=0: no stall reasons" | tee -a "$summary"
elif [[ -x "$ncu" ]]; then
    for w in q4_k q8_0; do
        for v in base pair_fence; do
            if ((SECONDS - t_start > 540)); then dev_skip "ncu_llama_${w}_$v" "past 540 s"; continue; fi
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
    echo "== per-kernel profiles (PROFILE_VARIANTS x PROFILE_CASES): the first layer's regions"
    for f in "$out"/profile_*.log; do
        [[ -e "$f" ]] || continue
        echo "-- $(basename "$f" .log)"
        grep -E "gemv|attn|GB/s|^ +[0-4] " "$f" | head -n 12
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
    echo "== decode: ms per layer-step, round 1 / round 2 (A B A B), and fraction of the floor (copy bandwidth of the same run)"
    OUT_DIR="$out" VARIANTS_L="${variants[*]}" CASES_L="${cases[*]}" ROUNDS_N="$rounds" python3 - <<'PY'
import json, os, re, math
out, rounds = os.environ["OUT_DIR"], int(os.environ["ROUNDS_N"])
variants, cases = os.environ["VARIANTS_L"].split(), os.environ["CASES_L"].split()
def applies(v, c): return not ((v.startswith("pair") or v == "nopair") and "f16" in c) and (not v.startswith("attn_cl_") or c.startswith("qwen"))
def run(r, c, v):  # (ms per layer-step, fraction of the floor) of one bench, or None
    try: txt = open(f"{out}/r{r}_{c}_{v}.log").read()
    except OSError: return None
    m = re.search(r'"ms_per_layer_step":([0-9.eE+-]+)', txt); f = re.search(r'"fraction_of_bw":([0-9.eE+-]+)', txt)
    return (float(m.group(1)), float(f.group(1)) if f else float("nan")) if m else None
res = {(c, v): [x for x in (run(r, c, v) for r in range(1, rounds + 1)) if x] for c in cases for v in variants}
print(f"{'variant':<14}" + "".join(f" {c:>19}" for c in cases))
for v in variants:
    row = f"{v:<14}"
    for c in cases:
        rs = res[(c, v)]
        cell = "-" if not applies(v, c) else "failed" if not rs else "/".join(f"{ms:.4f}" for ms, _ in rs) + f" {100 * sum(f for _, f in rs) / len(rs):3.0f}%"
        row += f" {cell:>19}"
    print(row)
print("(qwen: the issue's target is 0.020 ms per layer-step; llama: f16 >= 88%, q8_0 >= 80%, q4_k >= 75% of the floor)")
print()
print("== per weight format: each variant against base over that format's cases (ratio of means; 'wins' when")
print("   in every case both of its rounds are faster than both of base's; 'loses' when slower likewise)")
fmts = {"f16": [c for c in cases if c.endswith("f16") or "_f16_" in c], "q8_0": [c for c in cases if "q8_0" in c],
        "q4_k": [c for c in cases if "q4_k" in c]}
for fm, cs in fmts.items():
    if not cs: continue
    best = None
    for v in variants:
        if v == "base" or not all(applies(v, c) for c in cs): continue
        ratios, wins, loses = [], True, True
        for c in cs:
            a, b = [x[0] for x in res[(c, v)]], [x[0] for x in res[(c, "base")]]
            if len(a) < rounds or len(b) < rounds: ratios = None; break
            ratios.append((sum(a) / len(a)) / (sum(b) / len(b)))
            wins &= max(a) < min(b); loses &= min(a) > max(b)
        if ratios is None: print(f"  {fm:<5} {v:<14} incomplete"); continue
        g = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        verdict = "wins" if wins else "loses" if loses else "within noise"
        print(f"  {fm:<5} {v:<14} x{g:.3f} ({' '.join(f'{x:.3f}' for x in ratios)}) {verdict}")
        if wins and (best is None or g < best[1]): best = (v, g)
    print(f"  {fm:<5} -> {'default candidate: ' + best[0] if best else 'keep the default'}")
PY
    echo "copy bandwidth (GB/s) measured by the runs: $(cat "$out"/r*_*.log 2>/dev/null | sed -n 's/.*"roof_gb_per_s":\([0-9.]*\).*/\1/p' | sort -g | awk '{ a[NR] = $1 } END { if (NR) printf "%.0f .. %.0f (%d runs)", a[1], a[NR], NR }')"
} | tee -a "$summary"
echo "logs: $out"
