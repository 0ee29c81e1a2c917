#!/usr/bin/env bash
# Prefill attention on the GPU machine (issues #19 and #21): correctness of the flash kernel on cuda
# (test_ops attention cases and the paged tests, the new kernel and the first one with KILN_FLASH=0;
# draft trees, a CUDA graph replayed over 100 changing serve steps, kiln check paged_attention),
# compute-sanitizer racecheck of one flash launch, then a timing table of attention alone
# (bench_attn: n_tok 512 / 4096, GQA 1/4/8, hd 128, 64 and 256, gemma's soft-cap and window, f16
# cache, new vs first kernel), the warpgroup kernel under KILN_PRECISION=f16 (test_ops on cuda with and
# without its ping-pong (KILN_FLASH_WG=2), racecheck/memcheck/synccheck, timing against the
# ping-pong-less variant and the mma.sync kernel with KILN_FLASH_WG=0, Nsight Compute sections of
# the 512- and 4096-token llama kernels where ncu is found) and the mixed serve step of a 512-token
# paged prefill chunk with 63 decoding sequences (matmul/attention split).
# Never stops at a failure; each step under a time limit; about 7 minutes in all.
#
# usage: scripts/device-attn.sh [BIN_DIR]   (default devbin: a Release build's binaries)
# Run it from the repository root after `source .devdeps/env.sh`. With $OUT set, every log and
# summary.txt go there (else a temp dir).
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/device-lib.sh
. "$root/scripts/device-lib.sh"
dev_bin "${1:-devbin}" "scripts/device-attn.sh [BIN_DIR]" kiln test_ops bench_attn
dev_out attn
export KILN_SOURCE_DIR="$root" KILN_CACHE=off
dev_info

# correctness on cuda: the flash kernel (new, then the first) and the paged kernels
step attn_ops_new 90 env KILN_TEST_BACKEND=cuda "$bin/test_ops" --jobs 4 --filter 'ops/attention*'
step attn_ops_first 90 env KILN_TEST_BACKEND=cuda KILN_FLASH=0 "$bin/test_ops" --jobs 4 --filter 'ops/attention_prefill'
[[ -x "$bin/test_paged" ]] && step paged_cuda 90 "$bin/test_paged" --jobs 4 --filter 'paged/*cuda*'
# draft trees (split kernels at every size), a CUDA graph over 100 changing steps vs launched runs, kiln check
[[ -x "$bin/test_tree" ]] && step tree_cuda 120 "$bin/test_tree" --jobs 4 --filter 'tree/*cuda*'
[[ -x "$bin/test_replay" ]] && step replay_100_steps_cuda 300 "$bin/test_replay" --jobs 1 --filter 'replay/graph_replays_100*'
step check_paged_cuda 240 "$bin/kiln" check --op paged_attention --backend cuda --quick
san="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
if [[ -x "$san" ]]; then
    step racecheck_flash 120 "$san" --tool racecheck --error-exitcode 3 "$bin/kiln" bench --preset qwen2-0.5b --mode prefill \
        --tokens 300 --backend cuda --wtype f16 --layers 1 --steps 1 --no-roof
fi

# attention alone: new kernel, then the first (same shapes)
step bench_attn_new 60 "$bin/bench_attn" cuda 20
step bench_attn_first 60 env KILN_FLASH=0 "$bin/bench_attn" cuda 20
# f16 precision (sm_90a): the warpgroup kernel (TMA + wgmma, lower_flash_wg.c), then the mma.sync one
step attn_ops_wg 120 env KILN_TEST_BACKEND=cuda KILN_PRECISION=f16 "$bin/test_ops" --jobs 4 --filter 'ops/attention*'
step attn_ops_wg_nopp 120 env KILN_TEST_BACKEND=cuda KILN_PRECISION=f16 KILN_FLASH_WG=2 "$bin/test_ops" --jobs 4 --filter 'ops/attention*'
if [[ -x "$san" ]]; then
    for tool in racecheck memcheck synccheck; do # llama-7b 512 (shape 0) and gemma hd 256 + soft-cap (shape 10)
        for sh in 0 10; do
            step "${tool}_flash_wg_shape$sh" 120 env KILN_PRECISION=f16 "$san" --tool "$tool" --error-exitcode 3 "$bin/bench_attn" cuda 1 512 "$sh"
        done
    done
fi
step bench_attn_wg 90 env KILN_PRECISION=f16 "$bin/bench_attn" cuda 20
step bench_attn_wg_nopp 90 env KILN_PRECISION=f16 KILN_FLASH_WG=2 "$bin/bench_attn" cuda 20
step bench_attn_mma_f16 90 env KILN_PRECISION=f16 KILN_FLASH_WG=0 "$bin/bench_attn" cuda 20
# the 512-token region is three launches (two split kernels that exit at their row guard, then the
# flash kernel): programmatic dependent launch overlaps them; the difference is launch overhead
step bench_attn_wg_pdl 90 env KILN_PRECISION=f16 KILN_PDL=1 "$bin/bench_attn" cuda 20 512
# where the 512-token kernel's 30 us go (launch, Q staging, tiles, stores): Nsight Compute on the
# warpgroup kernel of llama-7b 512 (shape 0) and 4096 tokens (shape 3)
ncu_bin="$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)"
if [[ -n "$ncu_bin" ]]; then
    for sh in 0 3; do
        step "ncu_flash_wg_shape$sh" 180 env KILN_PRECISION=f16 KILN_NO_RECORD=1 "$ncu_bin" --kernel-name kiln_attn_flash_wg --launch-skip 1 --launch-count 1 \
            --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats \
            --section MemoryWorkloadAnalysis "$bin/bench_attn" cuda 2 4096 "$sh"
    done
fi
step prefill_profile_wg 60 env KILN_PRECISION=f16 "$bin/kiln" bench --preset llama-7b --mode prefill --tokens 512 --backend cuda \
    --wtype f16 --layers 1 --steps 5 --no-roof --profile
# a llama-7b prefill layer, per kernel
step prefill_profile 60 "$bin/kiln" bench --preset llama-7b --mode prefill --tokens 512 --backend cuda --wtype f16 \
    --layers 1 --steps 5 --no-roof --profile
# paged: the mixed step (a 512-token chunk + 63 decoding sequences at 1024), attention's share
step serve_mixed 90 "$bin/kiln" bench --preset llama-7b --mode serve --seqs 64 --ctx 1024 --chunk 512 --layers 2 \
    --backend cuda --json
step serve_mixed_first 90 env KILN_FLASH=0 "$bin/kiln" bench --preset llama-7b --mode serve --seqs 64 --ctx 1024 --chunk 512 \
    --layers 2 --backend cuda --json

{
    echo
    echo "attention alone (f16 cache; us and TFLOP/s of causal work):"
    printf '%-7s %-8s %-4s %12s %12s %12s %12s\n' n_tok kv_heads hd "new us" "new TF/s" "first us" "first TF/s"
    paste -d'\n' <(grep '"n_tok"' "$out/bench_attn_new.log") <(grep '"n_tok"' "$out/bench_attn_first.log") |
        sed -n 's/.*"n_tok": \([0-9]*\).*"kv_heads": \([0-9]*\), "hd": \([0-9]*\).*"us": \([0-9.]*\), "tflop_per_s": \([0-9.]*\).*/\1 \2 \3 \4 \5/p' |
        paste -d' ' - - | awk '{ printf "%-7s %-8s %-4s %12s %12s %12s %12s\n", $1, $2, $3, $4, $5, $9, $10 }'
    echo
    echo "f16 precision: warpgroup kernel (ping-pong), without ping-pong (KILN_FLASH_WG=2), mma.sync kernel (us, TFLOP/s of"
    echo "causal work, windowed rows counting their window's keys; targets: llama-7b 512 <= 15 us, 4096 >= 350 TF/s):"
    printf '%-6s %-5s %-4s %-4s %-5s %-6s %9s %8s %9s %8s %9s %8s\n' n_tok heads kvh hd cap window "wg us" "wg TF/s" "nopp us" "nopp TF" "mma us" "mma TF"
    paste -d'\n' <(grep '"n_tok"' "$out/bench_attn_wg.log") <(grep '"n_tok"' "$out/bench_attn_wg_nopp.log") <(grep '"n_tok"' "$out/bench_attn_mma_f16.log") |
        sed -n 's/.*"n_tok": \([0-9]*\), "heads": \([0-9]*\), "kv_heads": \([0-9]*\), "hd": \([0-9]*\), "us": \([0-9.]*\), "tflop_per_s": \([0-9.]*\), "softcap": \([0-9.e+-]*\), "window": \([0-9]*\).*/\1 \2 \3 \4 \7 \8 \5 \6/p' |
        paste -d' ' - - - | awk '{ printf "%-6s %-5s %-4s %-4s %-5s %-6s %9s %8s %9s %8s %9s %8s\n", $1, $2, $3, $4, $5, $6, $7, $8, $15, $16, $23, $24 }'
    echo
    echo "512 tokens with KILN_PDL=1 (launch overlap), wg kernel:"
    grep '"n_tok"' "$out/bench_attn_wg_pdl.log" | sed -n 's/.*"n_tok": \([0-9]*\), "heads": \([0-9]*\), "kv_heads": \([0-9]*\), "hd": \([0-9]*\), "us": \([0-9.]*\), "tflop_per_s": \([0-9.]*\), "softcap": \([0-9.e+-]*\), "window": \([0-9]*\).*/  \1 tokens \2\/\3 heads hd \4 cap \7 window \8: \5 us, \6 TF\/s/p'
    echo
    for f in "$out"/ncu_flash_wg_shape*.log; do
        [[ -f "$f" ]] || continue
        echo "ncu $(basename "$f" .log):"
        grep -E "^ +(Duration|Elapsed Cycles|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per Thread|Achieved Occupancy|No Eligible|Issued Warp Per Scheduler|Warp Cycles Per Issued Instruction)" "$f" | head -n 14
    done
    echo
    echo "llama-7b prefill layer at f16 precision, attention line:"
    grep -i "attn" "$out/prefill_profile_wg.log" | head -n 4
    echo
    echo "llama-7b prefill layer, flash kernel line:"
    grep -i "attn" "$out/prefill_profile.log" | head -n 4
    echo
    echo "serve mixed step (new, then first):"
    grep -o '"mixed[^}]*}' "$out/serve_mixed.log" | head -n 1
    grep -o '"mixed[^}]*}' "$out/serve_mixed_first.log" | head -n 1
} | tee -a "$summary"
echo "logs: $out"
