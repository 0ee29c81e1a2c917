/* Split GGUF files (llama-gguf-split's NAME-0000i-of-0000N.gguf): a random model cut into parts as
 * llama-gguf-split cuts it (metadata in the first part, tensors in file order, split.no/count/
 * tensors.count in every part) computes the same logits as the whole file, bit for bit, and
 * matches the f64 forward; every way a set can be wrong (a part missing, a later part opened, parts
 * from different sets, a wrong tensor count, a tensor twice, contradicting metadata, a renamed
 * first part, a part in memory) is refused with one line naming the part. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "support/gguf_writer.h"
#include "support/model_ref.h"
#include "support/testutil.h"

static kiln_ctx *ctx;
static char dir[64];
static void setup(void)
{
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.n_threads = 2, .quiet = true}, &ctx), KILN_OK);
    snprintf(dir, sizeof dir, "/tmp/kiln-test-split-XXXXXX");
    cr_assert(mkdtemp(dir), "mkdtemp");
}
static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    kiln_ctx_free(ctx);
}
TestSuite(gguf_split, .init = setup, .fini = teardown);

static const gw_model base = {.arch = "llama", .n_layer = 2, .hidden = 64, .n_head = 4, .n_kv_head = 2, .ffn = 96,
                              .n_vocab = 48, .n_ctx = 64, .wtype = KILN_DTYPE_Q8_0, .embtype = KILN_DTYPE_F16,
                              .qkv_bias = true, .tokens = true};

/* How to cut (and how to spoil) a set. */
typedef struct cut {
    int         n;             /* parts */
    bool        empty_first;   /* llama-gguf-split --no-tensor-in-metadata: the first part holds no tensor */
    bool        copy_meta;     /* later parts repeat every metadata key (same values) */
    int         bad_no;        /* > 0: part bad_no (0-based) says split.no = bad_no - 1 */
    int         other_count;   /* > 0: the last part says split.count = other_count */
    int64_t     tc_delta;      /* added to split.tensors.count in every part */
    int         dup;           /* > 0: part dup also holds the first tensor of part dup - 1 */
    const char *conflict;      /* a key the last part holds with another value (u32 7) */
} cut;

/* Copies metadata entry i of f into w (every type gw can write). */
static void copy_kv(gw *w, const kiln_gguf *f, int64_t i)
{
    const char *key = kiln_gguf_kv_key(f, i);
    kiln_gguf_type t = kiln_gguf_kv_type(f, i);
    int64_t v = 0;
    if (t == KILN_GGUF_STRING) {
        const char *s;
        cr_assert_eq(kiln_gguf_get_str(f, key, &s, NULL), KILN_OK);
        gw_kv_str(w, key, s);
    } else if (t == KILN_GGUF_ARRAY) {
        kiln_gguf_type et;
        uint64_t n;
        const void *data;
        cr_assert_eq(kiln_gguf_get_arr(f, key, &et, &n, &data), KILN_OK);
        if (et != KILN_GGUF_STRING) {
            gw_kv_arr(w, key, et, n, data);
            return;
        }
        char **s = calloc(n + 1, sizeof *s);
        for (uint64_t j = 0; j < n; j++) {
            const char *p;
            size_t len;
            cr_assert_eq(kiln_gguf_get_arr_str(f, key, j, &p, &len), KILN_OK);
            s[j] = strndup(p, len);
        }
        gw_kv_arr_str(w, key, n, (const char *const *)s);
        for (uint64_t j = 0; j < n; j++) free(s[j]);
        free(s);
    } else if (t == KILN_GGUF_F32) {
        float x;
        cr_assert_eq(kiln_gguf_get_f32(f, key, &x), KILN_OK);
        gw_kv_f32(w, key, x);
    } else { /* integers and bool: little-endian, so the value's first bytes are the type's */
        bool b = false;
        kiln_status s = t == KILN_GGUF_BOOL ? kiln_gguf_get_bool(f, key, &b) : kiln_gguf_get_i64(f, key, &v);
        cr_assert_eq(s, KILN_OK, "%s", key);
        if (t == KILN_GGUF_BOOL) v = b;
        gw_kv(w, key, t, &v);
    }
}

static void add_tensor(gw *w, const kiln_gguf *f, int64_t i)
{
    kiln_gguf_tensor t;
    cr_assert_eq(kiln_gguf_tensor_at(f, i, &t), KILN_OK);
    gw_tensor(w, t.name, t.ggml_type, t.rank, t.dims, t.data, t.bytes);
}

/* Writes whole's tensors as c->n parts DIR/STEM-0000i-of-0000n.gguf; the first part's path into
 * first. Tensors are cut into contiguous runs in file order, as llama-gguf-split does. */
static void write_cut(const kiln_gguf *whole, const char *stem, const cut *c, char *first, size_t n_first)
{
    int64_t nt = kiln_gguf_tensor_count(whole), at = 0;
    int takers = c->empty_first ? c->n - 1 : c->n;
    for (int p = 0; p < c->n; p++) {
        gw *w = gw_new(3, 0);
        bool spoil = c->conflict && p == c->n - 1; /* this part holds the conflicting key instead */
        if (p == 0 || c->copy_meta)
            for (int64_t i = 0; i < kiln_gguf_kv_count(whole); i++)
                if (!spoil || strcmp(kiln_gguf_kv_key(whole, i), c->conflict) != 0) copy_kv(w, whole, i);
        uint16_t no = (uint16_t)(c->bad_no == p && p ? p - 1 : p);
        uint16_t count = (uint16_t)(c->other_count && p == c->n - 1 ? c->other_count : c->n);
        int32_t tc = (int32_t)(nt + c->tc_delta);
        gw_kv(w, "split.no", KILN_GGUF_U16, &no);
        gw_kv(w, "split.count", KILN_GGUF_U16, &count);
        gw_kv(w, "split.tensors.count", KILN_GGUF_I32, &tc);
        if (spoil) gw_kv_u32(w, c->conflict, 7);
        int k = c->empty_first ? p - 1 : p;
        int64_t end = k < 0 ? 0 : nt * (k + 1) / takers;
        if (c->dup && p == c->dup) add_tensor(w, whole, at - 1); /* the last tensor of the part before */
        for (; at < end; at++) add_tensor(w, whole, at);
        char path[256];
        snprintf(path, sizeof path, "%s/%s-%05d-of-%05d.gguf", dir, stem, p + 1, c->n);
        cr_assert_eq(gw_write(w, path), 0, "writing %s", path);
        gw_free(w);
        if (p == 0) snprintf(first, n_first, "%s", path);
    }
}

#define N_TOK 10
/* Logits of a prefill of ids on backend be. */
static float *run(const kiln_gguf *f, const char *be, const int32_t *ids, int64_t V)
{
    kiln_graph *g;
    cr_assert_eq(kiln_model_build(f, &(kiln_model_options){.max_ctx = 32, .max_tok = 16, .logits = true}, &g), KILN_OK,
                 "%s", kiln_ctx_error(ctx));
    kiln_plan *p;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = be}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    float *logits = malloc((size_t)(N_TOK * V) * sizeof *logits);
    int32_t pos[N_TOK], next[N_TOK];
    for (int i = 0; i < N_TOK; i++) pos[i] = i;
    tu_poison(logits, (size_t)(N_TOK * V) * sizeof *logits);
    kiln_binding b[6] = {{.name = "n_tok", .value = N_TOK}, {.name = "n_kv", .value = N_TOK},
                         {.name = "ids", .data = (void *)ids, .bytes = N_TOK * 4}, {.name = "pos", .data = pos, .bytes = N_TOK * 4},
                         {.name = "logits", .data = logits, .bytes = (size_t)(N_TOK * V) * sizeof *logits},
                         {.name = "next", .data = next, .bytes = N_TOK * 4}};
    cr_assert_eq(kiln_run(p, b, 6), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_plan_free(p);
    kiln_graph_free(g);
    return logits;
}

/* The set cut as c loads, holds every tensor once (in its part) and computes the whole file's
 * logits bit for bit on ref and cpu, within the model contract of the f64 forward. */
static void check_same_model(const cut *c)
{
    gw_model m = base;
    m.seed = tu_next();
    uint8_t *bytes;
    kiln_gguf *whole = tu_model_open(ctx, &m, &bytes);
    char first[256];
    write_cut(whole, "model", c, first, sizeof first);
    kiln_gguf *f;
    cr_assert_eq(kiln_gguf_open(ctx, first, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_gguf_part_count(f), c->n);
    cr_assert_eq(kiln_gguf_tensor_count(f), kiln_gguf_tensor_count(whole));
    bool parts_seen[8] = {0};
    for (int64_t i = 0; i < kiln_gguf_tensor_count(whole); i++) {
        kiln_gguf_tensor a, b;
        cr_assert_eq(kiln_gguf_tensor_at(whole, i, &a), KILN_OK);
        cr_assert_eq(kiln_gguf_tensor_get(f, a.name, &b), KILN_OK, "%s", kiln_ctx_error(ctx));
        cr_assert(b.bytes == a.bytes && memcmp(a.data, b.data, a.bytes) == 0, "tensor %s differs", a.name);
        parts_seen[b.part] = true;
    }
    for (int p = c->empty_first; p < c->n; p++) cr_assert(parts_seen[p], "no tensor read from part %d", p + 1);
    int32_t ids[N_TOK];
    for (int i = 0; i < N_TOK; i++) ids[i] = (int32_t)tu_randint(0, m.n_vocab);
    char err[256];
    int64_t V = 0;
    double *want = mref_logits_ctx(f, ids, N_TOK, 32, &V, err, sizeof err);
    cr_assert(want, "f64 forward: %s", err);
    const char *bes[2] = {"ref", "cpu"};
    for (int k = 0; k < 2; k++) {
        float *a = run(whole, bes[k], ids, V), *b = run(f, bes[k], ids, V);
        cr_assert(memcmp(a, b, (size_t)(N_TOK * V) * sizeof *a) == 0, "%s: split logits differ from the whole file's", bes[k]);
        double *got = malloc((size_t)(N_TOK * V) * sizeof *got);
        for (int64_t i = 0; i < N_TOK * V; i++) got[i] = b[i];
        double tol = !strcmp(bes[k], "ref") ? tu_tol("matmul", KILN_DTYPE_F32) * 100 : tu_tol("matmul", m.wtype) * 10;
        tu_compare(bes[k], got, want, N_TOK * V, tol);
        free(got);
        free(a);
        free(b);
    }
    free(want);
    kiln_gguf_close(f);
    kiln_gguf_close(whole);
    free(bytes);
}

Test(gguf_split, three_parts_compute_the_whole_files_logits) { check_same_model(&(cut){.n = 3}); }
Test(gguf_split, metadata_only_first_part_and_repeated_metadata_load)
{
    check_same_model(&(cut){.n = 2, .empty_first = true, .copy_meta = true});
}

/* Cuts a fresh model as c; opening `open_part` (0-based) must fail with status s and one line
 * holding want and also (when not NULL). remove_part > 0 deletes that part (0-based) first. */
static void expect_refused(const cut *c, int open_part, int remove_part, kiln_status s, const char *want, const char *also)
{
    gw_model m = base;
    m.seed = tu_next();
    uint8_t *bytes;
    kiln_gguf *whole = tu_model_open(ctx, &m, &bytes);
    char first[256], path[256];
    write_cut(whole, "set", c, first, sizeof first);
    kiln_gguf_close(whole);
    free(bytes);
    if (remove_part) {
        snprintf(path, sizeof path, "%s/set-%05d-of-%05d.gguf", dir, remove_part + 1, c->n);
        cr_assert_eq(unlink(path), 0);
    }
    snprintf(path, sizeof path, "%s/set-%05d-of-%05d.gguf", dir, open_part + 1, c->n);
    kiln_gguf *f = (kiln_gguf *)&f;
    kiln_status got = kiln_gguf_open(ctx, path, &f);
    const char *e = kiln_ctx_error(ctx);
    cr_assert_eq(got, s, "want %s, got %s: %s", kiln_status_str(s), kiln_status_str(got), e);
    cr_assert_null(f);
    cr_assert(strstr(e, want), "message does not say '%s': %s", want, e);
    cr_assert(!also || strstr(e, also), "message does not say '%s': %s", also, e);
    cr_assert_null(strchr(e, '\n'), "not one line: %s", e);
}

Test(gguf_split, missing_part_is_named)
{
    expect_refused(&(cut){.n = 3}, 0, 1, KILN_ERR_IO, "part 2 of 3 is missing", "set-00002-of-00003.gguf");
}
Test(gguf_split, later_part_opened_alone_names_the_first)
{
    expect_refused(&(cut){.n = 3}, 2, 0, KILN_ERR_PARSE, "part 3 of a split GGUF", "set-00001-of-00003.gguf");
}
Test(gguf_split, part_with_another_number_is_refused)
{
    expect_refused(&(cut){.n = 3, .bad_no = 2}, 0, 0, KILN_ERR_PARSE, "set-00003-of-00003.gguf", "'split.no' is 1");
}
Test(gguf_split, part_of_another_count_is_refused)
{
    expect_refused(&(cut){.n = 3, .other_count = 4}, 0, 0, KILN_ERR_PARSE, "set-00003-of-00003.gguf", "'split.count'");
}
Test(gguf_split, wrong_tensor_count_is_refused)
{
    expect_refused(&(cut){.n = 2, .tc_delta = 1}, 0, 0, KILN_ERR_PARSE, "split.tensors.count", "hold");
}
Test(gguf_split, tensor_in_two_parts_is_refused)
{
    expect_refused(&(cut){.n = 3, .dup = 2, .tc_delta = 1}, 0, 0, KILN_ERR_PARSE, "is in part 2 and in part 3", NULL);
}
Test(gguf_split, part_contradicting_the_metadata_is_refused)
{
    expect_refused(&(cut){.n = 2, .copy_meta = true, .conflict = "llama.block_count"}, 0, 0, KILN_ERR_PARSE,
                   "'llama.block_count' differs", "set-00002-of-00002.gguf");
    expect_refused(&(cut){.n = 2, .conflict = "llama.expert_count"}, 0, 0, KILN_ERR_PARSE,
                   "'llama.expert_count' is not among", NULL);
}

Test(gguf_split, renamed_first_part_and_memory_parts_are_refused)
{
    gw_model m = base;
    m.seed = tu_next();
    uint8_t *bytes;
    kiln_gguf *whole = tu_model_open(ctx, &m, &bytes);
    char first[256], renamed[300];
    write_cut(whole, "set", &(cut){.n = 2}, first, sizeof first);
    kiln_gguf_close(whole);
    free(bytes);
    snprintf(renamed, sizeof renamed, "%s/model.gguf", dir);
    cr_assert_eq(rename(first, renamed), 0);
    kiln_gguf *f;
    cr_assert_eq(kiln_gguf_open(ctx, renamed, &f), KILN_ERR_PARSE);
    cr_assert(strstr(kiln_ctx_error(ctx), "does not end in -00001-of-00002.gguf"), "%s", kiln_ctx_error(ctx));
    FILE *in = fopen(renamed, "rb");
    cr_assert(in);
    fseek(in, 0, SEEK_END);
    size_t n = (size_t)ftell(in);
    rewind(in);
    uint8_t *b = malloc(n);
    cr_assert_eq(fread(b, 1, n, in), n);
    fclose(in);
    cr_assert_eq(kiln_gguf_open_memory(ctx, b, n, &f), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_ctx_error(ctx), "open it by path"), "%s", kiln_ctx_error(ctx));
    free(b);
}

/* A truncated later part fails as a malformed file naming that part's path. */
Test(gguf_split, truncated_part_names_its_path)
{
    gw_model m = base;
    m.seed = tu_next();
    uint8_t *bytes;
    kiln_gguf *whole = tu_model_open(ctx, &m, &bytes);
    char first[256], second[256];
    write_cut(whole, "set", &(cut){.n = 2}, first, sizeof first);
    kiln_gguf_close(whole);
    free(bytes);
    snprintf(second, sizeof second, "%s/set-00002-of-00002.gguf", dir);
    cr_assert_eq(truncate(second, 100), 0);
    kiln_gguf *f;
    cr_assert_eq(kiln_gguf_open(ctx, first, &f), KILN_ERR_PARSE);
    cr_assert(strstr(kiln_ctx_error(ctx), second), "%s", kiln_ctx_error(ctx));
}
