/* CPU ISA detection (cpuid + xgetbv, once per process) and the KILN_CPU_ISA override, plus the
 * table of kernel sets per ISA. Must not use any vector instruction itself: it runs before
 * anyone knows what the CPU has. */
#include <pthread.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "util/env.h"
#include "backends/cpu/cpu.h"
#include "backends/cpu/kern.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define KILN_X86 1
#endif

static enum kiln_cpu_isa g_max = KILN_CPU_ISA_COUNT; /* detected once; COUNT = not yet */
static bool g_vnni;                                  /* AVX-512 VNNI present */

#ifdef KILN_X86
static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static enum kiln_cpu_isa probe(bool *vnni)
{
    unsigned a, b, c, d;
    *vnni = false;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return KILN_CPU_ISA_SCALAR;
    bool osxsave = c & (1u << 27), fma = c & (1u << 12), f16c = c & (1u << 29), avx = c & (1u << 28);
    if (!osxsave || !avx || !fma || !f16c)
        return KILN_CPU_ISA_SCALAR;
    uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 6) != 6) /* XMM and YMM state enabled by the OS */
        return KILN_CPU_ISA_SCALAR;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return KILN_CPU_ISA_SCALAR;
    if (!(b & (1u << 5))) /* AVX2 */
        return KILN_CPU_ISA_SCALAR;
    bool f = b & (1u << 16), dq = b & (1u << 17), bw = b & (1u << 30), vl = b & (1u << 31);
    bool zmm_os = (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM_Hi256, Hi16_ZMM */
    if (f && dq && bw && vl && zmm_os) {
        *vnni = c & (1u << 11);
        return KILN_CPU_ISA_AVX512;
    }
    return KILN_CPU_ISA_AVX2;
}
#else
static enum kiln_cpu_isa probe(bool *vnni)
{
    *vnni = false;
    return KILN_CPU_ISA_SCALAR;
}
#endif

static kiln_cpu_kern g_tab[KILN_CPU_ISA_COUNT]; /* complete tables, filled once */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* Copies every NULL entry of t from lower (the next lower ISA's complete table). */
static void fill(kiln_cpu_kern *t, const kiln_cpu_kern *lower)
{
    for (int i = 0; i < KILN_DTYPE_COUNT; i++)
        if (!t->mm[i])
            t->mm[i] = lower->mm[i];
    for (int i = 0; i < 2; i++) {
        if (!t->kv_dot[i])
            t->kv_dot[i] = lower->kv_dot[i];
        if (!t->kv_axpy[i])
            t->kv_axpy[i] = lower->kv_axpy[i];
    }
    if (!t->exp_sum)
        t->exp_sum = lower->exp_sum;
    if (!t->fma_loop)
        t->fma_loop = lower->fma_loop;
    if (!t->read_sum)
        t->read_sum = lower->read_sum;
    if (!t->swiglu)
        t->swiglu = lower->swiglu;
}

static void init_once(void)
{
    bool v;
    g_max = probe(&v);
    g_vnni = v;
    g_tab[KILN_CPU_ISA_SCALAR] = kiln_cpu_kern_scalar;
    g_tab[KILN_CPU_ISA_AVX2] = g_tab[KILN_CPU_ISA_AVX512] = kiln_cpu_kern_scalar;
#ifdef KILN_X86
    g_tab[KILN_CPU_ISA_AVX2] = kiln_cpu_kern_avx2;
    fill(&g_tab[KILN_CPU_ISA_AVX2], &g_tab[KILN_CPU_ISA_SCALAR]);
    /* AVX-512 = the VNNI table (CPUs with VNNI only) over the plain AVX-512 one over AVX2's. */
    g_tab[KILN_CPU_ISA_AVX512] = g_vnni ? kiln_cpu_kern_avx512vnni : kiln_cpu_kern_avx512;
    if (g_vnni)
        fill(&g_tab[KILN_CPU_ISA_AVX512], &kiln_cpu_kern_avx512);
    fill(&g_tab[KILN_CPU_ISA_AVX512], &g_tab[KILN_CPU_ISA_AVX2]);
#endif
}

enum kiln_cpu_isa kiln_cpu_isa_max(void)
{
    pthread_once(&g_once, init_once);
    return g_max;
}

bool kiln_cpu_has_vnni(void)
{
    kiln_cpu_isa_max();
    return g_vnni;
}

enum kiln_cpu_isa kiln_cpu_isa_detect(void)
{
    enum kiln_cpu_isa m = kiln_cpu_isa_max();
    const char *e = kiln_env(KILN_ENV_CPU_ISA);
    if (e && strcmp(e, "best") != 0) {
        for (int i = 0; i < KILN_CPU_ISA_COUNT; i++)
            if (strcmp(e, kiln_cpu_isa_name((enum kiln_cpu_isa)i)) == 0)
                return (enum kiln_cpu_isa)i < m ? (enum kiln_cpu_isa)i : m;
        /* A typo must not pass silently as "best": say so once per process. */
        static atomic_flag warned = ATOMIC_FLAG_INIT;
        if (!atomic_flag_test_and_set(&warned))
            fprintf(stderr, "kiln: warning: KILN_CPU_ISA='%.40s' is not one of scalar, avx2, avx512, best; using %s\n", e,
                    kiln_cpu_isa_name(m));
    }
    return m;
}

const char *kiln_cpu_isa_name(enum kiln_cpu_isa isa)
{
    switch (isa) {
    case KILN_CPU_ISA_SCALAR: return "scalar";
    case KILN_CPU_ISA_AVX2: return "avx2";
    case KILN_CPU_ISA_AVX512: return "avx512";
    default: return "?";
    }
}

const kiln_cpu_kern *kiln_cpu_kern_get(enum kiln_cpu_isa isa)
{
    enum kiln_cpu_isa m = kiln_cpu_isa_max();
    if ((unsigned)isa >= KILN_CPU_ISA_COUNT || isa > m)
        isa = m;
    return &g_tab[isa];
}
