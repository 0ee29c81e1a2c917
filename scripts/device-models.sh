#!/usr/bin/env bash
# Whole-model figures for issue #20 on the GPU machine: llama-7b-shaped GGUF files (32 layers, 4096
# wide, 32 heads, ffn 11008, vocab 32000, random weights written by gen_model) in q4_0, q8_0 and
# llama.cpp's Q4_K_M mix (q4_k; attn_v/ffn_down q6_k on use_more_bits layers; output q6_k; token_embd
# f16 in all three), each run by `kiln generate` (a 512-token prompt of ids, then 128 greedy tokens,
# --ignore-eos) and `kiln bench --model` (512-token prefill; decode at KV 512) on cuda and cpu. First
# the cuda cases of issue #20's tests (test_paged softcap_and_window, test_model_arch gemma/phi3,
# partial rotary and every weight format, test_ops rope_partial, kiln check's attention masks). Never stops at a failure; every step runs under a limit. Summary table last.
#
# usage: scripts/device-models.sh [BIN_DIR] [FORMAT...]   (BIN_DIR default devbin; FORMAT q4_0 q8_0
#        q4_k_m, default all three; "tests" runs only the correctness steps)
# Needs from a Release build in BIN_DIR: kiln, gen_model, test_paged, test_model_arch, test_ops. The model
# files go to $KILN_MODEL_DIR (default /tmp/kiln-models: the device's disk, never $OUT; 3.8, 7.2 and
# 4.1 GB; a file already there is reused). Logs and summary.txt go to $OUT (else a temp dir). About
# 2 minutes a format to write it, 1-2 on cuda, 2-4 on cpu: run one format per call when calls are
# limited to 10 minutes.
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/device-lib.sh
. "$root/scripts/device-lib.sh"
dev_bin "${1:-$root/devbin}" "scripts/device-models.sh BIN_DIR [FORMAT...]" kiln gen_model
shift || true
formats=("$@")
[[ ${#formats[@]} -eq 0 ]] && formats=(q4_0 q8_0 q4_k_m)
dev_out models
mdir="${KILN_MODEL_DIR:-/tmp/kiln-models}"
mkdir -p "$mdir"
export KILN_SOURCE_DIR="$root"
export KILN_CACHE_DIR="${KILN_CACHE_DIR:-/tmp/kiln-models-cache}" # kernels shared by the steps, not sent back
kiln="$bin/kiln"
rows=()

# json_num LOG KEY: the number after "KEY": in the last JSON line of LOG, or "-".
json_num() {
    local v
    v=$(grep '^{' "$1" 2>/dev/null | tail -n 1 | sed -n "s/.*\"$2\": *\([0-9.eE+-]*\).*/\1/p")
    [[ -n "$v" ]] && printf '%.1f' "$v" || echo "-"
}

"$kiln" info >"$out/info.log" 2>&1
grep -i -m3 "cuda\|cpu" "$out/info.log"

# the cuda cases of issue #20's tests
[[ -x "$bin/test_paged" ]] && step paged_softcap_window_cuda 300 "$bin/test_paged" --jobs 2 --filter 'paged/softcap_and_window_cuda'
if [[ -x "$bin/test_model_arch" ]]; then
    step model_arch_gemma_phi3_cuda 300 "$bin/test_model_arch" --jobs 2 --filter 'model_arch/gemma_and_phi3_match_f64_on_cuda'
    step model_arch_formats_cuda 300 "$bin/test_model_arch" --jobs 2 --filter 'model_arch/every_weight_format_matches_f64_on_cuda'
    step model_arch_partial_rope_cuda 300 "$bin/test_model_arch" --jobs 2 --filter 'model_arch/partial_rotary*cuda*'
fi

# partial rotary on cuda: the rope row kernel and the q/k gemv/GEMM epilogues (rot 32 and 18 of 64)
[[ -x "$bin/test_ops" ]] && step ops_rope_partial_cuda 300 env KILN_TEST_BACKEND=cuda "$bin/test_ops" --jobs 2 --filter 'ops/rope_partial*'
# kiln check's attention masks (softcap, window, both; paged too) on cuda
step check_masks_cuda 300 "$kiln" check --op attention:masks --backend cuda --quick
step check_paged_masks_cuda 300 "$kiln" check --op paged_attention:masks --backend cuda --quick

# a 512-token prompt of ids (the random model's vocabulary has no text)
ids=$(awk 'BEGIN { for (i = 0; i < 512; i++) printf "%s%d", i ? "," : "", 1 + (i * 7919) % 31999 }')
threads=$(nproc)
for f in "${formats[@]}"; do
    [[ "$f" == tests ]] && continue
    model="$mdir/llama-7b-$f.gguf"
    if [[ ! -s "$model" ]]; then
        step "write_$f" 600 "$bin/gen_model" --arch llama --shape 7b --layers 32 --wtype "$f" "$model.part"
        [[ -s "$model.part" ]] && mv "$model.part" "$model"
    fi
    [[ -s "$model" ]] || continue
    "$kiln" info "$model" >"$out/info_$f.log" 2>&1
    for be in cuda cpu; do
        step "generate_${f}_$be" 600 "$kiln" generate "$model" --ids "$ids" -n 128 --ignore-eos --temp 0 --backend "$be" \
            --threads "$threads" --json
        step "bench_prefill_${f}_$be" 600 "$kiln" bench --model "$model" --mode prefill --tokens 512 --steps 3 \
            --backend "$be" --threads "$threads" --json
        step "bench_decode_${f}_$be" 600 "$kiln" bench --model "$model" --mode decode --ctx 512 --steps 16 \
            --backend "$be" --threads "$threads" --json
        rows+=("$(printf '| %-7s | %-4s | %9s | %9s | %9s | %9s | %7s |' "$f" "$be" \
            "$(json_num "$out/generate_${f}_$be.log" prefill_tok_s)" "$(json_num "$out/generate_${f}_$be.log" decode_tok_s)" \
            "$(json_num "$out/bench_prefill_${f}_$be.log" tok_s)" "$(json_num "$out/bench_decode_${f}_$be.log" tok_s)" \
            "$(json_num "$out/bench_decode_${f}_$be.log" weight_gb_per_s)")")
    done
done

{
    echo
    echo "== device-models summary ($(date -u +%H:%M) UTC; logs in $out)"
    dev_steps
    if [[ ${#rows[@]} -gt 0 ]]; then
        echo
        echo "llama-7b shape, 32 layers, tokens/s (generate: 512-token prompt, 128 generated; bench --model: prefill 512, decode at KV 512)"
        echo "| format  | be   | gen pp512 | gen tg128 | bench pp  | bench tg  | tg GB/s |"
        echo "|---------|------|-----------|-----------|-----------|-----------|---------|"
        printf '%s\n' "${rows[@]}"
    fi
} | tee -a "$summary"
