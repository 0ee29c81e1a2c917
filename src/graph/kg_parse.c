/* .kg parser: text -> kiln_graph, one line at a time, through the public builder only (every
 * shape and dtype rule lives in the builder; a builder error is reported at the op's line:col).
 * No recursion and no fixed-size buffer holds input: any input gives a graph or KILN_ERR_PARSE
 * with "file:line:col: what is wrong". Must not read or write graph internals. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <uthash.h>

#include "graph/kg.h"

enum tok_kind { TK_WORD, TK_STR, TK_LBR, TK_RBR, TK_COMMA, TK_EQ };

typedef struct tok {
    int    kind; /* enum tok_kind */
    size_t col;  /* 1-based byte column of its first character */
    size_t raw;  /* length in the source (strings: with quotes and escapes) */
    char  *s;    /* WORD/STR: NUL-terminated text (strings decoded) inside the line buffer */
} tok;

typedef struct kg_name {
    char          *key;  /* the name; owned */
    kiln_node      node; /* node it names (node table) */
    kiln_dim       dim;  /* symbol it names (symbol table) */
    size_t         line; /* line of its definition, for "defined twice" messages */
    UT_hash_handle hh;   /* uthash link */
} kg_name;

typedef struct kg_parser {
    kiln_ctx   *ctx;      /* receives the error text; may be NULL */
    const char *file;     /* source name in messages */
    char       *dir;      /* directory that file= paths are relative to ("" = cwd); owned */
    kiln_graph *g;        /* graph being built */
    size_t      line;     /* current line, 1-based */
    size_t      end_col;  /* column just past the last token of the line (for "missing ...") */
    char       *buf;      /* mutable copy of the current line; tokens point into it */
    size_t      cap_buf;  /* bytes allocated for buf */
    tok        *toks;     /* tokens of the current line */
    size_t      n_toks;   /* tokens in use */
    size_t      cap_toks; /* tokens allocated */
    kg_name    *nodes;    /* uthash: name -> node (leaves and named ops) */
    kg_name    *syms;     /* uthash: name -> symbol */
} kg_parser;

/* Values of an op's parameters after parsing (defaults filled in). */
typedef struct kg_args {
    float      s, eps, theta, scale; /* scale's s, norms' eps, rope's theta, attention's scale */
    int        mode;                 /* kiln_rope_mode */
    kiln_dim   n_kv;                 /* attention's valid cache rows */
    int        axis, d0, d1;         /* concat axis, transposed dims */
    kiln_dtype dtype;                /* cast target */
    int64_t    offset;               /* view element offset */
    const tok *mult;                 /* rope's multipliers (a string token) or NULL */
    float     *mult_v;               /* their values, head_dim/2 of them (owned by parse_def) */
    int64_t    block;                /* paged_attention's block size */
    float      softcap;              /* attention's logit soft-cap (0: none) */
    int64_t    window;               /* attention's sliding window (0: none) */
    int64_t    rot;                  /* rope's rotary dims (0: the whole head) */
    int64_t    k, norm, col, sum;    /* moe_route's experts kept and norm flag; scale_rows' column; moe_matmul's sum flag */
    int        rank;                 /* reshape/view dims */
    kiln_dim   dims[KILN_MAX_RANK];  /* reshape/view dims */
} kg_args;

__attribute__((format(printf, 3, 4))) static kiln_status perr(kg_parser *p, size_t col, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_kg_fail(p->ctx, KILN_ERR_PARSE, "%s:%zu:%zu: %s", p->file, p->line, col, msg);
}

static tok *at(kg_parser *p, size_t i) { return i < p->n_toks ? &p->toks[i] : NULL; }

/* Short text of a token for messages (names are cut by the %.60s at the call sites). */
static const char *tok_text(const tok *t)
{
    switch (t->kind) {
    case TK_LBR: return "[";
    case TK_RBR: return "]";
    case TK_COMMA: return ",";
    case TK_EQ: return "=";
    default: return t->s;
    }
}

/* ------------------------------------------------------------------ lexer */

static bool push_tok(kg_parser *p, int kind, size_t col, size_t raw, char *s)
{
    if (p->n_toks == p->cap_toks) {
        size_t cap = p->cap_toks ? p->cap_toks * 2 : 16;
        tok *t = realloc(p->toks, cap * sizeof *t);
        if (!t) return false;
        p->toks = t;
        p->cap_toks = cap;
    }
    p->toks[p->n_toks++] = (tok){.kind = kind, .col = col, .raw = raw, .s = s};
    return true;
}

static int hex_val(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes the string starting at the quote b[*i] in place (into b[*i+1 ..]); advances *i. */
static kiln_status lex_string(kg_parser *p, char *b, size_t len, size_t *i)
{
    size_t start = *i, r = start + 1, w = start + 1;
    for (;;) {
        if (r >= len) return perr(p, start + 1, "unterminated string");
        unsigned char c = (unsigned char)b[r];
        if (c == '"') break;
        if (c < 0x20 && c != '\t') return perr(p, r + 1, "control character 0x%02x in string", c);
        if (c != '\\') {
            b[w++] = b[r++];
            continue;
        }
        if (r + 1 >= len) return perr(p, start + 1, "unterminated string");
        char e = b[r + 1];
        int v = -1;
        switch (e) {
        case '"': case '\\': v = e; break;
        case 'n': v = '\n'; break;
        case 't': v = '\t'; break;
        case 'r': v = '\r'; break;
        case 'x':
            if (r + 3 < len && hex_val(b[r + 2]) >= 0 && hex_val(b[r + 3]) >= 0)
                v = hex_val(b[r + 2]) * 16 + hex_val(b[r + 3]);
            else
                return perr(p, r + 1, "bad \\x escape (needs two hex digits)");
            if (v == 0) return perr(p, r + 1, "NUL byte in string");
            r += 2;
            break;
        default: return perr(p, r + 1, "unknown escape '\\%c' in string", e >= 0x20 && e < 0x7f ? e : '?');
        }
        b[w++] = (char)v;
        r += 2;
    }
    b[w] = '\0';
    if (!push_tok(p, TK_STR, start + 1, r + 1 - start, b + start + 1))
        return kiln_kg_fail(p->ctx, KILN_ERR_NOMEM, "out of memory");
    *i = r + 1;
    return KILN_OK;
}

static bool is_delim(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '#' || c == '"' || c == '[' || c == ']' || c == ',' ||
           c == '=' || ((unsigned char)c < 0x20) || c == 0x7f;
}

/* Splits one line (without its '\n') into tokens; comments (#) end it. */
static kiln_status lex_line(kg_parser *p, const char *src, size_t len)
{
    if (len + 1 > p->cap_buf) {
        char *b = realloc(p->buf, len + 1);
        if (!b) return kiln_kg_fail(p->ctx, KILN_ERR_NOMEM, "out of memory (line of %zu bytes)", len);
        p->buf = b;
        p->cap_buf = len + 1;
    }
    char *b = p->buf;
    memcpy(b, src, len);
    b[len] = '\0';
    p->n_toks = 0;
    size_t i = 0;
    while (i < len) {
        unsigned char c = (unsigned char)b[i];
        int kind = c == '[' ? TK_LBR : c == ']' ? TK_RBR : c == ',' ? TK_COMMA : c == '=' ? TK_EQ : -1;
        if (c == ' ' || c == '\t' || c == '\r') {
            i++;
        } else if (c == '#') {
            break;
        } else if (c < 0x20 || c == 0x7f) {
            return perr(p, i + 1, "unexpected control character 0x%02x", c);
        } else if (kind >= 0) {
            if (!push_tok(p, kind, i + 1, 1, NULL)) return kiln_kg_fail(p->ctx, KILN_ERR_NOMEM, "out of memory");
            i++;
        } else if (c == '"') {
            kiln_status s = lex_string(p, b, len, &i);
            if (s != KILN_OK) return s;
        } else {
            size_t j = i;
            while (j < len && !is_delim(b[j])) j++;
            if (!push_tok(p, TK_WORD, i + 1, j - i, b + i)) return kiln_kg_fail(p->ctx, KILN_ERR_NOMEM, "out of memory");
            i = j;
        }
    }
    /* Terminate words now: the byte after each word is a delimiter already lexed (or the end);
     * a string's text starts after its quote, so no word terminator lands inside one. */
    for (size_t k = 0; k < p->n_toks; k++)
        if (p->toks[k].kind == TK_WORD) p->toks[k].s[p->toks[k].raw] = '\0';
    p->end_col = p->n_toks ? p->toks[p->n_toks - 1].col + p->toks[p->n_toks - 1].raw : 1;
    return KILN_OK;
}

/* ------------------------------------------------------------------ values */

static kiln_status parse_i64(kg_parser *p, const tok *t, const char *what, int64_t lo, int64_t hi, int64_t *out)
{
    if (t->kind != TK_WORD) return perr(p, t->col, "bad %s '%.60s' (expected an integer)", what, tok_text(t));
    const char *s = t->s;
    bool ok = (s[0] >= '0' && s[0] <= '9') || (s[0] == '-' && s[1] >= '0' && s[1] <= '9');
    char *end = NULL;
    errno = 0;
    long long v = ok ? strtoll(s, &end, 10) : 0;
    if (!ok || *end != '\0') return perr(p, t->col, "bad %s '%.60s' (expected an integer)", what, s);
    if (errno == ERANGE || v < lo || v > hi)
        return perr(p, t->col, "%s %.60s out of range [%lld, %lld]", what, s, (long long)lo, (long long)hi);
    *out = v;
    return KILN_OK;
}

static kiln_status parse_u64(kg_parser *p, const tok *t, const char *what, uint64_t *out)
{
    const char *s = t->kind == TK_WORD ? t->s : "";
    char *end = NULL;
    errno = 0;
    unsigned long long v = (s[0] >= '0' && s[0] <= '9') ? strtoull(s, &end, 10) : 0;
    if (!end || *end != '\0') return perr(p, t->col, "bad %s '%.60s' (expected an unsigned integer)", what, tok_text(t));
    if (errno == ERANGE) return perr(p, t->col, "%s %.60s out of range", what, s);
    *out = v;
    return KILN_OK;
}

static kiln_status parse_f32(kg_parser *p, const tok *t, const char *what, float *out)
{
    const char *s = t->kind == TK_WORD ? t->s : "";
    char *end = NULL;
    errno = 0;
    float v = s[0] ? strtof(s, &end) : 0.0f;
    if (!end || end == s || *end != '\0') return perr(p, t->col, "bad %s '%.60s' (expected a number)", what, tok_text(t));
    if (v != v && strcmp(s + (s[0] == '-' || s[0] == '+'), "nan") != 0) /* nan(...) payloads do not print back */
        return perr(p, t->col, "bad %s '%.60s' (NaN is written nan)", what, s);
    if (errno == ERANGE && (v > 1.0f || v < -1.0f)) /* overflow; underflow to subnormal is fine */
        return perr(p, t->col, "%s %.60s out of range for f32", what, s);
    *out = v;
    return KILN_OK;
}

/* A name at token *i: a bare word (not `_`) or a quoted string. */
static kiln_status read_name(kg_parser *p, size_t *i, const char *what, const char **out)
{
    tok *t = at(p, *i);
    if (!t) return perr(p, p->end_col, "missing %s", what);
    if (t->kind == TK_WORD && strcmp(t->s, "_") == 0)
        return perr(p, t->col, "'_' is not a name (it marks an absent operand)");
    if (t->kind == TK_STR || (t->kind == TK_WORD && kiln_kg_is_bare_name(t->s))) {
        *out = t->s;
        (*i)++;
        return KILN_OK;
    }
    return perr(p, t->col, "expected %s, found '%.60s'", what, tok_text(t));
}

static kiln_status read_dtype(kg_parser *p, size_t *i, kiln_dtype *out)
{
    tok *t = at(p, *i);
    if (!t) return perr(p, p->end_col, "missing dtype");
    if (t->kind != TK_WORD || !kiln_dtype_parse(t->s, out))
        return perr(p, t->col, "bad dtype '%.60s' (f32 f16 bf16 i32 q8_0 q4_k q5_k q6_k q4_0 q4_1 q5_0 q5_1 iq4_nl q2_k q3_k iq4_xs)", tok_text(t));
    (*i)++;
    return KILN_OK;
}

/* One dim: a constant >= 0 or a declared symbol. */
static kiln_status parse_dim(kg_parser *p, const tok *t, kiln_dim *out)
{
    if (t->kind == TK_WORD && ((t->s[0] >= '0' && t->s[0] <= '9') || t->s[0] == '-' || t->s[0] == '+')) {
        int64_t v;
        kiln_status s = parse_i64(p, t, "dim", 0, INT64_MAX, &v);
        if (s == KILN_OK) *out = v;
        return s;
    }
    if (t->kind != TK_WORD && t->kind != TK_STR) return perr(p, t->col, "expected a dim, found '%s'", tok_text(t));
    kg_name *e = NULL;
    HASH_FIND_STR(p->syms, t->s, e);
    if (!e) return perr(p, t->col, "unknown symbol '%.60s' (declare it with: sym NAME MAX)", t->s);
    *out = e->dim;
    return KILN_OK;
}

/* "[d, d, ...]" at token *i. */
static kiln_status read_dims(kg_parser *p, size_t *i, int *rank, kiln_dim dims[KILN_MAX_RANK])
{
    tok *open = at(p, *i);
    if (!open) return perr(p, p->end_col, "missing dims '[...]'");
    if (open->kind != TK_LBR) return perr(p, open->col, "expected '[' to start the dims, found '%.60s'", tok_text(open));
    size_t k = *i + 1;
    *rank = 0;
    tok *t = at(p, k);
    if (t && t->kind == TK_RBR) {
        *i = k + 1;
        return KILN_OK;
    }
    for (;;) {
        t = at(p, k);
        if (!t) return perr(p, open->col, "unterminated '[' (missing ']')");
        if (*rank == KILN_MAX_RANK) return perr(p, t->col, "too many dims (at most %d)", KILN_MAX_RANK);
        kiln_status s = parse_dim(p, t, &dims[(*rank)++]);
        if (s != KILN_OK) return s;
        t = at(p, ++k);
        if (!t) return perr(p, open->col, "unterminated '[' (missing ']')");
        if (t->kind == TK_RBR) break;
        if (t->kind != TK_COMMA) return perr(p, t->col, "expected ',' or ']' in dims, found '%.60s'", tok_text(t));
        k++;
    }
    *i = k + 1;
    return KILN_OK;
}

static kiln_status expect_end(kg_parser *p, size_t i, const char *after)
{
    tok *t = at(p, i);
    if (t) return perr(p, t->col, "unexpected '%.60s' after %s", tok_text(t), after);
    return KILN_OK;
}

/* ------------------------------------------------------------------ names */

static kiln_status add_name(kg_parser *p, kg_name **table, const char *name, kiln_node node, kiln_dim dim)
{
    kg_name *e = calloc(1, sizeof *e);
    char *key = e ? strdup(name) : NULL;
    if (!key) {
        free(e);
        return kiln_kg_fail(p->ctx, KILN_ERR_NOMEM, "out of memory");
    }
    *e = (kg_name){.key = key, .node = node, .dim = dim, .line = p->line};
    HASH_ADD_KEYPTR(hh, *table, e->key, strlen(e->key), e);
    return KILN_OK;
}

static kiln_status check_new(kg_parser *p, kg_name *table, const char *name, size_t col, const char *what)
{
    kg_name *e = NULL;
    HASH_FIND_STR(table, name, e);
    if (e) return perr(p, col, "duplicate %s '%.60s' (first defined on line %zu)", what, name, e->line);
    return KILN_OK;
}

static void free_names(kg_name **table)
{
    kg_name *e, *tmp;
    HASH_ITER(hh, *table, e, tmp) {
        HASH_DEL(*table, e);
        free(e->key);
        free(e);
    }
}

/* A builder failure becomes a parse error at col, carrying the builder's message. */
static kiln_status check_graph(kg_parser *p, size_t col)
{
    if (kiln_graph_status(p->g) == KILN_OK) return KILN_OK;
    return perr(p, col, "%s", kiln_graph_error(p->g));
}

/* ------------------------------------------------------------------ declarations */

static kiln_status parse_sym(kg_parser *p)
{
    size_t i = 1;
    const char *name;
    int64_t max;
    kiln_status s = read_name(p, &i, "symbol name", &name);
    if (s == KILN_OK) s = check_new(p, p->syms, name, p->toks[1].col, "symbol");
    if (s != KILN_OK) return s;
    if (!at(p, i)) return perr(p, p->end_col, "missing the symbol's max");
    if ((s = parse_i64(p, at(p, i), "max", 1, INT64_MAX, &max)) != KILN_OK) return s;
    if ((s = expect_end(p, i + 1, "the symbol's max")) != KILN_OK) return s;
    kiln_dim d = kiln_sym(p->g, name, max);
    if ((s = check_graph(p, p->toks[0].col)) != KILN_OK) return s;
    return add_name(p, &p->syms, name, KILN_NODE_NONE, d);
}

/* input / state / weight: KEYWORD NAME DTYPE [DIMS] ... */
static kiln_status parse_leaf_head(kg_parser *p, size_t *i, const char **name, kiln_dtype *t, int *rank,
                                   kiln_dim dims[KILN_MAX_RANK])
{
    kiln_status s = read_name(p, i, "name", name);
    if (s == KILN_OK) s = check_new(p, p->nodes, *name, p->toks[1].col, "name");
    if (s == KILN_OK) s = read_dtype(p, i, t);
    if (s == KILN_OK) s = read_dims(p, i, rank, dims);
    return s;
}

static kiln_status parse_leaf(kg_parser *p, bool state)
{
    size_t i = 1;
    const char *name;
    kiln_dtype t;
    int rank;
    kiln_dim dims[KILN_MAX_RANK];
    kiln_status s = parse_leaf_head(p, &i, &name, &t, &rank, dims);
    if (s == KILN_OK) s = expect_end(p, i, "the dims");
    if (s != KILN_OK) return s;
    kiln_node n = state ? kiln_state(p->g, name, t, rank, dims) : kiln_input(p->g, name, t, rank, dims);
    if ((s = check_graph(p, p->toks[0].col)) != KILN_OK) return s;
    return add_name(p, &p->nodes, name, n, 0);
}

static kiln_status parse_output(kg_parser *p)
{
    size_t i = 1;
    const char *name, *node;
    kiln_status s = read_name(p, &i, "output name", &name);
    if (s != KILN_OK) return s;
    size_t node_col = at(p, i) ? at(p, i)->col : p->end_col;
    if ((s = read_name(p, &i, "node to output", &node)) != KILN_OK) return s;
    if ((s = expect_end(p, i, "the output's node")) != KILN_OK) return s;
    kg_name *e = NULL;
    HASH_FIND_STR(p->nodes, node, e);
    if (!e) return perr(p, node_col, "unknown name '%.60s'", node);
    kiln_output(p->g, e->node, name);
    return check_graph(p, p->toks[0].col);
}

/* ------------------------------------------------------------------ key=value parameters */

#define MAX_KEYS 21 /* one per kiln_kg_param bit */

/* Reads key=value pairs from token i to the end of the line. keys[k] (NULL = not accepted) names
 * slot k; vals[k] / keycol[k] receive the value token and the key's column. */
static kiln_status read_params(kg_parser *p, size_t i, const char *owner, const char *const keys[MAX_KEYS],
                               tok *vals[MAX_KEYS], size_t keycol[MAX_KEYS])
{
    for (; i < p->n_toks; i += 3) {
        tok *t = at(p, i), *eq = at(p, i + 1), *v = at(p, i + 2);
        if (t->kind != TK_WORD || !eq || eq->kind != TK_EQ)
            return perr(p, t->col, "unexpected '%.60s' (expected key=value)", tok_text(t));
        if (!v || (v->kind != TK_WORD && v->kind != TK_STR))
            return perr(p, v ? v->col : p->end_col, "missing value for '%.60s'", t->s);
        int k = 0;
        while (k < MAX_KEYS && !(keys[k] && strcmp(keys[k], t->s) == 0)) k++;
        if (k == MAX_KEYS) {
            char list[160] = "";
            for (int j = 0; j < MAX_KEYS; j++)
                if (keys[j] && strlen(list) + strlen(keys[j]) + 2 < sizeof list)
                    strcat(strcat(list, " "), keys[j]);
            return perr(p, t->col, "unknown parameter '%.60s' for %s (takes:%s)", t->s, owner, list[0] ? list : " none");
        }
        if (vals[k]) return perr(p, t->col, "parameter '%s' given twice", keys[k]);
        vals[k] = v;
        keycol[k] = t->col;
    }
    return KILN_OK;
}

/* ------------------------------------------------------------------ weights */

static kiln_status load_weight_file(kg_parser *p, const tok *v, size_t need, void *dst)
{
    if (!v->s[0]) return perr(p, v->col, "empty file name");
    bool rel = v->s[0] != '/' && p->dir[0];
    size_t n = strlen(p->dir) + strlen(v->s) + 2;
    char *path = malloc(n);
    if (!path) return kiln_kg_fail(p->ctx, KILN_ERR_NOMEM, "out of memory");
    snprintf(path, n, "%s%s%s", rel ? p->dir : "", rel ? "/" : "", v->s);
    kiln_status s = KILN_OK;
    struct stat st;
    FILE *f = fopen(path, "rb");
    if (!f)
        s = perr(p, v->col, "cannot open weight file '%.300s': %s", path, strerror(errno));
    else if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode))
        s = perr(p, v->col, "weight file '%.300s' is not a regular file", path);
    else if ((uint64_t)st.st_size != (uint64_t)need)
        s = perr(p, v->col, "weight file '%.300s' has %lld bytes, the weight needs %zu", path, (long long)st.st_size,
                 need);
    else if (need && fread(dst, 1, need, f) != need)
        s = perr(p, v->col, "weight file '%.300s': short read", path);
    if (f) fclose(f);
    free(path);
    return s;
}

static kiln_status decode_hex(kg_parser *p, const tok *v, size_t need, unsigned char *dst)
{
    if (v->kind != TK_WORD || strncmp(v->s, "hex:", 4) != 0)
        return perr(p, v->col, "data must be written hex:DIGITS");
    const char *d = v->s + 4;
    size_t n = strlen(d);
    for (size_t k = 0; k < n; k++)
        if (hex_val(d[k]) < 0) return perr(p, v->col + 4 + k, "bad hex digit '%c' in data", d[k]);
    if (n % 2) return perr(p, v->col, "data has an odd number of hex digits (%zu)", n);
    if (n / 2 != need) return perr(p, v->col, "data has %zu bytes, the weight needs %zu", n / 2, need);
    for (size_t k = 0; k < need; k++) dst[k] = (unsigned char)(hex_val(d[2 * k]) * 16 + hex_val(d[2 * k + 1]));
    return KILN_OK;
}

/* weight NAME DTYPE [DIMS] (seed=U64 [scale=F] | file="PATH" | data=hex:DIGITS) */
static kiln_status parse_weight(kg_parser *p)
{
    enum { K_SEED, K_SCALE, K_FILE, K_DATA };
    static const char *const keys[MAX_KEYS] = {"seed", "scale", "file", "data"};
    size_t i = 1, keycol[MAX_KEYS] = {0};
    tok *vals[MAX_KEYS] = {0};
    const char *name;
    kiln_dtype t;
    int rank;
    kiln_dim dims[KILN_MAX_RANK];
    kiln_status s = parse_leaf_head(p, &i, &name, &t, &rank, dims);
    if (s == KILN_OK) s = read_params(p, i, "weight", keys, vals, keycol);
    if (s != KILN_OK) return s;
    int n_src = !!vals[K_SEED] + !!vals[K_FILE] + !!vals[K_DATA];
    if (n_src == 0) return perr(p, p->end_col, "weight '%.60s' needs seed=, file= or data=", name);
    if (n_src > 1) {
        size_t col = 0;
        for (int k = K_SEED; k <= K_DATA; k++)
            if (k != K_SCALE && vals[k] && keycol[k] > col) col = keycol[k];
        return perr(p, col, "weight '%.60s': seed=, file= and data= exclude each other", name);
    }
    if (vals[K_SCALE] && !vals[K_SEED]) return perr(p, keycol[K_SCALE], "scale= goes with seed= only");
    kiln_node n;
    if (vals[K_SEED]) {
        uint64_t seed = 0;
        float scale = 1.0f;
        if ((s = parse_u64(p, vals[K_SEED], "seed", &seed)) != KILN_OK) return s;
        if (vals[K_SCALE] && (s = parse_f32(p, vals[K_SCALE], "scale", &scale)) != KILN_OK) return s;
        n = kiln_weight_random(p->g, name, t, rank, dims, seed, scale);
    } else {
        size_t bytes;
        const char *why;
        if (!kiln_kg_weight_bytes(t, rank, dims, &bytes, &why))
            return perr(p, p->toks[0].col, "weight '%.60s': %s", name, why);
        void *data = malloc(bytes ? bytes : 1);
        if (!data) return kiln_kg_fail(p->ctx, KILN_ERR_NOMEM, "weight '%.60s': out of memory (%zu bytes)", name, bytes);
        s = vals[K_FILE] ? load_weight_file(p, vals[K_FILE], bytes, data) : decode_hex(p, vals[K_DATA], bytes, data);
        n = s == KILN_OK ? kiln_weight(p->g, name, t, rank, dims, data, KILN_WEIGHT_COPY) : KILN_NODE_NONE;
        free(data);
        if (s != KILN_OK) return s;
    }
    if ((s = check_graph(p, p->toks[0].col)) != KILN_OK) return s;
    return add_name(p, &p->nodes, name, n, 0);
}

/* ------------------------------------------------------------------ ops */

/* Operands from token *i up to the dims, the first key=value, or the end of the line. */
static kiln_status read_operands(kg_parser *p, size_t *i, const char *opn, const kiln_kg_op_spec *sp,
                                 kiln_node src[KILN_MAX_SRC])
{
    unsigned n = 0;
    for (;; (*i)++) {
        tok *t = at(p, *i), *nx = at(p, *i + 1);
        if (!t || t->kind == TK_LBR || (t->kind == TK_WORD && nx && nx->kind == TK_EQ)) break;
        if (t->kind != TK_WORD && t->kind != TK_STR)
            return perr(p, t->col, "expected an operand of %s, found '%s'", opn, tok_text(t));
        if (n == sp->n_req + sp->n_opt) return perr(p, t->col, "too many operands for %s (takes %s)", opn, sp->usage);
        if (t->kind == TK_WORD && strcmp(t->s, "_") == 0) {
            if (n < sp->n_req) return perr(p, t->col, "operand %u of %s may not be '_' (takes %s)", n + 1, opn, sp->usage);
            src[n++] = KILN_NODE_NONE;
            continue;
        }
        kg_name *e = NULL;
        HASH_FIND_STR(p->nodes, t->s, e);
        if (!e) return perr(p, t->col, "unknown name '%.60s'", t->s);
        src[n++] = e->node;
    }
    if (n < sp->n_req) {
        tok *t = at(p, *i);
        return perr(p, t ? t->col : p->end_col, "missing operand for %s (takes %s)", opn, sp->usage);
    }
    return KILN_OK;
}

/* Converts the parameter tokens of an op into a (defaults already there). */
static kiln_status op_args(kg_parser *p, const char *opn, const kiln_kg_op_spec *sp, tok *const vals[MAX_KEYS],
                           kg_args *a)
{
    kiln_status s = KILN_OK;
    for (unsigned b = 0; b < MAX_KEYS && s == KILN_OK; b++) {
        unsigned bit = 1u << b;
        const char *key = kiln_kg_param_key(bit);
        tok *v = vals[b];
        if (!key) continue;
        if (!v && (sp->required & bit)) return perr(p, p->end_col, "missing parameter %s= for %s (takes %s)", key, opn, sp->usage);
        if (!v) continue;
        int64_t iv = 0;
        switch (bit) {
        case KILN_KG_P_S: s = parse_f32(p, v, key, &a->s); break;
        case KILN_KG_P_EPS: s = parse_f32(p, v, key, &a->eps); break;
        case KILN_KG_P_THETA: s = parse_f32(p, v, key, &a->theta); break;
        case KILN_KG_P_SCALE: s = parse_f32(p, v, key, &a->scale); break;
        case KILN_KG_P_NKV: s = parse_dim(p, v, &a->n_kv); break;
        case KILN_KG_P_MODE:
            if (strcmp(v->s, "normal") == 0) a->mode = KILN_ROPE_NORMAL;
            else if (strcmp(v->s, "neox") == 0) a->mode = KILN_ROPE_NEOX;
            else s = perr(p, v->col, "bad mode '%.60s' (normal or neox)", v->s);
            break;
        case KILN_KG_P_DTYPE:
            if (!kiln_dtype_parse(v->s, &a->dtype)) s = perr(p, v->col, "bad dtype '%.60s'", v->s);
            break;
        case KILN_KG_P_OFFSET: s = parse_i64(p, v, key, 0, INT64_MAX, &a->offset); break;
        case KILN_KG_P_MULT:
            if (v->kind != TK_STR) s = perr(p, v->col, "mult must be a quoted list of numbers (\"1,0.5\")");
            a->mult = v;
            break;
        case KILN_KG_P_BLOCK: s = parse_i64(p, v, key, 1, 1 << 20, &a->block); break;
        case KILN_KG_P_SOFTCAP: s = parse_f32(p, v, key, &a->softcap); break;
        case KILN_KG_P_WINDOW: s = parse_i64(p, v, key, 0, INT32_MAX, &a->window); break;
        case KILN_KG_P_ROT: s = parse_i64(p, v, key, 1, INT32_MAX, &a->rot); break;
        case KILN_KG_P_K: s = parse_i64(p, v, key, 1, INT32_MAX, &a->k); break;
        case KILN_KG_P_NORM: s = parse_i64(p, v, key, 0, 1, &a->norm); break;
        case KILN_KG_P_COL: s = parse_i64(p, v, key, 0, INT32_MAX, &a->col); break;
        case KILN_KG_P_SUM: s = parse_i64(p, v, key, 0, 1, &a->sum); break;
        default: /* axis, d0, d1 */
            s = parse_i64(p, v, key, INT32_MIN, INT32_MAX, &iv);
            *(bit == KILN_KG_P_AXIS ? &a->axis : bit == KILN_KG_P_D0 ? &a->d0 : &a->d1) = (int)iv;
        }
    }
    return s;
}

/* rope's mult="F,F,...": exactly rot/2 numbers (head_dim/2 without rot=; x is operand x, already resolved). */
static kiln_status parse_mult(kg_parser *p, kiln_node x, kg_args *a)
{
    const tok *v = a->mult;
    uint32_t xi = (uint32_t)x - 1;
    if (x == KILN_NODE_NONE || xi >= p->g->n_nodes) return KILN_OK; /* the builder names the bad operand */
    const kiln_node_rec *n = &p->g->nodes[xi];
    int64_t half = a->rot ? a->rot / 2 : n->rank ? n->dims[n->rank - 1] / 2 : 0, got = 0;
    if (half < 1 || half > 65536) return KILN_OK; /* the builder explains the shape */
    if (!(a->mult_v = malloc((size_t)half * sizeof *a->mult_v))) return kiln_kg_fail(p->ctx, KILN_ERR_NOMEM, "out of memory");
    for (const char *s = v->s; *s; got++) {
        char *end = NULL;
        float f = strtof(s, &end);
        if (end == s || (*end && *end != ',') || got >= half)
            return perr(p, v->col, "mult must list exactly %lld numbers (rotary dims / 2) separated by commas",
                        (long long)half);
        a->mult_v[got] = f;
        s = *end ? end + 1 : end;
    }
    if (got != half)
        return perr(p, v->col, "mult lists %lld numbers; x's rotary dims need %lld", (long long)got, (long long)half);
    return KILN_OK;
}

static kiln_node build_op(kiln_graph *g, enum kiln_op op, const kiln_node *s, const kg_args *a)
{
    switch (op) {
    case KILN_OP_MATMUL: return kiln_matmul(g, s[0], s[1]);
    case KILN_OP_ADD: return kiln_add(g, s[0], s[1]);
    case KILN_OP_MUL: return kiln_mul(g, s[0], s[1]);
    case KILN_OP_SCALE: return kiln_scale(g, s[0], a->s);
    case KILN_OP_SWIGLU: return kiln_swiglu(g, s[0], s[1]);
    case KILN_OP_RMS_NORM: return kiln_rms_norm(g, s[0], s[1], a->eps);
    case KILN_OP_LAYER_NORM: return kiln_layer_norm(g, s[0], s[1], s[2], a->eps);
    case KILN_OP_SOFTMAX: return kiln_softmax(g, s[0]);
    case KILN_OP_ROPE:
        return a->rot ? kiln_rope_partial(g, s[0], s[1], (kiln_rope_mode)a->mode, a->theta, a->mult_v, a->rot)
                      : kiln_rope_ext(g, s[0], s[1], (kiln_rope_mode)a->mode, a->theta, a->mult_v);
    case KILN_OP_ATTENTION: return kiln_attention_ext(g, s[0], s[1], s[2], a->n_kv, a->scale, a->softcap, a->window);
    case KILN_OP_KV_SCATTER: return kiln_kv_scatter(g, s[0], s[1], s[2]);
    case KILN_OP_PAGED_ATTENTION:
        if (s[6] && (a->softcap != 0 || a->window != 0))
            return kiln_graph_fail(g, KILN_ERR_INVALID_ARG, "paged_attention: a tree step (parents) takes no softcap= "
                                   "or window=");
        return s[6] ? kiln_paged_attention_tree(g, s[0], s[1], s[2], s[3], s[4], s[5], s[6], (int)a->block, a->scale)
                    : kiln_paged_attention_ext(g, s[0], s[1], s[2], s[3], s[4], s[5], (int)a->block, a->scale, a->softcap,
                                               a->window);
    case KILN_OP_GET_ROWS: return kiln_get_rows(g, s[0], s[1]);
    case KILN_OP_ARGMAX: return kiln_argmax(g, s[0]);
    case KILN_OP_MOE_ROUTE: return kiln_moe_route(g, s[0], (int)a->k, a->norm != 0);
    case KILN_OP_SCALE_ROWS: return kiln_scale_rows(g, s[0], s[1], (int)a->col);
    case KILN_OP_MOE_MATMUL: return kiln_moe_matmul(g, s[0], s[1], s[2], (int)a->k, a->sum != 0);
    case KILN_OP_ALL_REDUCE: return kiln_all_reduce(g, s[0]);
    case KILN_OP_ALL_GATHER: return kiln_all_gather(g, s[0]);
    case KILN_OP_CAST: return kiln_cast(g, s[0], a->dtype);
    case KILN_OP_RESHAPE: return kiln_reshape(g, s[0], a->rank, a->dims);
    case KILN_OP_VIEW: return kiln_view(g, s[0], a->rank, a->dims, a->offset);
    case KILN_OP_TRANSPOSE: return kiln_transpose(g, s[0], a->d0, a->d1);
    case KILN_OP_CONCAT: return kiln_concat(g, s[0], s[1], a->axis);
    default: /* unary elementwise ops without parameters (silu, gelu, sigmoid): the op table's builder */
        if (kiln_op_is_elementwise(op) && kiln_kg_op_spec_of(op)->n_req == 1 && !kiln_kg_op_spec_of(op)->params)
            return kiln_op_unary(g, op, s[0]);
        return KILN_NODE_NONE; /* leaves have no spec and never get here */
    }
}

/* NAME = OP operands... [dims] key=value... */
static kiln_status parse_def(kg_parser *p)
{
    size_t i = 0, keycol[MAX_KEYS] = {0};
    const char *name, *keys[MAX_KEYS] = {0};
    tok *vals[MAX_KEYS] = {0};
    kiln_node src[KILN_MAX_SRC] = {0};
    enum kiln_op op;
    kiln_status s = read_name(p, &i, "name", &name);
    if (s == KILN_OK) s = check_new(p, p->nodes, name, p->toks[0].col, "name");
    if (s != KILN_OK) return s;
    tok *ot = at(p, 2);
    if (!ot) return perr(p, p->end_col, "missing op after '='");
    const kiln_kg_op_spec *sp = NULL;
    if (ot->kind != TK_WORD || !kiln_op_parse(ot->s, &op) || !(sp = kiln_kg_op_spec_of(op)))
        return perr(p, ot->col, "unknown op '%.60s'", tok_text(ot));
    const char *opn = kiln_op_name(op);
    kg_args a = {.eps = 1e-5f, .theta = 10000.0f, .mode = KILN_ROPE_NORMAL};
    i = 3;
    if ((s = read_operands(p, &i, opn, sp, src)) != KILN_OK) return s;
    if (sp->params & KILN_KG_P_DIMS) {
        if ((s = read_dims(p, &i, &a.rank, a.dims)) != KILN_OK) return s;
    } else if (at(p, i) && at(p, i)->kind == TK_LBR) {
        return perr(p, at(p, i)->col, "%s takes no dims (takes %s)", opn, sp->usage);
    }
    for (unsigned b = 0; b < MAX_KEYS; b++)
        if (sp->params & (1u << b)) keys[b] = kiln_kg_param_key(1u << b);
    if ((s = read_params(p, i, opn, keys, vals, keycol)) != KILN_OK) return s;
    if ((s = op_args(p, opn, sp, vals, &a)) != KILN_OK) return s;
    if (a.mult && (s = parse_mult(p, src[0], &a)) != KILN_OK) return free(a.mult_v), s;
    kiln_node n = build_op(p->g, op, src, &a);
    free(a.mult_v);
    if ((s = check_graph(p, ot->col)) != KILN_OK) return s;
    if (n == KILN_NODE_NONE) return perr(p, ot->col, "%s failed without a message", opn);
    kiln_name(p->g, n, name);
    if ((s = check_graph(p, p->toks[0].col)) != KILN_OK) return s;
    return add_name(p, &p->nodes, name, n, 0);
}

/* ------------------------------------------------------------------ driver */

static kiln_status parse_line(kg_parser *p, const char *src, size_t len)
{
    kiln_status s = lex_line(p, src, len);
    if (s != KILN_OK || p->n_toks == 0) return s;
    tok *t0 = &p->toks[0];
    if (p->n_toks >= 2 && p->toks[1].kind == TK_EQ) return parse_def(p);
    if (t0->kind != TK_WORD) return perr(p, t0->col, "expected a keyword or 'NAME = op', found '%.60s'", tok_text(t0));
    if (strcmp(t0->s, "sym") == 0) return parse_sym(p);
    if (strcmp(t0->s, "input") == 0) return parse_leaf(p, false);
    if (strcmp(t0->s, "state") == 0) return parse_leaf(p, true);
    if (strcmp(t0->s, "weight") == 0) return parse_weight(p);
    if (strcmp(t0->s, "output") == 0) return parse_output(p);
    return perr(p, t0->col, "unknown keyword '%.60s' (sym, input, weight, state, output, or NAME = op ...)", t0->s);
}

/* Directory part of path ("" when it has none). */
static char *dir_of(const char *path)
{
    const char *slash = path ? strrchr(path, '/') : NULL;
    size_t n = slash ? (size_t)(slash - path) + (slash == path) : 0;
    char *d = malloc(n + 1);
    if (d) {
        if (n) memcpy(d, path, n);
        d[n] = '\0';
    }
    return d;
}

KILN_API kiln_status kiln_kg_parse(kiln_ctx *ctx, const char *text, const char *file, kiln_graph **out)
{
    if (!out) return kiln_kg_fail(ctx, KILN_ERR_INVALID_ARG, "kiln_kg_parse: out is NULL");
    *out = NULL;
    if (!text) return kiln_kg_fail(ctx, KILN_ERR_INVALID_ARG, "kiln_kg_parse: text is NULL");
    kg_parser p = {.ctx = ctx, .file = file ? file : "<text>", .dir = dir_of(file)};
    kiln_status s = p.dir ? kiln_graph_new(&p.g) : KILN_ERR_NOMEM;
    if (s != KILN_OK) {
        free(p.dir);
        return kiln_kg_fail(ctx, s, "kiln_kg_parse: out of memory");
    }
    for (const char *line = text; s == KILN_OK;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        p.line++;
        s = parse_line(&p, line, len);
        if (!nl) break;
        line = nl + 1;
    }
    free_names(&p.nodes);
    free_names(&p.syms);
    free(p.buf);
    free(p.toks);
    free(p.dir);
    if (s != KILN_OK) {
        kiln_graph_free(p.g);
        return s;
    }
    *out = p.g;
    return KILN_OK;
}
