#!/usr/bin/env bash
# Runs the CPU backend's benchmark targets (issue #3) and prints one markdown table: decode for
# llama-7b and qwen2-0.5b with f16/q8_0/q4_k weights, decode attention over a cold 1024-long
# cache, prefill of 128 tokens. Every fraction is against the roof the benchmark measured in the
# same run (bandwidth or FMA peak). Run it on a quiet machine: anything else running moves both
# the numbers and the roof.
# Usage: bench/cpu-targets.sh [BUILD_DIR] [extra kiln bench args, e.g. --threads 2]
set -euo pipefail
build="${1:-build}"
shift || true
kiln="$build/kiln"
[ -x "$kiln" ] || { echo "cpu-targets: $kiln not found (build first: scripts/build)" >&2; exit 2; }

field() { # field NAME JSON -> the number after "NAME":
    sed -n "s/.*\"$1\":\([-0-9.e+]*\).*/\1/p" <<<"$2"
}
pct() { awk -v f="$1" 'BEGIN { printf "%.0f%%", 100 * f }'; }
ok() { awk -v f="$1" -v t="$2" 'BEGIN { print (f >= t ? "yes" : "no") }'; }

echo "| case | weights | ms / layer-step | GB/s or GFLOP/s | of measured roof | target | met |"
echo "|---|---|---|---|---|---|---|"
for preset in llama-7b qwen2-0.5b; do
    target=0.90
    [ "$preset" = qwen2-0.5b ] && target=0.85
    for w in f16 q8_0 q4_k; do
        j=$("$kiln" bench --preset "$preset" --wtype "$w" --json "$@")
        f=$(field fraction_of_bw "$j")
        printf '| %s decode | %s | %.3f | %.1f GB/s | %s | %s | %s |\n' "$preset" "$w" \
            "$(field ms_per_layer_step "$j")" "$(field gb_per_s "$j")" "$(pct "$f")" \
            "$(pct $target)" "$(ok "$f" $target)"
    done
done

if [ -x "$build/bench_cpu" ]; then
    a=$(BENCH_ONLY=attn "$build/bench_cpu" | tr -d '\n ')
    for c in f16 f32; do
        r=$(grep -o "{\"kind\":\"attention_decode\",\"cache\":\"$c\"[^}]*}" <<<"$a")
        f=$(sed -n 's/.*"frac_bw_local":\([0-9.]*\).*/\1/p' <<<"$r")
        ms=$(sed -n 's/.*"ms":\([0-9.]*\).*/\1/p' <<<"$r")
        gb=$(sed -n 's/.*"gb_s":\([0-9.]*\).*/\1/p' <<<"$r")
        printf '| decode attention, cold 1024 cache, llama-7b heads | %s cache | %s (whole call) | %s GB/s | %s | 80%% | %s |\n' \
            "$c" "$ms" "$gb" "$(pct "$f")" "$(ok "$f" 0.80)"
    done
fi

f32=""
for w in f32 q8_0 q4_k; do
    j=$("$kiln" bench --preset qwen2-0.5b --mode prefill --tokens 128 --wtype "$w" --json "$@")
    gf=$(field gflop_per_s "$j")
    f=$(field fraction_of_peak "$j")
    if [ "$w" = f32 ]; then
        f32=$gf
        tgt="75% of peak"
        met=$(ok "$f" 0.75)
    else
        tgt="faster than f32 ($f32)"
        met=$(awk -v a="$gf" -v b="$f32" 'BEGIN { print (a > b ? "yes" : "no") }')
    fi
    printf '| qwen2-0.5b prefill, 128 tokens | %s | %.3f | %.1f GFLOP/s | %s of peak | %s | %s |\n' "$w" \
        "$(field ms_per_layer_step "$j")" "$gf" "$(pct "$f")" "$tgt" "$met"
done
