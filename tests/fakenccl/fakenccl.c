/* A stand-in NCCL for tests (loaded through $KILN_NCCL_LIB beside tests/fakecuda): the entry points
 * kiln's cuda backend resolves, each call written to a log the tests read (fakenccl_log), and the
 * sum computed for real on fakecuda's device memory (host memory there) when a group ends.
 * FAKENCCL_VERSION sets the version, FAKENCCL_INIT_FAIL=1 makes ncclCommInitAll fail and
 * FAKENCCL_REDUCE_FAIL=1 makes ncclAllReduce and ncclAllGather fail. Must never be linked into kiln. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef struct fcomm { int rank, n, dev; } fcomm;
typedef struct pending { const float *x; float *y; size_t count; int rank; int gather; } pending;

static char    log_buf[1 << 16];
static size_t  log_len;
static int     in_group;
static pending pend[64];
static int     n_pend;

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static void logf_(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(log_buf + log_len, sizeof log_buf - log_len, fmt, ap);
    va_end(ap);
    if (k > 0 && log_len + (size_t)k < sizeof log_buf) log_len += (size_t)k;
}

static int env_int(const char *n, int d)
{
    const char *e = getenv(n);
    return e && *e ? atoi(e) : d;
}

EXPORT const char *fakenccl_log(void) { return log_buf; }
EXPORT void fakenccl_reset(void) { log_len = 0, log_buf[0] = 0, in_group = 0, n_pend = 0; }

EXPORT int ncclGetVersion(int *v)
{
    *v = env_int("FAKENCCL_VERSION", 22105);
    return 0;
}

EXPORT int ncclCommInitAll(fcomm **comms, int n, const int *devs)
{
    logf_("init %d:", n);
    for (int i = 0; i < n; i++) logf_(" %d", devs ? devs[i] : i);
    logf_("\n");
    if (env_int("FAKENCCL_INIT_FAIL", 0)) return 2; /* ncclSystemError */
    for (int i = 0; i < n; i++) {
        comms[i] = malloc(sizeof **comms);
        *comms[i] = (fcomm){.rank = i, .n = n, .dev = devs ? devs[i] : i};
    }
    return 0;
}

EXPORT int ncclGroupStart(void)
{
    logf_("group{");
    in_group = 1;
    n_pend = 0;
    return 0;
}

/* Every pending call of the group gets the sum of all their x (same count), in rank order; or for
 * all-gathers, every x at its rank's slice. */
EXPORT int ncclGroupEnd(void)
{
    logf_("}\n");
    if (!in_group) return 4; /* ncclInvalidArgument */
    in_group = 0;
    if (n_pend == 0) return 0;
    size_t count = pend[0].count;
    if (pend[0].gather) {
        for (int q = 0; q < n_pend; q++)
            for (int r = 0; r < n_pend; r++) memcpy(pend[q].y + (size_t)pend[r].rank * count, pend[r].x, count * sizeof(float));
        n_pend = 0;
        return 0;
    }
    float *sum = calloc(count ? count : 1, sizeof *sum);
    if (!sum) return 2;
    for (int r = 0; r < n_pend; r++)
        for (int q = 0; q < n_pend; q++)
            if (pend[q].rank == r)
                for (size_t i = 0; i < count; i++) sum[i] += pend[q].x[i];
    for (int q = 0; q < n_pend; q++) memcpy(pend[q].y, sum, count * sizeof *sum);
    free(sum);
    n_pend = 0;
    return 0;
}

EXPORT int ncclAllReduce(const void *x, void *y, size_t count, int dtype, int op, fcomm *comm, void *stream)
{
    logf_(" ar(rank %d, %zu, dtype %d, op %d%s)", comm->rank, count, dtype, op, stream ? "" : ", no stream");
    if (env_int("FAKENCCL_REDUCE_FAIL", 0)) return 3; /* ncclInternalError */
    if (!in_group || n_pend == 64 || dtype != 7 || op != 0 || (n_pend && pend[0].count != count)) return 4;
    pend[n_pend++] = (pending){.x = x, .y = y, .count = count, .rank = comm->rank};
    return 0;
}

EXPORT int ncclAllGather(const void *x, void *y, size_t count, int dtype, fcomm *comm, void *stream)
{
    logf_(" ag(rank %d, %zu, dtype %d%s)", comm->rank, count, dtype, stream ? "" : ", no stream");
    if (env_int("FAKENCCL_REDUCE_FAIL", 0)) return 3;
    if (!in_group || n_pend == 64 || dtype != 7 || (n_pend && (pend[0].count != count || !pend[0].gather))) return 4;
    pend[n_pend++] = (pending){.x = x, .y = y, .count = count, .rank = comm->rank, .gather = 1};
    return 0;
}

EXPORT int ncclCommDestroy(fcomm *comm)
{
    logf_("destroy %d\n", comm->rank);
    free(comm);
    return 0;
}

EXPORT const char *ncclGetErrorString(int r)
{
    static const char *const text[] = {"no error", "unhandled cuda error", "unhandled system error (fake)",
                                       "internal error (fake)", "invalid argument (fake)"};
    return r >= 0 && r <= 4 ? text[r] : "unknown";
}
