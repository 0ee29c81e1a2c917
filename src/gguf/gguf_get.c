/* GGUF accessors: the ggml type table (sizes and names of every type id ggml defines), metadata
 * getters with type checks, and tensors as kiln sees them (dims outermost-first). Reads the parsed
 * tables only; must not re-parse or trust anything gguf.c did not check. */
#include "gguf/gguf.h"
#include "sched/ctx.h"

#include <string.h>

typedef struct ggml_type_rec {
    const char *name;  /* ggml's name; NULL: id not defined */
    int64_t     block; /* values per block */
    size_t      bytes; /* bytes per block */
    kiln_dtype  t;     /* kiln dtype or KILN_DTYPE_COUNT */
} ggml_type_rec;

#define N KILN_DTYPE_COUNT
static const ggml_type_rec ggml_types[] = {
    [0] = {"f32", 1, 4, KILN_DTYPE_F32},       [1] = {"f16", 1, 2, KILN_DTYPE_F16},
    [2] = {"q4_0", 32, 18, KILN_DTYPE_Q4_0},                 [3] = {"q4_1", 32, 20, KILN_DTYPE_Q4_1},
    [6] = {"q5_0", 32, 22, KILN_DTYPE_Q5_0},                 [7] = {"q5_1", 32, 24, KILN_DTYPE_Q5_1},
    [8] = {"q8_0", 32, 34, KILN_DTYPE_Q8_0},   [9] = {"q8_1", 32, 36, N},
    [10] = {"q2_K", 256, 84, KILN_DTYPE_Q2_K},               [11] = {"q3_K", 256, 110, KILN_DTYPE_Q3_K},
    [12] = {"q4_K", 256, 144, KILN_DTYPE_Q4_K}, [13] = {"q5_K", 256, 176, KILN_DTYPE_Q5_K},
    [14] = {"q6_K", 256, 210, KILN_DTYPE_Q6_K}, [15] = {"q8_K", 256, 292, N},
    [16] = {"iq2_xxs", 256, 66, KILN_DTYPE_IQ2_XXS},            [17] = {"iq2_xs", 256, 74, KILN_DTYPE_IQ2_XS},
    [18] = {"iq3_xxs", 256, 98, KILN_DTYPE_IQ3_XXS},            [19] = {"iq1_s", 256, 50, KILN_DTYPE_IQ1_S},
    [20] = {"iq4_nl", 32, 18, KILN_DTYPE_IQ4_NL},              [21] = {"iq3_s", 256, 110, KILN_DTYPE_IQ3_S},
    [22] = {"iq2_s", 256, 82, KILN_DTYPE_IQ2_S},              [23] = {"iq4_xs", 256, 136, KILN_DTYPE_IQ4_XS},
    [24] = {"i8", 1, 1, N},                    [25] = {"i16", 1, 2, N},
    [26] = {"i32", 1, 4, N},                   [27] = {"i64", 1, 8, N},
    [28] = {"f64", 1, 8, N},                   [29] = {"iq1_m", 256, 56, KILN_DTYPE_IQ1_M},
    [30] = {"bf16", 1, 2, KILN_DTYPE_BF16},    [34] = {"tq1_0", 256, 54, N},
    [35] = {"tq2_0", 256, 66, N},
};
#undef N
#define N_GGML_TYPES (sizeof ggml_types / sizeof ggml_types[0])

bool kiln_gguf_type_size(uint32_t id, int64_t *block, size_t *block_bytes)
{
    if (id >= N_GGML_TYPES || !ggml_types[id].name) return false;
    *block = ggml_types[id].block;
    *block_bytes = ggml_types[id].bytes;
    return true;
}

kiln_dtype kiln_gguf_dtype_of(uint32_t id)
{
    return id < N_GGML_TYPES && ggml_types[id].name ? ggml_types[id].t : KILN_DTYPE_COUNT;
}

const char *kiln_gguf_type_label(uint32_t id)
{
    return id < N_GGML_TYPES && ggml_types[id].name ? ggml_types[id].name : "?";
}

KILN_API const char *kiln_gguf_type_name(kiln_gguf_type t)
{
    static const char *names[KILN_GGUF_TYPE_COUNT] = {"u8",   "i8",    "u16", "i16", "u32", "i32", "f32",
                                                      "bool", "string", "array", "u64", "i64", "f64"};
    return (unsigned)t < KILN_GGUF_TYPE_COUNT ? names[t] : "?";
}

KILN_API uint32_t kiln_gguf_version(const kiln_gguf *f) { return f ? f->version : 0; }
KILN_API uint32_t kiln_gguf_alignment(const kiln_gguf *f) { return f ? f->alignment : 0; }
KILN_API size_t kiln_gguf_size(const kiln_gguf *f) { return f ? f->total : 0; }
KILN_API int kiln_gguf_part_count(const kiln_gguf *f) { return f ? f->n_parts : 0; }
KILN_API int64_t kiln_gguf_kv_count(const kiln_gguf *f) { return f ? (int64_t)f->n_kv : 0; }

KILN_API const char *kiln_gguf_kv_key(const kiln_gguf *f, int64_t i)
{
    return f && i >= 0 && (uint64_t)i < f->n_kv ? f->kvs[i].key : NULL;
}

KILN_API int64_t kiln_gguf_kv_find(const kiln_gguf *f, const char *key)
{
    gguf_kv *kv = NULL;
    if (f && key) HASH_FIND_STR(f->kv_by_key, key, kv);
    return kv ? kv - f->kvs : -1;
}

KILN_API kiln_gguf_type kiln_gguf_kv_type(const kiln_gguf *f, int64_t i)
{
    return f && i >= 0 && (uint64_t)i < f->n_kv ? f->kvs[i].type : KILN_GGUF_TYPE_COUNT;
}

/* The entry of key, or NULL with the error set (KILN_ERR_NAME / _INVALID_ARG in *s). */
static const gguf_kv *lookup(const kiln_gguf *f, const char *key, kiln_status *s)
{
    if (!f || !key) {
        *s = KILN_ERR_INVALID_ARG;
        if (f) kiln_ctx_set_error(f->ctx, "gguf getter: NULL key");
        return NULL;
    }
    int64_t i = kiln_gguf_kv_find(f, key);
    if (i < 0) {
        *s = kiln_ctx_fail(f->ctx, KILN_ERR_NAME, "%s: no metadata key '%s'", f->path, key);
        return NULL;
    }
    return &f->kvs[i];
}

static kiln_status wrong_type(const kiln_gguf *f, const gguf_kv *kv, const char *want)
{
    return kiln_ctx_fail(f->ctx, KILN_ERR_DTYPE, "%s: metadata '%s' is %s%s%s, expected %s", f->path, kv->key,
                         kiln_gguf_type_name(kv->type), kv->type == KILN_GGUF_ARRAY ? " of " : "",
                         kv->type == KILN_GGUF_ARRAY ? kiln_gguf_type_name(kv->arr_type) : "", want);
}

/* Reads an integer scalar as a signed/unsigned pair: *neg says the value is negative. */
static bool int_value(const kiln_gguf *f, const gguf_kv *kv, uint64_t *mag, bool *neg)
{
    const uint8_t *p = f->base + kv->off;
    int64_t s = 0;
    uint64_t u = 0;
    bool is_signed = true;
    switch (kv->type) {
    case KILN_GGUF_U8: u = p[0], is_signed = false; break;
    case KILN_GGUF_I8: s = (int8_t)p[0]; break;
    case KILN_GGUF_U16: { uint16_t v; memcpy(&v, p, 2); u = v, is_signed = false; break; }
    case KILN_GGUF_I16: { int16_t v; memcpy(&v, p, 2); s = v; break; }
    case KILN_GGUF_U32: { uint32_t v; memcpy(&v, p, 4); u = v, is_signed = false; break; }
    case KILN_GGUF_I32: { int32_t v; memcpy(&v, p, 4); s = v; break; }
    case KILN_GGUF_U64: memcpy(&u, p, 8), is_signed = false; break;
    case KILN_GGUF_I64: memcpy(&s, p, 8); break;
    default: return false;
    }
    *neg = is_signed && s < 0;
    *mag = is_signed ? (s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s) : u;
    return true;
}

/* Gets an integer in [-min_mag, max] (min_mag 0 for unsigned results). */
static kiln_status get_int(const kiln_gguf *f, const char *key, uint64_t max, uint64_t min_mag, uint64_t *mag, bool *neg)
{
    kiln_status s = KILN_OK;
    const gguf_kv *kv = lookup(f, key, &s);
    if (!kv) return s;
    if (!int_value(f, kv, mag, neg)) return wrong_type(f, kv, "an integer");
    if ((*neg && *mag > min_mag) || (!*neg && *mag > max))
        return kiln_ctx_fail(f->ctx, KILN_ERR_SHAPE, "%s: metadata '%s' = %s%llu does not fit the requested type",
                             f->path, key, *neg ? "-" : "", (unsigned long long)*mag);
    return KILN_OK;
}

KILN_API kiln_status kiln_gguf_get_u32(const kiln_gguf *f, const char *key, uint32_t *out)
{
    uint64_t m;
    bool neg;
    kiln_status s = out ? get_int(f, key, UINT32_MAX, 0, &m, &neg) : KILN_ERR_INVALID_ARG;
    if (s == KILN_OK) *out = (uint32_t)m;
    return s;
}

KILN_API kiln_status kiln_gguf_get_u64(const kiln_gguf *f, const char *key, uint64_t *out)
{
    uint64_t m;
    bool neg;
    kiln_status s = out ? get_int(f, key, UINT64_MAX, 0, &m, &neg) : KILN_ERR_INVALID_ARG;
    if (s == KILN_OK) *out = m;
    return s;
}

KILN_API kiln_status kiln_gguf_get_i32(const kiln_gguf *f, const char *key, int32_t *out)
{
    uint64_t m;
    bool neg;
    kiln_status s = out ? get_int(f, key, INT32_MAX, (uint64_t)INT32_MAX + 1, &m, &neg) : KILN_ERR_INVALID_ARG;
    if (s == KILN_OK) *out = neg ? (int32_t)(0 - (int64_t)m) : (int32_t)m;
    return s;
}

KILN_API kiln_status kiln_gguf_get_i64(const kiln_gguf *f, const char *key, int64_t *out)
{
    uint64_t m;
    bool neg;
    kiln_status s = out ? get_int(f, key, INT64_MAX, (uint64_t)INT64_MAX + 1, &m, &neg) : KILN_ERR_INVALID_ARG;
    if (s == KILN_OK) *out = neg ? (m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m) : (int64_t)m;
    return s;
}

KILN_API kiln_status kiln_gguf_get_f64(const kiln_gguf *f, const char *key, double *out)
{
    kiln_status s = KILN_OK;
    const gguf_kv *kv = out ? lookup(f, key, &s) : NULL;
    if (!out) return KILN_ERR_INVALID_ARG;
    if (!kv) return s;
    if (kv->type == KILN_GGUF_F32) {
        float v;
        memcpy(&v, f->base + kv->off, 4);
        *out = v;
    } else if (kv->type == KILN_GGUF_F64) {
        memcpy(out, f->base + kv->off, 8);
    } else {
        return wrong_type(f, kv, "f32 or f64");
    }
    return KILN_OK;
}

KILN_API kiln_status kiln_gguf_get_f32(const kiln_gguf *f, const char *key, float *out)
{
    double d;
    kiln_status s = out ? kiln_gguf_get_f64(f, key, &d) : KILN_ERR_INVALID_ARG;
    if (s == KILN_OK) *out = (float)d;
    return s;
}

KILN_API kiln_status kiln_gguf_get_bool(const kiln_gguf *f, const char *key, bool *out)
{
    kiln_status s = KILN_OK;
    const gguf_kv *kv = out ? lookup(f, key, &s) : NULL;
    if (!out) return KILN_ERR_INVALID_ARG;
    if (!kv) return s;
    if (kv->type != KILN_GGUF_BOOL) return wrong_type(f, kv, "bool");
    *out = f->base[kv->off] != 0;
    return KILN_OK;
}

KILN_API kiln_status kiln_gguf_get_str(const kiln_gguf *f, const char *key, const char **out, size_t *len)
{
    kiln_status s = KILN_OK;
    const gguf_kv *kv = out ? lookup(f, key, &s) : NULL;
    if (!out) return KILN_ERR_INVALID_ARG;
    if (!kv) return s;
    if (kv->type != KILN_GGUF_STRING) return wrong_type(f, kv, "string");
    *out = kv->str;
    if (len) {
        uint64_t n;
        memcpy(&n, f->base + kv->off - 8, 8);
        *len = (size_t)n;
    }
    return KILN_OK;
}

KILN_API kiln_status kiln_gguf_get_arr(const kiln_gguf *f, const char *key, kiln_gguf_type *elem, uint64_t *n,
                                       const void **data)
{
    kiln_status s = KILN_OK;
    const gguf_kv *kv = lookup(f, key, &s);
    if (!kv) return s;
    if (kv->type != KILN_GGUF_ARRAY) return wrong_type(f, kv, "an array");
    if (elem) *elem = kv->arr_type;
    if (n) *n = kv->n;
    if (data) *data = kv->arr_type == KILN_GGUF_STRING ? NULL : f->base + kv->off;
    return KILN_OK;
}

KILN_API kiln_status kiln_gguf_get_arr_str(const kiln_gguf *f, const char *key, uint64_t i, const char **out,
                                           size_t *len)
{
    kiln_status s = KILN_OK;
    const gguf_kv *kv = out ? lookup(f, key, &s) : NULL;
    if (!out) return KILN_ERR_INVALID_ARG;
    if (!kv) return s;
    if (kv->type != KILN_GGUF_ARRAY || kv->arr_type != KILN_GGUF_STRING) return wrong_type(f, kv, "an array of strings");
    if (i >= kv->n)
        return kiln_ctx_fail(f->ctx, KILN_ERR_INVALID_ARG, "%s: '%s' has %llu strings, asked for #%llu", f->path, key,
                             (unsigned long long)kv->n, (unsigned long long)i);
    uint64_t l;
    memcpy(&l, f->base + kv->str_offs[i], 8);
    *out = (const char *)f->base + kv->str_offs[i] + 8;
    if (len) *len = (size_t)l;
    return KILN_OK;
}

KILN_API int64_t kiln_gguf_tensor_count(const kiln_gguf *f) { return f ? (int64_t)f->n_tensors : 0; }

static void fill_tensor(const kiln_gguf *f, const gguf_tensor *t, kiln_gguf_tensor *out)
{
    const kiln_gguf *h = t->home ? t->home : f; /* a split GGUF's tensor lives in its part's mapping */
    *out = (kiln_gguf_tensor){.name = t->name, .ggml_type = t->ggml_type, .type_name = kiln_gguf_type_label(t->ggml_type),
                              .t = kiln_gguf_dtype_of(t->ggml_type), .rank = t->rank,
                              .data = h->base + h->data_off + t->rel_off, .bytes = (size_t)t->bytes,
                              .offset = h->data_off + t->rel_off, .part = t->part};
    for (int d = 0; d < t->rank; d++) out->dims[d] = t->ne[t->rank - 1 - d];
}

KILN_API kiln_status kiln_gguf_tensor_at(const kiln_gguf *f, int64_t i, kiln_gguf_tensor *out)
{
    if (!f || !out) return KILN_ERR_INVALID_ARG;
    if (i < 0 || (uint64_t)i >= f->n_tensors)
        return kiln_ctx_fail(f->ctx, KILN_ERR_INVALID_ARG, "%s: tensor index %lld out of range (%llu tensors)", f->path,
                             (long long)i, (unsigned long long)f->n_tensors);
    fill_tensor(f, &f->tensors[i], out);
    return KILN_OK;
}

int64_t kiln_gguf_tensor_index(const kiln_gguf *f, const char *name)
{
    gguf_tensor *t = NULL;
    if (f && name) HASH_FIND_STR(f->t_by_name, name, t);
    return t ? t - f->tensors : -1;
}

KILN_API kiln_status kiln_gguf_tensor_get(const kiln_gguf *f, const char *name, kiln_gguf_tensor *out)
{
    if (!f || !name || !out) return KILN_ERR_INVALID_ARG;
    gguf_tensor *t;
    HASH_FIND_STR(f->t_by_name, name, t);
    if (!t) return kiln_ctx_fail(f->ctx, KILN_ERR_NAME, "%s: no tensor '%s'", f->path, name);
    if (kiln_gguf_dtype_of(t->ggml_type) == KILN_DTYPE_COUNT)
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s (id %u), which kiln does not run",
                             f->path, name, kiln_gguf_type_label(t->ggml_type), t->ggml_type);
    fill_tensor(f, t, out);
    return KILN_OK;
}
