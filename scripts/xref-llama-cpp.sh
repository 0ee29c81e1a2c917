#!/usr/bin/env bash
# The optional llama.cpp cross-check (issue #20): builds llama-cpp-python (CPU only) into a venv
# outside the repo when it is not there yet, then runs python/tests/test_llama_cpp.py against the
# kiln library of a build and prints the table of arch x format: NMSE of kiln's logits against
# llama.cpp's, greedy tokens equal. Never touches the repo's build or the system's Python.
#
#   scripts/xref-llama-cpp.sh [pytest args...]      e.g. -k "qwen2 and q4_k_m"
# Environment: XREF_VENV (default ~/.cache/kiln/venv-lcp), XREF_SDIST (a llama_cpp_python sdist;
# default: llama-cpp-python==0.3.36 from PyPI, which has only an sdist), KILN_LIB (default
# build/libkiln.so), XREF_JOBS (build jobs, default 2). The llama.cpp build takes about 40 minutes
# on 2 shared cores (measured: see docs in README, GGUF models).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${XREF_VENV:-$HOME/.cache/kiln/venv-lcp}
lib=${KILN_LIB:-$root/build/libkiln.so}
[ -f "$lib" ] || { echo "xref: no kiln library at $lib (build it: cmake --build build --target kiln)" >&2; exit 2; }
if ! "$venv/bin/python" -c "import llama_cpp, gguf, numpy, pytest" 2>/dev/null; then
  echo "xref: building llama-cpp-python into $venv (CPU only)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q numpy gguf pytest
  start=$(date +%s)
  CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_BLAS=OFF -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF -DLLAVA_BUILD=OFF \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL=${XREF_JOBS:-2} nice -n 10 "$venv/bin/pip" install "${XREF_SDIST:-llama-cpp-python==0.3.36}"
  echo "xref: llama-cpp-python built in $(( $(date +%s) - start )) s"
fi
out=$(mktemp /tmp/kiln-xref.XXXXXX.jsonl)
cd "$root/python/tests"
rc=0
KILN_LIB=$lib PYTHONPATH=$root/python KILN_XREF_OUT=$out KILN_XREF_FULL=${KILN_XREF_FULL:-1} \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider test_llama_cpp.py "$@" || rc=$?
"$venv/bin/python" - "$out" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
if not rows:
    sys.exit(0)
print(f"\n{'case':10} {'format':8} {'ref vs llama.cpp':>16} {'cpu vs llama.cpp':>16} {'llama.cpp vs f64':>16}  tokens equal (ref, cpu)")
for r in rows:
    t = r["tokens_equal"]
    print(f"{r['case']:10} {r['fmt']:8} {r['nmse_ref_vs_llama']:16.2e} {r['nmse_cpu_vs_llama']:16.2e} "
          f"{r['nmse_llama_vs_f64']:16.2e}  {t['ref']}/{r['n_greedy']}, {t['cpu']}/{r['n_greedy']}")
EOF
echo "xref: rows in $out"
exit $rc
