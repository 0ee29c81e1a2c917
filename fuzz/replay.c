/* A plain main for the fuzz targets (no libFuzzer): feeds every file named on the command line,
 * or every file in a named directory, to LLVMFuzzerTestOneInput once. CI replays the seed corpus
 * (tests/fuzz/corpus) through it under ASan/UBSan; a crash there is a regression, and so is an
 * input that runs past REPLAY_CPU_S seconds of CPU (the harnesses' caps keep each under a second:
 * tests/fuzz/corpus/build/huge-matmul-chain runs minutes without them). */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#ifndef REPLAY_CPU_S
#define REPLAY_CPU_S 30 /* CPU seconds one input may take (ASan Debug builds included) */
#endif

static const char *volatile current; /* the input being replayed, for the CPU-time alarm */

static void over_time(int sig)
{
    (void)sig;
    static const char msg[] = "replay: an input ran past its CPU-time limit (a fuzz harness cap is missing?): ";
    ssize_t r = write(2, msg, sizeof msg - 1); /* async-signal-safe output only */
    r += write(2, current, strlen(current));
    r += write(2, "\n", 1);
    _exit(r > 0 ? 3 : 4);
}

#include "fuzz/fuzz.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    while (buf && (n += fread(buf + n, 1, cap - n, f)) == cap) {
        uint8_t *b = realloc(buf, cap * 2);
        if (!b) break;
        buf = b;
        cap *= 2;
    }
    fclose(f);
    if (!buf) return 1;
    current = path;
    setitimer(ITIMER_VIRTUAL, &(struct itimerval){.it_value = {.tv_sec = REPLAY_CPU_S}}, NULL);
    LLVMFuzzerTestOneInput(buf, n);
    setitimer(ITIMER_VIRTUAL, &(struct itimerval){0}, NULL);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int files = 0, bad = 0;
    signal(SIGVTALRM, over_time);
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "%s: not found\n", argv[i]);
            bad++;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            bad += run_file(argv[i]);
            files++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        for (struct dirent *e; d && (e = readdir(d));) {
            if (e->d_name[0] == '.') continue;
            char path[8192];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            bad += run_file(path);
            files++;
        }
        if (d) closedir(d);
    }
    kiln_ctx_free(fuzz_ctx());
    printf("replayed %d inputs, %d unreadable\n", files, bad);
    return bad || files == 0;
}
