#!/usr/bin/env bash
# Installs kiln's build into a temporary prefix and builds the examples against it from outside the
# tree, four ways: CMake find_package (kiln::kiln, kiln::kiln_static) and pkg-config (shared, and
# --static naming libkiln.a); runs each and checks what it links. Usage: run.sh BUILD_DIR SOURCE_DIR.
# Must not touch anything outside its temporary folder (removed on exit).
set -euo pipefail
build="$(cd "$1" && pwd)" src="$(cd "$2" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
lib="$prefix/lib"
[ -d "$lib" ] || lib="$(dirname "$(find "$prefix" -name libkiln.a | head -1)")"

# Only kiln's own names are exported (glslang and SPIRV-Tools stay inside).
bad="$(nm -D --defined-only "$lib/libkiln.so" | awk '{print $3}' | grep -v '^kiln_' || true)"
if [ -n "$bad" ]; then echo "libkiln.so exports names that are not kiln's:"; echo "$bad" | head; exit 1; fi

run() { # run NAME EXE [args]: runs an example (cpu), fails with its output
  local name="$1" exe="$2"
  shift 2
  if ! out="$(KILN_CACHE_DIR="$tmp/cache" "$exe" "$@" 2>&1)"; then
    echo "$name failed:"; echo "$out"; exit 1
  fi
}
# ldd's output is read whole before grep looks at it: `ldd | grep -q` under pipefail fails at random
# (grep exits at the first match, ldd gets SIGPIPE).
static_ok() { # static_ok NAME EXE: the binary must not need libkiln.so
  local deps
  deps="$(ldd "$2")"
  if grep -q 'libkiln\.so' <<<"$deps"; then echo "$1 links libkiln.so but should be static"; exit 1; fi
}
uses_prefix() { # uses_prefix NAME EXE: the binary loads the prefix's libkiln.so
  local deps
  deps="$(ldd "$2")"
  grep -q "$lib/libkiln.so" <<<"$deps" || { echo "$1 does not use the prefix's libkiln.so:"; echo "$deps"; exit 1; }
}

# 1) CMake: find_package(kiln), shared and static.
cmake -S "$src/tests/install" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$prefix" -DKILN_EXAMPLES_DIR="$src/examples" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/cm" -j 2 >/dev/null
for e in decode_layer cost_model_experiment; do
  static_ok "cmake ${e}_static" "$tmp/cm/${e}_static"
  uses_prefix "cmake ${e}_shared" "$tmp/cm/${e}_shared"
done
run "cmake decode_layer_shared" "$tmp/cm/decode_layer_shared" cpu
run "cmake decode_layer_static" "$tmp/cm/decode_layer_static" cpu
run "cmake cost_model_experiment_static" "$tmp/cm/cost_model_experiment_static" 1

# 2) pkg-config: shared, and static (--static lists everything libkiln.a needs).
export PKG_CONFIG_PATH="$lib/pkgconfig"
cc=${CC:-cc}
# shellcheck disable=SC2046
$cc -O1 -o "$tmp/pc_shared" "$src/examples/decode_layer.c" $(pkg-config --cflags --libs kiln) -lm -Wl,-rpath,"$lib"
# shellcheck disable=SC2046
$cc -O1 -o "$tmp/pc_static" "$src/examples/decode_layer.c" \
  $(pkg-config --cflags --static --define-variable=kilnlib=:libkiln.a --libs kiln) -lm
static_ok "pkg-config static" "$tmp/pc_static"
uses_prefix "pkg-config shared" "$tmp/pc_shared"
run "pkg-config decode_layer_shared" "$tmp/pc_shared" cpu
run "pkg-config decode_layer_static" "$tmp/pc_static" cpu
echo "install: find_package and pkg-config, shared and static: ok"
