/* Finding and running NVIDIA's ptxas on printed PTX: assembles it for one sm with -v and reads the
 * register, spill, stack and shared-memory report. Used by the tests and `kiln ptx`, never by the
 * CUDA backend (the driver JITs PTX itself). Must not need a GPU or the CUDA driver. */
#include "util/env.h"
#include "ptx/ptx.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static bool executable(const char *path) { return path[0] && access(path, X_OK) == 0; }

bool kiln_ptx_find_ptxas(char *path, size_t n)
{
    const char *env = kiln_env(KILN_ENV_PTXAS);
    if (env && env[0]) {
        snprintf(path, n, "%s", env);
        if (executable(path)) return true;
    }
    const char *dirs = kiln_env(KILN_ENV_PATH);
    while (dirs && *dirs) {
        size_t len = strcspn(dirs, ":");
        if (len) {
            snprintf(path, n, "%.*s/ptxas", (int)len, dirs);
            if (executable(path)) return true;
        }
        dirs += len + (dirs[len] == ':');
    }
    snprintf(path, n, "/usr/local/cuda/bin/ptxas");
    if (executable(path)) return true;
    path[0] = '\0';
    return false;
}

/* The integer just before `word` in line (e.g. "24 bytes spill stores"), or -1. */
static int number_before(const char *line, const char *word)
{
    const char *w = strstr(line, word);
    if (!w) return -1;
    while (w > line && w[-1] == ' ') w--;
    const char *d = w;
    while (d > line && d[-1] >= '0' && d[-1] <= '9') d--;
    return d < w ? atoi(d) : -1;
}

static void parse_report(kiln_ptxas_report *rep)
{
    for (const char *line = rep->log; *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[512];
        snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), line);
        int v;
        if ((v = number_before(buf, "registers")) >= 0) rep->regs = v;
        if ((v = number_before(buf, "bytes spill stores")) >= 0) rep->spill_stores = v;
        if ((v = number_before(buf, "bytes spill loads")) >= 0) rep->spill_loads = v;
        if ((v = number_before(buf, "bytes stack frame")) >= 0) rep->stack = v;
        if ((v = number_before(buf, "bytes smem")) >= 0) rep->smem = v;
        if ((v = number_before(buf, "bytes cmem[0]")) >= 0) rep->cmem = v;
        line += len + (end != NULL);
    }
}

/* Runs argv[0] with stdout and stderr into the file `log_fd`; returns the exit status or -1. */
static int run_to(char *const *argv, int log_fd)
{
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(log_fd, 1);
        dup2(log_fd, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

kiln_status kiln_ptx_assemble(const char *ptxas, const char *ptx, int sm, kiln_ptxas_report *rep, char *err,
                              size_t n)
{
    memset(rep, 0, sizeof *rep);
    char src[] = "/tmp/kiln_ptx_XXXXXX", log[] = "/tmp/kiln_ptxas_XXXXXX";
    int fs = mkstemp(src);
    if (fs < 0) {
        snprintf(err, n, "mkstemp: %s", strerror(errno));
        return KILN_ERR_IO;
    }
    int fl = mkstemp(log);
    size_t len = strlen(ptx);
    bool wrote = fl >= 0 && write(fs, ptx, len) == (ssize_t)len;
    close(fs);
    kiln_status s = KILN_OK;
    if (!wrote) {
        snprintf(err, n, "writing the PTX to %s failed", src);
        s = KILN_ERR_IO;
    } else {
        char arch[32];
        snprintf(arch, sizeof arch, "-arch=sm_%d%s", sm, strstr(ptx, ".target sm_90a") ? "a" : ""); /* wgmma kernels */
        char *argv[] = {(char *)ptxas, arch, "-v", "-o", "/dev/null", src, NULL};
        int rc = run_to(argv, fl);
        lseek(fl, 0, SEEK_SET);
        ssize_t got = read(fl, rep->log, sizeof rep->log - 1);
        rep->log[got > 0 ? got : 0] = '\0';
        parse_report(rep);
        if (rc != 0) {
            snprintf(err, n, "%s %s exited with %d: %s", ptxas, arch, rc, rep->log);
            s = KILN_ERR_BACKEND;
        }
    }
    if (fl >= 0) {
        close(fl);
        unlink(log);
    }
    unlink(src);
    return s;
}

kiln_status kiln_ptx_print_assembled(const char *ptxas, const kiln_kir *k, int sm, char **text, unsigned *flags,
                                     kiln_ptx_stats *stats, kiln_ptxas_report *rep, char *err, size_t n)
{
    *text = NULL;
    *flags = 0;
    for (;;) {
        kiln_status s = kiln_ptx_print_ex(k, sm, *flags, text, stats, err, n);
        if (s == KILN_OK) s = kiln_ptx_assemble(ptxas, *text, sm, rep, err, n);
        if (s != KILN_OK || *flags || !(rep->spill_stores + rep->spill_loads + rep->stack)) return s;
        free(*text);
        *text = NULL;
        *flags = KILN_PTX_ALL_REGISTERS;
    }
}
