/* Fusion rules (DESIGN.md, Fusion): filled in by the fusion work; until then no node merges. */
#include "fuse/fuse.h"

void kiln_fuse_apply_rules(const kiln_graph *g, uint32_t *group, uint32_t *anchor_of) {}
