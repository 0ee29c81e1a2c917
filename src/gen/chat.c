/* Chat prompts (see chat.h): template family detection in llama.cpp's order of checks, so a
 * template it would file under another family (phi-3, zephyr, command-r, ...) is refused here
 * rather than written wrongly, and the prompt text of each family for one system and one user
 * message. Must not evaluate Jinja: the template is only inspected for markers. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "gen/chat.h"
#include "sched/ctx.h"
#include "util/sbuf.h"

static const char *const names[KILN_CHAT_KIND_COUNT] = {
    [KILN_CHAT_CHATML] = "chatml",
    [KILN_CHAT_LLAMA3] = "llama-3",
    [KILN_CHAT_GEMMA] = "gemma",
    [KILN_CHAT_MISTRAL_V1] = "mistral-v1",
    [KILN_CHAT_MISTRAL_V3] = "mistral-v3",
    [KILN_CHAT_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [KILN_CHAT_MISTRAL_V7] = "mistral-v7",
    [KILN_CHAT_LLAMA2] = "llama-2",
    [KILN_CHAT_LLAMA2_SYS] = "llama-2-sys",
    [KILN_CHAT_LLAMA2_SYS_STRIP] = "llama-2-sys-strip",
};

const char *kiln_chat_name(kiln_chat_kind k) { return k < KILN_CHAT_KIND_COUNT ? names[k] : "?"; }

/* Markers of families llama.cpp checks between the ones kiln writes: a template with them is one
 * of those, never ours. */
static const char *const other_before_gemma[][2] = {
    {"<|assistant|>", "<|end|>"}, {"[gMASK]<sop>", ""}, {"<|assistant|>", "<|user|>"}, {"<|begin_of_image|>", ""},
    {"<|user|>", "<|endoftext|>"}, {"bos_token + message['role']", ""},
};
static const char *const other_before_llama3[][2] = {
    {"'\\n\\nAssistant: ' + eos_token", ""}, {"GPT4 Correct ", ""}, {"USER: ", "ASSISTANT: "},
    {"### Instruction:", "<|EOT|>"}, {"<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"},
};

static bool has(const char *t, const char *m) { return !*m || strstr(t, m) != NULL; }

static kiln_status refuse(kiln_ctx *ctx, const char *what)
{
    return kiln_ctx_fail(ctx, KILN_ERR_UNSUPPORTED,
                         "chat template: the model's is %s; kiln writes prompts for llama-3, chatml (qwen), gemma "
                         "and mistral/llama-2 [INST] templates only",
                         what);
}

static kiln_chat_kind inst_kind(const char *t)
{
    if (has(t, "[SYSTEM_PROMPT]")) return KILN_CHAT_MISTRAL_V7;
    if (has(t, "' [INST] ' + system_message") || has(t, "[AVAILABLE_TOOLS]"))
        return has(t, " [INST]") ? KILN_CHAT_MISTRAL_V1 : has(t, "\"[INST]\"") ? KILN_CHAT_MISTRAL_V3_TEKKEN
                                                                              : KILN_CHAT_MISTRAL_V3;
    if (!has(t, "<<SYS>>")) return KILN_CHAT_LLAMA2;
    /* bos_token + '[INST]' only changes later turns; one turn is written like llama-2-sys */
    return has(t, "content.strip()") ? KILN_CHAT_LLAMA2_SYS_STRIP : KILN_CHAT_LLAMA2_SYS;
}

kiln_status kiln_chat_detect(kiln_ctx *ctx, const char *t, kiln_chat_kind *out)
{
    if (!t) return kiln_ctx_fail(ctx, KILN_ERR_UNSUPPORTED, "chat template: the model has none (no tokenizer.chat_template)");
    if (has(t, "<|im_start|>")) {
        if (has(t, "<|im_sep|>")) return refuse(ctx, "phi-4's");
        if (has(t, "<end_of_utterance>")) return refuse(ctx, "smolvlm's");
        return *out = KILN_CHAT_CHATML, KILN_OK;
    }
    if (strncmp(t, "mistral", 7) == 0 || has(t, "[INST]")) return *out = inst_kind(t), KILN_OK;
    for (size_t i = 0; i < sizeof other_before_gemma / sizeof *other_before_gemma; i++)
        if (has(t, other_before_gemma[i][0]) && has(t, other_before_gemma[i][1])) return refuse(ctx, "of another family");
    if (has(t, "<start_of_turn>")) return *out = KILN_CHAT_GEMMA, KILN_OK;
    for (size_t i = 0; i < sizeof other_before_llama3 / sizeof *other_before_llama3; i++)
        if (has(t, other_before_llama3[i][0]) && has(t, other_before_llama3[i][1])) return refuse(ctx, "of another family");
    if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>")) return *out = KILN_CHAT_LLAMA3, KILN_OK;
    return refuse(ctx, "not one kiln recognizes");
}

/* Appends s without leading and trailing white space (llama.cpp's trim). */
static void put_trim(kiln_sbuf *b, const char *s)
{
    size_t n = strlen(s), i = 0;
    while (i < n && isspace((unsigned char)s[i])) i++;
    while (n > i && isspace((unsigned char)s[n - 1])) n--;
    kiln_sbuf_printf(b, "%.*s", (int)(n - i), s + i);
}

static void put_inst(kiln_sbuf *b, kiln_chat_kind k, const char *sys, const char *user)
{
    if (k == KILN_CHAT_MISTRAL_V7) {
        if (sys) kiln_sbuf_printf(b, "[SYSTEM_PROMPT] %s[/SYSTEM_PROMPT]", sys);
        kiln_sbuf_printf(b, "[INST] %s[/INST]", user);
    } else if (k == KILN_CHAT_MISTRAL_V1 || k == KILN_CHAT_MISTRAL_V3 || k == KILN_CHAT_MISTRAL_V3_TEKKEN) {
        const char *lead = k == KILN_CHAT_MISTRAL_V1 ? " " : "", *trail = k == KILN_CHAT_MISTRAL_V3_TEKKEN ? "" : " ";
        kiln_sbuf_printf(b, "%s[INST]%s", lead, trail);
        if (sys) kiln_sbuf_printf(b, "%s\n\n", sys);
        kiln_sbuf_printf(b, "%s%s[/INST]", user, lead);
    } else { /* llama-2 */
        bool strip = k == KILN_CHAT_LLAMA2_SYS_STRIP;
        kiln_sbuf_printf(b, "[INST] ");
        if (sys) {
            kiln_sbuf_printf(b, "%s", k == KILN_CHAT_LLAMA2 ? "" : "<<SYS>>\n");
            if (strip) put_trim(b, sys);
            else kiln_sbuf_printf(b, "%s", sys);
            kiln_sbuf_printf(b, "%s", k == KILN_CHAT_LLAMA2 ? "\n" : "\n<</SYS>>\n\n");
        }
        if (strip) put_trim(b, user);
        else kiln_sbuf_printf(b, "%s", user);
        kiln_sbuf_printf(b, " [/INST]");
    }
}

kiln_status kiln_chat_format(kiln_ctx *ctx, kiln_chat_kind k, const char *sys, const char *user, char **out)
{
    *out = NULL;
    if (k >= KILN_CHAT_KIND_COUNT || !user) return kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "chat: bad arguments");
    if (sys && !*sys) sys = NULL; /* an empty system message is none */
    kiln_sbuf b = {0};
    switch (k) {
    case KILN_CHAT_CHATML:
        if (sys) kiln_sbuf_printf(&b, "<|im_start|>system\n%s<|im_end|>\n", sys);
        kiln_sbuf_printf(&b, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", user);
        break;
    case KILN_CHAT_LLAMA3:
        if (sys) kiln_sbuf_printf(&b, "<|start_header_id|>system<|end_header_id|>\n\n"), put_trim(&b, sys),
            kiln_sbuf_printf(&b, "<|eot_id|>");
        kiln_sbuf_printf(&b, "<|start_header_id|>user<|end_header_id|>\n\n");
        put_trim(&b, user);
        kiln_sbuf_printf(&b, "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case KILN_CHAT_GEMMA: /* no system role: it goes before the user's text */
        kiln_sbuf_printf(&b, "<start_of_turn>user\n");
        if (sys) put_trim(&b, sys), kiln_sbuf_printf(&b, "\n\n");
        put_trim(&b, user);
        kiln_sbuf_printf(&b, "<end_of_turn>\n<start_of_turn>model\n");
        break;
    default:
        put_inst(&b, k, sys, user);
        break;
    }
    if (b.oom || !b.s) {
        free(b.s);
        return kiln_ctx_fail(ctx, KILN_ERR_NOMEM, "chat prompt");
    }
    *out = b.s;
    return KILN_OK;
}
