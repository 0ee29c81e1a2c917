/* Attention template (decode, split-KV flash-decoding with grouped-query heads). */
#include "codegen/lower.h"

kiln_status kiln_lower_attention(const kiln_graph *g, const kiln_region *r, kiln_kir *k, char *err, size_t n_err)
{
    return kl_unsupported(err, n_err, "attention is not lowered yet");
}
