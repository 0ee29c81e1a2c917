/* Golden code generation: the PTX (sm_80, sm_90) and GLSL (no optional features, all of them) of
 * every kernel of every preset x matmul weight dtype x {1, 512} tokens, hashed and compared with
 * tests/data/codegen_golden.txt. A refactoring of codegen must leave every line as it is; a change
 * meant to change kernels regenerates the list (KILN_GOLDEN_UPDATE=1 build/test_golden) and says
 * why in its commit. Needs no GPU and no ptxas: lowering and printing only. */
#include "codegen/kir.h"
#include "fuse/fuse.h"
#include "ptx/ptx.h"
#include "model/presets.h"
#include "spirv/spirv.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static const kiln_dtype wtypes[] = {KILN_DTYPE_F32,  KILN_DTYPE_F16,  KILN_DTYPE_BF16, KILN_DTYPE_Q8_0,
                                    KILN_DTYPE_Q4_K, KILN_DTYPE_Q5_K, KILN_DTYPE_Q6_K};

typedef struct golden {
    char  *text; /* lines "preset wtype tokens region kernel name ptx80 ptx90 glsl-none glsl-all\n" */
    size_t len, cap;
} golden;

static void add_line(golden *o, const char *line)
{
    size_t n = strlen(line);
    if (o->len + n + 1 > o->cap) {
        o->cap = (o->len + n + 1) * 2;
        o->text = realloc(o->text, o->cap);
        cr_assert(o->text);
    }
    memcpy(o->text + o->len, line, n + 1);
    o->len += n;
}

static unsigned long long hash_text(char *txt)
{
    unsigned long long h = XXH64(txt, strlen(txt), 0);
    free(txt);
    return h;
}

/* One line per kernel of every region of g ("-" lines for regions no template takes). */
static void hash_graph(const kiln_graph *g, const char *what, golden *o)
{
    static const kiln_spv_features none = {0}, all = {.storage16 = true, .int_dot = true, .subgroup_size = 32,
                                                      .subgroup_arith = true, .subgroup_clustered = true};
    kiln_fusion f;
    cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK, "%s: fusion failed", what);
    for (uint32_t r = 0; r < f.n_regions; r++) {
        kiln_kir ks[KILN_LOWER_MAX];
        uint32_t nk = 0;
        char err[1024] = "", line[512];
        kiln_status s = kiln_lower_region_seq(g, &f.regions[r], ks, &nk, err, sizeof err);
        if (s == KILN_ERR_UNSUPPORTED) {
            snprintf(line, sizeof line, "%s %u - unsupported\n", what, r);
            add_line(o, line);
            continue;
        }
        cr_assert_eq(s, KILN_OK, "%s region %u: %s: %s", what, r, kiln_status_str(s), err);
        for (uint32_t i = 0; i < nk; i++) {
            unsigned long long h[4];
            for (int j = 0; j < 4; j++) {
                char *txt = NULL;
                s = j < 2 ? kiln_ptx_print(&ks[i], j ? 90 : 80, &txt, err, sizeof err)
                          : kiln_spv_glsl(&ks[i], j == 2 ? &none : &all, &txt, err, sizeof err);
                cr_assert_eq(s, KILN_OK, "%s region %u kernel %u printer %d: %s", what, r, i, j, err);
                h[j] = hash_text(txt);
            }
            snprintf(line, sizeof line, "%s %u %u %s %016llx %016llx %016llx %016llx\n", what, r, i, ks[i].name, h[0], h[1],
                     h[2], h[3]);
            add_line(o, line);
            kiln_kir_free(&ks[i]);
        }
    }
    kiln_fusion_free(&f);
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *t = malloc((size_t)n + 1);
    if (t && fread(t, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (t) t[n] = 0;
    fclose(f);
    return t;
}

/* The first line where a and b differ, for the failure message. */
static void first_diff(const char *a, const char *b, char *out, size_t n)
{
    int line = 1;
    const char *la = a, *lb = b;
    while (*a && *a == *b) {
        if (*a == '\n') line++, la = a + 1, lb = b + 1;
        a++, b++;
    }
    int wa = (int)strcspn(la, "\n"), wb = (int)strcspn(lb, "\n");
    snprintf(out, n, "line %d:\n  expected: %.*s\n  got:      %.*s", line, wa, la, wb, lb);
}

Test(golden, every_preset_kernel_prints_as_recorded, .timeout = 300)
{
    golden o = {0};
    add_line(&o, "# preset wtype tokens region kernel name ptx-sm80 ptx-sm90 glsl-none glsl-all (XXH64 of the text)\n");
    for (int p = 0; p < kiln_preset_count(); p++)
        for (size_t w = 0; w < sizeof wtypes / sizeof *wtypes; w++)
            for (int tok = 1; tok <= 512; tok *= 512) {
                kiln_preset_build_opts bo = {.wdtype = wtypes[w], .kvdtype = kiln_preset_kv_dtype(wtypes[w]), .n_layers = 1,
                                             .max_ctx = 4096, .max_tok = tok, .seed = 1, .shape_only = true};
                kiln_graph *g = NULL;
                char err[512] = "", what[96];
                cr_assert_eq(kiln_preset_build_ex(kiln_preset_at(p), &bo, &g, err, sizeof err), KILN_OK, "%s", err);
                snprintf(what, sizeof what, "%s %s %d", kiln_preset_at(p)->name, kiln_dtype_name(wtypes[w]), tok);
                hash_graph(g, what, &o);
                kiln_graph_free(g);
            }
    const char *dir = getenv("KILN_SOURCE_DIR") ? getenv("KILN_SOURCE_DIR") : KILN_SOURCE_DIR;
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/codegen_golden.txt", dir);
    if (getenv("KILN_GOLDEN_UPDATE")) {
        FILE *f = fopen(path, "wb");
        cr_assert(f, "cannot write %s", path);
        fwrite(o.text, 1, o.len, f);
        fclose(f);
        cr_log_warn("wrote %s", path);
    }
    char *want = read_all(path);
    cr_assert(want, "%s is missing: KILN_GOLDEN_UPDATE=1 build/test_golden writes it", path);
    if (strcmp(want, o.text)) {
        FILE *f = fopen("codegen_golden.actual.txt", "wb");
        if (f) fwrite(o.text, 1, o.len, f), fclose(f);
        char diff[1024];
        first_diff(want, o.text, diff, sizeof diff);
        cr_assert_fail("generated code differs from %s at %s\n(all lines: codegen_golden.actual.txt in the test's folder; "
                       "if the change is meant, KILN_GOLDEN_UPDATE=1 build/test_golden and say why in the commit)",
                       path, diff);
    }
    free(want);
    free(o.text);
}
