/* Running the kiln tool from the test_cli*.c tests (support/cli.h): child runs through system(),
 * outputs captured in temp files. Test support only. */
#include "support/cli.h"

#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln/kiln.h"

void kiln_exe(char *buf, size_t n)
{
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert(len > 0, "readlink /proc/self/exe failed");
    self[len] = '\0';
    char *slash = strrchr(self, '/');
    cr_assert(slash);
    *slash = '\0';
    cr_assert(strlen(self) + 6 <= n, "path too long: %s", self);
    memcpy(buf, self, strlen(self));
    memcpy(buf + strlen(self), "/kiln", 6);
    cr_assert(access(buf, X_OK) == 0, "kiln binary not found at %s", buf);
}

void slurp(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "r");
    size_t got = f ? fread(buf, 1, n - 1, f) : 0;
    buf[got] = '\0';
    if (f)
        fclose(f);
}

/* Runs `kiln ARGS` (ARGS is shell text) and captures exit code, stdout and stderr. */
void kiln_cli(cli_out *o, const char *args)
{
    char exe[PATH_MAX], outp[] = "/tmp/kiln_cli_outXXXXXX", errp[] = "/tmp/kiln_cli_errXXXXXX", cmd[8192];
    kiln_exe(exe, sizeof exe);
    int fo = mkstemp(outp), fe = mkstemp(errp);
    cr_assert(fo >= 0 && fe >= 0);
    close(fo);
    close(fe);
    snprintf(cmd, sizeof cmd, "'%s' %s >%s 2>%s", exe, args, outp, errp);
    int st = system(cmd);
    o->rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    slurp(outp, o->out, sizeof o->out);
    slurp(errp, o->err, sizeof o->err);
    unlink(outp);
    unlink(errp);
}

void kiln_cli_env(cli_out *o, const char *env, const char *args)
{
    char exe[PATH_MAX], cmd[8192];
    kiln_exe(exe, sizeof exe);
    snprintf(cmd, sizeof cmd, "--version >/dev/null; env %s '%s' %s", env, exe, args); /* the second command is captured */
    kiln_cli(o, cmd);
}

double json_key(const char *json, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    cr_assert(p, "no %s in %s", key, json);
    return strtod(p + strlen(pat), NULL);
}

const gw_model cli_model = {.arch = "qwen2", .n_layer = 2, .hidden = 64, .n_head = 4, .n_kv_head = 2,
                                   .ffn = 96, .n_vocab = 50, .n_ctx = 128, .wtype = KILN_DTYPE_Q8_0,
                                   .embtype = KILN_DTYPE_F16, .tokens = true, .seed = 21};

void write_model(char *path)
{
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cr_assert_eq(gw_model_write(&cli_model, path), 0);
}
