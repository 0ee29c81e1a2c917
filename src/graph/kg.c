/* .kg format, shared part: the op table (operands and parameters of every op), bare-name rule,
 * exact float text, weight byte sizes, and kiln_kg_load (reads a file, then kiln_kg_parse).
 * The parser is kg_parse.c, the printer kg_print.c. Must not hold process-wide state. */
#include "graph/kg.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

#define P(x) KILN_KG_P_##x

static const kiln_kg_op_spec op_specs[KILN_OP_COUNT] = {
#define KILN_OP_SPEC(id, name, cls, flops, nreq, nopt, params, req, usage) [KILN_OP_##id] = {nreq, nopt, params, req, usage},
    KILN_OPS(KILN_OP_SPEC)
#undef KILN_OP_SPEC
};

const kiln_kg_op_spec *kiln_kg_op_spec_of(enum kiln_op op)
{
    if ((unsigned)op >= KILN_OP_COUNT || op_specs[op].n_req == 0) return NULL;
    return &op_specs[op];
}

const char *kiln_kg_param_key(unsigned bit)
{
    switch (bit) {
    case P(S): return "s";
    case P(EPS): return "eps";
    case P(MODE): return "mode";
    case P(THETA): return "theta";
    case P(NKV): return "n_kv";
    case P(SCALE): return "scale";
    case P(AXIS): return "axis";
    case P(D0): return "d0";
    case P(D1): return "d1";
    case P(DTYPE): return "dtype";
    case P(OFFSET): return "offset";
    case P(MULT): return "mult";
    case P(BLOCK): return "block";
    case P(SOFTCAP): return "softcap";
    case P(WINDOW): return "window";
    case P(ROT): return "rot";
    case P(K): return "k";
    case P(NORM): return "norm";
    case P(COL): return "col";
    case P(SUM): return "sum";
    default: return NULL;
    }
}

static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '.'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool kiln_kg_is_bare_name(const char *s)
{
    if (!s || !is_alpha(s[0]) || strcmp(s, "_") == 0) return false;
    for (const char *p = s + 1; *p; p++)
        if (!is_alpha(*p) && !is_digit(*p) && *p != '-') return false;
    return true;
}

const char *kiln_kg_fmt_float(float v, char buf[32])
{
    if (isnan(v)) return strcpy(buf, signbit(v) ? "-nan" : "nan"); /* payloads are not kept */
    if (isinf(v)) return strcpy(buf, v < 0 ? "-inf" : "inf");
    if (fabsf(v) < 1e7f && v == (float)(int32_t)v) { /* small integers plainly: 10000, not 1e+04 */
        snprintf(buf, 32, "%s%d", signbit(v) && v == 0 ? "-" : "", (int)v);
        return buf;
    }
    for (int prec = 1; prec <= 9; prec++) { /* 9 significant digits always round-trip a float */
        snprintf(buf, 32, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v) break;
    }
    char *e = strchr(buf, 'e'); /* exponent without '+' or leading zeros: 1e-5, 3e20 */
    if (e) {
        char *d = e + 1, *r = e + 1;
        if (*r == '+') r++;
        else if (*r == '-') *d++ = *r++;
        while (*r == '0' && r[1]) r++;
        memmove(d, r, strlen(r) + 1);
    }
    return buf;
}

bool kiln_kg_weight_bytes(kiln_dtype t, int rank, const int64_t *dims, size_t *bytes, const char **why)
{
    if ((unsigned)t >= KILN_DTYPE_COUNT) return *why = "unknown dtype", false;
    if (rank < 1 || rank > KILN_MAX_RANK) return *why = "rank must be 1 to 4", false;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 0) return *why = "weight dims must be constant (no symbols)", false;
        if (dims[i] < 1) return *why = "dims must be >= 1", false;
    }
    int64_t blk = kiln_dtype_block(t), last = dims[rank - 1];
    if (blk < 1 || last % blk != 0) return *why = "last dim is not a multiple of the dtype's block", false;
    unsigned __int128 total = (unsigned __int128)kiln_dtype_block_bytes(t) * (unsigned __int128)(last / blk);
    for (int i = 0; i + 1 < rank; i++) {
        total *= (unsigned __int128)dims[i];
        if (total > ((unsigned __int128)1 << 50)) break;
    }
    if (total > ((unsigned __int128)1 << 50)) return *why = "weight is larger than 2^50 bytes", false;
    *bytes = (size_t)total;
    return true;
}

kiln_status kiln_kg_fail(kiln_ctx *ctx, kiln_status s, const char *fmt, ...)
{
    char msg[1024]; /* 1 KiB, as documented in kg.h */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_err_set(kiln_err_of(ctx), s, "%s", msg);
}

#define KG_MAX_BYTES ((size_t)1 << 30) /* a .kg file larger than this is refused, not read on forever */

/* Reads a file into a NUL-terminated buffer. Stops at the first NUL byte (the caller reports it by
 * line and column) or past KG_MAX_BYTES, so an endless stream (`kiln run /dev/stdin < /dev/zero`)
 * fails at once instead of filling memory. */
static kiln_status read_text(kiln_ctx *ctx, const char *path, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_kg_fail(ctx, KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    bool nul = false, huge = false;
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        nul = memchr(buf + n, '\0', got) != NULL;
        n += got;
        if (nul || n < cap - 1) break;
        if ((huge = n > KG_MAX_BYTES)) break;
        char *bigger = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
        if (!bigger) free(buf);
        buf = bigger;
        cap *= 2;
    }
    bool bad = ferror(f) != 0;
    fclose(f);
    if (!buf) return kiln_kg_fail(ctx, KILN_ERR_NOMEM, "%s: out of memory reading the file", path);
    if (bad || huge) {
        free(buf);
        if (huge) return kiln_kg_fail(ctx, KILN_ERR_PARSE, "%s: more than %zu MiB: not a .kg graph", path, KG_MAX_BYTES >> 20);
        return kiln_kg_fail(ctx, KILN_ERR_IO, "%s: read error", path);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return KILN_OK;
}

/* Files that are not .kg text, named for what they are (a model file, an empty file). */
static kiln_status not_kg(kiln_ctx *ctx, const char *path, const char *text, size_t len)
{
    if (len >= 4 && memcmp(text, "GGUF", 4) == 0)
        return kiln_kg_fail(ctx, KILN_ERR_PARSE,
                            "%s is a GGUF model file, not a .kg graph (models are read by kiln_gguf_open and "
                            "kiln_model_build; the kiln tool takes them in generate, bench --model, plan and info)", path);
    size_t pl = strlen(path);
    if (pl >= 5 && strcmp(path + pl - 5, ".gguf") == 0)
        return kiln_kg_fail(ctx, KILN_ERR_PARSE,
                            "%s is named .gguf but is not a GGUF file (it does not start with the GGUF magic), "
                            "and a .kg graph is not read from a .gguf name", path);
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r')) i++;
    if (i == len)
        return kiln_kg_fail(ctx, KILN_ERR_PARSE,
                            "%s is empty: a .kg graph declares inputs, ops and `output NAME NODE` lines", path);
    return KILN_OK;
}

KILN_API kiln_status kiln_kg_load(kiln_ctx *ctx, const char *path, kiln_graph **out)
{
    if (!out) return KILN_ERR_INVALID_ARG;
    *out = NULL;
    if (!path) return kiln_kg_fail(ctx, KILN_ERR_INVALID_ARG, "kiln_kg_load: path is NULL");
    char *text = NULL;
    size_t len = 0;
    kiln_status s = read_text(ctx, path, &text, &len);
    if (s != KILN_OK) return s;
    if ((s = not_kg(ctx, path, text, len)) != KILN_OK) {
        free(text);
        return s;
    }
    const char *nul = memchr(text, '\0', len);
    if (nul) { /* the parser takes a C string: a NUL would silently end the file */
        size_t line = 1, col = 1;
        for (const char *c = text; c < nul; c++, col++)
            if (*c == '\n') line++, col = 0;
        free(text);
        return kiln_kg_fail(ctx, KILN_ERR_PARSE, "%s:%zu:%zu: NUL byte in the file", path, line, col);
    }
    s = kiln_kg_parse(ctx, text, path, out);
    free(text);
    return s;
}
