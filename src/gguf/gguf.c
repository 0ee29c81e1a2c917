/* GGUF v2/v3 parser: maps a file (or takes a buffer), reads the header, metadata key-values and
 * tensor infos with a bounds check before every read, and checks the tensor data layout
 * (alignment, bounds, overlap, duplicate names). Every failure is KILN_ERR_PARSE naming the byte
 * offset and the field. Must not write the mapped bytes, trust any count, or abort. */
#include "gguf/gguf.h"
#include "sched/ctx.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_MAX_DIMS 4

/* The reader: a cursor over the bytes with the context for errors. */
typedef struct rd {
    kiln_gguf     *f;   /* file being built */
    size_t         off; /* cursor */
    kiln_status    st;  /* first error */
} rd;

static kiln_status fail(rd *r, size_t off, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static kiln_status fail(rd *r, size_t off, const char *field, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    kiln_ctx_set_error(r->f->ctx, "%s: byte %zu: %s: %s", r->f->path, off, field, what);
    return r->st = KILN_ERR_PARSE;
}

static bool need(rd *r, size_t n, const char *field)
{
    if (n <= r->f->size - r->off) return true;
    fail(r, r->off, field, "truncated: needs %zu bytes, %zu left in the file", n, r->f->size - r->off);
    return false;
}

static bool rd_u32(rd *r, uint32_t *v, const char *field)
{
    if (!need(r, 4, field)) return false;
    memcpy(v, r->f->base + r->off, 4);
    r->off += 4;
    return true;
}

static bool rd_u64(rd *r, uint64_t *v, const char *field)
{
    if (!need(r, 8, field)) return false;
    memcpy(v, r->f->base + r->off, 8);
    r->off += 8;
    return true;
}

/* Reads a string's length and skips its bytes; *at = offset of the bytes. */
static bool rd_str(rd *r, size_t *at, uint64_t *len, const char *field)
{
    size_t start = r->off;
    if (!rd_u64(r, len, field)) return false;
    if (*len > r->f->size - r->off) {
        fail(r, start, field, "string length %llu runs past the end of the file (%zu bytes left)",
             (unsigned long long)*len, r->f->size - r->off);
        return false;
    }
    *at = r->off;
    r->off += (size_t)*len;
    return true;
}

static char *dup_bytes(const uint8_t *p, size_t n)
{
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, p, n);
        s[n] = 0;
    }
    return s;
}

size_t kiln_gguf_scalar_size(kiln_gguf_type t)
{
    static const size_t sz[KILN_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return (unsigned)t < KILN_GGUF_TYPE_COUNT ? sz[t] : 0;
}

/* Reads one metadata value of type t into kv (arrays: t is ARRAY and the header follows). */
static bool rd_value(rd *r, gguf_kv *kv, const char *key)
{
    size_t at = r->off;
    if (kv->type == KILN_GGUF_STRING) {
        uint64_t len;
        if (!rd_str(r, &kv->off, &len, key)) return false;
        if (!(kv->str = dup_bytes(r->f->base + kv->off, (size_t)len))) return r->st = KILN_ERR_NOMEM, false;
        kv->n = 1;
        return true;
    }
    if (kv->type != KILN_GGUF_ARRAY) {
        size_t sz = kiln_gguf_scalar_size(kv->type);
        if (!need(r, sz, key)) return false;
        if (kv->type == KILN_GGUF_BOOL && r->f->base[r->off] > 1)
            return fail(r, r->off, key, "bool value %u is neither 0 nor 1", r->f->base[r->off]), false;
        kv->off = r->off;
        kv->n = 1;
        r->off += sz;
        return true;
    }
    uint32_t et;
    if (!rd_u32(r, &et, key)) return false;
    if (et >= KILN_GGUF_TYPE_COUNT) return fail(r, at, key, "unknown array element type %u", et), false;
    if (et == KILN_GGUF_ARRAY) return fail(r, at, key, "arrays of arrays are not supported"), false;
    kv->arr_type = (kiln_gguf_type)et;
    size_t n_at = r->off;
    if (!rd_u64(r, &kv->n, key)) return false;
    size_t left = r->f->size - r->off;
    if (et == KILN_GGUF_STRING) {
        if (kv->n > left / 8)
            return fail(r, n_at, key, "array of %llu strings runs past the end of the file (%zu bytes left)",
                        (unsigned long long)kv->n, left), false;
        kv->off = r->off;
        if (!(kv->str_offs = malloc((size_t)(kv->n ? kv->n : 1) * sizeof *kv->str_offs)))
            return r->st = KILN_ERR_NOMEM, false;
        for (uint64_t i = 0; i < kv->n; i++) {
            size_t s_at;
            uint64_t len;
            kv->str_offs[i] = r->off;
            if (!rd_str(r, &s_at, &len, key)) return false;
        }
        return true;
    }
    size_t sz = kiln_gguf_scalar_size(kv->arr_type);
    if (kv->n > left / sz)
        return fail(r, n_at, key, "array of %llu %s values runs past the end of the file (%zu bytes left)",
                    (unsigned long long)kv->n, kiln_gguf_type_name(kv->arr_type), left), false;
    kv->off = r->off;
    if (kv->arr_type == KILN_GGUF_BOOL)
        for (uint64_t i = 0; i < kv->n; i++)
            if (r->f->base[r->off + i] > 1)
                return fail(r, r->off + (size_t)i, key, "bool element %llu is %u, neither 0 nor 1",
                            (unsigned long long)i, r->f->base[r->off + i]), false;
    r->off += (size_t)(kv->n * sz);
    return true;
}

static bool rd_kvs(rd *r)
{
    for (uint64_t i = 0; i < r->f->n_kv; i++) {
        gguf_kv *kv = &r->f->kvs[i];
        size_t at = r->off;
        uint64_t len;
        size_t key_at;
        char field[64];
        snprintf(field, sizeof field, "key of metadata entry %llu", (unsigned long long)i);
        if (!rd_str(r, &key_at, &len, field)) return false;
        if (!(kv->key = dup_bytes(r->f->base + key_at, (size_t)len))) return r->st = KILN_ERR_NOMEM, false;
        if (strlen(kv->key) != len) return fail(r, at, field, "key contains a NUL byte"), false;
        gguf_kv *dup;
        HASH_FIND_STR(r->f->kv_by_key, kv->key, dup);
        if (dup) return fail(r, at, kv->key, "duplicate metadata key"), false;
        HASH_ADD_KEYPTR(hh, r->f->kv_by_key, kv->key, strlen(kv->key), kv);
        uint32_t t;
        size_t t_at = r->off;
        if (!rd_u32(r, &t, kv->key)) return false;
        if (t >= KILN_GGUF_TYPE_COUNT) return fail(r, t_at, kv->key, "unknown value type %u", t), false;
        kv->type = (kiln_gguf_type)t;
        if (!rd_value(r, kv, kv->key)) return false;
    }
    return true;
}

static bool rd_tensor_infos(rd *r)
{
    for (uint64_t i = 0; i < r->f->n_tensors; i++) {
        gguf_tensor *t = &r->f->tensors[i];
        t->info_off = r->off;
        uint64_t len;
        size_t name_at;
        char field[96];
        snprintf(field, sizeof field, "name of tensor %llu", (unsigned long long)i);
        if (!rd_str(r, &name_at, &len, field)) return false;
        if (!(t->name = dup_bytes(r->f->base + name_at, (size_t)len))) return r->st = KILN_ERR_NOMEM, false;
        if (strlen(t->name) != len) return fail(r, t->info_off, field, "name contains a NUL byte"), false;
        gguf_tensor *dup;
        HASH_FIND_STR(r->f->t_by_name, t->name, dup);
        if (dup) return fail(r, t->info_off, t->name, "duplicate tensor name"), false;
        HASH_ADD_KEYPTR(hh, r->f->t_by_name, t->name, strlen(t->name), t);
        uint32_t nd;
        size_t at = r->off;
        snprintf(field, sizeof field, "tensor '%.60s' n_dims", t->name);
        if (!rd_u32(r, &nd, field)) return false;
        if (nd < 1 || nd > GGUF_MAX_DIMS) return fail(r, at, field, "%u dims (1 to %d allowed)", nd, GGUF_MAX_DIMS), false;
        t->rank = (int)nd;
        int64_t numel = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t ne;
            at = r->off;
            snprintf(field, sizeof field, "tensor '%.60s' ne[%u]", t->name, d);
            if (!rd_u64(r, &ne, field)) return false;
            if (ne < 1 || ne > (uint64_t)INT64_MAX / (uint64_t)numel)
                return fail(r, at, field, "dim %llu is zero or overflows the element count", (unsigned long long)ne), false;
            t->ne[d] = (int64_t)ne;
            numel *= (int64_t)ne;
        }
        at = r->off;
        snprintf(field, sizeof field, "tensor '%.60s' type", t->name);
        if (!rd_u32(r, &t->ggml_type, field)) return false;
        int64_t block;
        size_t bb;
        if (!kiln_gguf_type_size(t->ggml_type, &block, &bb))
            return fail(r, at, field, "unknown tensor type %u", t->ggml_type), false;
        if (t->ne[0] % block)
            return fail(r, at, field, "row length %lld is not a multiple of the %s block (%lld)", (long long)t->ne[0],
                        kiln_gguf_type_label(t->ggml_type), (long long)block), false;
        uint64_t blocks = (uint64_t)(numel / block);
        if (blocks > SIZE_MAX / bb) return fail(r, at, field, "data size overflows"), false;
        t->bytes = blocks * bb;
        at = r->off;
        snprintf(field, sizeof field, "tensor '%.60s' offset", t->name);
        if (!rd_u64(r, &t->rel_off, field)) return false;
        if (t->rel_off % r->f->alignment)
            return fail(r, at, field, "data offset %llu is not a multiple of the alignment %u",
                        (unsigned long long)t->rel_off, r->f->alignment), false;
    }
    return true;
}

static int cmp_off(const void *a, const void *b)
{
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    return x->rel_off < y->rel_off ? -1 : x->rel_off > y->rel_off;
}

/* Tensor data must lie inside the file and not overlap. */
static bool check_layout(rd *r)
{
    kiln_gguf *f = r->f;
    size_t a = f->alignment, end = r->off;
    f->data_off = end + (a - end % a) % a;
    if (f->n_tensors && f->data_off > f->size)
        return fail(r, end, "tensor data", "the data section (aligned to %u at byte %zu) starts past the end of the file",
                    f->alignment, f->data_off), false;
    gguf_tensor **order = malloc((size_t)(f->n_tensors ? f->n_tensors : 1) * sizeof *order);
    if (!order) return r->st = KILN_ERR_NOMEM, false;
    for (uint64_t i = 0; i < f->n_tensors; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)f->n_tensors, sizeof *order, cmp_off);
    size_t room = f->size - (f->data_off < f->size ? f->data_off : f->size);
    bool ok = true;
    for (uint64_t i = 0; ok && i < f->n_tensors; i++) {
        const gguf_tensor *t = order[i];
        if (t->rel_off > room || t->bytes > room - t->rel_off)
            ok = !fail(r, f->data_off + (size_t)(t->rel_off < room ? t->rel_off : room), t->name,
                       "data (%llu bytes at data offset %llu) runs past the end of the file (%zu bytes of data)",
                       (unsigned long long)t->bytes, (unsigned long long)t->rel_off, room);
        else if (i + 1 < f->n_tensors && t->rel_off + t->bytes > order[i + 1]->rel_off)
            ok = !fail(r, f->data_off + (size_t)order[i + 1]->rel_off, order[i + 1]->name,
                       "data overlaps tensor '%s' (bytes %llu..%llu of the data section)", t->name,
                       (unsigned long long)t->rel_off, (unsigned long long)(t->rel_off + t->bytes));
    }
    free(order);
    return ok;
}

static bool rd_alignment(rd *r)
{
    gguf_kv *kv;
    HASH_FIND_STR(r->f->kv_by_key, "general.alignment", kv);
    r->f->alignment = 32;
    if (!kv) return true;
    if (kv->type != KILN_GGUF_U32)
        return fail(r, kv->off, "general.alignment", "type %s, expected u32", kiln_gguf_type_name(kv->type)), false;
    uint32_t a;
    memcpy(&a, r->f->base + kv->off, 4);
    if (a == 0 || (a & (a - 1)))
        return fail(r, kv->off, "general.alignment", "%u is not a power of two", a), false;
    /* The format requires a multiple of 8, and kernels load f32/f16/bf16/q8_0 data in place:
     * a smaller alignment would make those loads misaligned (issue #17). */
    if (a % 8)
        return fail(r, kv->off, "general.alignment", "%u is not a multiple of 8 (the format requires it; tensor data "
                    "would be loaded from misaligned addresses)", a), false;
    r->f->alignment = a;
    return true;
}

static kiln_status parse(kiln_gguf *f)
{
    rd r = {.f = f};
    uint32_t magic;
    if (!rd_u32(&r, &magic, "magic")) return r.st;
    if (magic != GGUF_MAGIC) return fail(&r, 0, "magic", "not a GGUF file (magic 0x%08x)", magic);
    if (!rd_u32(&r, &f->version, "version")) return r.st;
    if (f->version == 0x03000000u || f->version == 0x02000000u)
        return fail(&r, 4, "version", "big-endian GGUF files are not supported");
    if (f->version != 2 && f->version != 3)
        return fail(&r, 4, "version", "version %u (kiln reads 2 and 3)", f->version);
    size_t at = r.off;
    if (!rd_u64(&r, &f->n_tensors, "tensor_count")) return r.st;
    /* Each tensor info takes at least 8 (name) + 4 + 8 + 4 + 8 bytes; each key-value 8 + 4 + 1. */
    if (f->n_tensors > (f->size - r.off) / 32)
        return fail(&r, at, "tensor_count", "%llu tensors cannot fit in the file", (unsigned long long)f->n_tensors);
    at = r.off;
    if (!rd_u64(&r, &f->n_kv, "metadata_kv_count")) return r.st;
    if (f->n_kv > (f->size - r.off) / 13)
        return fail(&r, at, "metadata_kv_count", "%llu key-values cannot fit in the file", (unsigned long long)f->n_kv);
    f->kvs = calloc((size_t)f->n_kv + 1, sizeof *f->kvs);
    f->tensors = calloc((size_t)f->n_tensors + 1, sizeof *f->tensors);
    if (!f->kvs || !f->tensors) return KILN_ERR_NOMEM;
    if (!rd_kvs(&r) || !rd_alignment(&r) || !rd_tensor_infos(&r) || !check_layout(&r)) {
        if (r.st == KILN_ERR_NOMEM) kiln_ctx_set_error(f->ctx, "%s: out of memory while parsing", f->path);
        return r.st;
    }
    return KILN_OK;
}

static kiln_status open_common(kiln_ctx *ctx, kiln_gguf *f, kiln_gguf **out)
{
    f->n_parts = 1;
    f->total = f->size;
    kiln_status s = parse(f);
    if (s != KILN_OK) {
        if (s == KILN_ERR_NOMEM && !kiln_ctx_error(ctx)[0]) kiln_ctx_set_error(ctx, "%s: out of memory", f->path);
        kiln_gguf_close(f);
        return s;
    }
    *out = f;
    return KILN_OK;
}

KILN_API kiln_status kiln_gguf_open_memory(kiln_ctx *ctx, const void *data, size_t bytes, kiln_gguf **out)
{
    if (out) *out = NULL;
    if (!ctx || !out || (!data && bytes)) {
        if (ctx) kiln_ctx_set_error(ctx, "kiln_gguf_open_memory: NULL argument");
        return KILN_ERR_INVALID_ARG;
    }
    kiln_ctx_set_error(ctx, "%s", "");
    kiln_gguf *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup("<memory>"))) {
        free(f);
        return kiln_ctx_fail(ctx, KILN_ERR_NOMEM, "kiln_gguf_open_memory: out of memory");
    }
    f->ctx = ctx;
    f->base = data ? data : (const uint8_t *)"";
    f->size = bytes;
    kiln_status s = open_common(ctx, f, out);
    if (s == KILN_OK && (s = kiln_gguf_join_parts(f, false)) != KILN_OK) { /* a split part: refused */
        kiln_gguf_close(f);
        *out = NULL;
        return s;
    }
    if (s == KILN_OK && f->n_tensors && (uintptr_t)data % 8) { /* tensor data is used in place */
        kiln_gguf_close(f);
        *out = NULL;
        return kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "kiln_gguf_open_memory: the buffer at %p holds tensors but is not 8-byte aligned",
                             data);
    }
    return s;
}

KILN_API kiln_status kiln_gguf_open(kiln_ctx *ctx, const char *path, kiln_gguf **out)
{
    if (out) *out = NULL;
    if (!ctx || !path || !out) {
        if (ctx) kiln_ctx_set_error(ctx, "kiln_gguf_open: NULL argument");
        return KILN_ERR_INVALID_ARG;
    }
    kiln_ctx_set_error(ctx, "%s", "");
    kiln_status s = kiln_gguf_open_one(ctx, path, out);
    if (s == KILN_OK && (s = kiln_gguf_join_parts(*out, true)) != KILN_OK) {
        kiln_gguf_close(*out);
        *out = NULL;
    }
    return s;
}

kiln_status kiln_gguf_open_one(kiln_ctx *ctx, const char *path, kiln_gguf **out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kiln_ctx_fail(ctx, KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return kiln_ctx_fail(ctx, KILN_ERR_IO, "%s: not a regular file", path);
    }
    kiln_gguf *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        close(fd);
        return kiln_ctx_fail(ctx, KILN_ERR_NOMEM, "%s: out of memory", path);
    }
    f->ctx = ctx;
    f->size = (size_t)st.st_size;
    f->base = (const uint8_t *)"";
    if (f->size) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            kiln_gguf_close(f);
            return kiln_ctx_fail(ctx, KILN_ERR_IO, "%s: cannot map %zu bytes: %s", path, (size_t)st.st_size, strerror(e));
        }
        f->base = m;
        f->mapped = true;
    }
    close(fd);
    return open_common(ctx, f, out);
}

KILN_API void kiln_gguf_close(kiln_gguf *f)
{
    if (!f) return;
    HASH_CLEAR(hh, f->kv_by_key);
    HASH_CLEAR(hh, f->t_by_name);
    for (uint64_t i = 0; f->kvs && i < f->n_kv; i++) {
        free(f->kvs[i].key);
        free(f->kvs[i].str);
        free(f->kvs[i].str_offs);
    }
    for (uint64_t i = 0; f->tensors && i < f->n_tensors; i++) free(f->tensors[i].name);
    for (int i = 0; f->parts && i < f->n_parts - 1; i++) kiln_gguf_close(f->parts[i]);
    free(f->parts);
    free(f->kvs);
    free(f->tensors);
    if (f->mapped) munmap((void *)f->base, f->size);
    free(f->path);
    free(f);
}
