/* A progress line on stderr for long work (compiles, model loading, prefill): redrawn in place on
 * a terminal by a thread of its own once 2 s have passed, so one long call still shows time going
 * by. Off with quiet, when stderr is not a terminal, or KILN_PROGRESS=0; KILN_PROGRESS=1 forces
 * plain lines (one a second, from the start: logs and tests). Must not print anything else. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

typedef struct kiln_progress kiln_progress;

/* Starts "kiln: WHAT DONE/TOTAL UNIT (DETAIL), T s" (total 0: no count). NULL when progress is
 * off or cannot start (every other call accepts NULL and does nothing). */
kiln_progress *kiln_progress_start(bool quiet, const char *what, uint64_t total, const char *unit);
/* Updates the count and the detail (NULL keeps it); cheap, any thread. */
void kiln_progress_set(kiln_progress *p, uint64_t done, const char *detail);
/* Stops the thread: a terminal's line is erased, a forced one ends with a last line. Frees p. */
void kiln_progress_end(kiln_progress *p);
