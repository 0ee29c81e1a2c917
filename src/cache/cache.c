/* The cache's keys and in-memory table: XXH3-128 keys that carry the codegen version and the
 * binary's identity, a uthash table of refcounted objects behind one mutex, the process's
 * counters. Disk entries are in disk.c. Must not know what the objects are. */
#define _GNU_SOURCE /* dl_iterate_phdr */
#include "util/env.h"
#include "cache/cache.h"

#include <ctype.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/cache_int.h"

/* ------------------------------------------------------------------ keys */

static pthread_once_t ident_once = PTHREAD_ONCE_INIT;
static uint64_t       ident[3]; /* size, XXH3-64 of the bytes, 1 when known: the file holding this code */

/* dl_iterate_phdr callback: the name of the loaded object whose segments hold *addr ("" for the
 * main program). */
static int holder(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    const char **io = data;
    uintptr_t a = (uintptr_t)io[0];
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && a >= lo && a < lo + ph->p_memsz) {
            io[1] = info->dlpi_name ? info->dlpi_name : "";
            return 1;
        }
    }
    return 0;
}

/* The identity of the file holding kiln's code: its size and a hash of its bytes, so a rebuilt kiln
 * never loads what another build printed. The file is found through the loader's own list: dladdr
 * names the main program by its argv[0], which Criterion's workers and a tool started through PATH
 * change or leave relative (the identity then silently was zero: issue #17). */
static void ident_init(void)
{
    const char *io[2] = {(const char *)(uintptr_t)&kiln_cache_key_begin, NULL};
    dl_iterate_phdr(holder, io);
    const char *path = io[1] && io[1][0] ? io[1] : "/proc/self/exe";
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0) return;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m != MAP_FAILED) {
            ident[0] = (uint64_t)st.st_size;
            ident[1] = XXH3_64bits(m, (size_t)st.st_size);
            ident[2] = 1;
            munmap(m, (size_t)st.st_size);
        }
    }
    close(fd);
}

void kiln_cache_build_identity(uint64_t out[3])
{
    pthread_once(&ident_once, ident_init);
    memcpy(out, ident, sizeof ident);
}

void kiln_cache_key_begin(kiln_cache_keyer *k, const char *what)
{
    pthread_once(&ident_once, ident_init);
    XXH3_128bits_reset(&k->st);
    const uint32_t head[3] = {0x6b696c6e /* "kiln" */, KILN_CODEGEN_VERSION, KILN_CACHE_FORMAT};
    XXH3_128bits_update(&k->st, head, sizeof head);
    kiln_cache_key_str(k, KILN_VERSION_STRING);
    XXH3_128bits_update(&k->st, ident, sizeof ident);
    kiln_cache_key_str(k, what);
}

void kiln_cache_key_add(kiln_cache_keyer *k, const void *p, size_t n) { XXH3_128bits_update(&k->st, p, n); }

void kiln_cache_key_str(kiln_cache_keyer *k, const char *s)
{
    uint64_t n = s ? strlen(s) : UINT64_MAX;
    XXH3_128bits_update(&k->st, &n, sizeof n);
    if (s) XXH3_128bits_update(&k->st, s, (size_t)n);
}

kiln_cache_key kiln_cache_key_end(kiln_cache_keyer *k)
{
    XXH128_hash_t h = XXH3_128bits_digest(&k->st);
    return (kiln_cache_key){{h.high64, h.low64}};
}

void kiln_cache_key_hex(const kiln_cache_key *k, char out[33])
{
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)k->h[0], (unsigned long long)k->h[1]);
}

const char *kiln_cache_kind_ext(enum kiln_cache_kind k)
{
    static const char *const ext[KILN_CACHE_KIND_COUNT] = {
        [KILN_CACHE_KIND_NONE] = "none", [KILN_CACHE_KIND_CPU] = "cpu", [KILN_CACHE_KIND_CUDA] = "cuda",
        [KILN_CACHE_KIND_VULKAN] = "vk", [KILN_CACHE_KIND_PLAN] = "plan"};
    return (unsigned)k < KILN_CACHE_KIND_COUNT ? ext[k] : "?";
}

/* ------------------------------------------------------------------ context cache */

kiln_cache *kiln_cache_new(const char *dir, bool quiet)
{
    kiln_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    if (!(c->dir = strdup(dir ? dir : ""))) {
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    const char *e = kiln_env(KILN_ENV_CACHE), *bad_max = NULL;
    bool known = !e || !strcmp(e, "off") || !strcmp(e, "0") || !strcmp(e, "on") || !strcmp(e, "1") || !strcmp(e, "all");
    c->disk_on = dir && *dir && !(e && (strcmp(e, "off") == 0 || strcmp(e, "0") == 0));
    c->disk_cpu = c->disk_on && e && strcmp(e, "all") == 0;
    c->quiet = quiet;
    c->max_bytes = kiln_cache_max_bytes(&bad_max);
    kiln_cache_check_dir(c);
    /* A misspelt setting would otherwise be silently the default (issue #23): said once a process. */
    static atomic_bool said_mode, said_max;
    if (!known && !quiet && !atomic_exchange(&said_mode, true))
        fprintf(stderr, "kiln: warning: %s='%s' is not one of off, on, all; using on\n", kiln_env_name(KILN_ENV_CACHE), e);
    if (bad_max && !quiet && !atomic_exchange(&said_max, true))
        fprintf(stderr, "kiln: warning: %s='%s' is not a size (bytes with an optional K, M, G or T; 0: no bound); using %llu MiB\n",
                kiln_env_name(KILN_ENV_CACHE_MAX), bad_max, (unsigned long long)(KILN_CACHE_MAX_DEFAULT >> 20));
    return c;
}

uint64_t kiln_cache_max_bytes(const char **bad)
{
    if (bad) *bad = NULL;
    const char *e = kiln_env(KILN_ENV_CACHE_MAX);
    if (!e) return KILN_CACHE_MAX_DEFAULT;
    uint64_t v = 0;
    const char *p = e;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (UINT64_MAX - 9) / 10) goto refuse;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (p == e) goto refuse;
    static const char units[] = "KMGT";
    const char *u = *p ? strchr(units, toupper((unsigned char)*p)) : NULL;
    if (u) {
        int shift = 10 * (int)(u - units + 1);
        if (v > (UINT64_MAX >> shift)) goto refuse;
        v <<= shift;
        p++;
        if (*p == 'i') p++;
    }
    if (*p == 'B') p++;
    if (*p) goto refuse;
    return v;
refuse:
    if (bad) *bad = e;
    return KILN_CACHE_MAX_DEFAULT;
}

void kiln_cache_free(kiln_cache *c)
{
    if (!c) return;
    kiln_cache_mem_clear(c);
    kiln_cache_stats_flush(c);
    pthread_mutex_destroy(&c->lock);
    free(c->dir);
    free(c);
}

kiln_cache_obj *kiln_cache_mem_find(kiln_cache *c, const kiln_cache_key *key)
{
    kiln_cache_obj *o = NULL;
    pthread_mutex_lock(&c->lock);
    HASH_FIND(hh, c->table, key, sizeof *key, o);
    if (o) kiln_cache_obj_ref(o);
    pthread_mutex_unlock(&c->lock);
    return o;
}

void kiln_cache_mem_clear(kiln_cache *c)
{
    kiln_cache_obj *o, *tmp;
    pthread_mutex_lock(&c->lock);
    HASH_ITER(hh, c->table, o, tmp) {
        HASH_DEL(c->table, o);
        kiln_cache_obj_unref(o);
    }
    pthread_mutex_unlock(&c->lock);
}

bool kiln_cache_mem_add(kiln_cache *c, kiln_cache_obj *o)
{
    kiln_cache_obj *there = NULL;
    pthread_mutex_lock(&c->lock);
    HASH_FIND(hh, c->table, &o->key, sizeof o->key, there);
    if (!there) {
        kiln_cache_obj_ref(o);
        HASH_ADD(hh, c->table, key, sizeof o->key, o);
        /* Bounded: the oldest entries leave the table (plans using them keep their reference). */
        while (HASH_COUNT(c->table) > KILN_CACHE_MEM_MAX) {
            kiln_cache_obj *old = c->table;
            HASH_DEL(c->table, old);
            kiln_cache_obj_unref(old);
        }
    }
    pthread_mutex_unlock(&c->lock);
    return !there;
}

void kiln_cache_obj_ref(kiln_cache_obj *o) { atomic_fetch_add(&o->refs, 1); }

void kiln_cache_obj_unref(kiln_cache_obj *o)
{
    if (o && atomic_fetch_sub(&o->refs, 1) == 1) o->destroy(o, o->arg);
}

void kiln_cache_count(kiln_cache *c, bool mem, bool hit)
{
    if (mem) atomic_fetch_add(hit ? &c->n.mem_hits : &c->n.mem_misses, 1);
    else atomic_fetch_add(hit ? &c->n.disk_hits : &c->n.disk_misses, 1);
}

kiln_cache_stats kiln_cache_stats_get(const kiln_cache *c)
{
    kiln_cache *m = (kiln_cache *)c;
    return (kiln_cache_stats){.mem_hits = atomic_load(&m->n.mem_hits), .mem_misses = atomic_load(&m->n.mem_misses),
                              .disk_hits = atomic_load(&m->n.disk_hits), .disk_misses = atomic_load(&m->n.disk_misses),
                              .disk_rejects = atomic_load(&m->n.disk_rejects), .disk_writes = atomic_load(&m->n.disk_writes),
                              .evictions = atomic_load(&m->n.evictions)};
}

bool kiln_cache_disk_on(const kiln_cache *c) { return c && c->disk_on; }

bool kiln_cache_disk_for(const kiln_cache *c, enum kiln_cache_kind kind)
{
    return kiln_cache_disk_on(c) && kind != KILN_CACHE_KIND_NONE && (kind != KILN_CACHE_KIND_CPU || c->disk_cpu);
}

char *kiln_cache_default_dir(void)
{
    const char *e = kiln_env(KILN_ENV_CACHE_DIR);
    if (e) return strdup(e);
    char buf[4096];
    const char *x = kiln_env(KILN_ENV_XDG_CACHE_HOME), *h = kiln_env(KILN_ENV_HOME);
    if (x && *x) snprintf(buf, sizeof buf, "%s/kiln", x);
    else if (h && *h) snprintf(buf, sizeof buf, "%s/.cache/kiln", h);
    else snprintf(buf, sizeof buf, "/tmp/kiln-cache");
    return strdup(buf);
}
