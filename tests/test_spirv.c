/* Tests of the GLSL printer and the glslang compile: hand-built kir kernels that use every op
 * print, compile and pass spirv-val (with and without the optional device features); the same
 * kernel always gives the same text and words; glslang errors name the GLSL line. Must not need
 * a Vulkan device (test_vulkan runs the kernels). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuse/fuse.h"
#include "model/presets.h"
#include "spirv/spirv.h"
#include "support/kirtest.h"

static const kiln_spv_features feat_none = {0};
static const kiln_spv_features feat_all = {
    .storage16 = true, .int_dot = true, .subgroup_size = 8, .subgroup_arith = true, .subgroup_clustered = true, .fma_f64 = true};
static const kiln_spv_features feat_sg32 = {.subgroup_size = 32, .subgroup_arith = true};

static bool have_tool(const char *tool)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", tool);
    return system(cmd) == 0;
}

/* Prints, compiles and (when spirv-val is installed) validates k; returns the words. */
static uint32_t *build(const kiln_kir *k, const kiln_spv_features *f, size_t *n_words, char **glsl_out)
{
    char err[4096] = "";
    char *glsl = NULL;
    kiln_status s = kiln_spv_glsl(k, f, &glsl, err, sizeof err);
    cr_assert_eq(s, KILN_OK, "print %s: %s", k->name, err);
    uint32_t *w = NULL;
#ifndef KILN_HAVE_VULKAN
    free(glsl);
    cr_skip("kiln was built without glslang: nothing to compile");
#endif
    s = kiln_spv_compile(glsl, &w, n_words, err, sizeof err);
    cr_assert_eq(s, KILN_OK, "compile %s: %s\n%s", k->name, err, glsl);
    cr_assert_gt(*n_words, 5);
    cr_assert_eq(w[0], 0x07230203u, "SPIR-V magic");
    cr_assert_eq(w[1], 0x00010300u, "SPIR-V 1.3, got %08x", w[1]);
    if (have_tool("spirv-val")) {
        char path[] = "/tmp/kiln_spv_XXXXXX";
        int fd = mkstemp(path);
        cr_assert_geq(fd, 0);
        cr_assert_eq(write(fd, w, *n_words * 4), (ssize_t)(*n_words * 4));
        close(fd);
        char cmd[256];
        snprintf(cmd, sizeof cmd, "spirv-val --target-env vulkan1.1 %s", path);
        int rc = system(cmd);
        unlink(path);
        cr_assert_eq(rc, 0, "spirv-val rejects %s:\n%s", k->name, glsl);
    }
    if (glsl_out) *glsl_out = glsl;
    else free(glsl);
    return w;
}

Test(spirv, every_op_covered)
{
    kiln_kir a, r, m;
    uint32_t n_out;
    kt_build_alu(&a, &n_out, NULL);
    kt_build_reduce(&r);
    kt_build_mma(&m);
    bool seen[KILN_KOP_COUNT] = {false};
    for (uint32_t i = 0; i < a.n_ins; i++) seen[a.ins[i].op] = true;
    for (uint32_t i = 0; i < r.n_ins; i++) seen[r.ins[i].op] = true;
    for (uint32_t i = 0; i < m.n_ins; i++) seen[m.ins[i].op] = true;
    kiln_kir_free(&m);
    /* the warpgroup, mbarrier and TMA ops (STS4 .. SETMAXNREG, WSET) are sm_90a-only and named barriers
     * and PACK2, HFMA2, PRMT (the Hopper GEMM's f16-pair decoders), LDS_CL (clusters) and ST4 (flash_wg's epilogue) CUDA's: the GLSL printer refuses them (test_gemm_wg and test_ptx cover them); the programmatic-launch ops print nothing (spirv/pdl_ops_print_nothing) */
    for (int op = 1; op < KILN_KOP_COUNT; op++)
        if ((op < KILN_KOP_STS4 || op > KILN_KOP_SETMAXNREG) && op != KILN_KOP_GRID_WAIT && op != KILN_KOP_GRID_LAUNCH &&
            op != KILN_KOP_PREFETCH && op != KILN_KOP_WSET && op != KILN_KOP_NBAR_SYNC && op != KILN_KOP_NBAR_ARRIVE &&
            op != KILN_KOP_PACK2 && op != KILN_KOP_HFMA2 && op != KILN_KOP_PRMT && op != KILN_KOP_LDS_CL && op != KILN_KOP_ST4)
            cr_expect(seen[op], "no test kernel uses op %s", kiln_kop_name(op));
    cr_assert_leq(n_out, 128);
    kiln_kir_free(&a);
    kiln_kir_free(&r);
}

/* A kernel lowered for programmatic dependent launch (CUDA's) prints for Vulkan as if it were not:
 * its grid wait, trigger and L2 prefetches leave no trace, and it compiles and validates. */
Test(spirv, pdl_ops_print_nothing)
{
    kiln_kir k;
    kiln_kir_init(&k, "pdl_ops", 64);
    uint32_t w = kiln_kir_buf(&k, KILN_KBUF_NODE, 1, false), y = kiln_kir_buf(&k, KILN_KBUF_NODE, 2, true);
    k.pdl = true;
    k.pdl_const = 1u | 1u << w;
    kiln_kir_op(&k, KILN_KOP_GRID_LAUNCH, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t tid = kiln_kir_op(&k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    kiln_kir_op(&k, KILN_KOP_PREFETCH, KILN_KT_NONE, tid, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)w);
    kiln_kir_op(&k, KILN_KOP_GRID_WAIT, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    kiln_kir_op(&k, KILN_KOP_ST, KILN_KT_NONE, tid, kiln_kld(&k, w, tid), KILN_IDX_NONE, (int32_t)y);
    char *glsl = NULL;
    size_t n = 0;
    free(build(&k, &feat_all, &n, &glsl));
    cr_assert(glsl && strstr(glsl, "b2.w[") && !strstr(glsl, "v0 ") && !strstr(glsl, "v2 ") && !strstr(glsl, "v3 "),
              "the three ops left text:\n%s", glsl);
    free(glsl);
    kiln_kir_free(&k);
}

Test(spirv, kernels_compile_and_validate)
{
    if (!have_tool("spirv-val")) fprintf(stderr, "spirv-val not installed: compiling without validation\n");
    const kiln_spv_features *fs[] = {&feat_none, &feat_all, &feat_sg32, NULL};
    for (int i = 0; i < 4; i++) {
        kiln_kir a, r;
        uint32_t n_out;
        kt_build_alu(&a, &n_out, NULL);
        kt_build_reduce(&r);
        size_t n;
        free(build(&a, fs[i], &n, NULL));
        free(build(&r, fs[i], &n, NULL));
        kiln_kir m;
        kt_build_mma(&m);
        free(build(&m, fs[i], &n, NULL));
        kiln_kir_free(&m);
        kiln_kir_free(&a);
        kiln_kir_free(&r);
    }
}

Test(spirv, same_kernel_same_words)
{
    kiln_kir a, b;
    uint32_t n_out;
    kt_build_alu(&a, &n_out, NULL);
    kt_build_alu(&b, &n_out, NULL);
    size_t na, nb;
    char *ga, *gb;
    uint32_t *wa = build(&a, &feat_all, &na, &ga), *wb = build(&b, &feat_all, &nb, &gb);
    cr_assert_str_eq(ga, gb);
    cr_assert_eq(na, nb);
    cr_assert(memcmp(wa, wb, na * 4) == 0, "SPIR-V differs between two compiles of one kernel");
    /* features change the text: subgroup reductions and 16-bit stores are really used */
    kiln_kir r;
    kt_build_reduce(&r);
    char err[512], *gn = NULL, *gs = NULL;
    cr_assert_eq(kiln_spv_glsl(&r, &feat_none, &gn, err, sizeof err), KILN_OK);
    cr_assert_eq(kiln_spv_glsl(&r, &feat_all, &gs, err, sizeof err), KILN_OK);
    cr_assert(!strstr(gn, "subgroup") && strstr(gs, "subgroupClusteredAdd") && strstr(gs, "subgroupMax"));
    cr_assert(strstr(ga, "uint16_t") && strstr(ga, "kiln_sdot"));
    free(gn), free(gs), free(ga), free(gb), free(wa), free(wb);
    kiln_kir_free(&a), kiln_kir_free(&b), kiln_kir_free(&r);
}

Test(spirv, errors_name_the_line)
{
#ifndef KILN_HAVE_VULKAN
    cr_skip("kiln was built without glslang");
#endif
    const char *bad = "#version 450\nlayout(local_size_x = 32) in;\nvoid main()\n{\n    int x = nope + 1;\n}\n";
    char err[2048];
    uint32_t *w;
    size_t n;
    cr_assert_eq(kiln_spv_compile(bad, &w, &n, err, sizeof err), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(err, "nope") && strstr(err, "GLSL line 5:") && strstr(err, "int x = nope + 1;"), "%s", err);
    cr_assert_null(w);
}

Test(spirv, rejects_invalid_kernel)
{
    kiln_kir k;
    kiln_kir_init(&k, "bad", 64);
    kiln_kir_op(&k, KILN_KOP_ADD, KILN_KT_F32, 5, 6, KILN_IDX_NONE, 0); /* operands not defined */
    char err[256], *g = NULL;
    cr_assert_eq(kiln_spv_glsl(&k, NULL, &g, err, sizeof err), KILN_ERR_INTERNAL); /* as kiln_ptx_print */
    cr_assert_null(g);
    cr_assert(strstr(err, "not defined"), "%s", err);
    kiln_kir_free(&k);
}

/* Every kernel the lowering makes for a graph prints, compiles and passes spirv-val. */
static int validate_graph(const kiln_graph *g, bool fuse)
{
    kiln_fusion fu;
    cr_assert_eq(kiln_fuse(g, fuse, &fu), KILN_OK);
    int lowered = 0;
    for (uint32_t i = 0; i < fu.n_regions; i++) {
        kiln_kir k[KILN_LOWER_MAX];
        uint32_t nk = 0;
        char err[512];
        kiln_status s = kiln_lower_region_seq(g, &fu.regions[i], k, &nk, err, sizeof err);
        cr_assert(s == KILN_OK || s == KILN_ERR_UNSUPPORTED, "region %u: %s: %s", i, kiln_status_str(s), err);
        for (uint32_t j = 0; s == KILN_OK && j < nk; j++) {
            size_t n;
            free(build(&k[j], &feat_none, &n, NULL));
            free(build(&k[j], &feat_all, &n, NULL));
            lowered++;
            kiln_kir_free(&k[j]);
        }
    }
    kiln_fusion_free(&fu);
    return lowered;
}

Test(spirv, lowered_kernels_validate, .timeout = 600)
{
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    kiln_graph *g;
    cr_assert_eq(kiln_kg_load(ctx, KILN_SOURCE_DIR "/tests/data/every_op.kg", &g), KILN_OK, "%s", kiln_ctx_error(ctx));
    int n = validate_graph(g, false) + validate_graph(g, true);
    kiln_graph_free(g);
    const kiln_dtype wt[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_Q8_0};
    for (int i = 0; i < 3; i++) {
        char err[256];
        kiln_preset_build_opts bo = {.wdtype = wt[i], .kvdtype = wt[i] == KILN_DTYPE_F32 ? KILN_DTYPE_F32 : KILN_DTYPE_F16,
                                     .n_layers = 1, .max_ctx = 256, .max_tok = 4, .seed = 1};
        cr_assert_eq(kiln_preset_build_ex(kiln_preset_find("qwen2-0.5b"), &bo, &g, err, sizeof err), KILN_OK, "%s", err);
        n += validate_graph(g, true);
        kiln_graph_free(g);
    }
    cr_assert_gt(n, 10, "only %d kernels lowered", n);
    kiln_ctx_free(ctx);
}
