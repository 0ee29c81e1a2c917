#!/usr/bin/env bash
# Serving engines on the GPU machine (issue #21). Two modes; builds nothing; never stops at a failure;
# each step under a time limit.
#
# check (default, about 6 minutes): the host time of kiln_run_async per step on a captured CUDA graph
# (every input, output and metadata buffer bound as device memory; goal <= 10 us for a 32-layer step),
# for llama-7b (32 layers, f16 and q4_k; the 64-sequence case 8 layers: 32 of them with a 64 x 1024
# KV cache need 81.65 GiB, past an H100's 80) and qwen2-0.5b stretched to 32 layers, at 1, 16 and 64
# sequences; serve 64 x 1024 with f16 and q8_0 pools; then the paged and tree tests on cuda (q8_0
# pools; tree steps of many rows now take the flash kernel), test_flash_kir, the 100-step graph
# replay and kiln check paged_attention/kv_scatter.
#
# steps (about 8 minutes, BUDGET_S=470 cuts the later steps): where a serve decode step's time goes.
# llama-7b f16 layers, paged f16 pool (block 16, shuffled), the plan of a 512-token chunk + decode
# (as engines compile it): decode of 16x1024, 64x1024, 256x1024 and 64x4096 (and 64x1024 ragged,
# and the 64x1024 mixed step) for each variant of VARIANTS (default "base off pd48 f16": off =
# KILN_PAGED_DECODE=0, pd48 = KILN_PAGED_DECODE=48, f16 = KILN_PRECISION=f16; name=VAR=1+VAR2=2 adds
# one), two rounds A B A B; then under ncu
# (--clock-control none) one decode step of one layer per case: every kernel's time, DRAM bytes and
# achieved GB/s; stall reasons of the 64x1024 attention and GEMM kernels; then PyTorch in the same
# run (bench/torch_ref.py serve: cuBLAS + SDPA over contiguous caches, one CUDA graph) with the copy
# bandwidth that sets the floor. Summary tables last on stdout.
#
# usage: scripts/device-serve.sh [BIN_DIR] [check|steps]   (default devbin: a Release build's binaries)
# BIN_DIR needs kiln; check runs test_paged, test_tree, test_flash_kir and test_replay when present.
# Run it from the repository root after `source .devdeps/env.sh`. With $OUT set, every log and
# summary.txt go there (else a temp dir); steps writes only summary.txt and logs.tar.xz there.
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/device-lib.sh
. "$root/scripts/device-lib.sh"
dev_bin "${1:-devbin}" "scripts/device-serve.sh [BIN_DIR] [check|steps]" kiln
mode="${2:-check}"
final="${OUT:-}"
if [[ "$mode" == steps ]]; then # the logs stay in a temp dir (a call brings back a few files): $OUT gets summary.txt and logs.tar.xz
    OUT="$(mktemp -d /tmp/device-serve.XXXXXX)" dev_out serve
    # shellcheck source=scripts/device-serve-steps.sh
    . "$root/scripts/device-serve-steps.sh"
    if [[ -n "$final" ]]; then
        mkdir -p "$final"
        cp "$summary" "$final/summary.txt"
        tar -cJf "$final/logs.tar.xz" -C "$out" --exclude ./cache . 2>/dev/null
    fi
    exit 0
fi
dev_out serve
if [[ "$mode" != check ]]; then
    echo "usage: scripts/device-serve.sh [BIN_DIR] [check|steps] (unknown mode '$mode')" >&2
    exit 2
fi
export KILN_SOURCE_DIR="$root" KILN_CACHE=off
dev_info

# host time per kiln_run_async step (JSON lines: host_us_per_step_median/p90/max, step_ms)
# (--layers per run: host time grows with the kernel count, so the table has a column for it)
host_runs=(
    "host_llama7b_f16_s1:--preset llama-7b --wtype f16 --seqs 1 --ctx 1024 --layers 32"
    "host_llama7b_f16_s64_8l:--preset llama-7b --wtype f16 --seqs 64 --ctx 1024 --layers 8"
    "host_llama7b_q4k_s16:--preset llama-7b --wtype q4_k --seqs 16 --ctx 1024 --layers 32"
    "host_qwen05b_32l_s16:--preset qwen2-0.5b --wtype f16 --seqs 16 --ctx 1024 --layers 32"
)
for r in "${host_runs[@]}"; do
    name="${r%%:*}"
    # shellcheck disable=SC2086
    step "$name" 300 "$bin/kiln" bench --mode serve --host --steps 320 --backend cuda --json ${r#*:}
done
# q8_0 pools against f16 ones: decode 64 x 1024 and the mixed step (llama-7b f16 layers, block 16)
for kv in f16 q8_0; do
    step "serve_64x1024_kv_$kv" 180 "$bin/kiln" bench --preset llama-7b --mode serve --seqs 64 --ctx 1024 --chunk 512 --layers 2 \
        --backend cuda --kv "$kv" --json
done

# correctness on cuda (present binaries only)
[[ -x "$bin/test_paged" ]] && step paged_cuda 120 "$bin/test_paged" --jobs 4 --filter 'paged/*cuda*'
[[ -x "$bin/test_tree" ]] && step tree_cuda 120 "$bin/test_tree" --jobs 4 --filter 'tree/*cuda*'
[[ -x "$bin/test_flash_kir" ]] && step flash_kir 120 "$bin/test_flash_kir" --jobs 4
[[ -x "$bin/test_replay" ]] && step replay_100_steps_cuda 300 "$bin/test_replay" --jobs 1 --filter 'replay/graph_replays_100*'
step check_paged_cuda 240 "$bin/kiln" check --op paged_attention --backend cuda --quick
step check_kv_scatter_cuda 120 "$bin/kiln" check --op kv_scatter --backend cuda --quick
san="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
if [[ -x "$san" ]]; then # a mixed step over q8_0 pools (scatter, split and flash kernels), then a tree step's flash kernel
    step memcheck_serve_q8_0 240 "$san" --tool memcheck --error-exitcode 3 "$bin/kiln" bench --preset qwen2-0.5b --mode serve \
        --seqs 8 --ctx 256 --chunk 64 --layers 1 --steps 1 --backend cuda --kv q8_0
    [[ -x "$bin/test_tree" ]] && step racecheck_tree_cuda 240 "$san" --tool racecheck --error-exitcode 3 "$bin/test_tree" --jobs 1 \
        --filter 'tree/verify_equals_path_decoding_cuda'
fi

echo | tee -a "$summary"
echo "kiln_run_async host time per step (us), every binding device memory (goal <= 10 for 32 layers; us per kernel x 32-layer kernels for the 8-layer run):" | tee -a "$summary"
printf "%-24s %6s %8s %8s %8s %8s %10s\n" run layers kernels median p90 max step_ms | tee -a "$summary"
for r in "${host_runs[@]}"; do
    name="${r%%:*}"
    line=$(grep -h '"host":true' "$out/$name.log" 2>/dev/null | tail -n1)
    if [[ -z "$line" ]]; then
        printf "%-24s %8s\n" "$name" "-" | tee -a "$summary"
        continue
    fi
    layers=$(sed -n 's/.*--layers \([0-9]*\).*/\1/p' <<<"$r")
    python3 - "$name" "$line" "$layers" <<'EOF' | tee -a "$summary"
import json, sys
j = json.loads(sys.argv[2])
print("%-24s %6s %8d %8.2f %8.2f %8.2f %10.3f" % (sys.argv[1], sys.argv[3], j["kernels"], j["host_us_per_step_median"],
      j["host_us_per_step_p90"], j["host_us_per_step_max"], j["step_ms"]))
EOF
done
