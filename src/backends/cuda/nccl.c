/* Loading NCCL at run time (nccl.h): $KILN_NCCL_LIB, the system's libnccl.so.2, or a Python
 * environment's copy (pip's nvidia-nccl-cu12 puts it in site-packages/nvidia/nccl/lib). Resolves
 * the entry points split plans use and says precisely why when it cannot. Must not link libnccl. */
#include "backends/cuda/nccl.h"
#include "util/env.h"

#include <dlfcn.h>
#include <glob.h>
#include <stdio.h>
#include <string.h>

/* The first libnccl.so.2 under a Python prefix (lib/python3.* /site-packages/nvidia/nccl/lib). */
static bool python_nccl(const char *prefix, char *out, size_t n)
{
    char pat[600];
    glob_t gl;
    snprintf(pat, sizeof pat, "%s/lib/python3*/*-packages/nvidia/nccl/lib/libnccl.so.2", prefix);
    bool found = glob(pat, 0, NULL, &gl) == 0 && gl.gl_pathc > 0;
    if (found) snprintf(out, n, "%s", gl.gl_pathv[0]);
    globfree(&gl);
    return found;
}

static bool resolve(kiln_nccl *c, char *msg, size_t len)
{
    struct { const char *sym; void *slot; size_t size; } t[] = {
        {"ncclGetVersion", &c->get_version, sizeof c->get_version},
        {"ncclCommInitAll", &c->comm_init_all, sizeof c->comm_init_all},
        {"ncclAllReduce", &c->all_reduce, sizeof c->all_reduce},
        {"ncclAllGather", &c->all_gather, sizeof c->all_gather},
        {"ncclGroupStart", &c->group_start, sizeof c->group_start},
        {"ncclGroupEnd", &c->group_end, sizeof c->group_end},
        {"ncclCommDestroy", &c->comm_destroy, sizeof c->comm_destroy},
        {"ncclGetErrorString", &c->error_string, sizeof c->error_string},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        void *fn = dlsym(c->lib, t[i].sym);
        if (!fn) {
            snprintf(msg, len, "%s has no %s: not an NCCL 2 library", c->path, t[i].sym);
            return false;
        }
        memcpy(t[i].slot, &fn, t[i].size);
    }
    if (c->get_version(&c->version) != 0 || c->version < 2000) {
        snprintf(msg, len, "%s: NCCL version %d; kiln needs NCCL 2", c->path, c->version);
        return false;
    }
    return true;
}

bool kiln_nccl_load(kiln_nccl *c, char *msg, size_t len)
{
    memset(c, 0, sizeof *c);
    const char *env = kiln_env(KILN_ENV_NCCL_LIB);
    char py[600] = "";
    if (env) snprintf(c->path, sizeof c->path, "%s", env);
    else snprintf(c->path, sizeof c->path, "libnccl.so.2");
    c->lib = dlopen(c->path, RTLD_NOW | RTLD_LOCAL);
    if (!c->lib && env) {
        snprintf(msg, len, "KILN_NCCL_LIB=%s could not be loaded: %s", env, dlerror());
        return false;
    }
    char local[520] = "";
    if (kiln_env(KILN_ENV_HOME)) snprintf(local, sizeof local, "%.500s/.local", kiln_env(KILN_ENV_HOME)); /* pip --user */
    const char *prefixes[] = {kiln_env(KILN_ENV_VIRTUAL_ENV), kiln_env(KILN_ENV_CONDA_PREFIX), local[0] ? local : NULL,
                              "/usr/local", "/usr"};
    for (size_t i = 0; !c->lib && i < sizeof prefixes / sizeof *prefixes; i++)
        if (prefixes[i] && python_nccl(prefixes[i], py, sizeof py)) {
            snprintf(c->path, sizeof c->path, "%s", py);
            c->lib = dlopen(c->path, RTLD_NOW | RTLD_LOCAL);
        }
    if (!c->lib) {
        snprintf(msg, len, "libnccl.so.2 not found (not in the library paths, nor in a Python environment's "
                           "nvidia/nccl/lib; set KILN_NCCL_LIB=PATH)");
        return false;
    }
    if (!resolve(c, msg, len)) {
        kiln_nccl_unload(c);
        return false;
    }
    return true;
}

void kiln_nccl_unload(kiln_nccl *c)
{
    if (c->lib) dlclose(c->lib);
    memset(c, 0, sizeof *c);
}
