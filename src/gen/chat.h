/* Chat prompts from a model's tokenizer.chat_template: the template is recognized by the markers
 * of its family (llama-3, chatml/qwen, gemma, mistral and llama-2 [INST]), as llama.cpp's
 * llm_chat_detect_template does, and the prompt is written the way that family writes one system
 * and one user message plus the assistant's opening. Must not guess: any other template is refused. */
#pragma once

#include "kiln/kiln.h"

typedef enum kiln_chat_kind {
    KILN_CHAT_CHATML,           /* <|im_start|>role ... <|im_end|> (qwen) */
    KILN_CHAT_LLAMA3,           /* <|start_header_id|>role<|end_header_id|> ... <|eot_id|> */
    KILN_CHAT_GEMMA,            /* <start_of_turn>user ... <end_of_turn> (system merged into user) */
    KILN_CHAT_MISTRAL_V1,       /* " [INST] ... [/INST]" */
    KILN_CHAT_MISTRAL_V3,       /* "[INST] ... [/INST]" */
    KILN_CHAT_MISTRAL_V3_TEKKEN, /* "[INST]...[/INST]" */
    KILN_CHAT_MISTRAL_V7,       /* [SYSTEM_PROMPT] ... [INST] ... [/INST] */
    KILN_CHAT_LLAMA2,           /* [INST] ... [/INST], system folded into the user text */
    KILN_CHAT_LLAMA2_SYS,       /* [INST] <<SYS>> ... <</SYS>> ... [/INST] */
    KILN_CHAT_LLAMA2_SYS_STRIP, /* the same, messages trimmed */
    KILN_CHAT_KIND_COUNT
} kiln_chat_kind;

/* The family of a template (tmpl may be NULL: no template in the file). KILN_ERR_UNSUPPORTED with
 * a message naming what was found when kiln does not write prompts for it. */
kiln_status kiln_chat_detect(kiln_ctx *ctx, const char *tmpl, kiln_chat_kind *out);
/* "chatml", "llama-3", ... */
const char *kiln_chat_name(kiln_chat_kind k);
/* The prompt (malloc'ed, NUL-terminated) for an optional system message and a user message,
 * ending where the assistant's reply starts. BOS is not written: the tokenizer adds it. */
kiln_status kiln_chat_format(kiln_ctx *ctx, kiln_chat_kind k, const char *system, const char *user, char **out);
