#!/usr/bin/env bash
# Packs the libFuzzer targets for scripts/device-fuzz.sh: fuzz_build, fuzz_gguf and fuzz_cache from
# a -DKILN_FUZZ=ON build folder (scripts/fuzz builds one), the shared libraries they load other than
# glibc's (as ldd finds them here), and the seed corpora tests/fuzz/corpus/<target> joined with any
# grown corpus folders named as TARGET=DIR, and scripts/device-fuzz.sh. Builds nothing; writes one .tar.xz.
#
# usage: scripts/fuzz-bundle.sh BUILD_FUZZ_DIR OUT.tar.xz [build=DIR gguf=DIR cache=DIR ...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ $# -lt 2 || ! -d "$1" ]]; then
    echo "usage: scripts/fuzz-bundle.sh BUILD_FUZZ_DIR OUT.tar.xz [TARGET=CORPUS_DIR ...]" >&2
    exit 2
fi
bdir="$1" dest="$2"
shift 2
stage="$(mktemp -d /tmp/fuzzbundle.XXXXXX)"
trap 'rm -rf "$stage"' EXIT
b="$stage/fuzzbundle"
mkdir -p "$b/bin" "$b/lib"
for t in build gguf cache; do
    [[ -x "$bdir/fuzz_$t" ]] || { echo "$bdir/fuzz_$t is missing (build with scripts/fuzz)" >&2; exit 2; }
    cp "$bdir/fuzz_$t" "$b/bin/"
    mkdir -p "$b/corpus/$t"
    cp "$root/tests/fuzz/corpus/$t/"* "$b/corpus/$t/"
    # libraries resolved here, glibc's own left to the machine (its glibc must be as new or newer)
    ldd "$bdir/fuzz_$t" | awk '$3 ~ /^\// { print $3 }' | grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
        xargs -r -I{} cp -L -n {} "$b/lib/"
done
for arg in "$@"; do # grown corpora: TARGET=DIR
    t="${arg%%=*}" d="${arg#*=}"
    [[ -d "$d" && -d "$b/corpus/$t" ]] || { echo "not a TARGET=DIR pair: $arg" >&2; exit 2; }
    find "$d" -maxdepth 1 -type f -size -1024k -exec cp -n {} "$b/corpus/$t/" \;
done
cp "$root/scripts/device-fuzz.sh" "$b/" # the runner travels with it: tar -xJf; bash fuzzbundle/device-fuzz.sh fuzzbundle
tar -C "$stage" -cJf "$dest" fuzzbundle
echo "$dest: $(du -h "$dest" | cut -f1); bin: $(ls "$b/bin" | tr '\n' ' '); lib: $(ls "$b/lib" | tr '\n' ' ')"
for t in build gguf cache; do echo "corpus/$t: $(ls "$b/corpus/$t" | wc -l) inputs"; done
