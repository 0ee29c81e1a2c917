#!/usr/bin/env bash
# Issue #20 on the GPU machine, one step per device call (each fits 9 minutes: every command runs
# under the time left of BUDGET_S, default 530 s): the cuda cases of the model tests, then whole-model
# figures of llama-7b-shaped GGUF files (32 layers, 4096 wide, 32 heads, ffn 11008, vocab 32000,
# random weights from gen_model) in q4_0, q8_0 and llama.cpp's Q4_K_M mix: `kiln generate` (a
# 512-token prompt of ids, 128 greedy tokens, --ignore-eos; again after a 1-token prompt) and `kiln bench --model` (prefill 512,
# decode at KV 512) on cuda or cpu, and llama.cpp's llama-bench / llama-cpp-python on the same file
# when either is installed. Never stops at a failure; builds nothing. Summary table last on STDOUT.
#
# usage: scripts/device-models.sh BIN_DIR STEP
#   STEP: tests             the cuda test cases (~2-4 min)
#         write FMT         write $KILN_MODEL_DIR/llama-7b-FMT.gguf (FMT q4_0 | q8_0 | q4_k_m; ~2 min)
#         FMT BACKEND       figures of FMT on cuda or cpu (writes the file first when it is missing)
#         llamacpp FMT      llama.cpp's pp512/tg128 on that file (cuda when it has it, else cpu)
#         table             the figures collected so far on this machine
# BIN_DIR (a Release build): kiln, gen_model; tests also test_paged, test_model_arch, test_ops.
# Model files: $KILN_MODEL_DIR (default /tmp/kiln-models, never $OUT: 3.8/7.2/4.1 GB), reused while
# the machine stays warm; figures accumulate in $KILN_MODEL_DIR/figures.tsv. Logs go to $OUT.
# MODEL_SHAPE=0.5b MODEL_LAYERS=2 make a small file for a dry run on a machine without a GPU.
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/device-lib.sh
. "$root/scripts/device-lib.sh"
usage() { sed -n '/^# usage/,/^# Model files/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 2 ]] || usage
dev_bin "$1" "scripts/device-models.sh BIN_DIR STEP" kiln gen_model
shift
dev_out models
mdir="${KILN_MODEL_DIR:-/tmp/kiln-models}"
mkdir -p "$mdir"
export KILN_SOURCE_DIR="$root"
export KILN_CACHE_DIR="${KILN_CACHE_DIR:-$mdir/cache}" # kernels shared by the calls, not sent back
kiln="$bin/kiln"
t_start=$(date +%s) budget="${BUDGET_S:-530}"

# bstep NAME LIMIT CMD...: device-lib's step under min(LIMIT, what is left of the budget); a step
# that would start with less than 15 s left is skipped and listed.
bstep() {
    local name="$1" limit="$2" left
    shift 2
    left=$(( budget - ($(date +%s) - t_start) ))
    if (( left < 15 )); then dev_skip "$name" "budget of ${budget}s spent"; return 0; fi
    (( limit > left )) && limit=$left
    step "$name" "$limit" "$@"
}

# json_num LOG KEY: the number after "KEY": in the last JSON line of LOG, or "-".
json_num() {
    local v
    v=$(grep '^{' "$1" 2>/dev/null | tail -n 1 | sed -n "s/.*\"$2\": *\([0-9.eE+-]*\).*/\1/p")
    [[ -n "$v" ]] && printf '%.1f' "$v" || echo "-"
}

# median_tok_s LOG TOKENS: TOKENS / median of step_ms of bench's JSON (the lower one of two; the first
# step pays the first touch of the weights), or "-".
median_tok_s() {
    grep '^{' "$1" 2>/dev/null | tail -n 1 | sed -n 's/.*"step_ms":\[\([^]]*\)\].*/\1/p' | tr ',' '\n' | sort -g |
        awk -v t="$2" '{ v[NR] = $1 } END { if (NR) printf "%.1f", t * 1000 / v[int((NR + 1) / 2)]; else print "-" }'
}

shape="${MODEL_SHAPE:-7b}" layers="${MODEL_LAYERS:-32}" # other values only for a dry run elsewhere
model_of() { echo "$mdir/llama-$shape-$layers-$1.gguf"; }

write_model() {
    local f="$1" m; m=$(model_of "$f")
    [[ -s "$m" ]] && { echo "reusing $m ($(du -h "$m" | cut -f1))"; return 0; }
    bstep "write_$f" 300 "$bin/gen_model" --arch llama --shape "$shape" --layers "$layers" --wtype "$f" "$m.part"
    [[ -s "$m.part" ]] && mv "$m.part" "$m"
    [[ -s "$m" ]]
}

# figures FMT BACKEND: generate, bench prefill, bench decode; one row into figures.tsv.
figures() {
    local f="$1" be="$2" m; m=$(model_of "$f")
    write_model "$f" || return 0
    local ids threads=$(nproc)
    ids=$(awk 'BEGIN { for (i = 0; i < 512; i++) printf "%s%d", i ? "," : "", 1 + (i * 7919) % 31999 }')
    "$kiln" info "$m" >"$out/info_$f.log" 2>&1
    local g="generate_${f}_$be" p="bench_prefill_${f}_$be" d="bench_decode_${f}_$be"
    bstep "$g" 240 "$kiln" generate "$m" --ids "$ids" -n 128 --ignore-eos --temp 0 --backend "$be" --threads "$threads" --json
    # the same 128 tokens after a 1-token prompt: generate's plan is then built for 1 token (max_tok = the
    # prompt), as bench's decode plan is; if this decodes at bench's rate, the plan's shape is why
    # generate decoded at a third of it (session 5: 103 vs 328 tok/s on cuda)
    bstep "${g}_1tok" 120 "$kiln" generate "$m" --ids 1 -n 128 --ignore-eos --temp 0 --backend "$be" --threads "$threads" --json
    local steps=5; [[ "$be" == cpu ]] && steps=2 # cpu: tens of seconds a 512-token prefill
    bstep "$p" 200 "$kiln" bench --model "$m" --mode prefill --tokens 512 --steps "$steps" --backend "$be" --threads "$threads" --json
    bstep "$d" 120 "$kiln" bench --model "$m" --mode decode --ctx 512 --steps 16 --backend "$be" --threads "$threads" --json
    printf 'kiln\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$f" "$be" "$(json_num "$out/$g.log" prefill_tok_s)" \
        "$(json_num "$out/$g.log" decode_tok_s)" "$(json_num "$out/${g}_1tok.log" decode_tok_s)" \
        "$(median_tok_s "$out/$p.log" 512)" "$(median_tok_s "$out/$d.log" 1)" \
        "$(json_num "$out/$d.log" weight_gb_per_s)" >>"$mdir/figures.tsv"
}

# llamacpp FMT: llama-bench (PATH or $LLAMA_BENCH) -p 512 -n 128, else llama-cpp-python timing the
# same prompt and 128 tokens; one row into figures.tsv. Says so when neither is installed.
llamacpp() {
    local f="$1" m; m=$(model_of "$f")
    write_model "$f" || return 0
    local lb="${LLAMA_BENCH:-$(command -v llama-bench)}" log="$out/llamacpp_$f.log"
    if [[ -n "$lb" && -x "$lb" ]]; then
        bstep "llama_bench_$f" 400 "$lb" -m "$m" -p 512 -n 128 -ngl 99 -o json
        local pp tg
        pp=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(" ".join("%.1f" % x["avg_ts"] for x in r))' \
            "$out/llama_bench_$f.log" 2>/dev/null)
        read -r pp tg <<<"${pp:-- -}"
        printf 'llama-bench\t%s\tgpu\t%s\t%s\t-\t-\t-\t-\n' "$f" "$pp" "$tg" >>"$mdir/figures.tsv"
    elif python3 -c 'import llama_cpp' 2>/dev/null; then
        bstep "llama_cpp_python_$f" 400 python3 - "$m" <<'PY'
import json, sys, time
import llama_cpp
m = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=1024, n_batch=512, n_gpu_layers=-1, logits_all=False, verbose=False)
ids = [1 + (i * 7919) % 31999 for i in range(512)]
t0 = time.perf_counter(); m.eval(ids); t1 = time.perf_counter()
for i in range(128):  # as llama-bench's tg: one token a step, the values do not matter to the time
    m.eval([1 + (i * 104729) % 31999])
t2 = time.perf_counter()
print(json.dumps({"prefill_tok_s": 512 / (t1 - t0), "decode_tok_s": 128 / (t2 - t1)}))
PY
        printf 'llama-cpp-python\t%s\tgpu\t%s\t%s\t-\t-\t-\t-\n' "$f" "$(json_num "$out/llama_cpp_python_$f.log" prefill_tok_s)" \
            "$(json_num "$out/llama_cpp_python_$f.log" decode_tok_s)" >>"$mdir/figures.tsv"
    else
        echo "llama.cpp: neither llama-bench nor llama-cpp-python on this machine" | tee "$log"
        dev_skip "llamacpp_$f" "not installed"
    fi
}

tests() {
    dev_info
    [[ -x "$bin/test_paged" ]] && bstep paged_softcap_window_cuda 120 "$bin/test_paged" --jobs 2 --filter 'paged/softcap_and_window_cuda'
    if [[ -x "$bin/test_model_arch" ]]; then
        bstep model_arch_gemma_phi3_cuda 150 "$bin/test_model_arch" --jobs 2 --filter 'model_arch/gemma_and_phi3_match_f64_on_cuda'
        bstep model_arch_qwen3_cuda 90 "$bin/test_model_arch" --jobs 2 --filter 'model_arch/qwen3*cuda*'
        bstep model_arch_longrope_cuda 90 "$bin/test_model_arch" --jobs 2 --filter 'model_arch/phi3_longrope*cuda*'
        bstep model_arch_formats_cuda 150 "$bin/test_model_arch" --jobs 2 --filter 'model_arch/every_weight_format_matches_f64_on_cuda'
        bstep model_arch_partial_rope_cuda 90 "$bin/test_model_arch" --jobs 2 --filter 'model_arch/partial_rotary*cuda*'
        bstep model_arch_yarn_cuda 90 "$bin/test_model_arch" --jobs 2 --filter 'model_arch/yarn_matches_f64_on_cuda'
    fi
    [[ -x "$bin/test_fuse" ]] && bstep fuse_rule7_embedding_cuda 90 env KILN_TEST_BACKEND=cuda "$bin/test_fuse" --jobs 2 --filter 'fuse/rule@(7*|1_embedding*)'
    # partial rotary on cuda: the rope row kernel and the q/k gemv/GEMM epilogues (rot 32 and 18 of 64)
    [[ -x "$bin/test_ops" ]] && bstep ops_rope_partial_cuda 90 env KILN_TEST_BACKEND=cuda "$bin/test_ops" --jobs 2 --filter 'ops/rope_partial*'
    check_masks attention:masks check_masks_cuda
    check_masks paged_attention:masks check_paged_masks_cuda
}

# check_masks OP NAME: kiln check's soft-cap/window cases of OP on cuda. `kiln check --op` takes
# attention:masks and paged_attention:masks since 3f0896b; a kiln built before that answers "unknown
# op" (session 5's device run did: a stale kiln in BIN_DIR), so that is named as such, not run.
check_masks() {
    if ! "$kiln" check --help 2>&1 | grep -q "$1"; then
        dev_skip "$2" "$bin/kiln predates 'kiln check --op $1' (main 3f0896b): rebuild the kiln target"
        return 0
    fi
    bstep "$2" 90 "$kiln" check --op "$1" --backend cuda --quick
}

case "$1" in
tests) tests ;;
write) [[ $# -eq 2 ]] || usage; write_model "$2" ;;
llamacpp) [[ $# -eq 2 ]] || usage; llamacpp "$2" ;;
table) ;;
q4_0 | q8_0 | q4_k_m | q4_k | q6_k | q5_0 | iq4_xs)
    [[ $# -eq 2 && ( "$2" == cuda || "$2" == cpu ) ]] || usage
    figures "$1" "$2" ;;
*) usage ;;
esac

{
    echo
    echo "== device-models $* ($(date -u +%H:%M) UTC, $(( $(date +%s) - t_start )) s; logs in $out)"
    # which kiln measured: session 5's figures came from a BIN_DIR whose kiln predated main's changes
    echo "   kiln: $(date -u -r "$kiln" '+built %Y-%m-%d %H:%M UTC') $(sha256sum "$kiln" | cut -c1-12)"
    dev_steps
    if [[ -s "$mdir/figures.tsv" ]]; then
        echo
        echo "llama-7b shape, 32 layers, tokens/s (generate: 512-token prompt then 128 tokens; tg 1-tok: 128 tokens"
        echo "after a 1-token prompt; bench --model: median step of prefill 512 / decode at KV 512); every row this"
        echo "machine has measured since it started"
        echo "| engine           | format | be   | gen pp512 | gen tg128 | tg 1-tok  | bench pp  | bench tg  | tg GB/s |"
        echo "|------------------|--------|------|-----------|-----------|-----------|-----------|-----------|---------|"
        awk -F'\t' 'NF == 9 { printf "| %-16s | %-6s | %-4s | %9s | %9s | %9s | %9s | %9s | %7s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }' \
            "$mdir/figures.tsv"
    fi
} | tee "$out/summary.txt"
