/* Device memory of the CUDA backend: a pool over cuMemAlloc. Sizes round up to 256 bytes; freed
 * blocks are kept and handed out again for requests of about their size (cuMemFree synchronizes
 * the whole device, so plans that are built and freed repeatedly must not call it every time).
 * Out of memory empties the cache and retries once. Must not touch memory contents. */
#include "backends/cuda/cuda.h"

#include <stdio.h>
#include <stdlib.h>

static size_t round256(size_t b) { return b ? (b + 255) & ~(size_t)255 : 256; }

static void drop(kiln_cuda *c, size_t i)
{
    c->d.mem_free(c->blocks[i].ptr); /* errors ignored: the block is gone either way */
    c->blocks[i] = c->blocks[--c->n_blocks];
}

void kiln_cuda_pool_trim(kiln_cuda *c)
{
    for (size_t i = c->n_blocks; i-- > 0;)
        if (!c->blocks[i].live) drop(c, i);
    c->cached = 0;
}

kiln_status kiln_cuda_alloc(kiln_cuda *c, size_t bytes, CUdeviceptr *out, char *err, size_t n)
{
    *out = 0;
    size_t want = round256(bytes);
    if (want < bytes) {
        snprintf(err, n, "device allocation of %zu bytes is too large", bytes);
        return KILN_ERR_NOMEM;
    }
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < c->n_blocks; i++) {
        const kiln_cuda_block *b = &c->blocks[i];
        if (!b->live && b->bytes >= want && b->bytes - want <= want / 8 && (best == SIZE_MAX || b->bytes < c->blocks[best].bytes))
            best = i;
    }
    if (best != SIZE_MAX) {
        c->blocks[best].live = true;
        c->cached -= c->blocks[best].bytes;
        *out = c->blocks[best].ptr;
        return KILN_OK;
    }
    if (c->n_blocks == c->cap_blocks) {
        size_t cap = c->cap_blocks ? 2 * c->cap_blocks : 64;
        kiln_cuda_block *grown = realloc(c->blocks, cap * sizeof *grown);
        if (!grown) {
            snprintf(err, n, "out of host memory for the device pool's table");
            return KILN_ERR_NOMEM;
        }
        c->blocks = grown;
        c->cap_blocks = cap;
    }
    CUdeviceptr p = 0;
    CUresult r = c->d.mem_alloc(&p, want);
    if (r == KILN_CU_ERROR_OUT_OF_MEMORY && c->cached) {
        kiln_cuda_pool_trim(c);
        r = c->d.mem_alloc(&p, want);
    }
    if (r != KILN_CU_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cuMemAlloc of %zu bytes (%.1f MiB)", want, want / 1048576.0);
        return kiln_cuda_fail(c, r, what, err, n);
    }
    c->blocks[c->n_blocks++] = (kiln_cuda_block){.ptr = p, .bytes = want, .live = true};
    *out = p;
    return KILN_OK;
}

void kiln_cuda_free(kiln_cuda *c, CUdeviceptr p)
{
    if (!p) return;
    for (size_t i = 0; i < c->n_blocks; i++) {
        kiln_cuda_block *b = &c->blocks[i];
        if (b->ptr != p || !b->live) continue;
        b->live = false;
        c->cached += b->bytes;
        /* keep at most a quarter of the device cached */
        if (c->cached > c->mem_total / 4) {
            c->cached -= b->bytes;
            drop(c, i);
        }
        return;
    }
}

void kiln_cuda_pool_destroy(kiln_cuda *c)
{
    for (size_t i = c->n_blocks; i-- > 0;) drop(c, i);
    free(c->blocks);
    c->blocks = NULL;
    c->n_blocks = c->cap_blocks = c->cached = 0;
}
