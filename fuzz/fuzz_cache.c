/* Fuzz target: disk cache entries edited with their checksums recomputed, as a forger or another
 * build would write them (issue #17). The first input makes a temporary folder (KILN_CACHE=all),
 * compiles a fixed graph on cpu (rms_norm -> gate/up matmuls -> swiglu -> down + residual, and a
 * softmax) and keeps its outputs and entries. Each input then picks an entry, overwrites payload
 * bytes or u32 words (often with node indices of the graph), reseals both checksums, and compiles
 * and runs the graph again with the memory table dropped: compile and run must succeed and the
 * outputs must equal the first ones bit for bit (a forged entry is refused and rebuilt, or changes
 * nothing that matters). The entry is restored afterwards. Must not hide a crash. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/cache.h"
#include "fuzz/fuzz.h"
#include "sched/ctx.h"

#define D 64   /* width */
#define F 96   /* hidden */
#define T 3    /* tokens */
#define MAX_E 16 /* entries kept */

static struct {
    kiln_ctx   *ctx;            /* its own context: cache folder and mode of its own */
    kiln_graph *g;              /* the graph */
    char        dir[64];        /* temporary cache folder */
    float       want[T * D + T * D]; /* y then s of the first run */
    int         n;              /* entries */
    char        path[MAX_E][128]; /* their files */
    uint8_t    *orig[MAX_E];    /* their bytes */
    size_t      len[MAX_E];     /* their sizes */
} S;

static void cleanup(void)
{
    size_t n;
    for (int i = 0; i < S.n; i++) free(S.orig[i]);
    kiln_graph_free(S.g);
    kiln_ctx_free(S.ctx);
    kiln_cache_clear(S.dir, &n);
    rmdir(S.dir);
}

static kiln_graph *build(void)
{
    kiln_graph *g = NULL;
    if (kiln_graph_new(&g) != KILN_OK) return NULL;
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){T, D});
    kiln_node h = kiln_rms_norm(g, x, kiln_weight_random(g, "nw", KILN_DTYPE_F32, 1, (kiln_dim[]){D}, 1, 1.0f), 1e-6f);
    kiln_node a = kiln_matmul(g, h, kiln_weight_random(g, "wg", KILN_DTYPE_Q8_0, 2, (kiln_dim[]){F, D}, 2, 0.2f));
    kiln_node b = kiln_matmul(g, h, kiln_weight_random(g, "wu", KILN_DTYPE_F16, 2, (kiln_dim[]){F, D}, 3, 0.2f));
    kiln_node y = kiln_matmul(g, kiln_swiglu(g, a, b), kiln_weight_random(g, "wd", KILN_DTYPE_F32, 2, (kiln_dim[]){D, F}, 4, 0.2f));
    kiln_output(g, kiln_add(g, y, x), "y");
    kiln_output(g, kiln_softmax(g, kiln_scale(g, x, 3.0f)), "s");
    return g;
}

/* Compiles (cpu) and runs the graph; false when either fails. */
static bool run(float *out)
{
    float x[T * D];
    for (int i = 0; i < T * D; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    kiln_plan *p = NULL;
    kiln_status s = kiln_compile(S.ctx, S.g, &(kiln_compile_options){.backend = "cpu"}, &p);
    if (s != KILN_OK) return false;
    kiln_binding bd[] = {{.name = "x", .data = x, .bytes = sizeof x}, {.name = "y", .data = out, .bytes = T * D * 4},
                         {.name = "s", .data = out + T * D, .bytes = T * D * 4}};
    s = kiln_run(p, bd, 3);
    kiln_plan_free(p);
    return s == KILN_OK;
}

static bool setup(void)
{
    snprintf(S.dir, sizeof S.dir, "/tmp/kiln-fuzz-cache-XXXXXX");
    if (!mkdtemp(S.dir)) return false;
    setenv("KILN_CACHE", "all", 1); /* cpu tables on disk too: the mode is read when the context opens */
    if (kiln_ctx_new(&(kiln_ctx_options){.n_threads = 1, .quiet = true, .cache_dir = S.dir}, &S.ctx) != KILN_OK) return false;
    atexit(cleanup);
    S.g = build();
    FUZZ_CHECK(S.g && kiln_graph_status(S.g) == KILN_OK, "the fixed graph does not build");
    FUZZ_CHECK(run(S.want), "the fixed graph does not compile or run: %s", kiln_ctx_error(S.ctx));
    kiln_cache_entry_info *e = NULL;
    size_t n = 0;
    FUZZ_CHECK(kiln_cache_list(S.dir, &e, &n) == KILN_OK && n > 1, "no cache entries in %s", S.dir);
    for (size_t i = 0; i < n && S.n < MAX_E; i++) {
        snprintf(S.path[S.n], sizeof S.path[0], "%s/%s", S.dir, e[i].name);
        FILE *f = fopen(S.path[S.n], "rb");
        if (!f) continue;
        fseek(f, 0, SEEK_END);
        S.len[S.n] = (size_t)ftell(f);
        fseek(f, 0, SEEK_SET);
        S.orig[S.n] = malloc(S.len[S.n]);
        size_t got = S.orig[S.n] ? fread(S.orig[S.n], 1, S.len[S.n], f) : 0;
        fclose(f);
        if (got == S.len[S.n] && got > 64) S.n++;
        else free(S.orig[S.n]);
    }
    free(e);
    return S.n > 0;
}

static void spit(const char *path, const uint8_t *b, size_t n)
{
    unlink(path);
    FILE *f = fopen(path, "wb");
    FUZZ_CHECK(f, "cannot write %s", path);
    FUZZ_CHECK(fwrite(b, 1, n, f) == n, "short write of %s", path);
    fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > 512) return 0;
    if (!S.ctx && !setup()) abort();
    int which = data[0] % S.n;
    bool words = data[1] & 1;
    size_t n = S.len[which], pl = n - 64;
    uint8_t *m = malloc(n);
    memcpy(m, S.orig[which], n);
    for (size_t i = 2; i + (words ? 6 : 3) <= size; i += words ? 6 : 3) {
        size_t off = ((size_t)data[i] << 8 | data[i + 1]);
        if (words) {
            uint32_t v;
            memcpy(&v, data + i + 2, 4);
            if (v >> 24 == 0xff) v = (v & 0xffff) % (S.g->n_nodes + 1); /* a node index, or one past */
            if (pl >= 4) memcpy(m + 64 + (off % (pl / 4)) * 4, &v, 4);
        } else {
            m[64 + off % pl] = data[i + 2];
        }
    }
    uint64_t len = pl, pc = XXH3_64bits(m + 64, pl);
    memcpy(m + 32, &len, 8);
    memcpy(m + 40, &pc, 8);
    uint64_t hc = XXH3_64bits(m, 56);
    memcpy(m + 56, &hc, 8);
    spit(S.path[which], m, n);
    free(m);
    kiln_cache_mem_clear(S.ctx->cache);
    float got[T * D * 2];
    memset(got, 0xff, sizeof got);
    FUZZ_CHECK(run(got), "entry %s forged: compile or run failed: %s", S.path[which], kiln_ctx_error(S.ctx));
    FUZZ_CHECK(memcmp(got, S.want, sizeof got) == 0, "entry %s forged: the outputs changed", S.path[which]);
    spit(S.path[which], S.orig[which], n); /* the next input starts from the real entries */
    return 0;
}
