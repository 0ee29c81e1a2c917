/* The progress line (progress.h): one thread per line in progress, sleeping on a condition variable
 * between redraws so that ending it is immediate. Writes stderr only, and only when enabled. */
#include "util/progress.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/env.h"

#define DELAY_S 2.0    /* work shorter than this shows nothing on a terminal */
#define REDRAW_S 0.25  /* terminal redraw period */
#define LINE_S 1.0     /* forced plain lines' period */

struct kiln_progress {
    pthread_t       th;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    bool            stop;       /* end asked */
    bool            tty;        /* redraw in place; else plain lines (forced) */
    double          t0;         /* start, monotonic seconds */
    char            what[64], unit[16], detail[48];
    uint64_t        done, total;
    int             drawn;      /* length of the line on the terminal, 0 when none */
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Formats and writes the line; called with mu held. */
static void draw(kiln_progress *p, bool last)
{
    char line[200];
    int n = snprintf(line, sizeof line, "kiln: %s", p->what);
    if (p->total && n < (int)sizeof line)
        n += snprintf(line + n, sizeof line - (size_t)n, " %llu/%llu%s", (unsigned long long)p->done,
                      (unsigned long long)p->total, p->unit);
    if (p->detail[0] && n < (int)sizeof line) n += snprintf(line + n, sizeof line - (size_t)n, " (%s)", p->detail);
    if (n < (int)sizeof line) n += snprintf(line + n, sizeof line - (size_t)n, ", %.1f s%s", now_s() - p->t0, last ? ", done" : "");
    if (n >= (int)sizeof line) n = (int)sizeof line - 1;
    if (p->tty) fprintf(stderr, "\r%s%*s", line, p->drawn > n ? p->drawn - n : 0, "");
    else fprintf(stderr, "%s\n", line);
    fflush(stderr);
    p->drawn = n;
}

static void *ticker(void *arg)
{
    kiln_progress *p = arg;
    double period = p->tty ? REDRAW_S : LINE_S, next = p->t0 + (p->tty ? DELAY_S : 0);
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        double t = now_s();
        if (t >= next) {
            draw(p, false);
            next = t + period;
            continue;
        }
        struct timespec w;
        clock_gettime(CLOCK_MONOTONIC, &w);
        double d = next - t;
        w.tv_sec += (time_t)d;
        w.tv_nsec += (long)((d - (double)(time_t)d) * 1e9);
        if (w.tv_nsec >= 1000000000L) w.tv_sec++, w.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&p->cv, &p->mu, &w); /* the condition's clock is CLOCK_MONOTONIC */
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

kiln_progress *kiln_progress_start(bool quiet, const char *what, uint64_t total, const char *unit)
{
    const char *e = kiln_env(KILN_ENV_PROGRESS);
    bool forced = e && !strcmp(e, "1"), tty = isatty(2) == 1;
    if (quiet || (e && !strcmp(e, "0")) || (!forced && !tty)) return NULL;
    kiln_progress *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->tty = tty && !forced;
    p->t0 = now_s();
    p->total = total;
    snprintf(p->what, sizeof p->what, "%s", what);
    snprintf(p->unit, sizeof p->unit, "%s", unit ? unit : "");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&p->mu, NULL);
    if (pthread_create(&p->th, NULL, ticker, p) != 0) { /* no line rather than no work */
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return NULL;
    }
    return p;
}

void kiln_progress_set(kiln_progress *p, uint64_t done, const char *detail)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->done = done;
    if (detail) snprintf(p->detail, sizeof p->detail, "%s", detail);
    pthread_mutex_unlock(&p->mu);
}

void kiln_progress_end(kiln_progress *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->th, NULL);
    if (!p->tty) draw(p, true);
    else if (p->drawn) fprintf(stderr, "\r%*s\r", p->drawn, ""), fflush(stderr);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
