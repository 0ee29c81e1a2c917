/* The stand-in CUDA driver (tests/fakecuda) from a test: its log, read through the same handle
 * kiln's dlopen of $KILN_LIBCUDA shares, and the environment that points kiln at it. One place for
 * what test_cuda_backend, test_replay and test_mgpu each set up by hand before. Asserts (Criterion)
 * when the driver cannot be loaded; must not be used by tests that want the machine's own driver. */
#pragma once

#include "fakecuda/fakecuda.h"
#include "kiln/kiln.h"

/* The driver's log (loads it on first use; the counters run on across calls). */
fakecuda_log *tu_fakecuda(void);
/* Points kiln at the stand-in driver ($KILN_LIBCUDA): contexts made after this see its device. */
void tu_fakecuda_use(void);
/* tu_fakecuda_use, then a quiet context with n_threads host threads (0: the default). */
kiln_ctx *tu_fakecuda_ctx(int n_threads);
