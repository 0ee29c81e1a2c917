#!/usr/bin/env bash
# Issue #22 (decode at the roof), session 7's one device run: PARTS (default "ncu qwen reduce gen", in
# that order) of
#   ncu:    every kernel of one decode step, launched one by one, under Nsight Compute: duration, DRAM
#           bytes and throughput, instructions executed (per DRAM byte), issue activity, achieved
#           occupancy and the warp stall reasons (smsp__warp_issue_stalled_*_per_warp_active.pct), of
#           llama-7b q4_k (KV 1024, one layer) and qwen2-0.5b q4_k and f16 (KV 1024, one layer), and
#           qwen2-0.5b q4_k with KILN_GEMV_REDUCE=1 and with KILN_GEMV_PRELOAD=1, llama-7b q4_k with
#           KILN_GEMV_PIPELINE=1 and with KILN_GEMV_PAIR=1 KILN_GEMV_FENCE=1;
#   qwen:   kiln bench --profile of qwen2-0.5b (24 layers, f16 and q4_k): the per-kernel table;
#   reduce: A B A B through scripts/device-decode.sh (no checks, no ncu): qwen2-0.5b q4_k/f16 with
#           variants base, reduce (KILN_GEMV_REDUCE=1), preload (KILN_GEMV_PRELOAD=1), pdl3, attn_cl,
#           attn_cl_pdl3 (QWEN_VARIANTS); llama-7b q4_k/q8_0/f16 at KV 1024 with base, reduce, fence,
#           pair_fence, pipe (KILN_GEMV_PIPELINE=1), pair_pipe (LLAMA_VARIANTS);
#           per-kernel profiles on q4_k;
#   gen:    kiln generate against bench --model decode (scripts/device-generate.sh: Q4_K_M llama-7b,
#           512- and 16-token prompts, new and KILN_DECODE_KERNELS=0, A B A B; writes the model first
#           unless $KILN_MODEL_DIR has it: about 2 minutes).
# Builds nothing; never stops at a failure; each part's summary to stdout, all logs under $OUT.
#
# usage: scripts/device-dec.sh [BIN_DIR]   (default build: kiln, gen_model of a Release build)
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/device-lib.sh
. "$root/scripts/device-lib.sh"
dev_bin "${1:-$root/build}" "scripts/device-dec.sh [BIN_DIR]" kiln
dev_out dec
top="$out"
export KILN_CACHE=off
dev_info
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader 2>/dev/null | tee -a "$summary"

# ncu_step NAME SKIP COUNT ENV ARGS...: kiln_ kernels of `env ENV kiln bench ARGS --steps 2`, the
# first SKIP (the warm-up run's: the plan's kernel count) skipped, COUNT (the timed steps') profiled
ncu_metrics="gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed"
ncu_metrics+=",launch__grid_size,launch__block_size,launch__registers_per_thread,smsp__inst_executed.sum"
ncu_metrics+=",smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active"
ncu_metrics+=",lts__t_bytes.sum,regex:smsp__warp_issue_stalled_.*_per_warp_active\\.pct"
ncu_step() { # NAME SKIP COUNT ENV BENCH_ARGS...
    local name="$1" skip="$2" count="$3" e="$4"
    shift 4
    # shellcheck disable=SC2086
    step "$name" 240 env KILN_NO_RECORD=1 $e "$ncu" --csv --page raw --log-file "$out/$name.csv" --kernel-name regex:^kiln_ \
        --launch-skip "$skip" --launch-count "$count" --metrics "$ncu_metrics" "$bin/kiln" bench "$@" --mode decode \
        --backend cuda --steps 2 --no-roof
}
ncu_table() { # the CSVs of $out/ncu_*.csv as one table each
    OUT_DIR="$out" python3 - <<'PY'
import csv, glob, os
for f in sorted(glob.glob(os.environ["OUT_DIR"] + "/ncu_*.csv")):
    rows = [r for r in csv.reader(l for l in open(f, errors="replace") if l.startswith('"'))]
    print(f"-- {os.path.basename(f)[:-4]}")
    if len(rows) < 3: print("   (no kernels)"); continue
    hdr, units, data = rows[0], rows[1], rows[2:]
    col = {h: i for i, h in enumerate(hdr)}
    def num(r, k):
        try: v = float(r[col[k]].replace(",", ""))
        except (KeyError, ValueError): return float("nan")
        u = units[col[k]]
        return v * {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1, "us": 1, "msecond": 1e3, "ms": 1e3, "byte": 1, "B": 1,
                    "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6, "Gbyte": 1e9, "GB": 1e9}.get(u, 1)
    stalls = [h for h in hdr if h.startswith("smsp__warp_issue_stalled_")]
    print(f"   {'kernel':<16} {'grid':>6} {'regs':>4} {'us':>7} {'MB rd':>7} {'GB/s':>6} {'dram%':>5} {'inst/B':>6} {'issue%':>6} {'warps%':>6}  top stalls (% of active warp cycles)")
    tot = 0.0
    for r in data:
        us, rd = num(r, "gpu__time_duration.sum"), num(r, "dram__bytes_read.sum")
        tot += us
        inst = num(r, "smsp__inst_executed.sum")
        st = sorted(((num(r, h), h[len("smsp__warp_issue_stalled_"):-len("_per_warp_active.pct")]) for h in stalls), reverse=True)[:5]
        name = r[col.get("Kernel Name", 4)].split("(")[0]
        print(f"   {name:<16} {num(r, 'launch__grid_size'):6.0f} {num(r, 'launch__registers_per_thread'):4.0f} {us:7.2f} {rd / 1e6:7.3f} "
              f"{rd / 1e3 / us if us > 0 else 0:6.0f} {num(r, 'dram__throughput.avg.pct_of_peak_sustained_elapsed'):5.1f} "
              f"{inst * 32 / rd if rd > 0 else float('nan'):6.2f} {num(r, 'smsp__issue_active.avg.pct_of_peak_sustained_active'):6.1f} "
              f"{num(r, 'sm__warps_active.avg.pct_of_peak_sustained_active'):6.1f}  " + " ".join(f"{n} {v:.0f}" for v, n in st))
    print(f"   total {tot:.2f} us over {len(data)} kernels (inst/B: thread instructions, warp instructions x 32, per DRAM byte read)")
PY
}

# shellcheck disable=SC2206
parts=(${PARTS:-ncu qwen reduce gen})
for part in "${parts[@]}"; do
    echo "== part $part ($(date -u +%H:%M:%S))" | tee -a "$summary"
    case "$part" in
    ncu)
        ncu="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
        if [[ ! -x "$ncu" ]]; then echo "ncu absent" | tee -a "$summary"; continue; fi
        out="$top/ncu" && mkdir -p "$out"
        # kernels a step: llama q4_k 6-7, qwen 6 (docs/kernels.md); skip the warm-up's, keep 2 steps' worth
        ncu_step ncu_llama_q4_k 6 12 "" --preset llama-7b --wtype q4_k --ctx 1024 --layers 1
        ncu_step ncu_llama_q4_k_pipe 6 12 KILN_GEMV_PIPELINE=1 --preset llama-7b --wtype q4_k --ctx 1024 --layers 1
        ncu_step ncu_llama_q4_k_pair_fence 6 12 "KILN_GEMV_PAIR=1 KILN_GEMV_FENCE=1" --preset llama-7b --wtype q4_k --ctx 1024 --layers 1
        ncu_step ncu_qwen_q4_k 6 12 "" --preset qwen2-0.5b --wtype q4_k --ctx 1024 --layers 1
        ncu_step ncu_qwen_f16 6 12 "" --preset qwen2-0.5b --wtype f16 --ctx 1024 --layers 1
        ncu_step ncu_qwen_q4_k_reduce 6 12 KILN_GEMV_REDUCE=1 --preset qwen2-0.5b --wtype q4_k --ctx 1024 --layers 1
        ncu_step ncu_qwen_q4_k_preload 6 12 KILN_GEMV_PRELOAD=1 --preset qwen2-0.5b --wtype q4_k --ctx 1024 --layers 1
        ncu_table | tee -a "$summary"
        out="$top"
        ;;
    qwen)
        for w in f16 q4_k; do
            step "qwen_${w}_profile" 120 "$bin/kiln" bench --preset qwen2-0.5b --wtype "$w" --ctx 1024 --layers 24 --mode decode \
                --backend cuda --steps 8 --no-roof --profile
            { echo "-- qwen2-0.5b $w, 24 layers: per-kernel profile (kernel by kernel; the first layer's regions)"
              sed -n '1,/^ *# /p' "$out/qwen_${w}_profile.log" | tail -n 1
              grep -E '^ +[0-4] ' "$out/qwen_${w}_profile.log"
              grep -E '^total|median' "$out/qwen_${w}_profile.log"; } | tee -a "$summary"
        done
        ;;
    reduce)
        # qwen2-0.5b: REDUCE beside the one-kernel cluster attention and PDL 3 (never timed A B A B);
        # llama-7b: REDUCE beside the fence, pair + fence (kl_wfmt.gemv_auto's candidates) and the pipeline
        OUT="$top/reduce_qwen" VARIANTS="${QWEN_VARIANTS:-base reduce preload pdl3 attn_cl attn_cl_pdl3}" CASES="qwen_q4_k qwen_f16" \
            CHECKS=0 NCU=0 PROFILE_CASES="qwen_q4_k" PROFILE_VARIANTS="base preload attn_cl" BUDGET_S=220 \
            "$root/scripts/device-decode.sh" "$bin" | sed -n '/^== /,$p' | tee -a "$summary"
        OUT="$top/reduce_llama" VARIANTS="${LLAMA_VARIANTS:-base reduce fence pair_fence pipe pair_pipe}" \
            CASES="llama_q4_k_1k llama_q8_0_1k llama_f16_1k" CHECKS=0 NCU=0 \
            PROFILE_CASES="llama_q4_k_1k" PROFILE_VARIANTS="base pair_fence pipe" BUDGET_S=260 \
            "$root/scripts/device-decode.sh" "$bin" | sed -n '/^== /,$p' | tee -a "$summary"
        ;;
    gen)
        [[ -x "$bin/gen_model" ]] || { echo "no $bin/gen_model: no generate part" | tee -a "$summary"; continue; }
        OUT="$top/gen" "$root/scripts/device-generate.sh" "$bin" q4_k_m | sed -n '/^== device-generate/,$p' | tee -a "$summary"
        ;;
    *) echo "unknown part $part" | tee -a "$summary" ;;
    esac
done
echo "logs: $top"
