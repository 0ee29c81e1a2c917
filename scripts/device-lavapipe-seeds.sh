#!/usr/bin/env bash
# `kiln check` seeds on Mesa's lavapipe, many at once, on the GPU machine's idle cores (issue #17:
# 100 lavapipe seeds; this machine has two cores). Uses no GPU: the bundle made by
# scripts/lavapipe-bundle.sh is the only Vulkan driver the loader sees (env.sh), and each run's
# `kiln info` line is checked to name llvmpipe before its seed counts.
#
# usage: scripts/device-lavapipe-seeds.sh BUNDLE KILN OP A B JOBS [DEADLINE] [-- CHECK_ARGS...]
#   BUNDLE    devrun/lavapipe.tar.xz;  KILN  the kiln binary (build/kiln)
#   OP        kiln check's --op (matmul, fused, ...);  A..B  the seeds;  JOBS  runs at once
#   DEADLINE  seconds from the start after which no seed runs on: one still running is stopped and
#             listed as unfinished (not as failed); seeds not started by then are listed (default 0: none)
#   CHECK_ARGS  more kiln check arguments (e.g. --quick)
# Each seed runs `kiln check --backend vulkan --op OP --seed N --threads 1 --failures CHECK_ARGS`
# with LP_NUM_THREADS=1 (one core each; set it for more lavapipe threads a seed). Contracts: $KILN_SOURCE_DIR/contracts, else this script's
# checkout's: they must be those of KILN's commit (a kiln older than its contracts fails every seed
# on a dtype it does not know; for a long local run, pin a copy: git archive REV contracts). $OUT (else a temp dir) gets OP-N.txt per seed and
# summary-OP.txt: one line a seed (rc, seconds), then the counts and every failing seed's rows.
set -u
if [[ $# -lt 6 ]]; then
    echo "usage: scripts/device-lavapipe-seeds.sh BUNDLE KILN OP A B JOBS [SECONDS] [-- CHECK_ARGS...]" >&2
    exit 2
fi
bundle="$1" kiln="$2" op="$3" a="$4" b="$5" jobs="$6"
shift 6
deadline=0
if [[ $# -gt 0 && "$1" != "--" ]]; then deadline="$1"; shift; fi
[[ $# -gt 0 && "$1" == "--" ]] && shift
extra=("$@")
out="${OUT:-$(mktemp -d /tmp/lvpseeds.XXXXXX)}"
mkdir -p "$out"
kiln="$(cd "$(dirname "$kiln")" && pwd)/$(basename "$kiln")"
[[ -x "$kiln" ]] || { echo "no kiln binary at $kiln" >&2; exit 2; }
work="$(mktemp -d /tmp/lvpseeds-work.XXXXXX)" # one per call: two calls may run side by side
tar -xJf "$bundle" -C "$work" || { echo "cannot unpack $bundle" >&2; exit 2; }
# shellcheck source=/dev/null
source "$work/lavapipe/env.sh"
export LP_NUM_THREADS="${LP_NUM_THREADS:-1}" KILN_LIBCUDA=/nonexistent/libcuda.so.1 # no process touches the GPU
export KILN_CACHE_DIR="$work/cache"                          # the seeds share compiled kernels
export KILN_SOURCE_DIR="${KILN_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}" # contracts/
sum="$out/summary-$op.txt"
"$kiln" info >"$out/info.txt" 2>&1
vk="$(grep -m 1 '^  vulkan' "$out/info.txt")"
echo "kiln info: $vk" | tee "$sum"
echo "contracts: $KILN_SOURCE_DIR/contracts; lavapipe threads a seed: $LP_NUM_THREADS" | tee -a "$sum"
if ! grep -q 'available.*llvmpipe' <<<"$vk"; then
    echo "vulkan is not lavapipe here: nothing run" | tee -a "$sum"
    cat "$out/info.txt"
    exit 2
fi

t_start=$(date +%s)
one() { # one SEED: runs it (until the deadline), one summary line
    local s="$1" t0 rc lim=()
    t0=$(date +%s)
    [[ "$deadline" -gt 0 ]] && lim=(timeout --kill-after=5 $((deadline - (t0 - t_start))))
    "${lim[@]}" "$kiln" check --backend vulkan --op "$op" --seed "$s" --threads 1 --failures "${extra[@]}" >"$out/$op-$s.txt" 2>&1
    rc=$?
    if [[ "$deadline" -gt 0 && ($rc -eq 124 || $rc -eq 137) ]]; then
        echo "seed $s unfinished at the deadline ($(($(date +%s) - t0))s)" >>"$sum"
    else
        echo "seed $s rc $rc $(($(date +%s) - t0))s" >>"$sum"
    fi
}
running=0
for s in $(seq "$a" "$b"); do
    if [[ "$deadline" -gt 0 && $(($(date +%s) - t_start)) -ge $((deadline - 5)) ]]; then
        echo "deadline ${deadline}s: seeds $s..$b not started" >>"$sum"
        break
    fi
    one "$s" &
    running=$((running + 1))
    if [[ $running -ge $jobs ]]; then wait -n; running=$((running - 1)); fi
done
wait
{
    echo "--- $op, seeds $a..$b, $jobs at once, $(($(date +%s) - t_start)) s wall"
    echo "passed: $(grep -c ' rc 0 ' "$sum")  failed: $(grep -c -E ' rc [1-9]' "$sum")  unfinished: $(grep -c unfinished "$sum")"
    for f in $(grep -E ' rc [1-9]' "$sum" | awk '{ print $2 }'); do
        echo "== seed $f"
        tail -n 30 "$out/$op-$f.txt"
    done
} >>"$sum"
sed -n '/^---/,$p' "$sum"
