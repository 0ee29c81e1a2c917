/* `kiln spirv FILE.kg | --preset NAME [--disasm] [--features none|all]`: every fused region of a
 * graph lowered to kir and printed as the Vulkan backend's GLSL (or, with --disasm, the SPIR-V
 * disassembly through spirv-dis). Reports only; never runs a graph and needs no device. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "codegen/kir.h"
#include "fuse/fuse.h"
#include "model/presets.h"
#include "spirv/spirv.h"
#include "util/env.h"

typedef struct spirv_opts {
    const char        *file;     /* FILE.kg, or NULL with --preset */
    const kiln_preset *preset;   /* --preset */
    kiln_dtype         wtype;    /* --wtype */
    int64_t            ctx;      /* --ctx: bound of n_kv */
    int64_t            tokens;   /* --tokens: bound of n_tok */
    bool               disasm;   /* --disasm */
    bool               no_fuse;  /* --no-fuse */
    bool               all;      /* --features all: every optional device feature (else none) */
} spirv_opts;

static int parse_spirv(int argc, char *const *argv, spirv_opts *o)
{
    *o = (spirv_opts){.wtype = KILN_DTYPE_Q8_0, .ctx = 1024, .tokens = 1};
    kiln_cli_args a = {.argc = argc, .argv = argv, .i = 1, .cmd = "spirv"};
    while (a.i < argc) {
        const char *v, *arg = argv[a.i];
        int r;
        int64_t n;
        if ((r = kiln_cli_preset_flags(&a, &o->preset, &o->wtype)) != 0) {
            if (r < 0) return KILN_CLI_USAGE;
        } else if ((r = kiln_cli_flag_value(&a, "--ctx", &v)) != 0 || (r = kiln_cli_flag_value(&a, "--tokens", &v)) != 0) {
            if (r < 0 || !kiln_cli_parse_i64("spirv", arg, v, 1, 1 << 20, &n)) return KILN_CLI_USAGE;
            *(strstr(arg, "ctx") ? &o->ctx : &o->tokens) = n;
        } else if ((r = kiln_cli_flag_value(&a, "--features", &v)) != 0) {
            if (r < 0) return KILN_CLI_USAGE;
            if (strcmp(v, "none") && strcmp(v, "all")) {
                fprintf(stderr, "kiln spirv: --features takes none or all\n");
                return KILN_CLI_USAGE;
            }
            o->all = !strcmp(v, "all");
        } else if (!strcmp(arg, "--disasm") || !strcmp(arg, "--no-fuse")) {
            *(arg[2] == 'd' ? &o->disasm : &o->no_fuse) = true;
            a.i++;
        } else if (arg[0] == '-') {
            return kiln_cli_unknown_flag("spirv", arg);
        } else if (!o->file) {
            o->file = arg;
            a.i++;
        } else {
            fprintf(stderr, "kiln spirv: unexpected argument '%s' (see kiln spirv --help)\n", arg);
            return KILN_CLI_USAGE;
        }
    }
    return kiln_cli_one_source("spirv", o->file, o->preset) ? KILN_CLI_OK : KILN_CLI_USAGE;
}

/* Whether an executable spirv-dis is on PATH (asked once, before any output). */
static bool have_spirv_dis(void)
{
    const char *path = kiln_env(KILN_ENV_PATH); /* the one environment table (util/env.c) */
    char dir[4096];
    while (path && *path) {
        size_t n = strcspn(path, ":");
        snprintf(dir, sizeof dir, "%.*s/spirv-dis", (int)(n ? n : 1), n ? path : ".");
        if (access(dir, X_OK) == 0) return true;
        path += n + (path[n] == ':');
    }
    return false;
}

/* Prints the spirv-dis listing of words; false (with spirv-dis's exit status said) when it fails. */
static bool disasm(const uint32_t *words, size_t n)
{
    char path[] = "/tmp/kiln_spirv_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return false;
    bool ok = write(fd, words, n * 4) == (ssize_t)(n * 4);
    close(fd);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "spirv-dis --no-color '%s'", path);
    fflush(stdout);
    int st = ok ? system(cmd) : -1;
    unlink(path);
    if (st != 0)
        fprintf(stderr, "kiln spirv: %s\n", !ok ? "cannot write the SPIR-V to a temporary file"
                                         : st == -1 ? "cannot start a shell for spirv-dis"
                                         : WIFEXITED(st) ? "spirv-dis failed (its message is above)"
                                                         : "spirv-dis was stopped by a signal (output closed?)");
    return st == 0;
}

/* Prints kernel j of region i; false on failure. */
static bool print_kernel(const kiln_kir *k, uint32_t i, uint32_t j, const spirv_opts *o, const kiln_spv_features *f)
{
    char err[2048] = "";
    printf("// ---- region %u kernel %u: %s, %u threads x grid %u,%u,%u: %s\n", i, j, k->name, k->block, k->grid[0], k->grid[1],
           k->grid[2], k->what);
    char *glsl = NULL;
    uint32_t *words = NULL;
    size_t n_words = 0;
    kiln_status s = kiln_spv_glsl(k, f, &glsl, err, sizeof err);
    if (s == KILN_OK && o->disasm) s = kiln_spv_compile(glsl, &words, &n_words, err, sizeof err);
    bool ok = s == KILN_OK;
    if (!ok) printf("// error: %s: %s\n", kiln_status_str(s), err);
    else if (!o->disasm) fputs(glsl, stdout);
    else if (!disasm(words, n_words))
        ok = false;
    printf("\n");
    free(words);
    free(glsl);
    return ok;
}

/* Prints region i's kernels; returns false when it failed for another reason than "no template". */
static bool print_region(const kiln_graph *g, const kiln_region *r, uint32_t i, const spirv_opts *o, const kiln_spv_features *f)
{
    kiln_kir k[KILN_LOWER_MAX];
    uint32_t nk = 0;
    char err[512] = "";
    kiln_status s = kiln_lower_region_seq(g, r, k, &nk, err, sizeof err);
    printf("// ---- region %u (%s, anchor #%u): ", i, kiln_region_kind_name((enum kiln_region_kind)r->kind), r->anchor);
    if (s != KILN_OK) {
        printf("not lowered: %s\n\n", err);
        return s == KILN_ERR_UNSUPPORTED;
    }
    printf("%u kernel%s\n", nk, nk > 1 ? "s" : "");
    bool ok = true;
    for (uint32_t j = 0; j < nk; j++) {
        ok &= print_kernel(&k[j], i, j, o, f);
        kiln_kir_free(&k[j]);
    }
    return ok;
}

int kiln_cli_spirv(int argc, char *const *argv)
{
    if (kiln_cli_wants_help(argc, argv, "spirv")) return KILN_CLI_OK;
    spirv_opts o;
    int rc = parse_spirv(argc, argv, &o);
    if (rc != KILN_CLI_OK) return rc;
    if (o.disasm && !have_spirv_dis()) {
        fprintf(stderr, "kiln spirv: --disasm runs spirv-dis, which is not on PATH (apt-get install spirv-tools)\n");
        return KILN_CLI_FAIL;
    }
    kiln_ctx *ctx = NULL;
    kiln_graph *g = NULL;
    kiln_status s = kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx);
    if (s != KILN_OK) return kiln_cli_fail("spirv", ctx, s, "creating the context");
    rc = kiln_cli_load_source("spirv", ctx, o.file, o.preset, o.wtype,
                              (kiln_preset_build_opts){.n_layers = 1, .max_ctx = o.ctx, .max_tok = o.tokens, .seed = 1}, &g);
    if (rc != KILN_CLI_OK) goto out;
    kiln_fusion fu;
    if ((s = kiln_fuse(g, !o.no_fuse, &fu)) != KILN_OK) {
        rc = kiln_cli_fail("spirv", ctx, s, "fusing");
        goto out;
    }
    const kiln_spv_features none = {0}, all = {.storage16 = true, .int_dot = true, .subgroup_size = 32,
                                               .subgroup_arith = true, .subgroup_clustered = true};
    for (uint32_t i = 0; i < fu.n_regions; i++)
        if (!print_region(g, &fu.regions[i], i, &o, o.all ? &all : &none)) rc = KILN_CLI_FAIL;
    kiln_fusion_free(&fu);
out:
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    return rc;
}
