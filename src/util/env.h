/* The environment: every variable kiln reads, in one table (env.c) and one doc (docs/env.md). No
 * other file calls getenv. Variables that change generated code or launches only fill the
 * kiln_compile_options fields a caller left at zero (kiln_env_options); the rest are read where
 * they act, through kiln_env. Must not depend on anything but kiln.h. */
#pragma once

#include "kiln/kiln.h"

enum kiln_env_var {
    KILN_ENV_CPU_ISA = 0,    /* cap on the cpu backend's SIMD path */
    KILN_ENV_CUDA_DEVICE,    /* CUDA device ordinal */
    KILN_ENV_LIBCUDA,        /* another libcuda (the tests' stand-in driver) */
    KILN_ENV_PTX_DUMP,       /* folder that gets every compiled kernel's PTX */
    KILN_ENV_PTXAS,          /* ptxas for `kiln ptx` and the tests */
    KILN_ENV_PATH,           /* where else to look for ptxas */
    KILN_ENV_VK_DEVICE,      /* Vulkan device by index or name */
    KILN_ENV_CACHE,          /* kernel cache: off / on / all */
    KILN_ENV_CACHE_DIR,      /* kernel cache folder */
    KILN_ENV_CACHE_MAX,      /* the cache folder's size bound */
    KILN_ENV_PROGRESS,       /* progress lines on stderr: 0 never, 1 always (else on a terminal) */
    KILN_ENV_XDG_CACHE_HOME, /* its default parent */
    KILN_ENV_HOME,           /* its parent when XDG_CACHE_HOME is unset */
    KILN_ENV_SOURCE_DIR,     /* where contracts/ is */
    KILN_ENV_FAULT_INJECT,   /* test-only faults (util/fault.h) */
    KILN_ENV_GEMM,           /* kiln_compile_options.codegen.gemm */
    KILN_ENV_GEMM_BM,        /* kiln_compile_options.codegen.gemm_rows */
    KILN_ENV_GRID_CAP,       /* kiln_compile_options.codegen.grid_cap */
    KILN_ENV_VK_DISABLE,     /* kiln_compile_options.codegen.vk_disable */
    KILN_ENV_NO_RECORD,      /* kiln_compile_options.no_record */
    KILN_ENV_WGMMA,          /* kiln_compile_options.codegen.wgmma */
    KILN_ENV_PDL,            /* kiln_compile_options.codegen.pdl */
    KILN_ENV_PRECISION,      /* kiln_compile_options.codegen.precision */
    KILN_ENV_FLASH,          /* kiln_compile_options.codegen.flash */
    KILN_ENV_FLASH_WG,       /* kiln_compile_options.codegen.flash_wg */
    KILN_ENV_FLASH_ROWS,     /* kiln_compile_options.codegen.flash_rows */
    KILN_ENV_FLASH_SPLIT,    /* kiln_compile_options.codegen.flash_split */
    KILN_ENV_GEMM_CLUSTER,   /* kiln_compile_options.codegen.gemm_cluster */
    KILN_ENV_GEMM_EPILOGUE,  /* kiln_compile_options.codegen.gemm_epilogue */
    KILN_ENV_GEMM_BN,        /* kiln_compile_options.codegen.gemm_cols */
    KILN_ENV_NCCL_LIB,       /* libnccl for split plans over distinct GPUs */
    KILN_ENV_VIRTUAL_ENV,    /* a Python environment that may ship NCCL (nvidia/nccl/lib) */
    KILN_ENV_CONDA_PREFIX,   /* a conda environment, likewise */
    KILN_ENV_SPLIT,          /* "all": split plans divide whatever divides, without the cost model */
    KILN_ENV_GEMV_PAIR,      /* kiln_compile_options.codegen.gemv_pair */
    KILN_ENV_GEMV_PREFETCH,  /* kiln_compile_options.codegen.gemv_prefetch */
    KILN_ENV_GEMV_FENCE,     /* kiln_compile_options.codegen.gemv_fence */
    KILN_ENV_ATTN_CLUSTER,   /* kiln_compile_options.codegen.attn_cluster */
    KILN_ENV_PAGED_DECODE,   /* kiln_compile_options.codegen.paged_decode */
    KILN_ENV_DECODE_KERNELS,    /* kiln_compile_options.codegen.decode_kernels */
    KILN_ENV_GEMV_REDUCE,    /* kiln_compile_options.codegen.gemv_reduce */
    KILN_ENV_GEMV_PRELOAD,   /* kiln_compile_options.codegen.gemv_preload */
    KILN_ENV_PAGED_MIXED,    /* kiln_compile_options.codegen.paged_mixed */
    KILN_ENV_GEMV_PIPELINE,  /* kiln_compile_options.codegen.gemv_pipeline */
    KILN_ENV_GEMM_PERSIST,   /* kiln_compile_options.codegen.gemm_persist */
    KILN_ENV_GEMM_SPLITK,    /* kiln_compile_options.codegen.gemm_splitk */
    KILN_ENV_GEMV_XLOAD,     /* kiln_compile_options.codegen.gemv_xload */
    KILN_ENV_GEMM_PAIRS,     /* kiln_compile_options.codegen.gemm_pairs */
    KILN_ENV_COUNT
};

/* The variable's value, or NULL when unset or empty. Read at each call (tests set some of them
 * between calls: KILN_FAULT_INJECT, KILN_LIBCUDA). */
const char *kiln_env(enum kiln_env_var v);
/* Its name ("KILN_GEMM"), for messages. */
const char *kiln_env_name(enum kiln_env_var v);
/* The options a compile runs with: *o (or zeros for NULL) with every code-generation field left at
 * zero, and no_record, filled from its variable. */
void kiln_env_options(const kiln_compile_options *in, kiln_compile_options *out);
