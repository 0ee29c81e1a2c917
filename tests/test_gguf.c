/* Tests of the GGUF loader: files written by tests/support/gguf_writer round-trip every metadata
 * type and tensor type (dims reversed to kiln order, data bytes in place); every malformed-file
 * path fails with KILN_ERR_PARSE naming the byte offset and the field; every prefix and random
 * corruption of a valid file is an error or a valid file, never a crash. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "support/gguf_writer.h"
#include "support/testutil.h"

static kiln_ctx *ctx;
static void setup(void) { cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.n_threads = 1, .quiet = true}, &ctx), KILN_OK); }
static void teardown(void) { kiln_ctx_free(ctx); }
TestSuite(gguf, .init = setup, .fini = teardown);

/* Raw byte builder for hand-made (malformed) files. */
typedef struct raw {
    uint8_t b[4096]; /* bytes */
    size_t  n;       /* used */
} raw;
static void r_put(raw *r, const void *p, size_t n)
{
    cr_assert(r->n + n <= sizeof r->b);
    memcpy(r->b + r->n, p, n);
    r->n += n;
}
static void r_u32(raw *r, uint32_t v) { r_put(r, &v, 4); }
static void r_u64(raw *r, uint64_t v) { r_put(r, &v, 8); }
static void r_str(raw *r, const char *s)
{
    r_u64(r, strlen(s));
    r_put(r, s, strlen(s));
}
static void r_header(raw *r, uint64_t n_t, uint64_t n_kv)
{
    r->n = 0;
    r_u32(r, 0x46554747u);
    r_u32(r, 3);
    r_u64(r, n_t);
    r_u64(r, n_kv);
}
static void r_pad(raw *r, size_t a)
{
    while (r->n % a) r_put(r, "", 1);
}

/* Opening the bytes must fail with status s and a message holding every string in want[]. */
static void expect_fail(const void *p, size_t n, kiln_status s, const char *what, const char *const *want, int n_want)
{
    kiln_gguf *f = (kiln_gguf *)1;
    kiln_status got = kiln_gguf_open_memory(ctx, p, n, &f);
    cr_assert_eq(got, s, "%s: status %s, want %s (%s)", what, kiln_status_str(got), kiln_status_str(s), kiln_ctx_error(ctx));
    cr_assert_null(f, "%s: *out not NULL on error", what);
    for (int i = 0; i < n_want; i++)
        cr_assert(strstr(kiln_ctx_error(ctx), want[i]), "%s: message lacks '%s': %s", what, want[i], kiln_ctx_error(ctx));
}
#define FAIL(bytes, n, what, ...)                                                                                    \
    do {                                                                                                             \
        const char *w_[] = {__VA_ARGS__};                                                                            \
        expect_fail(bytes, n, KILN_ERR_PARSE, what, w_, (int)(sizeof w_ / sizeof w_[0]));                            \
    } while (0)

Test(gguf, metadata_of_every_type_round_trips)
{
    gw *w = gw_new(3, 64);
    uint8_t u8 = 200;
    int8_t i8 = -100;
    uint16_t u16 = 60000;
    int16_t i16 = -30000;
    uint32_t u32 = 4000000000u;
    int32_t i32 = -2000000000;
    float f32 = 3.25f;
    bool bl = true;
    uint64_t u64 = 0xfedcba9876543210ull;
    int64_t i64 = INT64_MIN + 5;
    double f64 = -1.0 / 3.0;
    gw_kv(w, "a.u8", KILN_GGUF_U8, &u8);
    gw_kv(w, "a.i8", KILN_GGUF_I8, &i8);
    gw_kv(w, "a.u16", KILN_GGUF_U16, &u16);
    gw_kv(w, "a.i16", KILN_GGUF_I16, &i16);
    gw_kv(w, "a.u32", KILN_GGUF_U32, &u32);
    gw_kv(w, "a.i32", KILN_GGUF_I32, &i32);
    gw_kv(w, "a.f32", KILN_GGUF_F32, &f32);
    gw_kv(w, "a.bool", KILN_GGUF_BOOL, &bl);
    gw_kv_str(w, "a.str", "héllo wörld");
    gw_kv(w, "a.u64", KILN_GGUF_U64, &u64);
    gw_kv(w, "a.i64", KILN_GGUF_I64, &i64);
    gw_kv(w, "a.f64", KILN_GGUF_F64, &f64);
    int32_t arr[5] = {1, -2, 3, -4, 5};
    gw_kv_arr(w, "a.arr_i32", KILN_GGUF_I32, 5, arr);
    double arr64[3] = {0.5, -1e300, 7};
    gw_kv_arr(w, "a.arr_f64", KILN_GGUF_F64, 3, arr64);
    gw_kv_arr(w, "a.arr_empty", KILN_GGUF_U8, 0, NULL);
    const char *strs[3] = {"", "b", "third string"};
    gw_kv_arr_str(w, "a.arr_str", 3, strs);
    size_t n;
    uint8_t *bytes = gw_bytes(w, &n);
    gw_free(w);
    kiln_gguf *f;
    cr_assert_eq(kiln_gguf_open_memory(ctx, bytes, n, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_gguf_version(f), 3);
    cr_assert_eq(kiln_gguf_alignment(f), 64);
    cr_assert_eq(kiln_gguf_kv_count(f), 17);
    cr_assert_str_eq(kiln_gguf_kv_key(f, 0), "general.alignment");
    cr_assert_str_eq(kiln_gguf_kv_key(f, 9), "a.str");
    cr_assert_eq(kiln_gguf_kv_type(f, 9), KILN_GGUF_STRING);
    cr_assert_eq(kiln_gguf_kv_find(f, "a.f64"), 12);
    cr_assert_eq(kiln_gguf_kv_find(f, "nope"), -1);
    cr_assert_null(kiln_gguf_kv_key(f, 17));
    int64_t v64;
    uint64_t vu64;
    uint32_t vu32;
    int32_t vi32;
    cr_assert_eq(kiln_gguf_get_i64(f, "a.u8", &v64), KILN_OK);
    cr_assert_eq(v64, 200);
    cr_assert_eq(kiln_gguf_get_i64(f, "a.i8", &v64), KILN_OK);
    cr_assert_eq(v64, -100);
    cr_assert_eq(kiln_gguf_get_u32(f, "a.u16", &vu32), KILN_OK);
    cr_assert_eq(vu32, 60000);
    cr_assert_eq(kiln_gguf_get_i32(f, "a.i16", &vi32), KILN_OK);
    cr_assert_eq(vi32, -30000);
    cr_assert_eq(kiln_gguf_get_u32(f, "a.u32", &vu32), KILN_OK);
    cr_assert_eq(vu32, 4000000000u);
    cr_assert_eq(kiln_gguf_get_i32(f, "a.u32", &vi32), KILN_ERR_SHAPE, "4e9 does not fit i32");
    cr_assert_eq(kiln_gguf_get_i32(f, "a.i32", &vi32), KILN_OK);
    cr_assert_eq(vi32, -2000000000);
    cr_assert_eq(kiln_gguf_get_u32(f, "a.i32", &vu32), KILN_ERR_SHAPE, "negative into u32");
    cr_assert(strstr(kiln_ctx_error(ctx), "a.i32"), "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_gguf_get_u64(f, "a.u64", &vu64), KILN_OK);
    cr_assert_eq(vu64, u64);
    cr_assert_eq(kiln_gguf_get_i64(f, "a.u64", &v64), KILN_ERR_SHAPE);
    cr_assert_eq(kiln_gguf_get_i64(f, "a.i64", &v64), KILN_OK);
    cr_assert_eq(v64, i64);
    float vf;
    double vd;
    cr_assert_eq(kiln_gguf_get_f32(f, "a.f32", &vf), KILN_OK);
    cr_assert_eq(vf, 3.25f);
    cr_assert_eq(kiln_gguf_get_f64(f, "a.f64", &vd), KILN_OK);
    cr_assert_eq(vd, f64);
    cr_assert_eq(kiln_gguf_get_f32(f, "a.u32", &vf), KILN_ERR_DTYPE);
    cr_assert(strstr(kiln_ctx_error(ctx), "a.u32") && strstr(kiln_ctx_error(ctx), "u32"), "%s", kiln_ctx_error(ctx));
    bool vb = false;
    cr_assert_eq(kiln_gguf_get_bool(f, "a.bool", &vb), KILN_OK);
    cr_assert(vb);
    cr_assert_eq(kiln_gguf_get_bool(f, "a.u8", &vb), KILN_ERR_DTYPE);
    const char *s;
    size_t len;
    cr_assert_eq(kiln_gguf_get_str(f, "a.str", &s, &len), KILN_OK);
    cr_assert_str_eq(s, "héllo wörld");
    cr_assert_eq(len, strlen("héllo wörld"));
    cr_assert_eq(kiln_gguf_get_str(f, "missing.key", &s, &len), KILN_ERR_NAME);
    cr_assert(strstr(kiln_ctx_error(ctx), "missing.key"));
    kiln_gguf_type et;
    uint64_t cnt;
    const void *data;
    cr_assert_eq(kiln_gguf_get_arr(f, "a.arr_i32", &et, &cnt, &data), KILN_OK);
    cr_assert_eq(et, KILN_GGUF_I32);
    cr_assert_eq(cnt, 5);
    int32_t got[5];
    memcpy(got, data, sizeof got);
    cr_assert_arr_eq(got, arr, sizeof arr);
    cr_assert_eq(kiln_gguf_get_arr(f, "a.arr_f64", &et, &cnt, &data), KILN_OK);
    double got64[3];
    memcpy(got64, data, sizeof got64);
    cr_assert(et == KILN_GGUF_F64 && cnt == 3 && got64[1] == -1e300 && got64[2] == 7);
    cr_assert_eq(kiln_gguf_get_arr(f, "a.arr_empty", &et, &cnt, NULL), KILN_OK);
    cr_assert(et == KILN_GGUF_U8 && cnt == 0);
    cr_assert_eq(kiln_gguf_get_arr(f, "a.arr_str", &et, &cnt, &data), KILN_OK);
    cr_assert(et == KILN_GGUF_STRING && cnt == 3 && data == NULL);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(kiln_gguf_get_arr_str(f, "a.arr_str", (uint64_t)i, &s, &len), KILN_OK);
        cr_assert(len == strlen(strs[i]) && memcmp(s, strs[i], len) == 0, "string %d", i);
    }
    cr_assert_eq(kiln_gguf_get_arr_str(f, "a.arr_str", 3, &s, &len), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_gguf_get_arr_str(f, "a.arr_i32", 0, &s, &len), KILN_ERR_DTYPE);
    cr_assert_eq(kiln_gguf_get_arr(f, "a.str", &et, &cnt, NULL), KILN_ERR_DTYPE);
    cr_assert_eq(kiln_gguf_tensor_count(f), 0);
    kiln_gguf_close(f);
    free(bytes);
    kiln_gguf_close(NULL);
}

/* Every kiln tensor type, written from random values, comes back with reversed dims, its bytes in
 * place at an aligned offset; v2 files read the same. */
Test(gguf, tensors_of_every_kiln_type_round_trip)
{
    static const kiln_dtype types[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_Q8_0,
                                       KILN_DTYPE_Q4_K, KILN_DTYPE_Q5_K, KILN_DTYPE_Q6_K};
    static const uint32_t ids[] = {0, 1, 30, 8, 12, 13, 14};
    for (uint32_t version = 2; version <= 3; version++) {
        gw *w = gw_new(version, version == 2 ? 0 : 128);
        void *src[7];
        size_t sz[7];
        for (int i = 0; i < 7; i++) {
            float v[3 * 512];
            tu_fill(v, 3 * 512, -2, 2);
            src[i] = tu_to_dtype(types[i], v, 3 * 512, &sz[i]);
            char name[32];
            snprintf(name, sizeof name, "t.%s", kiln_dtype_name(types[i]));
            int64_t dims[3] = {3, 1, 512};
            gw_tensor(w, name, ids[i], i == 0 ? 3 : 2, i == 0 ? dims : (int64_t[]){3, 512}, src[i], sz[i]);
        }
        size_t n;
        uint8_t *bytes = gw_bytes(w, &n);
        gw_free(w);
        kiln_gguf *f;
        cr_assert_eq(kiln_gguf_open_memory(ctx, bytes, n, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
        cr_assert_eq(kiln_gguf_version(f), version);
        cr_assert_eq(kiln_gguf_tensor_count(f), 7);
        for (int i = 0; i < 7; i++) {
            char name[32];
            snprintf(name, sizeof name, "t.%s", kiln_dtype_name(types[i]));
            kiln_gguf_tensor t;
            cr_assert_eq(kiln_gguf_tensor_get(f, name, &t), KILN_OK, "%s", kiln_ctx_error(ctx));
            cr_assert_eq(t.t, types[i], "%s", name);
            cr_assert_eq(t.ggml_type, ids[i]);
            cr_assert_eq(t.rank, i == 0 ? 3 : 2);
            cr_assert(t.dims[0] == 3 && t.dims[t.rank - 1] == 512, "%s dims", name);
            cr_assert_eq(t.bytes, sz[i]);
            cr_assert_eq(t.offset % kiln_gguf_alignment(f), 0);
            cr_assert_eq((const uint8_t *)t.data, bytes + t.offset);
            cr_assert(memcmp(t.data, src[i], sz[i]) == 0, "%s bytes", name);
            kiln_gguf_tensor u;
            cr_assert_eq(kiln_gguf_tensor_at(f, i, &u), KILN_OK);
            cr_assert_str_eq(u.name, name);
            free(src[i]);
        }
        kiln_gguf_tensor t;
        cr_assert_eq(kiln_gguf_tensor_get(f, "nope", &t), KILN_ERR_NAME);
        cr_assert(strstr(kiln_ctx_error(ctx), "nope"));
        cr_assert_eq(kiln_gguf_tensor_at(f, 7, &t), KILN_ERR_INVALID_ARG);
        kiln_gguf_close(f);
        free(bytes);
    }
}

Test(gguf, unsupported_tensor_type_opens_but_fails_by_name)
{
    gw *w = gw_new(3, 0);
    uint8_t tq2[66] = {0}; /* tq2_0 (ggml id 35): one block of 256 */
    gw_tensor(w, "blk.0.attn_q.weight", 35, 1, (int64_t[]){256}, tq2, sizeof tq2);
    size_t n;
    uint8_t *bytes = gw_bytes(w, &n);
    gw_free(w);
    kiln_gguf *f;
    cr_assert_eq(kiln_gguf_open_memory(ctx, bytes, n, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_gguf_tensor t;
    cr_assert_eq(kiln_gguf_tensor_at(f, 0, &t), KILN_OK);
    cr_assert(t.t == KILN_DTYPE_COUNT && strcmp(t.type_name, "tq2_0") == 0 && t.bytes == 66);
    cr_assert_eq(kiln_gguf_tensor_get(f, "blk.0.attn_q.weight", &t), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_ctx_error(ctx), "blk.0.attn_q.weight") && strstr(kiln_ctx_error(ctx), "tq2_0"), "%s",
              kiln_ctx_error(ctx));
    kiln_gguf_close(f);
    free(bytes);
}

/* general.alignment 1, 2 or 4 (the format requires a multiple of 8) made kernels load f32 and f16
 * data from odd addresses (issue #17): refused naming the key, whether opened from a file or from
 * memory; 8 and 64 open. A buffer that is not 8-byte aligned itself is refused too. */
Test(gguf, alignment_not_a_multiple_of_8_is_refused)
{
    const uint32_t aligns[] = {1, 2, 4, 8, 64};
    for (int i = 0; i < 5; i++) {
        gw *w = gw_new(3, aligns[i]);
        uint16_t h = 0x3c00;   /* 1.0 in f16: the next tensor starts 2 bytes in at alignment 1 or 2 */
        float x[3] = {1, 2, 3};
        gw_tensor(w, "a", 1, 1, (int64_t[]){1}, &h, sizeof h);
        gw_tensor(w, "b", 0, 1, (int64_t[]){3}, x, sizeof x);
        char path[] = "/tmp/kiln-test-align-XXXXXX";
        int fd = mkstemp(path);
        cr_assert_geq(fd, 0);
        close(fd);
        cr_assert_eq(gw_write(w, path), 0);
        size_t n;
        uint8_t *bytes = gw_bytes(w, &n);
        gw_free(w);
        kiln_gguf *f = NULL;
        kiln_status s = kiln_gguf_open(ctx, path, &f);
        unlink(path);
        if (aligns[i] % 8) {
            cr_expect_eq(s, KILN_ERR_PARSE, "alignment %u: %s", aligns[i], kiln_status_str(s));
            cr_expect(strstr(kiln_ctx_error(ctx), "general.alignment") && strstr(kiln_ctx_error(ctx), "not a multiple of 8"),
                      "alignment %u: %s", aligns[i], kiln_ctx_error(ctx));
            FAIL(bytes, n, "alignment not a multiple of 8", "general.alignment", "not a multiple of 8");
        } else {
            cr_expect_eq(s, KILN_OK, "alignment %u: %s", aligns[i], kiln_ctx_error(ctx));
            kiln_gguf_tensor t;
            cr_expect_eq(kiln_gguf_tensor_get(f, "b", &t), KILN_OK, "%s", kiln_ctx_error(ctx));
            cr_expect_eq((uintptr_t)t.data % 8, 0, "tensor data aligned");
            cr_expect(memcmp(t.data, x, sizeof x) == 0);
            kiln_gguf_close(f);
        }
        if (aligns[i] == 8) { /* the same bytes one byte into a buffer */
            uint8_t *odd = malloc(n + 8);
            memcpy(odd + 1, bytes, n);
            f = (kiln_gguf *)1;
            cr_expect_eq(kiln_gguf_open_memory(ctx, odd + 1, n, &f), KILN_ERR_INVALID_ARG);
            cr_expect_null(f);
            cr_expect(strstr(kiln_ctx_error(ctx), "not 8-byte aligned"), "%s", kiln_ctx_error(ctx));
            free(odd);
        }
        free(bytes);
    }
}

Test(gguf, open_file_maps_and_reports_io_errors)
{
    char path[] = "/tmp/kiln_gguf_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    gw *w = gw_new(3, 0);
    gw_kv_str(w, "general.architecture", "llama");
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    gw_tensor(w, "x", 0, 2, (int64_t[]){2, 4}, v, sizeof v);
    cr_assert_eq(gw_write(w, path), 0);
    gw_free(w);
    kiln_gguf *f;
    cr_assert_eq(kiln_gguf_open(ctx, path, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_gguf_tensor t;
    cr_assert_eq(kiln_gguf_tensor_get(f, "x", &t), KILN_OK);
    cr_assert(memcmp(t.data, v, sizeof v) == 0 && t.dims[0] == 2 && t.dims[1] == 4);
    kiln_gguf_close(f);
    FILE *e = fopen(path, "w"); /* an empty file */
    fclose(e);
    cr_assert_eq(kiln_gguf_open(ctx, path, &f), KILN_ERR_PARSE);
    cr_assert(strstr(kiln_ctx_error(ctx), "byte 0") && strstr(kiln_ctx_error(ctx), "magic"), "%s", kiln_ctx_error(ctx));
    unlink(path);
    cr_assert_eq(kiln_gguf_open(ctx, path, &f), KILN_ERR_IO);
    cr_assert(strstr(kiln_ctx_error(ctx), path));
    cr_assert_eq(kiln_gguf_open(ctx, "/", &f), KILN_ERR_IO);
    cr_assert_eq(kiln_gguf_open(ctx, NULL, &f), KILN_ERR_INVALID_ARG);
}

Test(gguf, malformed_headers_name_offset_and_field)
{
    raw r;
    FAIL("GGU", 3, "short magic", "byte 0", "magic", "truncated");
    FAIL("GGML\3\0\0\0", 8, "bad magic", "byte 0", "magic", "not a GGUF");
    r_header(&r, 0, 0);
    memcpy(r.b + 4, "\1\0\0\0", 4);
    FAIL(r.b, r.n, "version 1", "byte 4", "version", "version 1");
    memcpy(r.b + 4, "\0\0\0\3", 4);
    FAIL(r.b, r.n, "big-endian", "byte 4", "big-endian");
    r_header(&r, 0, 0);
    FAIL(r.b, 12, "truncated tensor_count", "byte 8", "tensor_count", "truncated");
    FAIL(r.b, 20, "truncated kv count", "byte 16", "metadata_kv_count");
    r_header(&r, UINT64_MAX, 0);
    FAIL(r.b, r.n, "huge tensor count", "byte 8", "tensor_count");
    r_header(&r, 0, UINT64_MAX / 2);
    FAIL(r.b, r.n, "huge kv count", "byte 16", "metadata_kv_count");
    r_header(&r, 0, 1);
    r_u64(&r, UINT64_MAX);
    r_u32(&r, 4);
    r_u32(&r, 0);
    FAIL(r.b, r.n, "key length overflow", "byte 24", "key of metadata entry 0", "runs past");
    r_header(&r, 0, 1);
    r_str(&r, "k");
    r_u32(&r, 13);
    r_u64(&r, 0);
    FAIL(r.b, r.n, "unknown value type", "byte 33", ": k: ", "unknown value type 13");
    r_header(&r, 0, 1);
    r_str(&r, "k");
    r_u32(&r, KILN_GGUF_STRING);
    r_u64(&r, 1000);
    r_put(&r, "abc", 3);
    FAIL(r.b, r.n, "string value past end", "byte 37", "k", "1000");
    r_header(&r, 0, 1);
    r_str(&r, "k");
    r_u32(&r, KILN_GGUF_ARRAY);
    r_u32(&r, 77);
    r_u64(&r, 1);
    FAIL(r.b, r.n, "unknown array element type", "byte 37", "element type 77");
    r_header(&r, 0, 1);
    r_str(&r, "k");
    r_u32(&r, KILN_GGUF_ARRAY);
    r_u32(&r, KILN_GGUF_ARRAY);
    r_u64(&r, 1);
    FAIL(r.b, r.n, "nested array", "byte 37", "arrays of arrays");
    r_header(&r, 0, 1);
    r_str(&r, "k");
    r_u32(&r, KILN_GGUF_ARRAY);
    r_u32(&r, KILN_GGUF_U64);
    r_u64(&r, UINT64_MAX / 4);
    FAIL(r.b, r.n, "array count overflow", "byte 41", "runs past");
    r_header(&r, 0, 1);
    r_str(&r, "k");
    r_u32(&r, KILN_GGUF_ARRAY);
    r_u32(&r, KILN_GGUF_STRING);
    r_u64(&r, 2);
    r_str(&r, "a");
    r_u64(&r, 99);
    FAIL(r.b, r.n, "string element past end", "byte 58", "k", "runs past");
    r_header(&r, 0, 1);
    r_str(&r, "k");
    r_u32(&r, KILN_GGUF_BOOL);
    r_put(&r, "\2", 1);
    FAIL(r.b, r.n, "bool 2", "byte 37", "neither 0 nor 1");
    r_header(&r, 0, 2);
    r_str(&r, "k");
    r_u32(&r, KILN_GGUF_U8);
    r_put(&r, "\2", 1);
    r_str(&r, "k");
    r_u32(&r, KILN_GGUF_U8);
    r_put(&r, "\2", 1);
    FAIL(r.b, r.n, "duplicate key", "byte 38", "duplicate metadata key");
    r_header(&r, 0, 1);
    r_u64(&r, 3);
    r_put(&r, "a\0b", 3);
    r_u32(&r, KILN_GGUF_U8);
    r_put(&r, "\1", 1);
    FAIL(r.b, r.n, "NUL in key", "byte 24", "key of metadata entry 0", "NUL");
    r_header(&r, 0, 1);
    r_str(&r, "k");
    r_u32(&r, KILN_GGUF_ARRAY);
    r_u32(&r, KILN_GGUF_STRING);
    r_u64(&r, 1000);
    r_u64(&r, 0);
    FAIL(r.b, r.n, "string array count", "byte 41", "array of 1000 strings", "runs past");
    r_header(&r, 0, 1);
    r_str(&r, "k");
    r_u32(&r, KILN_GGUF_ARRAY);
    r_u32(&r, KILN_GGUF_BOOL);
    r_u64(&r, 3);
    r_put(&r, "\1\0\7", 3);
    FAIL(r.b, r.n, "bool array element", "byte 51", "bool element 2 is 7");
    r_header(&r, 0, 1);
    r_str(&r, "general.alignment");
    r_u32(&r, KILN_GGUF_U32);
    r_u32(&r, 48);
    FAIL(r.b, r.n, "alignment 48", "general.alignment", "power of two");
    r_header(&r, 0, 1);
    r_str(&r, "general.alignment");
    r_u32(&r, KILN_GGUF_U64);
    r_u64(&r, 32);
    FAIL(r.b, r.n, "alignment u64", "general.alignment", "expected u32");
}

/* A file with one tensor info built from the given fields (and 64 bytes of data). */
static void one_tensor(raw *r, const char *name, uint32_t nd, const uint64_t *ne, uint32_t type, uint64_t off)
{
    r_header(r, 1, 0);
    r_str(r, name);
    r_u32(r, nd);
    for (uint32_t d = 0; d < nd; d++) r_u64(r, ne[d]);
    r_u32(r, type);
    r_u64(r, off);
    r_pad(r, 32);
    uint8_t data[64] = {0};
    r_put(r, data, sizeof data);
}

Test(gguf, malformed_tensor_infos_name_offset_and_field)
{
    raw r;
    uint64_t ne[5] = {16, 1, 1, 1, 1};
    one_tensor(&r, "w", 0, ne, 0, 0);
    FAIL(r.b, r.n, "0 dims", "byte 33", "tensor 'w' n_dims", "0 dims");
    one_tensor(&r, "w", 5, ne, 0, 0);
    FAIL(r.b, r.n, "5 dims", "byte 33", "5 dims");
    uint64_t zero[2] = {16, 0};
    one_tensor(&r, "w", 2, zero, 0, 0);
    FAIL(r.b, r.n, "zero dim", "byte 45", "ne[1]");
    uint64_t big[2] = {1ull << 40, 1ull << 40};
    one_tensor(&r, "w", 2, big, 0, 0);
    FAIL(r.b, r.n, "dims overflow", "byte 45", "ne[1]", "overflows");
    uint64_t f64big[2] = {1ull << 31, 1ull << 31};
    one_tensor(&r, "w", 2, f64big, 28, 0);
    FAIL(r.b, r.n, "data size overflow", "byte 53", "tensor 'w' type", "data size overflows");
    one_tensor(&r, "w", 1, ne, 0, 0);
    FAIL(r.b, 60, "data section past end", "byte 57", "tensor data", "starts past the end");
    r_header(&r, 1, 0);
    r_u64(&r, 3);
    r_put(&r, "a\0b", 3);
    r_u32(&r, 1);
    r_u64(&r, 16);
    r_u32(&r, 0);
    r_u64(&r, 0);
    r_pad(&r, 32);
    r_put(&r, (uint8_t[64]){0}, 64);
    FAIL(r.b, r.n, "NUL in tensor name", "byte 24", "name of tensor 0", "NUL");
    one_tensor(&r, "w", 1, ne, 99, 0);
    FAIL(r.b, r.n, "unknown type", "byte 45", "tensor 'w' type", "unknown tensor type 99");
    one_tensor(&r, "w", 1, ne, 8, 0);
    FAIL(r.b, r.n, "row not a block multiple", "byte 45", "not a multiple of the q8_0 block");
    one_tensor(&r, "w", 1, ne, 0, 8);
    FAIL(r.b, r.n, "misaligned", "byte 49", "tensor 'w' offset", "alignment 32");
    one_tensor(&r, "w", 1, ne, 0, 32);
    FAIL(r.b, r.n, "data past end", "w", "runs past the end");
    uint64_t huge[1] = {1ull << 50};
    one_tensor(&r, "w", 1, huge, 0, 0);
    FAIL(r.b, r.n, "huge data", "byte 64", "w", "runs past the end");
    one_tensor(&r, "w", 1, ne, 0, 0);
    FAIL(r.b, r.n - 1, "truncated data", "w", "runs past the end");
    one_tensor(&r, "w", 1, ne, 0, 0);
    FAIL(r.b, 56, "truncated info", "byte 49", "tensor 'w' offset", "truncated");
    /* two tensors: overlapping data, and the same name twice */
    for (int dup = 0; dup < 2; dup++) {
        r_header(&r, 2, 0);
        r_str(&r, "a");
        r_u32(&r, 1);
        r_u64(&r, 16);
        r_u32(&r, 0);
        r_u64(&r, 0);
        r_str(&r, dup ? "a" : "b");
        r_u32(&r, 1);
        r_u64(&r, 16);
        r_u32(&r, 0);
        r_u64(&r, 32);
        r_pad(&r, 32);
        uint8_t data[128] = {0};
        r_put(&r, data, sizeof data);
        if (dup) FAIL(r.b, r.n, "duplicate name", "byte 57", ": a: ", "duplicate tensor name");
        else FAIL(r.b, r.n, "overlap", "byte 128", "b", "overlaps tensor 'a'");
    }
}

/* Every prefix of a valid model file fails cleanly; random byte corruptions never crash. */
Test(gguf, every_prefix_and_random_corruption_is_handled)
{
    gw_model m = {.arch = "qwen2", .n_layer = 1, .hidden = 64, .n_head = 4, .n_kv_head = 2, .ffn = 96,
                  .n_vocab = 40, .n_ctx = 64, .wtype = KILN_DTYPE_Q8_0, .embtype = KILN_DTYPE_F16, .tokens = true,
                  .seed = 3};
    gw *w = gw_model_new(&m);
    size_t n;
    uint8_t *bytes = gw_bytes(w, &n);
    gw_free(w);
    kiln_gguf *f;
    cr_assert_eq(kiln_gguf_open_memory(ctx, bytes, n, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_gguf_close(f);
    for (size_t len = 0; len < n; len += len < 4096 ? 1 : 97) {
        uint8_t *p = malloc(len + 1); /* exact-size copy so ASan catches any overread */
        memcpy(p, bytes, len);
        cr_assert_eq(kiln_gguf_open_memory(ctx, p, len, &f), KILN_ERR_PARSE, "prefix %zu", len);
        cr_assert(strstr(kiln_ctx_error(ctx), "byte "), "prefix %zu: %s", len, kiln_ctx_error(ctx));
        free(p);
    }
    uint8_t *p = malloc(n);
    for (int trial = 0; trial < 300; trial++) {
        memcpy(p, bytes, n);
        for (int k = 0; k < 4; k++) p[tu_randint(0, trial % 2 ? 600 : (int64_t)n)] ^= (uint8_t)tu_randint(1, 256);
        kiln_status s = kiln_gguf_open_memory(ctx, p, n, &f);
        cr_assert(s == KILN_OK || s == KILN_ERR_PARSE, "trial %d: %s", trial, kiln_status_str(s));
        kiln_gguf_close(f);
    }
    free(p);
    free(bytes);
}
