#!/usr/bin/env bash
# Packs Mesa's lavapipe (Debian 12's mesa-vulkan-drivers, LLVM 15) for the GPU machine, which has no
# Mesa: libvulkan_lvp.so, libLLVM-15 and the small libraries they load, and an env.sh that writes an
# ICD file for it. scripts/device-lavapipe-seeds.sh unpacks it there (under /tmp, never over /).
# libLLVM's libxml2 (+ ICU, 40 MB) and libz3 (23 MB) are replaced by stubs: lavapipe never calls
# them (Windows manifests, the static analyzer's solver); a stub that is called aborts, naming itself.
#
# usage: scripts/lavapipe-bundle.sh [OUT.tar.xz]   (default devrun/lavapipe.tar.xz; ~30 MB, 3 min)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$root/devrun/lavapipe.tar.xz}"
mkdir -p "$(dirname "$dest")"
stage="$(mktemp -d /tmp/lvpbundle.XXXXXX)"
trap 'rm -rf "$stage"' EXIT
lists=/tmp/lavapipe-apt-lists
mkdir -p "$lists/partial" "$stage/debs" "$stage/x"
o="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=$lists"
apt-get $o update >/dev/null
# lavapipe's and libLLVM-15's own libraries, other than glibc/libstdc++/zlib/zstd/tinfo (Ubuntu
# 24.04 has those, as new or newer)
pkgs="mesa-vulkan-drivers libllvm15 libedit2 libbsd0 libmd0 libffi8 libexpat1 libdrm2 libwayland-client0
      libx11-xcb1 libxcb1 libxcb-dri3-0 libxcb-present0 libxcb-xfixes0 libxcb-sync1 libxcb-randr0
      libxcb-shm0 libxshmfence1 libxau6 libxdmcp6 libxml2"
(cd "$stage/debs" && apt-get $o download $pkgs >/dev/null 2>&1) || { echo "apt-get download failed" >&2; exit 1; }
for f in "$stage/debs"/*.deb; do dpkg -x "$f" "$stage/x"; done
src="$stage/x/usr/lib/x86_64-linux-gnu"
b="$stage/lavapipe"
mkdir -p "$b/lib"
libs="libvulkan_lvp.so libLLVM-15.so.1 libedit.so.2 libbsd.so.0 libmd.so.0 libffi.so.8 libexpat.so.1
      libdrm.so.2 libwayland-client.so.0 libX11-xcb.so.1 libxcb.so.1 libxcb-dri3.so.0 libxcb-present.so.0
      libxcb-xfixes.so.0 libxcb-sync.so.1 libxcb-randr.so.0 libxcb-shm.so.0 libxshmfence.so.1
      libXau.so.6 libXdmcp.so.6"
for l in $libs; do
    f="$src/$l"
    [[ -e "$f" ]] || f="$stage/x/lib/x86_64-linux-gnu/$l"
    cp -L "$f" "$b/lib/$l"
done

# stubs: libLLVM's undefined symbols from libxml2 (versioned) and libz3 (not), as functions that
# abort, or as data where the real library defines data (xmlFree is a function pointer variable)
llvm="$b/lib/libLLVM-15.so.1"
nm -D --undefined-only "$llvm" | awk '{ print $2 }' | grep -E '^xml[A-Za-z]*@LIBXML2_' >"$stage/xml.syms"
nm -D --undefined-only "$llvm" | awk '{ print $2 }' | grep -E '^Z3_' >"$stage/z3.syms"
data="$(nm -D --defined-only "$src/libxml2.so.2" | awk '$2 == "D" || $2 == "B" { sub(/@.*/, "", $3); print $3 }')"
stubs() { # stubs LIB SYMFILE > C source
    echo '#include <stdio.h>'
    echo '#include <stdlib.h>'
    echo "static void stub(const char *n) { fprintf(stderr, \"lavapipe bundle: stub %s of $1 called\\n\", n); abort(); }"
    local s
    while read -r s; do
        s="${s%%@*}"
        if grep -qx "$s" <<<"$data"; then echo "void *$s;"
        else echo "void $s(void) { stub(\"$s\"); }"; fi
    done <"$2"
}
stubs libxml2 "$stage/xml.syms" >"$stage/xml.c"
stubs libz3 "$stage/z3.syms" >"$stage/z3.c"
# libxml2's version nodes, each inheriting from the one before as in the real library
awk -F@ '{ v[$2] = v[$2] " " $1 ";" } END { for (k in v) print k, v[k] }' "$stage/xml.syms" | sort -V |
    awk '{ name = $1; $1 = ""; printf "%s {%s }%s;\n", name, ($0 == "" ? "" : " global:" $0), (prev == "" ? "" : " " prev); prev = name }' \
        >"$stage/xml.map"
cc -shared -fPIC -O1 -o "$b/lib/libxml2.so.2" -Wl,-soname,libxml2.so.2 -Wl,--version-script,"$stage/xml.map" "$stage/xml.c"
cc -shared -fPIC -O1 -o "$b/lib/libz3.so.4" -Wl,-soname,libz3.so.4 "$stage/z3.c"

cat >"$b/env.sh" <<'EOS'
# Sourced (bash): lavapipe as the only Vulkan driver. Writes its ICD file beside the libraries and
# points the Vulkan loader at it alone, so the NVIDIA driver is never loaded; the unpacked libraries
# go first on LD_LIBRARY_PATH (they are the bundle's only copies of their sonames that are used).
_lvp="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cat >"$_lvp/lvp_icd.json" <<EOJ
{ "file_format_version": "1.0.0",
  "ICD": { "library_path": "$_lvp/lib/libvulkan_lvp.so", "api_version": "1.1.230" } }
EOJ
export VK_DRIVER_FILES="$_lvp/lvp_icd.json" VK_ICD_FILENAMES="$_lvp/lvp_icd.json"
export VK_LOADER_LAYERS_DISABLE='~implicit~'
export LD_LIBRARY_PATH="$_lvp/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
EOS
# what is still unresolved with the bundle first (here everything resolves; there glibc & co.)
LD_LIBRARY_PATH="$b/lib" ldd "$b/lib/libvulkan_lvp.so" | grep -i 'not found' && { echo "unresolved" >&2; exit 1; }
tar -C "$stage" -cf - lavapipe | xz -9 -T2 >"$dest"
echo "$dest: $(du -h "$dest" | cut -f1); lib: $(ls "$b/lib" | tr '\n' ' ')"
