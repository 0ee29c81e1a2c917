#!/usr/bin/env bash
# Issue #24 on a machine with two GPUs (the device tool's nvidia-h200-x2): kiln info's multi-gpu
# line, kiln calibrate's all-reduce measurement (saved to this run's cache dir, so the cost model of
# the later steps weighs the measured link), the split tests on cuda (virtual parts on one GPU
# against the f64 reference; llama-7b and qwen2-7b layers on two GPUs through NCCL against one GPU,
# 16 decode steps and a 512-token prefill), a random 7b-shaped GGUF model through kiln plan
# --devices (the cost model's verdicts) and kiln generate on one GPU and with --gpus 2 (greedy ids
# of both in the log), the benchmarks (llama-7b f16 decode at KV 1024, also without the CUDA graphs
# of the parts, and 512-token prefill, and the llama-70b layer, each on one GPU and split over two),
# then compute-sanitizer memcheck of one split decode step. A summary table is printed last. Never
# stops at a failure: every step runs under a limit.
#
# usage: source .devdeps/env.sh && scripts/device-mgpu.sh [BIN_DIR]     (BIN_DIR default devbin)
# Needs from a Release build in BIN_DIR: kiln, test_split and gen_model. Logs and JSON go to $OUT
# (else a temp dir). About 5 minutes. NCCL: $KILN_NCCL_LIB, the system's, or the Python environment's
# (pip's nvidia-nccl-cu12, as torch installs it); NCCL_NVLS_ENABLE=0 stays set (no NVLink multicast).
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/device-lib.sh
. "$root/scripts/device-lib.sh"
dev_bin "${1:-$root/devbin}" "scripts/device-mgpu.sh BIN_DIR" kiln
dev_out mgpu
export NCCL_NVLS_ENABLE=0
export KILN_SOURCE_DIR="$root"
export KILN_CACHE_DIR="${KILN_CACHE_DIR:-/tmp/kiln-mgpu-cache}" # cubins shared by the steps, not sent back
kiln="$bin/kiln"

nvidia-smi --query-gpu=index,name,memory.total --format=csv >"$out/gpus.txt" 2>&1
nvidia-smi topo -m >>"$out/gpus.txt" 2>&1
if ! "$kiln" info 2>/dev/null | grep -q '^multi-gpu: on' && [[ -z "${KILN_NCCL_LIB:-}" ]]; then
    lib=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
    [[ -n "$lib" && -f "$lib" ]] && export KILN_NCCL_LIB="$lib"
fi
step info 30 "$kiln" info
grep -E '^(  cuda|multi-gpu)' "$out/info.log"
step calibrate 60 "$kiln" calibrate --json
grep -o '"link":{[^}]*}' "$out/calibrate.log"

if [[ -x "$bin/test_split" ]]; then
    step test_split_cuda 170 "$bin/test_split" --jobs 1 --verbose --filter 'split/cuda*'
    grep -E 'NMSE|Synthesis|skip' "$out/test_split_cuda.log" | tail -n 12
else
    dev_skip test_split_cuda "$bin/test_split missing"
fi

if [[ -x "$bin/gen_model" ]]; then
    model=/tmp/kiln-mgpu-7b.gguf
    step gen_model 60 "$bin/gen_model" --shape 7b --layers 2 --wtype f16 "$model"
    step plan-gguf-2gpu 60 "$kiln" plan "$model" --devices cuda:0,1
    grep -E 'tensor-parallel|cost model' "$out/plan-gguf-2gpu.log" | cut -c1-200 | head -n 8
    step generate-1gpu 90 "$kiln" generate "$model" --ids 1,2,3,4 -n 16 --temp 0 --backend cuda --json
    step generate-2gpu 90 "$kiln" generate "$model" --ids 1,2,3,4 -n 16 --temp 0 --gpus 2 --json
    grep -h '^{' "$out/generate-1gpu.log" "$out/generate-2gpu.log" | cut -c1-300
    rm -f "$model"
else
    dev_skip generate "$bin/gen_model missing"
fi

# bench NAME ARGS...: one JSON line to $out/NAME.json
bench() {
    local name="$1"; shift
    step "$name" 75 "$kiln" bench --layers 1 --wtype f16 --no-roof --json "$@"
    grep '^{' "$out/$name.log" >"$out/$name.json" 2>/dev/null
}
bench 7b-decode-1gpu --preset llama-7b --mode decode --ctx 1024 --steps 32 --gpus 1 --host-io
bench 7b-decode-2gpu --preset llama-7b --mode decode --ctx 1024 --steps 32 --gpus 2
KILN_NO_RECORD=1 bench 7b-decode-2gpu-nograph --preset llama-7b --mode decode --ctx 1024 --steps 32 --gpus 2
bench 7b-prefill-1gpu --preset llama-7b --mode prefill --tokens 512 --steps 4 --gpus 1 --host-io
bench 7b-prefill-2gpu --preset llama-7b --mode prefill --tokens 512 --steps 4 --gpus 2
bench 70b-decode-1gpu --preset llama-70b --mode decode --ctx 1024 --steps 16 --gpus 1 --host-io
bench 70b-decode-2gpu --preset llama-70b --mode decode --ctx 1024 --steps 16 --gpus 2
bench 70b-prefill-2gpu --preset llama-70b --mode prefill --tokens 512 --steps 3 --gpus 2

if command -v compute-sanitizer >/dev/null; then
    step memcheck-split-step 100 compute-sanitizer --tool memcheck --error-exitcode 3 \
        "$kiln" bench --preset llama-7b --layers 1 --wtype f16 --mode decode --ctx 64 --steps 1 --gpus 2 --no-roof
else
    dev_skip memcheck-split-step "no compute-sanitizer"
fi

{
    echo
    echo "== summary ($out)"
    dev_steps
    printf '\n%-20s %14s %10s %10s\n' bench ms/layer-step GB/s GFLOP/s
    for f in "$out"/*.json; do
        [[ -s "$f" ]] || continue
        python3 - "$f" <<'EOF' 2>/dev/null || true
import json, os, sys
j = json.loads(open(sys.argv[1]).readline())
print(f"{os.path.basename(sys.argv[1])[:-5]:<20} {j['ms_per_layer_step']:14.4f} {j['gb_per_s']:10.1f} {j['gflop_per_s']:10.1f}")
EOF
    done
} | tee -a "$summary"
