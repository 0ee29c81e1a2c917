/* GEMV template. */
#include "codegen/lower.h"

kiln_status kiln_lower_gemv(const kiln_graph *g, const kiln_region *r, kiln_kir *k, char *err, size_t n_err)
{
    return kl_unsupported(err, n_err, "matmul is not lowered yet");
}
