/* `kiln ptx`: the PTX kiln generates for each fused region of a .kg file or a model preset, with
 * ptxas's report (registers, spills, shared memory) when ptxas is found and a static summary of
 * each kernel's memory traffic. Reports only: never loads the driver or runs anything. */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "codegen/kir.h"
#include "fuse/fuse.h"
#include "ptx/ptx.h"
#include "util/env.h"
#include "model/presets.h"

typedef struct ptx_opts {
    const char        *file;    /* FILE.kg, or NULL with --preset */
    const kiln_preset *preset;  /* --preset */
    kiln_dtype         wtype;   /* --wtype */
    int64_t            tokens;  /* --tokens: bound of n_tok (1 = decode) */
    int64_t            ctx;     /* --ctx: bound of n_kv */
    int64_t            sm;      /* --sm */
    int64_t            region;  /* --region I, or -1 for all */
    bool               json;    /* --json */
    bool               summary; /* --summary: no PTX text */
    bool               no_fuse; /* --no-fuse */
    bool               kir;     /* --kir: the kir listing before each kernel's PTX */
} ptx_opts;

static int parse_ptx(int argc, char *const *argv, ptx_opts *o)
{
    *o = (ptx_opts){.wtype = KILN_DTYPE_Q8_0, .tokens = 1, .ctx = 4096, .sm = 90, .region = -1};
    kiln_cli_args a = {.argc = argc, .argv = argv, .i = 1, .cmd = "ptx"};
    while (a.i < argc) {
        const char *v, *arg = argv[a.i];
        int r;
        if ((r = kiln_cli_preset_flags(&a, &o->preset, &o->wtype)) != 0) {
            if (r < 0) return KILN_CLI_USAGE;
        } else if ((r = kiln_cli_flag_value(&a, "--tokens", &v)) != 0) {
            if (r < 0 || !kiln_cli_parse_i64("ptx", "--tokens", v, 1, 1 << 20, &o->tokens)) return KILN_CLI_USAGE;
        } else if ((r = kiln_cli_flag_value(&a, "--ctx", &v)) != 0) {
            if (r < 0 || !kiln_cli_parse_i64("ptx", "--ctx", v, 1, 1 << 24, &o->ctx)) return KILN_CLI_USAGE;
        } else if ((r = kiln_cli_flag_value(&a, "--region", &v)) != 0) {
            if (r < 0 || !kiln_cli_parse_i64("ptx", "--region", v, 0, 1 << 20, &o->region)) return KILN_CLI_USAGE;
        } else if ((r = kiln_cli_flag_value(&a, "--sm", &v)) != 0) {
            if (r < 0 || !kiln_cli_parse_i64("ptx", "--sm", v, 80, 90, &o->sm)) return KILN_CLI_USAGE;
        } else if (!strcmp(arg, "--json") || !strcmp(arg, "--summary") || !strcmp(arg, "--no-fuse") || !strcmp(arg, "--kir")) {
            *(arg[2] == 'j' ? &o->json : arg[2] == 's' ? &o->summary : arg[2] == 'k' ? &o->kir : &o->no_fuse) = true;
            a.i++;
        } else if (arg[0] == '-') {
            return kiln_cli_unknown_flag("ptx", arg);
        } else if (!o->file) {
            o->file = arg;
            a.i++;
        } else {
            fprintf(stderr, "kiln ptx: unexpected argument '%s' (see kiln ptx --help)\n", arg);
            return KILN_CLI_USAGE;
        }
    }
    return kiln_cli_one_source("ptx", o->file, o->preset) ? KILN_CLI_OK : KILN_CLI_USAGE;
}

/* "rms_norm + matmul x3 + rope x2": the region's ops in order of first appearance. */
static void ops_text(const kiln_graph *g, const kiln_region *r, char *out, size_t n)
{
    out[0] = '\0';
    size_t len = 0;
    for (uint32_t i = 0; i < r->n_nodes; i++) {
        uint8_t op = g->nodes[r->nodes[i]].op;
        int count = 0, seen = 0;
        for (uint32_t j = 0; j < r->n_nodes; j++) {
            count += g->nodes[r->nodes[j]].op == op;
            seen += j < i && g->nodes[r->nodes[j]].op == op;
        }
        if (seen || len >= n) continue;
        len += (size_t)snprintf(out + len, n - len, count > 1 ? "%s%s x%d" : "%s%s", len ? " + " : "",
                                kiln_op_name((enum kiln_op)op), count);
    }
}

/* One kernel of a region. */
typedef struct ptx_kernel {
    kiln_kir          kir;       /* the kernel */
    char             *text;      /* its PTX */
    kiln_ptx_stats    st;        /* static summary */
    bool              assembled; /* ptxas ran and succeeded */
    kiln_ptxas_report rep;       /* its report */
    unsigned          flags;     /* printer flags it needed (KILN_PTX_ALL_REGISTERS after spilling) */
    char              err[4096]; /* why ptxas failed */
} ptx_kernel;

/* Per-region result, for the text and JSON printers. */
typedef struct ptx_item {
    uint32_t    index;                   /* region index */
    const char *kind;                    /* region kind */
    char        ops[256];                /* fused ops */
    kiln_status status;                  /* lowering/printing */
    char        err[4096];               /* why not lowered / printed */
    ptx_kernel  k[KILN_LOWER_MAX];       /* its kernels, run in order */
    uint32_t    n;                       /* kernels */
} ptx_item;

static void print_static(FILE *f, const kiln_ptx_stats *s)
{
    fprintf(f, "--- static: global loads %u x 4 B + %u x 16 B (%u read-only .nc, %u inside loops); stores %u x 4 B + %u x 2 B",
            s->ld32, s->ld128, s->ld_nc, s->loop_loads, s->st32, s->st16);
    if (s->st128) fprintf(f, " + %u x 16 B", s->st128); /* only where there are (flash_wg's epilogue): other lines as they were */
    fprintf(f, "\n");
    fprintf(f, "--- static: shared %u B, %u loads / %u stores, %u barriers, %u shuffles (%u reductions); %u loops "
            "(nesting %u), %u ifs; %u f32 + %u integer ops; %u parameter slots\n",
            s->shared_bytes, s->lds, s->sts, s->barriers, s->shuffles, s->reduces, s->loops, s->max_depth, s->ifs,
            s->f32_ops, s->int_ops, s->params);
}

static void print_item_text(const ptx_item *it, uint32_t n_regions, int sm, bool summary, bool kir)
{
    printf("=== region %u/%u: %s [%s]", it->index, n_regions, it->kind, it->ops);
    if (it->status == KILN_ERR_UNSUPPORTED) {
        printf(": not lowered: %s\n\n", it->err);
        return;
    }
    if (it->status != KILN_OK) {
        printf(": FAILED: %s: %s\n\n", kiln_status_str(it->status), it->err);
        return;
    }
    printf(": %u kernel%s\n", it->n, it->n > 1 ? "s, in order" : "");
    for (uint32_t i = 0; i < it->n; i++) {
        const ptx_kernel *k = &it->k[i];
        printf("--- %s (%s), block %u, grid %u x %u x %u", k->kir.name, k->kir.what, k->kir.block, k->kir.grid[0],
               k->kir.grid[1], k->kir.grid[2]);
        if (k->kir.scratch_bytes) printf(", region scratch %llu B", (unsigned long long)k->kir.scratch_bytes);
        printf("\n");
        if (kir) kiln_kir_dump(&k->kir, stdout);
        if (!summary && k->text) fputs(k->text, stdout);
        if (k->assembled)
            printf("--- ptxas sm_%d: %d registers%s, spills %d B stored / %d B loaded, stack %d B, shared %d B\n", sm,
                   k->rep.regs, k->flags & KILN_PTX_ALL_REGISTERS ? " (all registers: it spilled under the default cap)" : "",
                   k->rep.spill_stores, k->rep.spill_loads, k->rep.stack, k->rep.smem);
        else if (k->err[0]) printf("--- ptxas sm_%d FAILED: %s\n", sm, k->err);
        print_static(stdout, &k->st);
    }
    printf("\n");
}

static void print_kernel_json(const ptx_kernel *k, bool first, bool summary)
{
    printf("%s{\"kernel\":\"%s\",\"what\":", first ? "" : ",", k->kir.name);
    kiln_cli_json_str(stdout, k->kir.what);
    printf(",\"block\":%u,\"grid\":[%u,%u,%u],\"scratch_bytes\":%llu", k->kir.block, k->kir.grid[0], k->kir.grid[1],
           k->kir.grid[2], (unsigned long long)k->kir.scratch_bytes);
    if (!summary) {
        printf(",\"ptx\":");
        kiln_cli_json_str(stdout, k->text ? k->text : "");
    }
    if (k->assembled)
        printf(",\"ptxas\":{\"regs\":%d,\"all_registers\":%s,\"spill_stores\":%d,\"spill_loads\":%d,\"stack\":%d,\"smem\":%d}",
               k->rep.regs, k->flags & KILN_PTX_ALL_REGISTERS ? "true" : "false", k->rep.spill_stores, k->rep.spill_loads,
               k->rep.stack, k->rep.smem);
    else if (k->err[0]) {
        printf(",\"ptxas_error\":");
        kiln_cli_json_str(stdout, k->err);
    }
    const kiln_ptx_stats *s = &k->st;
    printf(",\"static\":{\"ld32\":%u,\"ld128\":%u,\"ld_nc\":%u,\"loop_loads\":%u,\"st32\":%u,\"st16\":%u,\"st128\":%u,\"lds\":%u,"
           "\"sts\":%u,\"barriers\":%u,\"shuffles\":%u,\"reduces\":%u,\"loops\":%u,\"max_depth\":%u,\"ifs\":%u,"
           "\"f32_ops\":%u,\"int_ops\":%u,\"params\":%u,\"shared_bytes\":%u}}",
           s->ld32, s->ld128, s->ld_nc, s->loop_loads, s->st32, s->st16, s->st128, s->lds, s->sts, s->barriers, s->shuffles,
           s->reduces, s->loops, s->max_depth, s->ifs, s->f32_ops, s->int_ops, s->params, s->shared_bytes);
}

static void print_item_json(const ptx_item *it, bool first, bool summary)
{
    printf("%s{\"index\":%u,\"kind\":\"%s\",\"ops\":", first ? "" : ",", it->index, it->kind);
    kiln_cli_json_str(stdout, it->ops);
    printf(",\"lowered\":%s", it->status == KILN_OK ? "true" : "false");
    if (it->status != KILN_OK) {
        printf(",\"status\":\"%s\",\"why\":", kiln_status_str(it->status));
        kiln_cli_json_str(stdout, it->err);
        printf("}");
        return;
    }
    printf(",\"kernels\":[");
    for (uint32_t i = 0; i < it->n; i++) print_kernel_json(&it->k[i], i == 0, summary);
    printf("]}");
}

/* Lowers, prints and assembles region r into it; returns false when printing or ptxas failed. */
static bool do_region(const kiln_graph *g, const kiln_fusion *f, uint32_t r, int sm, const char *ptxas, ptx_item *it)
{
    it->index = r;
    it->kind = kiln_region_kind_name((enum kiln_region_kind)f->regions[r].kind);
    ops_text(g, &f->regions[r], it->ops, sizeof it->ops);
    kiln_kir kir[KILN_LOWER_MAX];
    kiln_compile_options co;
    kiln_env_options(NULL, &co); /* $KILN_GEMM, $KILN_WGMMA, ... as a compile reads them */
    kiln_lower_target t0 = kiln_lower_target_for_sm(sm), t = kiln_lower_target_with(&t0, &co.codegen);
    it->status = kiln_lower_region_for(g, &f->regions[r], &t, kir, &it->n, it->err, sizeof it->err);
    if (it->status != KILN_OK) return it->status == KILN_ERR_UNSUPPORTED;
    bool ok = true;
    for (uint32_t i = 0; i < it->n; i++) {
        ptx_kernel *k = &it->k[i];
        k->kir = kir[i];
        if (!ptxas[0]) {
            kiln_status s = kiln_ptx_print_ex(&k->kir, sm, 0, &k->text, &k->st, it->err, sizeof it->err);
            if (s != KILN_OK) it->status = s, ok = false;
            continue;
        }
        kiln_status s = kiln_ptx_print_assembled(ptxas, &k->kir, sm, &k->text, &k->flags, &k->st, &k->rep, k->err, sizeof k->err);
        k->assembled = s == KILN_OK;
        if (s != KILN_OK && !k->text) { /* printing failed */
            it->status = s;
            snprintf(it->err, sizeof it->err, "%s", k->err);
            k->err[0] = 0;
        }
        ok &= k->assembled;
    }
    return ok;
}

static void free_item(ptx_item *it)
{
    for (uint32_t i = 0; i < it->n; i++) {
        free(it->k[i].text);
        kiln_kir_free(&it->k[i].kir);
    }
    free(it);
}

int kiln_cli_ptx(int argc, char *const *argv)
{
    if (kiln_cli_wants_help(argc, argv, "ptx")) return KILN_CLI_OK;
    ptx_opts o;
    int rc = parse_ptx(argc, argv, &o);
    if (rc != KILN_CLI_OK) return rc;
    kiln_ctx *ctx = NULL;
    kiln_graph *g = NULL;
    char ptxas[1024];
    kiln_status s = kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx);
    if (s != KILN_OK) return kiln_cli_fail("ptx", ctx, s, "creating the context");
    rc = kiln_cli_load_source("ptx", ctx, o.file, o.preset, o.wtype,
                              (kiln_preset_build_opts){.n_layers = 1, .max_ctx = o.ctx, .max_tok = o.tokens, .seed = 1,
                                                       .shape_only = true}, &g);
    if (rc != KILN_CLI_OK) {
        kiln_ctx_free(ctx);
        return rc;
    }
    kiln_compile_options env;
    kiln_env_options(NULL, &env);
    if (env.codegen.precision == KILN_PREC_F16) kiln_graph_narrow_gemm_inputs(g); /* as a compile does */
    kiln_fusion f;
    if ((s = kiln_fuse(g, !o.no_fuse, &f)) != KILN_OK) {
        kiln_graph_free(g);
        rc = kiln_cli_fail("ptx", ctx, s, "fusing");
        kiln_ctx_free(ctx);
        return rc;
    }
    if (o.region >= (int64_t)f.n_regions) {
        fprintf(stderr, "kiln ptx: --region %lld but the graph has %u regions\n", (long long)o.region, f.n_regions);
        rc = KILN_CLI_USAGE;
    }
    bool have_ptxas = kiln_ptx_find_ptxas(ptxas, sizeof ptxas);
    int lowered = 0, failed = 0, spills = 0, max_regs = 0;
    if (rc == KILN_CLI_OK && o.json) {
        printf("{\"sm\":%d,\"ptxas\":", (int)o.sm);
        if (have_ptxas) kiln_cli_json_str(stdout, ptxas);
        else printf("null");
        printf(",\"regions\":[");
    }
    for (uint32_t r = 0, first = 1; rc == KILN_CLI_OK && r < f.n_regions; r++) {
        if (o.region >= 0 && r != (uint32_t)o.region) continue;
        ptx_item *it = calloc(1, sizeof *it);
        if (!it) {
            rc = KILN_CLI_FAIL;
            break;
        }
        failed += !do_region(g, &f, r, (int)o.sm, ptxas, it);
        lowered += it->status == KILN_OK;
        for (uint32_t i = 0; i < it->n; i++) {
            const ptx_kernel *k = &it->k[i];
            spills += k->assembled ? k->rep.spill_stores + k->rep.spill_loads : 0;
            if (k->assembled && k->rep.regs > max_regs) max_regs = k->rep.regs;
        }
        if (o.json) print_item_json(it, first, o.summary);
        else print_item_text(it, f.n_regions, (int)o.sm, o.summary, o.kir);
        first = 0;
        free_item(it);
    }
    if (rc == KILN_CLI_OK) {
        if (o.json) printf("],\"lowered\":%d,\"failed\":%d,\"spill_bytes\":%d,\"max_regs\":%d}\n", lowered, failed, spills, max_regs);
        else printf("%u regions, %d lowered, %d failed; %s\n", f.n_regions, lowered, failed,
                    have_ptxas ? "assembled with ptxas" : "ptxas not found ($KILN_PTXAS, PATH, /usr/local/cuda/bin): not assembled");
        if (!o.json && have_ptxas && lowered) printf("spill bytes in all: %d, most registers: %d\n", spills, max_regs);
        if (failed) rc = KILN_CLI_FAIL;
    }
    kiln_fusion_free(&f);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    return rc;
}
