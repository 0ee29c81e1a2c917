/* The one table of environment variables (documented in docs/env.md) and the translation of the
 * code-changing ones into kiln_compile_options. The only getenv call in src/. Must not keep state:
 * every call reads the environment as it is. */
#include "util/env.h"

#include <stdlib.h>
#include <string.h>

static const char *const names[KILN_ENV_COUNT] = {
    [KILN_ENV_CPU_ISA] = "KILN_CPU_ISA",
    [KILN_ENV_CUDA_DEVICE] = "KILN_CUDA_DEVICE",
    [KILN_ENV_LIBCUDA] = "KILN_LIBCUDA",
    [KILN_ENV_PTX_DUMP] = "KILN_PTX_DUMP",
    [KILN_ENV_PTXAS] = "KILN_PTXAS",
    [KILN_ENV_PATH] = "PATH",
    [KILN_ENV_VK_DEVICE] = "KILN_VK_DEVICE",
    [KILN_ENV_CACHE] = "KILN_CACHE",
    [KILN_ENV_CACHE_DIR] = "KILN_CACHE_DIR",
    [KILN_ENV_CACHE_MAX] = "KILN_CACHE_MAX",
    [KILN_ENV_PROGRESS] = "KILN_PROGRESS",
    [KILN_ENV_XDG_CACHE_HOME] = "XDG_CACHE_HOME",
    [KILN_ENV_HOME] = "HOME",
    [KILN_ENV_SOURCE_DIR] = "KILN_SOURCE_DIR",
    [KILN_ENV_FAULT_INJECT] = "KILN_FAULT_INJECT",
    [KILN_ENV_GEMM] = "KILN_GEMM",
    [KILN_ENV_GEMM_BM] = "KILN_GEMM_BM",
    [KILN_ENV_GRID_CAP] = "KILN_GRID_CAP",
    [KILN_ENV_VK_DISABLE] = "KILN_VK_DISABLE",
    [KILN_ENV_NO_RECORD] = "KILN_NO_RECORD",
    [KILN_ENV_WGMMA] = "KILN_WGMMA",
    [KILN_ENV_PDL] = "KILN_PDL",
    [KILN_ENV_PRECISION] = "KILN_PRECISION",
    [KILN_ENV_FLASH] = "KILN_FLASH",
    [KILN_ENV_FLASH_WG] = "KILN_FLASH_WG",
    [KILN_ENV_FLASH_ROWS] = "KILN_FLASH_ROWS",
    [KILN_ENV_FLASH_SPLIT] = "KILN_FLASH_SPLIT",
    [KILN_ENV_GEMM_CLUSTER] = "KILN_GEMM_CLUSTER",
    [KILN_ENV_GEMM_EPILOGUE] = "KILN_GEMM_EPILOGUE",
    [KILN_ENV_GEMM_BN] = "KILN_GEMM_BN",
    [KILN_ENV_NCCL_LIB] = "KILN_NCCL_LIB",
    [KILN_ENV_VIRTUAL_ENV] = "VIRTUAL_ENV",
    [KILN_ENV_CONDA_PREFIX] = "CONDA_PREFIX",
    [KILN_ENV_SPLIT] = "KILN_SPLIT",
    [KILN_ENV_GEMV_PAIR] = "KILN_GEMV_PAIR",
    [KILN_ENV_GEMV_PREFETCH] = "KILN_GEMV_PREFETCH",
    [KILN_ENV_GEMV_FENCE] = "KILN_GEMV_FENCE",
    [KILN_ENV_ATTN_CLUSTER] = "KILN_ATTN_CLUSTER",
    [KILN_ENV_PAGED_DECODE] = "KILN_PAGED_DECODE",
    [KILN_ENV_PAGED_MIXED] = "KILN_PAGED_MIXED",
    [KILN_ENV_DECODE_KERNELS] = "KILN_DECODE_KERNELS",
    [KILN_ENV_GEMV_REDUCE] = "KILN_GEMV_REDUCE",
    [KILN_ENV_GEMV_PRELOAD] = "KILN_GEMV_PRELOAD",
    [KILN_ENV_GEMV_PIPELINE] = "KILN_GEMV_PIPELINE",
    [KILN_ENV_GEMM_PERSIST] = "KILN_GEMM_PERSIST",
    [KILN_ENV_GEMM_SPLITK] = "KILN_GEMM_SPLITK",
    [KILN_ENV_GEMV_XLOAD] = "KILN_GEMV_XLOAD",
    [KILN_ENV_GEMM_PAIRS] = "KILN_GEMM_PAIRS",
};

const char *kiln_env(enum kiln_env_var v)
{
    if ((unsigned)v >= KILN_ENV_COUNT) return NULL;
    const char *e = getenv(names[v]);
    return e && *e ? e : NULL;
}

const char *kiln_env_name(enum kiln_env_var v) { return (unsigned)v < KILN_ENV_COUNT ? names[v] : "?"; }

void kiln_env_options(const kiln_compile_options *in, kiln_compile_options *out)
{
    if (in) *out = *in;
    else memset(out, 0, sizeof *out);
    kiln_codegen_options *c = &out->codegen;
    const char *e;
    char *end = NULL;
    if (!c->gemm && (e = kiln_env(KILN_ENV_GEMM)) && !strcmp(e, "0")) c->gemm = KILN_GEMM_OFF;
    if (!c->gemm_rows && (e = kiln_env(KILN_ENV_GEMM_BM)) && !strcmp(e, "64")) c->gemm_rows = 64;
    if (!c->wgmma && (e = kiln_env(KILN_ENV_WGMMA))) c->wgmma = !strcmp(e, "1") ? KILN_GEMM_ON : !strcmp(e, "0") ? KILN_GEMM_OFF : 0;
    if (!c->pdl && (e = kiln_env(KILN_ENV_PDL)))
        c->pdl = !strcmp(e, "1") ? KILN_GEMM_ON : !strcmp(e, "2") ? KILN_PDL_NO_PREFETCH : !strcmp(e, "3") ? KILN_PDL_REGS
               : !strcmp(e, "0") ? KILN_GEMM_OFF : 0;
    if (!c->gemv_pair && (e = kiln_env(KILN_ENV_GEMV_PAIR)))
        c->gemv_pair = !strcmp(e, "1") ? KILN_GEMM_ON : !strcmp(e, "0") ? KILN_GEMM_OFF : 0;
    if (!c->gemv_prefetch && (e = kiln_env(KILN_ENV_GEMV_PREFETCH)) && e[0] >= '1' && e[0] <= '4' && !e[1]) c->gemv_prefetch = e[0] - '0';
    if (!c->gemv_fence && (e = kiln_env(KILN_ENV_GEMV_FENCE)))
        c->gemv_fence = !strcmp(e, "1") ? KILN_GEMM_ON : !strcmp(e, "0") ? KILN_GEMM_OFF : 0;
    if (!c->attn_cluster && (e = kiln_env(KILN_ENV_ATTN_CLUSTER)))
        c->attn_cluster = !strcmp(e, "1") ? KILN_GEMM_ON : !strcmp(e, "0") ? KILN_GEMM_OFF : 0;
    if (!c->paged_decode && (e = kiln_env(KILN_ENV_PAGED_DECODE))) {
        long v = strtol(e, &end, 10);
        c->paged_decode = *end ? 0 : v == 0 ? KILN_GEMM_OFF : v >= 1 && v <= 64 ? (int32_t)v : 0;
    }
    if (!c->paged_mixed && (e = kiln_env(KILN_ENV_PAGED_MIXED)))
        c->paged_mixed = !strcmp(e, "1") ? KILN_GEMM_ON : !strcmp(e, "0") ? KILN_GEMM_OFF : !strcmp(e, "2") ? KILN_PAGED_MIXED_SIDE
                       : !strcmp(e, "3") ? KILN_PAGED_MIXED_ALL : 0;
    if (!c->decode_kernels && (e = kiln_env(KILN_ENV_DECODE_KERNELS)))
        c->decode_kernels = !strcmp(e, "1") ? KILN_GEMM_ON : !strcmp(e, "0") ? KILN_GEMM_OFF : 0;
    if (!c->gemv_reduce && (e = kiln_env(KILN_ENV_GEMV_REDUCE)))
        c->gemv_reduce = !strcmp(e, "1") ? KILN_GEMM_ON : !strcmp(e, "0") ? KILN_GEMM_OFF : 0;
    if (!c->gemv_preload && (e = kiln_env(KILN_ENV_GEMV_PRELOAD)))
        c->gemv_preload = !strcmp(e, "1") ? KILN_GEMM_ON : !strcmp(e, "0") ? KILN_GEMM_OFF : 0;
    if (!c->gemv_pipeline && (e = kiln_env(KILN_ENV_GEMV_PIPELINE)))
        c->gemv_pipeline = !strcmp(e, "1") ? KILN_GEMM_ON : !strcmp(e, "0") ? KILN_GEMM_OFF : 0;
    if (!c->gemv_xload && (e = kiln_env(KILN_ENV_GEMV_XLOAD)))
        c->gemv_xload = !strcmp(e, "1") ? KILN_GEMM_ON : !strcmp(e, "0") ? KILN_GEMM_OFF : 0;
    if (!c->precision && (e = kiln_env(KILN_ENV_PRECISION)) && !strcmp(e, "f16")) c->precision = KILN_PREC_F16;
    if (!c->flash && (e = kiln_env(KILN_ENV_FLASH))) c->flash = !strcmp(e, "1") ? KILN_GEMM_ON : !strcmp(e, "0") ? KILN_GEMM_OFF : 0;
    if (!c->flash_wg && (e = kiln_env(KILN_ENV_FLASH_WG)))
        c->flash_wg = !strcmp(e, "1") ? KILN_GEMM_ON : !strcmp(e, "0") ? KILN_GEMM_OFF : !strcmp(e, "2") ? KILN_FLASH_WG_NO_PINGPONG
                    : !strcmp(e, "3") ? KILN_FLASH_WG_PINGPONG : 0;
    if (!c->flash_rows && (e = kiln_env(KILN_ENV_FLASH_ROWS))) c->flash_rows = !strcmp(e, "64") ? 64 : !strcmp(e, "128") ? 128 : 0;
    if (!c->flash_split && (e = kiln_env(KILN_ENV_FLASH_SPLIT))) c->flash_split = !strcmp(e, "2") ? 2 : !strcmp(e, "4") ? 4 : !strcmp(e, "1") ? 1 : !strcmp(e, "auto") ? -1 : 0;
    if (!c->gemm_cluster && (e = kiln_env(KILN_ENV_GEMM_CLUSTER)))
        c->gemm_cluster = !strcmp(e, "1") ? 1 : !strcmp(e, "2") ? 2 : !strcmp(e, "4") ? 4 : 0;
    if (!c->gemm_epilogue && (e = kiln_env(KILN_ENV_GEMM_EPILOGUE)))
        c->gemm_epilogue = !strcmp(e, "1") ? KILN_GEMM_ON : !strcmp(e, "0") ? KILN_GEMM_OFF : 0;
    if (!c->gemm_persist && (e = kiln_env(KILN_ENV_GEMM_PERSIST)))
        c->gemm_persist = !strcmp(e, "1") ? KILN_GEMM_ON : !strcmp(e, "0") ? KILN_GEMM_OFF : 0;
    if (!c->gemm_splitk && (e = kiln_env(KILN_ENV_GEMM_SPLITK)))
        c->gemm_splitk = !strcmp(e, "1") ? KILN_GEMM_ON : !strcmp(e, "0") ? KILN_GEMM_OFF : 0;
    if (!c->gemm_pairs && (e = kiln_env(KILN_ENV_GEMM_PAIRS)))
        c->gemm_pairs = !strcmp(e, "1") ? KILN_GEMM_ON : !strcmp(e, "0") ? KILN_GEMM_OFF : 0;
    if (!c->gemm_cols && (e = kiln_env(KILN_ENV_GEMM_BN)))
        c->gemm_cols = !strcmp(e, "128") ? 128 : !strcmp(e, "144") ? 144 : !strcmp(e, "160") ? 160 : !strcmp(e, "176") ? 176
                     : !strcmp(e, "192") ? 192 : !strcmp(e, "256") ? 256 : 0;
    if (!c->grid_cap && (e = kiln_env(KILN_ENV_GRID_CAP))) {
        long v = strtol(e, NULL, 10);
        c->grid_cap = v > 0 && v <= INT32_MAX ? (int32_t)v : v == 0 ? -1 : 0; /* "0": every virtual block */
    }
    if (!c->vk_disable && (e = kiln_env(KILN_ENV_VK_DISABLE)))
        c->vk_disable = (strstr(e, "16bit") ? KILN_VK_NO_16BIT : 0) | (strstr(e, "subgroup") ? KILN_VK_NO_SUBGROUP : 0) |
                        (strstr(e, "dot") ? KILN_VK_NO_DOT : 0);
    if (!out->no_record && kiln_env(KILN_ENV_NO_RECORD)) out->no_record = true;
}
