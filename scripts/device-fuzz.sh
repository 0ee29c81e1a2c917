#!/usr/bin/env bash
# Long fuzz runs on the GPU machine's 16 idle cores (issue #17: an hour per target; this machine is
# starved): fuzz_build, fuzz_gguf and fuzz_cache (libFuzzer, ASan + UBSan, built here by
# scripts/fuzz-bundle.sh) run in parallel in -fork mode over the given cores for the given seconds,
# each from its seed corpus plus what earlier runs found. Builds nothing and uses no GPU.
# Never stops at a finding: crashes, leaks, timeouts and out-of-memory inputs are kept as files.
#
# usage: scripts/device-fuzz.sh BUNDLE [SECONDS] [CORES]
#   BUNDLE   the bundle's .tar.xz (devrun/fuzzbundle.tar.xz) or its unpacked folder: bin/fuzz_*,
#            lib/ (the shared libraries they need), corpus/<target>/ (seeds)
#   SECONDS  fuzzing time per target (default 480); CORES: fuzzing processes in all (default nproc - 1)
# With $OUT set, summary.txt, logs.tar.xz (each target's log and every finding) and corpora.tar.xz
# (the corpora as they grew) go there (else a temp dir). The summary table comes last.
set -u
bundle="${1:-}"
secs="${2:-480}"
cores="${3:-$(($(nproc) - 1))}"
if [[ -z "$bundle" || ! -e "$bundle" || ! "$secs" =~ ^[0-9]+$ || ! "$cores" =~ ^[0-9]+$ || "$cores" -lt 3 ]]; then
    echo "usage: scripts/device-fuzz.sh BUNDLE(.tar.xz or folder) [SECONDS] [CORES >= 3]" >&2
    exit 2
fi
# (stands alone, without scripts/device-lib.sh: it travels inside the bundle and as devrun/'s copy)
out="${OUT:-$(mktemp -d /tmp/device-fuzz.XXXXXX)}"
mkdir -p "$out"
work="$(mktemp -d /tmp/fuzzwork.XXXXXX)"
if [[ -d "$bundle" ]]; then
    b="$(cd "$bundle" && pwd)"
else
    tar -xJf "$bundle" -C "$work" || { echo "cannot unpack $bundle" >&2; exit 2; }
    b="$work/fuzzbundle"
fi
export LD_LIBRARY_PATH="$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# A leak fails like a crash; UBSan reports stop the input (the build also has -fno-sanitize-recover).
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export KILN_CACHE=off # the targets' own caches only (fuzz_cache makes its own folders)
# ref and cpu only, as where the targets were written: no process probes the GPU (CUDA under ASan,
# the NVIDIA Vulkan driver's own allocations in LeakSanitizer's report)
export KILN_LIBCUDA=/nonexistent/libcuda.so.1 VK_DRIVER_FILES=/nonexistent/icd.json VK_ICD_FILENAMES=/nonexistent/icd.json

targets=(build gguf cache)
# fuzz_build runs the slowest inputs (graphs compiled twice and run eight times): half the cores
jobs_build=$((cores / 2))
jobs_gguf=$(((cores - jobs_build + 1) / 2))
jobs_cache=$((cores - jobs_build - jobs_gguf))
declare -A jobs=([build]=$jobs_build [gguf]=$jobs_gguf [cache]=$jobs_cache)

for t in "${targets[@]}"; do
    if ! "$b/bin/fuzz_$t" -runs=1 >"$work/probe-$t.log" 2>&1; then # one empty input: it loads and starts
        echo "fuzz_$t does not start:" >&2
        tail -n 20 "$work/probe-$t.log" >&2
    fi
done

t0=$(date +%s)
for t in "${targets[@]}"; do
    mkdir -p "$work/corpus-$t" "$work/found-$t"
    # -fork: one process per job, restarted after a finding; -ignore_*: keep going and keep the file
    timeout --kill-after=30 $((secs + 60)) "$b/bin/fuzz_$t" -fork="${jobs[$t]}" -ignore_crashes=1 -ignore_timeouts=1 \
        -ignore_ooms=1 -max_total_time="$secs" -timeout=10 -rss_limit_mb=2560 -malloc_limit_mb=1024 \
        -print_final_stats=1 -artifact_prefix="$work/found-$t/" "$work/corpus-$t" "$b/corpus/$t" \
        >"$work/fuzz_$t.log" 2>&1 &
done
wait
t1=$(date +%s)

# stat NAME TARGET: the last fork-mode status line's field ("#N: cov: C ft: F corp: P exec/s: E
# oom/timeout/crash: O/T/X time: S job: J")
last() { grep -E '^#[0-9]+: cov:' "$work/fuzz_$1.log" | tail -n 1; }
count() { find "$work/found-$1" -maxdepth 1 -name "$2-*" | wc -l; }
{
    echo "fuzzing $secs s per target on $cores cores (build ${jobs[build]}, gguf ${jobs[gguf]}, cache ${jobs[cache]}), $((t1 - t0)) s wall"
    printf '%-12s %12s %8s %8s %8s %8s %9s %6s %8s %6s\n' target executions edges features corpus crashes timeouts leaks ooms slow
    for t in "${targets[@]}"; do
        l="$(last "$t")"
        ex="$(sed -n 's/^#\([0-9]*\):.*/\1/p' <<<"$l")"
        cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$l")"
        ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$l")"
        corp="$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$l")"
        # a leak is written as leak-*, a crash as crash-*; a crash whose report is LeakSanitizer's counts as a leak
        printf '%-12s %12s %8s %8s %8s %8s %9s %6s %8s %6s\n' "fuzz_$t" "${ex:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" \
            "$(count "$t" crash)" "$(count "$t" timeout)" "$(count "$t" leak)" "$(count "$t" oom)" "$(count "$t" slow-unit)"
    done
    echo
    for t in "${targets[@]}"; do
        n=$(find "$work/found-$t" -maxdepth 1 -type f | wc -l)
        [[ $n -eq 0 ]] && continue
        echo "fuzz_$t findings ($n):"
        find "$work/found-$t" -maxdepth 1 -type f -printf '  %f (%s bytes)\n' | head -n 20
        grep -E -m 6 "^(==[0-9]+==ERROR|SUMMARY|.*runtime error|fuzz check failed)" "$work/fuzz_$t.log" | sed 's/^/  | /'
    done
} >"$work/summary.txt"

cp "$work/summary.txt" "$out/summary.txt"
(cd "$work" && tar -cJf "$out/logs.tar.xz" fuzz_*.log probe-*.log found-*)
(cd "$work" && tar -cJf "$out/corpora.tar.xz" corpus-*)
ls -l "$out"
cat "$work/summary.txt"
rm -rf "$work"
