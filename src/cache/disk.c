/* Disk entries: <dir>/<32 hex key>.<kind>, a 64-byte header (magic, format, kind, key, payload
 * length, payload XXH3-64, header XXH3-64) and the payload. Written to a temporary file in the same
 * folder and renamed, so a reader sees a whole file or none. Every check failing is a miss; a
 * file is never trusted past its checks. Also the folder operations of `kiln cache` and the size
 * bound (least-recently-used eviction: a hit sets its file's time). */
#include "cache/cache_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HEADER 64
#define MAX_PAYLOAD ((size_t)1 << 30)
static const char magic[8] = {'K', 'I', 'L', 'N', 'C', 'A', 'C', 'H'};

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static void make_header(unsigned char h[HEADER], enum kiln_cache_kind kind, const kiln_cache_key *key, const void *payload,
                        size_t len)
{
    memset(h, 0, HEADER);
    memcpy(h, magic, 8);
    put_u32(h + 8, KILN_CACHE_FORMAT);
    put_u32(h + 12, (uint32_t)kind);
    put_u64(h + 16, key->h[0]);
    put_u64(h + 24, key->h[1]);
    put_u64(h + 32, len);
    put_u64(h + 40, XXH3_64bits(payload, len));
    /* 48..55 reserved, zero */
    put_u64(h + 56, XXH3_64bits(h, 56));
}

bool kiln_cache_entry_check(const unsigned char *buf, size_t n, enum kiln_cache_kind kind, const kiln_cache_key *key,
                            const unsigned char **payload, size_t *len, const char **why)
{
    const char *w = NULL;
    if (n < HEADER) w = "truncated header";
    else if (memcmp(buf, magic, 8) != 0) w = "not a kiln cache file";
    else if (get_u64(buf + 56) != XXH3_64bits(buf, 56)) w = "header checksum";
    else if (get_u32(buf + 8) != KILN_CACHE_FORMAT) w = "format version";
    else if (get_u32(buf + 12) != (uint32_t)kind) w = "kind";
    else if (get_u64(buf + 16) != key->h[0] || get_u64(buf + 24) != key->h[1]) w = "key";
    else if (get_u64(buf + 48) != 0) w = "reserved bytes";
    else if (get_u64(buf + 32) != n - HEADER) w = n - HEADER < get_u64(buf + 32) ? "truncated payload" : "trailing bytes";
    else if (get_u64(buf + 40) != XXH3_64bits(buf + HEADER, n - HEADER)) w = "payload checksum";
    if (why) *why = w ? w : "ok";
    if (w) return false;
    *payload = buf + HEADER;
    *len = n - HEADER;
    return true;
}

static void entry_path(const kiln_cache *c, enum kiln_cache_kind kind, const kiln_cache_key *key, char *out, size_t n)
{
    char hex[33];
    kiln_cache_key_hex(key, hex);
    snprintf(out, n, "%s/%s.%s", c->dir, hex, kiln_cache_kind_ext(kind));
}

int kiln_cache_open_file(const char *path, int flags, unsigned mode)
{
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever (issue #17);
     * O_NOFOLLOW: a symlink planted in the folder must not redirect a write (or a read). */
    int fd = open(path, flags | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, (mode_t)mode);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl != -1) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

/* Reads a whole regular file (at most max bytes); NULL when it cannot, is not a regular file (a
 * FIFO, device or symlink), or is larger. *absent: there was no file of that name at all. */
static unsigned char *read_all(const char *path, size_t max, size_t *n, bool *absent)
{
    int fd = kiln_cache_open_file(path, O_RDONLY, 0);
    *absent = fd < 0 && errno == ENOENT;
    if (fd < 0) return NULL;
    struct stat st;
    unsigned char *buf = NULL;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size <= max && (buf = malloc((size_t)st.st_size + 1))) {
        size_t got = 0;
        while (got < (size_t)st.st_size) {
            ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
            if (r <= 0) break;
            got += (size_t)r;
        }
        *n = got;
    }
    close(fd);
    return buf;
}

bool kiln_cache_disk_get(kiln_cache *c, enum kiln_cache_kind kind, const kiln_cache_key *key, void **payload, size_t *len)
{
    *payload = NULL;
    *len = 0;
    if (!kiln_cache_disk_on(c)) return false;
    char path[4200];
    entry_path(c, kind, key, path, sizeof path);
    size_t n = 0;
    bool absent;
    unsigned char *buf = read_all(path, MAX_PAYLOAD + HEADER, &n, &absent);
    const unsigned char *p;
    size_t pl;
    bool ok = buf && kiln_cache_entry_check(buf, n, kind, key, &p, &pl, NULL);
    if (!ok && !absent) atomic_fetch_add(&c->n.disk_rejects, 1); /* there, but refused */
    if (ok) {
        utimensat(AT_FDCWD, path, NULL, AT_SYMLINK_NOFOLLOW); /* used now: the last to be evicted */
        memmove(buf, p, pl); /* the payload alone, at the start of the block */
        *payload = buf;
        *len = pl;
    } else {
        free(buf);
    }
    kiln_cache_count(c, false, ok);
    return ok;
}

/* A folder that refuses writes (read-only, full, no permission): disk off, one warning. */
static void degrade(kiln_cache *c, const char *what, int err)
{
    c->disk_on = false;
    if (!atomic_exchange(&c->warned, true) && !c->quiet)
        fprintf(stderr, "kiln: warning: cache folder '%s': %s: %s; caching in memory only\n", c->dir, what, strerror(err));
}

/* Whether a folder can be written, or made (its nearest existing ancestor can be written);
 * else *err says why. */
static bool can_write(const char *dir, int *err)
{
    char p[4200];
    snprintf(p, sizeof p, "%s", dir);
    for (;;) {
        struct stat st;
        if (stat(p, &st) == 0) {
            if (!S_ISDIR(st.st_mode)) return *err = ENOTDIR, false;
            if (access(p, W_OK | X_OK) != 0) return *err = errno, false;
            return true;
        }
        if (errno != ENOENT) return *err = errno, false;
        char *slash = strrchr(p, '/');
        if (!slash || slash == p) return true; /* "/" itself or a relative name: the first write says */
        *slash = 0;
    }
}

void kiln_cache_check_dir(kiln_cache *c)
{
    int err = 0;
    if (kiln_cache_disk_on(c) && !can_write(c->dir, &err)) degrade(c, "cannot write there", err);
}

/* Any failure to make the folder or write in it: read-only, full, no permission, not a folder. */
static bool refused(int e) { return e != 0 && e != EEXIST && e != EINTR; }

/* mkdir -p of c->dir. */
static int make_dir(const char *dir)
{
    char p[4200];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) return errno;
        *s = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST) return errno;
    return 0;
}

/* Keeps the folder under its bound after a write of `wrote` bytes: the context's first write
 * scans the folder, later ones only when what it wrote since would pass the bound; a trim goes
 * down to 90% so that the next is many writes away. Other processes' writes between two scans are
 * not seen: the bound holds within what runs concurrently writes. */
static void bound(kiln_cache *c, uint64_t wrote)
{
    if (!c->max_bytes) return;
    uint64_t est = atomic_fetch_add(&c->est_bytes, wrote) + wrote;
    if ((atomic_load(&c->scanned) && est <= c->max_bytes) || atomic_exchange(&c->trimming, true)) return;
    size_t removed = 0;
    uint64_t total = 0;
    if (kiln_cache_trim(c->dir, c->max_bytes, c->max_bytes / 10 * 9, &removed, &total)) {
        atomic_store(&c->est_bytes, total);
        atomic_store(&c->scanned, true);
        atomic_fetch_add(&c->n.evictions, removed);
    }
    atomic_store(&c->trimming, false);
}

void kiln_cache_disk_put(kiln_cache *c, enum kiln_cache_kind kind, const kiln_cache_key *key, const void *payload, size_t len)
{
    if (!kiln_cache_disk_on(c) || len > MAX_PAYLOAD) return;
    static atomic_uint serial;
    char path[4200], tmp[4300], hex[33];
    entry_path(c, kind, key, path, sizeof path);
    kiln_cache_key_hex(key, hex);
    snprintf(tmp, sizeof tmp, "%s/.tmp.%ld.%u.%s", c->dir, (long)getpid(), atomic_fetch_add(&serial, 1), hex);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ENOENT) {
        int e = make_dir(c->dir);
        if (e) {
            if (refused(e)) degrade(c, "cannot create it", e);
            return;
        }
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    }
    if (fd < 0) {
        if (refused(errno)) degrade(c, "cannot write an entry", errno);
        return;
    }
    unsigned char h[HEADER];
    make_header(h, kind, key, payload, len);
    const unsigned char *parts[2] = {h, payload};
    size_t sizes[2] = {HEADER, len};
    int err = 0;
    for (int i = 0; i < 2 && !err; i++)
        for (size_t done = 0; done < sizes[i] && !err;) {
            ssize_t w = write(fd, parts[i] + done, sizes[i] - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) err = w < 0 ? errno : ENOSPC;
            else done += (size_t)w;
        }
    if (close(fd) != 0 && !err) err = errno;
    if (!err && rename(tmp, path) != 0) err = errno;
    if (err) {
        unlink(tmp);
        if (refused(err)) degrade(c, "cannot write an entry", err);
        return;
    }
    atomic_fetch_add(&c->n.disk_writes, 1);
    bound(c, HEADER + len);
}

/* ------------------------------------------------------------------ stats file */

#define N_STATS 7
static const char *const stat_names[N_STATS] = {"mem_hits",     "mem_misses",  "disk_hits", "disk_misses",
                                                "disk_rejects", "disk_writes", "evictions"};

static void stats_parse(const char *text, uint64_t v[N_STATS])
{
    for (int i = 0; i < N_STATS; i++) {
        const char *p = strstr(text, stat_names[i]);
        size_t k = strlen(stat_names[i]);
        v[i] = p && p[k] == ' ' ? strtoull(p + k + 1, NULL, 10) : 0;
    }
}

/* The stats file's text ("" when absent, unreadable or not a regular file). */
static const char *read_stats(const char *path, char *text, size_t n)
{
    text[0] = 0;
    int fd = kiln_cache_open_file(path, O_RDONLY, 0);
    if (fd < 0) return text;
    ssize_t r = pread(fd, text, n - 1, 0);
    text[r > 0 ? r : 0] = 0;
    close(fd);
    return text;
}

/* The folder's counters plus this process's: read-modify-write under an exclusive lock on the
 * folder itself, the new text written to a fresh temporary file and renamed over `stats`, so a
 * symlink, FIFO or hard link planted as `stats` is replaced, never written through (issue #17). */
void kiln_cache_stats_flush(kiln_cache *c)
{
    kiln_cache_stats s = kiln_cache_stats_get(c);
    uint64_t add[N_STATS] = {s.mem_hits, s.mem_misses, s.disk_hits, s.disk_misses, s.disk_rejects, s.disk_writes, s.evictions};
    bool any = false;
    for (int i = 0; i < N_STATS; i++) any |= add[i] != 0;
    if (!any || !c->disk_on) return;
    int dfd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return;
    if (flock(dfd, LOCK_EX) == 0) {
        char path[4200], tmp[4300], text[512];
        snprintf(path, sizeof path, "%s/stats", c->dir);
        snprintf(tmp, sizeof tmp, "%s/.tmp.%ld.stats", c->dir, (long)getpid());
        uint64_t v[N_STATS];
        stats_parse(read_stats(path, text, sizeof text), v);
        int k = 0;
        for (int i = 0; i < N_STATS; i++)
            k += snprintf(text + k, sizeof text - (size_t)k, "%s %llu\n", stat_names[i], (unsigned long long)(v[i] + add[i]));
        unlink(tmp); /* a leftover of a killed process with this pid */
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd >= 0) { /* best effort: counters are advisory */
            bool ok = write(fd, text, (size_t)k) == k;
            ok = close(fd) == 0 && ok;
            if (!ok || rename(tmp, path) != 0) unlink(tmp);
        }
        flock(dfd, LOCK_UN);
    }
    close(dfd);
}

kiln_cache_stats kiln_cache_folder_stats(const char *dir)
{
    char path[4200], text[512];
    snprintf(path, sizeof path, "%s/stats", dir);
    uint64_t v[N_STATS];
    stats_parse(read_stats(path, text, sizeof text), v); /* replaced by rename: whole, without a lock */
    return (kiln_cache_stats){v[0], v[1], v[2], v[3], v[4], v[5], v[6]};
}

/* ------------------------------------------------------------------ folder */

/* "<32 hex>.<ext>": the key and kind of an entry's file name. */
static bool entry_name(const char *name, kiln_cache_key *key, enum kiln_cache_kind *kind)
{
    if (strlen(name) < 34 || name[32] != '.') return false;
    for (int i = 0; i < 32; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f'))) return false;
    for (int k = 1; k < KILN_CACHE_KIND_COUNT; k++)
        if (strcmp(name + 33, kiln_cache_kind_ext((enum kiln_cache_kind)k)) == 0) {
            char a[17] = {0}, b[17] = {0};
            memcpy(a, name, 16);
            memcpy(b, name + 16, 16);
            key->h[0] = strtoull(a, NULL, 16);
            key->h[1] = strtoull(b, NULL, 16);
            *kind = (enum kiln_cache_kind)k;
            return true;
        }
    return false;
}

static int cmp_info(const void *a, const void *b)
{
    return strcmp(((const kiln_cache_entry_info *)a)->name, ((const kiln_cache_entry_info *)b)->name);
}

kiln_status kiln_cache_list(const char *dir, kiln_cache_entry_info **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? KILN_OK : KILN_ERR_IO;
    size_t cap = 0;
    kiln_status s = KILN_OK;
    for (struct dirent *e; (e = readdir(d));) {
        kiln_cache_key key;
        enum kiln_cache_kind kind;
        if (!entry_name(e->d_name, &key, &kind)) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            kiln_cache_entry_info *g = realloc(*out, cap * sizeof *g);
            if (!g) { s = KILN_ERR_NOMEM; break; }
            *out = g;
        }
        kiln_cache_entry_info *info = &(*out)[(*n)++];
        memset(info, 0, sizeof *info);
        snprintf(info->name, sizeof info->name, "%.40s", e->d_name);
        snprintf(info->kind, sizeof info->kind, "%s", kiln_cache_kind_ext(kind));
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t bytes = 0;
        bool absent;
        unsigned char *buf = read_all(path, MAX_PAYLOAD + HEADER, &bytes, &absent);
        const unsigned char *p;
        size_t pl;
        const char *why = errno == EINVAL || errno == ELOOP ? "not a regular file" : "unreadable";
        info->bytes = bytes;
        info->ok = buf && kiln_cache_entry_check(buf, bytes, kind, &key, &p, &pl, &why);
        snprintf(info->why, sizeof info->why, "%s", info->ok ? "" : why);
        free(buf);
    }
    closedir(d);
    if (*out) qsort(*out, *n, sizeof **out, cmp_info);
    return s;
}

kiln_status kiln_cache_clear(const char *dir, size_t *removed)
{
    *removed = 0;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? KILN_OK : KILN_ERR_IO;
    kiln_status s = KILN_OK;
    for (struct dirent *e; (e = readdir(d));) {
        kiln_cache_key key;
        enum kiln_cache_kind kind;
        if (!entry_name(e->d_name, &key, &kind) && strncmp(e->d_name, ".tmp.", 5) != 0 && strcmp(e->d_name, "stats") != 0)
            continue;
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) == 0) (*removed)++;
        else if (errno != ENOENT) s = KILN_ERR_IO;
    }
    closedir(d);
    return s;
}

/* ------------------------------------------------------------------ size bound */

typedef struct aged {
    struct timespec t; /* modification time: the last write or disk hit */
    uint64_t        bytes;
    char            name[40];
} aged;

static int cmp_aged(const void *a, const void *b)
{
    const aged *x = a, *y = b;
    if (x->t.tv_sec != y->t.tv_sec) return x->t.tv_sec < y->t.tv_sec ? -1 : 1;
    if (x->t.tv_nsec != y->t.tv_nsec) return x->t.tv_nsec < y->t.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The entries of an open folder with their times and sizes (stat only: no file is read);
 * temporary files an hour old are removed on the way. NULL with *n 0 when there are none. */
static aged *scan(DIR *d, size_t *n, uint64_t *total)
{
    aged *a = NULL;
    size_t cap = 0;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (struct dirent *e; (e = readdir(d));) {
        kiln_cache_key key;
        enum kiln_cache_kind kind;
        struct stat st;
        bool entry = entry_name(e->d_name, &key, &kind);
        if ((!entry && strncmp(e->d_name, ".tmp.", 5) != 0) || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (!entry) {
            if (st.st_mtim.tv_sec + 3600 < now.tv_sec) unlinkat(dirfd(d), e->d_name, 0);
            continue;
        }
        if (*n == cap) {
            aged *g = realloc(a, (cap = cap ? 2 * cap : 256) * sizeof *g);
            if (!g) break; /* what was listed is still trimmed */
            a = g;
        }
        a[*n].t = st.st_mtim;
        a[*n].bytes = (uint64_t)st.st_size;
        snprintf(a[*n].name, sizeof a[*n].name, "%.39s", e->d_name);
        *total += a[(*n)++].bytes;
    }
    return a;
}

bool kiln_cache_trim(const char *dir, uint64_t max, uint64_t keep, size_t *removed, uint64_t *total)
{
    *removed = 0;
    *total = 0;
    DIR *d = opendir(dir);
    if (!d) return false;
    if (flock(dirfd(d), LOCK_EX | LOCK_NB) != 0) { /* another process is at it */
        closedir(d);
        return false;
    }
    size_t n = 0;
    aged *a = scan(d, &n, total);
    if (*total > max && a) {
        qsort(a, n, sizeof *a, cmp_aged); /* least recently used first */
        for (size_t i = 0; i + 1 < n && *total > keep; i++) /* never the newest: the entry just written */
            if (unlinkat(dirfd(d), a[i].name, 0) == 0) (*removed)++, *total -= a[i].bytes;
            else if (errno == ENOENT) *total -= a[i].bytes; /* gone already (kiln cache clear) */
    }
    free(a);
    flock(dirfd(d), LOCK_UN);
    closedir(d);
    return true;
}
