#!/usr/bin/env bash
# `kiln generate` decode against `kiln bench --model` decode on the GPU machine (issue #22, item 1):
# a llama-7b-shaped Q4_K_M GGUF (32 layers, random weights by gen_model, as scripts/device-models.sh
# writes it), generate with a 512-token and a 16-token prompt of ids (128 greedy tokens, --ignore-eos,
# --profile: host ms a step in kiln_run / sampling / text, recordings made and replayed, the kernels'
# device time a step by kind), interleaved A B A B with the old decode kernels of a prefill-sized
# plan (old: KILN_DECODE_KERNELS=0), and bench --model decode at KV 512 and 576 (generate's KV runs
# 512..640) with its per-kernel profile. Builds nothing; never stops at a failure; summary table last.
#
# usage: scripts/device-generate.sh [BIN_DIR] [FORMAT [ncu]]   (BIN_DIR default devbin: kiln and gen_model
#        from a Release build; FORMAT q4_k_m (default), q8_0 or q4_0; ncu: only the ncu listing below). The model goes to $KILN_MODEL_DIR
#        (default /tmp/kiln-models, never $OUT; reused when there: about 2 minutes to write). Logs and
#        summary.txt to $OUT (else a temp dir). ROUNDS (default 2) of the A B pairs. A dry run without a
#        GPU: MODEL_SHAPE=tiny MODEL_LAYERS=2 MODEL_VOCAB=64 LONG=64 GEN=16 BENCH_STEPS=16 KILN_LIBCUDA=<fakecuda .so>.
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/device-lib.sh
. "$root/scripts/device-lib.sh"
dev_bin "${1:-$root/devbin}" "scripts/device-generate.sh [BIN_DIR] [FORMAT]" kiln gen_model
fmt="${2:-q4_k_m}"
dev_out generate
mdir="${KILN_MODEL_DIR:-/tmp/kiln-models}"
mkdir -p "$mdir"
export KILN_CACHE_DIR="${KILN_CACHE_DIR:-/tmp/kiln-generate-cache}" # kernels shared by the steps (keys hold the options)
kiln="$bin/kiln"
rounds="${ROUNDS:-2}"
dev_info

shape="${MODEL_SHAPE:-7b}" layers="${MODEL_LAYERS:-32}" vocab="${MODEL_VOCAB:-32000}" long="${LONG:-512}" gen="${GEN:-128}"
model="$mdir/llama-$shape-$layers-$fmt.gguf"
[[ "$shape/$layers" == 7b/32 ]] && model="$mdir/llama-7b-$fmt.gguf" # device-models.sh's file
if [[ ! -s "$model" ]]; then
    step "write_$fmt" 400 "$bin/gen_model" --arch llama --shape "$shape" --layers "$layers" --wtype "$fmt" "$model.part"
    [[ -s "$model.part" ]] && mv "$model.part" "$model"
fi
[[ -s "$model" ]] || { echo "no model file: nothing to time" | tee -a "$summary"; exit 0; }

ids_of() { awk -v n="$1" -v v="$vocab" 'BEGIN { for (i = 0; i < n; i++) printf "%s%d", i ? "," : "", 1 + (i * 7919) % (v - 1) }'; }
idsL=$(ids_of "$long")
ids16=$(ids_of 16)
declare -A env_of=([new]="" [old]="KILN_DECODE_KERNELS=0")

# MODE ncu (third argument): which kernels a decode step of generate's prompt-sized plan runs and
# their durations, against bench --model's decode plan: ncu on the attention kernels (by name, grid,
# duration) of the first decode steps, kernels launched one by one (KILN_NO_RECORD=1), then exit.
if [[ "${3:-}" == ncu ]]; then
    ncu="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
    [[ -x "$ncu" ]] || { echo "ncu absent" | tee -a "$summary"; exit 0; }
    sec=(--section SpeedOfLight --section LaunchStats)
    # the prefill launches one flash kernel a layer (32 attn launches); then each decode step 2 a layer
    step ncu_gen_attn 300 env KILN_NO_RECORD=1 "$ncu" --kernel-name regex:attn --launch-skip 32 --launch-count 8 "${sec[@]}" \
        "$kiln" generate "$model" --ids "$idsL" -n 3 --ignore-eos --temp 0 --backend cuda
    step ncu_gen_attn_old 300 env KILN_NO_RECORD=1 KILN_DECODE_KERNELS=0 "$ncu" --kernel-name regex:attn --launch-skip 32 \
        --launch-count 8 "${sec[@]}" "$kiln" generate "$model" --ids "$idsL" -n 3 --ignore-eos --temp 0 --backend cuda
    step ncu_bench_attn 300 env KILN_NO_RECORD=1 "$ncu" --kernel-name regex:attn --launch-skip 64 --launch-count 8 "${sec[@]}" \
        "$kiln" bench --model "$model" --mode decode --ctx $((long + gen / 2)) --steps 1 --backend cuda
    # every kernel of one decode step of generate (names and durations only)
    step ncu_gen_step 300 env KILN_NO_RECORD=1 "$ncu" --launch-skip 400 --launch-count 170 --section SpeedOfLight \
        "$kiln" generate "$model" --ids "$idsL" -n 3 --ignore-eos --temp 0 --backend cuda
    {
        echo
        echo "== ncu: attention kernels of the first decode steps (name (grid)x(block), duration)"
        for f in "$out"/ncu_*attn*.log; do
            echo "-- $(basename "$f" .log)"
            grep -E "^  kiln_[a-z_]+ |^ +Duration" "$f" | sed 's/, Context.*//; s/  */ /g' | paste - - | head -n 12
        done
        echo "-- ncu_gen_step: kernels by name (count, total us)"
        awk '/^  kiln_[a-z_]+ / { k = $1 } /^ +Duration/ { v = $NF; if ($(NF-1) == "msecond") v *= 1000; if ($(NF-1) == "nsecond") v /= 1000;
             d[k] += v; n[k]++ } END { for (k in d) printf "  %-22s %4d %10.1f\n", k, n[k], d[k] }' "$out/ncu_gen_step.log" 2>/dev/null
    } | tee -a "$summary"
    exit 0
fi

# warm the kernel cache (compiles are not what is timed; each prompt length is its own plan)
for v in new old; do
    # shellcheck disable=SC2086
    step "warm_$v" 240 env ${env_of[$v]} "$kiln" generate "$model" --ids "$idsL" -n 2 --ignore-eos --temp 0 --backend cuda --json
done
for ((r = 1; r <= rounds; r++)); do
    for p in long 16; do
        ids=$idsL
        [[ $p == 16 ]] && ids=$ids16
        for v in new old; do
            # shellcheck disable=SC2086
            step "r${r}_gen${p}_$v" 240 env ${env_of[$v]} "$kiln" generate "$model" --ids "$ids" -n "$gen" --ignore-eos --temp 0 \
                --backend cuda --profile --json
        done
    done
    for c in start mid; do
        kv=$long
        [[ $c == mid ]] && kv=$((long + gen / 2))
        step "r${r}_bench_$c" 240 "$kiln" bench --model "$model" --mode decode --ctx "$kv" --steps "${BENCH_STEPS:-64}" --backend cuda --json
    done
done
step bench_mid_profile 240 "$kiln" bench --model "$model" --mode decode --ctx $((long + gen / 2)) --steps 8 --backend cuda --profile
# the text report of one profiled generate (the breakdown for people)
step genlong_new_profile_text 240 "$kiln" generate "$model" --ids "$idsL" -n "$gen" --ignore-eos --temp 0 --backend cuda --profile

{
    echo
    echo "== device-generate summary ($(date -u +%H:%M) UTC, $fmt; logs in $out)"
    dev_steps
    echo
    echo "== where a generate decode step goes (--profile, round 1; kernels: the last step again kernel by kernel):"
    OUT_DIR="$out" ROUNDS_N="$rounds" LONG_N="$long" GEN_N="$gen" python3 - <<'PY'
import json, os
out, rounds, long, gen = os.environ["OUT_DIR"], int(os.environ["ROUNDS_N"]), int(os.environ["LONG_N"]), int(os.environ["GEN_N"])
def last_json(name):
    try: lines = [l for l in open(f"{out}/{name}.log") if l.startswith("{")]
    except OSError: return None
    try: return json.loads(lines[-1]) if lines else None
    except ValueError: return None
for p in ("long", "16"):
    for v in ("new", "old"):
        j = last_json(f"r1_gen{p}_{v}")
        if not j or "profile" not in j: print(f"  gen{p} {v}: -"); continue
        pf = j["profile"]
        print(f"  gen{p} {v}: step {pf['step_ms']:.3f} ms = kiln_run {pf['run_ms']:.3f} (bind {pf['bind_ms']:.3f}, submit {pf['submit_ms']:.3f}, "
              f"wait {pf['wait_ms']:.3f}) + sample {pf['sample_ms']:.3f} + text {pf['emit_ms']:.3f} + rest {pf['other_ms']:.3f}; "
              f"recordings {pf['recordings']} (prefill {pf['prefill_recordings']}), replays {pf['replays']}, launched {pf['launches']}; "
              f"kernels {pf['kernels_ms']:.3f} ms")
        for k in pf["kinds"]: print(f"      {k['ms']:8.3f} ms {k['regions']:3d} x {k['what']}")
print()
print("== decode tok/s, round 1 / round 2 (A B A B; new = this build, old = KILN_DECODE_KERNELS=0)")
def tok(name, key):
    j = last_json(name)
    return j.get(key) if j else None
def cell(vals): return "/".join("-" if x is None else f"{x:.1f}" for x in vals)
rows = []
for p, n in (("long", long), ("16", 16)):
    for v in ("new", "old"):
        rows.append((f"generate, {n}-token prompt, {gen} tokens, {v}", [tok(f"r{r}_gen{p}_{v}", "decode_tok_s") for r in range(1, rounds + 1)]))
for c, n in (("start", long), ("mid", long + gen // 2)):
    rows.append((f"bench --model decode, KV {n}", [tok(f"r{r}_bench_{c}", "tok_s") for r in range(1, rounds + 1)]))
for name, vals in rows: print(f"| {name:<44} | {cell(vals):>15} |")
b = [x for r in range(1, rounds + 1) for x in [tok(f"r{r}_bench_mid", "tok_s")] if x]
for p in ("long", "16"):
    g = [x for r in range(1, rounds + 1) for x in [tok(f"r{r}_gen{p}_new", "decode_tok_s")] if x]
    if b and g:
        print(f"generate ({p} prompt, new) / bench (KV {long + gen // 2}): {sum(g) / len(g) / (sum(b) / len(b)):.3f} (target >= 0.90)")
PY
} | tee -a "$summary"
