#!/usr/bin/env bash
# The Python binding on the GPU machine (issue #23): pytest of python/tests with torch's CUDA
# tensors (run_async on torch's stream, device bindings), then examples/python/torch_decode.py on
# cuda (a llama-style layer in a torch decode loop, checked against torch's own layer, timed) and
# on cpu. Never stops at a failure: each step runs under a time limit and reports its status.
#
# usage: scripts/device-python.sh [BUILD_DIR]   (default devbin; needs BUILD_DIR/libkiln.so and
# BUILD_DIR/gen_model, python3 with numpy, pytest and torch; sources .devdeps/env.sh when present)
# With $OUT set, $OUT gets summary.txt and each step's log. About 1-2 minutes.
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ -f .devdeps/env.sh ] && . .devdeps/env.sh
# shellcheck source=scripts/device-lib.sh
. "$root/scripts/device-lib.sh"
dev_bin "${1:-devbin}" "scripts/device-python.sh [BUILD_DIR]" gen_model
[ -f "$bin/libkiln.so" ] || { echo "$bin/libkiln.so is missing" >&2; exit 2; }
dev_out python
export KILN_LIB="$bin/libkiln.so" KILN_GEN_MODEL="$bin/gen_model" PYTHONPATH="$root/python"
export KILN_SOURCE_DIR="$root" KILN_CACHE_DIR="$(mktemp -d /tmp/device-python-cache.XXXXXX)"

python3 -c 'import numpy, pytest, torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1 | tee -a "$summary"
"$bin/kiln" info 2>&1 | sed -n '1,8p' | tee -a "$summary" || true
# Every binding test, the torch CPU and CUDA ones included (the example runs below, not here).
step pytest 150 python3 -m pytest -q -p no:cacheprovider -rs python/tests
step torch_decode_cuda 120 python3 examples/python/torch_decode.py --device cuda --steps 128
step torch_decode_cpu 60 python3 examples/python/torch_decode.py --device cpu --small --steps 16 --prompt 8
for f in torch_decode_cuda torch_decode_cpu; do
  grep -E '^(kiln:|decode:|NMSE|OK|FAIL)' "$out/$f.log" | sed "s/^/$f: /" | tee -a "$summary"
done
grep -E 'passed|failed|SKIPPED' "$out/pytest.log" | tail -n 8 | sed 's/^/pytest: /' | tee -a "$summary"
rm -rf "$KILN_CACHE_DIR"
