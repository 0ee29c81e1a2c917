/* Lazy random weights: the bytes of kiln_weight_random tensors, generated when a plan needs them
 * (kiln_compile calls kiln_graph_materialize_weights on its copy of the graph), rows split over
 * threads. Element e of a weight is splitmix64 step e + 1 from the seed, so any split gives the
 * same bytes. Must not be called while building or parsing: that is the point. */
#include "graph/graph.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#define MAX_THREADS 64 /* most generator threads */

typedef struct fill_job {
    const kiln_node_rec *n;     /* the weight */
    unsigned char       *dst;   /* its bytes */
    int64_t              row;   /* values per row (last dim) */
    int64_t              rows;  /* rows */
    size_t               row_b; /* bytes per row */
    int64_t              r0, r1;/* rows of this thread */
    kiln_status          st;    /* KILN_OK or KILN_ERR_NOMEM */
} fill_job;

static void *fill_rows(void *arg)
{
    fill_job *j = arg;
    float *tmp = malloc((size_t)j->row * sizeof *tmp);
    if (!tmp) {
        j->st = KILN_ERR_NOMEM;
        return NULL;
    }
    const uint64_t G = 0x9E3779B97F4A7C15ull;
    uint64_t base = j->n->seed * G + 0x632BE59BD9B4E019ull;
    float scale = j->n->rand_scale;
    for (int64_t r = j->r0; r < j->r1; r++) {
        uint64_t s = base + (uint64_t)r * (uint64_t)j->row * G;
        for (int64_t i = 0; i < j->row; i++) {
            s += G; /* splitmix64 */
            uint64_t z = s;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            z ^= z >> 31;
            tmp[i] = scale * (float)((double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0);
        }
        kiln_quantize((kiln_dtype)j->n->dtype, tmp, j->dst + (size_t)r * j->row_b, j->row);
    }
    free(tmp);
    return NULL;
}

kiln_status kiln_graph_weight_fill(const kiln_node_rec *n, void *dst)
{
    if (!n || !dst || n->rank < 1 || !n->random) return KILN_ERR_INVALID_ARG;
    int64_t row = n->dims[n->rank - 1], rows = 1;
    for (int i = 0; i + 1 < n->rank; i++) rows *= n->dims[i];
    if (row < 1 || rows < 1) return KILN_OK;
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t work = rows * row, nth = nc > 0 ? nc : 1;
    if (nth > MAX_THREADS) nth = MAX_THREADS;
    if (nth > work / (1 << 16) + 1) nth = work / (1 << 16) + 1; /* small weights: one thread */
    if (nth > rows) nth = rows;
    fill_job jobs[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    for (int64_t t = 0; t < nth; t++) {
        jobs[t] = (fill_job){.n = n, .dst = dst, .row = row, .rows = rows, .row_b = kiln_row_bytes((kiln_dtype)n->dtype, row),
                             .r0 = rows * t / nth, .r1 = rows * (t + 1) / nth, .st = KILN_OK};
        if (t > 0) started[t] = pthread_create(&tid[t], NULL, fill_rows, &jobs[t]) == 0;
    }
    fill_rows(&jobs[0]);
    kiln_status st = jobs[0].st;
    for (int64_t t = 1; t < nth; t++) {
        if (started[t]) pthread_join(tid[t], NULL);
        else fill_rows(&jobs[t]); /* no thread: do its rows here */
        if (jobs[t].st != KILN_OK) st = jobs[t].st;
    }
    return st;
}

kiln_status kiln_graph_materialize_weights(kiln_graph *g)
{
    if (!g) return KILN_ERR_INVALID_ARG;
    bool *used = calloc(g->n_nodes + 1, sizeof *used);
    if (!used) return KILN_ERR_NOMEM;
    for (uint32_t i = 0; i < g->n_nodes; i++) /* a weight no op reads is never generated */
        for (int k = 0; k < g->nodes[i].n_src; k++)
            if (g->nodes[i].src[k] < g->n_nodes) used[g->nodes[i].src[k]] = true;
    for (uint32_t o = 0; o < g->n_outs; o++) used[g->outs[o].node] = true;
    kiln_status st = KILN_OK;
    for (uint32_t i = 0; i < g->n_nodes && st == KILN_OK; i++) {
        kiln_node_rec *n = &g->nodes[i];
        if (n->op != KILN_OP_WEIGHT || !n->random || n->data || !used[i]) continue;
        void *data;
        kiln_blob *b = kiln_blob_new(kiln_node_bytes(n, n->dims), &data);
        if (!b) {
            st = KILN_ERR_NOMEM;
            break;
        }
        if ((st = kiln_graph_weight_fill(n, data)) != KILN_OK) {
            kiln_blob_unref(b);
            break;
        }
        n->data = data;
        n->blob = b;
    }
    free(used);
    return st;
}
