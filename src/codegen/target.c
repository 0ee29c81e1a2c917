/* The default lowering target (an H100's numbers, which the templates were tuned on) and the
 * merge of compile options into a backend's target. Must not probe any device. */
#include "codegen/target.h"

kiln_lower_target kiln_lower_target_default(void)
{
    return (kiln_lower_target){.sm_count = 132,
                               .busy_warps = 4096,
                               .grid_max = 4096,
                               .smem_bytes = 32768,
                               .warp = 32,
                               .mma = true,
                               .dp4a = true};
}

kiln_lower_target kiln_lower_target_for_sm(int sm)
{
    kiln_lower_target t = kiln_lower_target_default();
    t.wgmma = sm == 90;
    t.griddep = sm == 90;
    t.mma_native = true;
    return t;
}

bool kiln_lower_target_pdl(const kiln_lower_target *t)
{
    return t->griddep && (t->opts.pdl == KILN_GEMM_ON || t->opts.pdl == KILN_PDL_NO_PREFETCH || t->opts.pdl == KILN_PDL_REGS);
}

uint32_t kiln_stride_blocks(uint32_t n, uint64_t resident, uint32_t limit, int32_t cap)
{
    if (cap > 0) {
        if ((uint32_t)cap < n) n = (uint32_t)cap;
    } else if (cap == 0 && resident > 0 && resident < n) {
        n = (uint32_t)resident;
    }
    return n < limit ? n : limit;
}

uint32_t kiln_lower_smem_for(const kiln_lower_target *t, uint32_t threads)
{
    uint32_t printer = t->mma_native ? 0 : 4 * threads;
    return t->smem_bytes > printer ? t->smem_bytes - printer : 0;
}

kiln_lower_target kiln_lower_target_with(const kiln_lower_target *t, const kiln_codegen_options *o)
{
    kiln_lower_target r = *t;
    if (o) r.opts = *o;
    return r;
}
