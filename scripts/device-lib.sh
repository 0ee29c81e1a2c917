# shellcheck shell=bash
# The harness the GPU-machine scripts (scripts/device-*.sh) share; sourced, never run: the output
# folder and summary file, the binary folder's check, `step` (one command under a time limit, its
# output in a log, one status line) and the closing list of every step's result.
# Nothing here may stop a run at a failing step: a device call is scarce, so every script goes on to
# its end and always prints its summary. Only a missing binary folder or binary exits (status 2).

# dev_out NAME: out = $OUT, else a new /tmp/device-NAME.XXXXXX; summary = $out/summary.txt, emptied.
dev_out() {
    out="${OUT:-$(mktemp -d "/tmp/device-$1.XXXXXX")}"
    mkdir -p "$out"
    summary="$out/summary.txt"
    : >"$summary"
    dev_names=() dev_results=()
}

# dev_bin DIR USAGE PROG...: bin = DIR as an absolute path; exits 2 with USAGE when DIR or one of
# the PROGs in it is missing.
dev_bin() {
    local dir="$1" usage="$2" p
    shift 2
    bin="$(cd "$dir" 2>/dev/null && pwd)" || { echo "usage: $usage (no folder '$dir')" >&2; exit 2; }
    for p in "$@"; do
        [[ -x "$bin/$p" ]] || { echo "usage: $usage ($bin/$p missing)" >&2; exit 2; }
    done
}

# dev_info: kiln info to $out/info.log; its first two cuda lines to the summary.
dev_info() {
    "$bin/kiln" info >"$out/info.log" 2>&1
    grep -i -m 2 "cuda" "$out/info.log" | tee -a "$summary"
}

# step NAME LIMIT CMD...: runs CMD under `timeout LIMIT`, its output in $out/NAME.log; one status
# line to stdout and the summary, the log's tail on failure. A run that exits 0 but ran no test (a
# Criterion filter that matched nothing) fails: a green line must mean something was checked.
# Returns 0 always; the result is kept for dev_steps.
step() {
    local name="$1" limit="$2" log="$out/$1.log" t0 t1 rc why="" ran=""
    shift 2
    t0=$(date +%s.%N)
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then why="timed out after ${limit}s"
    elif [[ $rc -ne 0 ]]; then why="rc=$rc"
    elif grep -q 'Synthesis: Tested: 0 ' "$log"; then why="no test ran"
    else ran=$(sed -n 's/.*Synthesis: Tested: \([0-9]*\) .*/, \1 tests/p' "$log" | tail -n 1)
    fi
    local secs line
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    line=$(printf '[%s] %-36s %6ss%s' "$([[ -z $why ]] && echo " ok " || echo FAIL)" "$name" "$secs" "${why:+  $why}$ran")
    echo "$line" | tee -a "$summary"
    [[ -n $why ]] && tail -n 12 "$log" | sed 's/^/       | /'
    dev_names+=("$name")
    dev_results+=("$([[ -z $why ]] && echo "ok (${secs}s$ran)" || echo "FAIL: $why")")
    return 0
}

# dev_skip NAME WHY: a step that could not run, listed by dev_steps.
dev_skip() {
    echo "[skip] $1: $2" | tee -a "$summary"
    dev_names+=("$1") dev_results+=("skip: $2")
}

# dev_steps: every step's result, one line each (the summary's first part).
dev_steps() {
    local i
    for i in "${!dev_names[@]}"; do printf '  %-36s %s\n' "${dev_names[$i]}" "${dev_results[$i]}"; done
}
