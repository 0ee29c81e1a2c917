/* Split GGUF (llama-gguf-split, the converters' --split-max-*): a first part NAME-00001-of-0000N.gguf
 * holding the metadata and split.count/split.no/split.tensors.count, and parts 2..N named the same
 * way holding more tensors. Opens every part as llama.cpp's loader does, checks that they agree,
 * and moves their tensors into the first part's table. Must not run a set with a part missing,
 * doubled or contradicting the first one: those are refused naming the part. */
#include "gguf/gguf.h"
#include "sched/ctx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PARTS 65535 /* llama.cpp reads split.count as u16 */

/* An integer metadata key of f; false when absent or not an integer (llama.cpp writes u16/i32). */
static bool key_int(const kiln_gguf *f, const char *key, int64_t *v)
{
    uint64_t u;
    if (kiln_gguf_get_i64(f, key, v) == KILN_OK) return true;
    if (kiln_gguf_get_u64(f, key, &u) == KILN_OK && u <= INT64_MAX) return *v = (int64_t)u, true;
    return false;
}

/* The path of part i (0-based) of n: llama.cpp's llama_split_path, "%s-%05d-of-%05d.gguf". */
static char *part_path(const char *prefix, size_t len, int i, int n)
{
    size_t cap = len + 32;
    char *p = malloc(cap);
    if (p) snprintf(p, cap, "%.*s-%05d-of-%05d.gguf", (int)len, prefix, i + 1, n);
    return p;
}

/* Length of the prefix when path ends in "-%05d-of-%05d.gguf" for part i of n (llama_split_prefix),
 * else 0. */
static size_t split_prefix(const char *path, int i, int n)
{
    char tail[40];
    snprintf(tail, sizeof tail, "-%05d-of-%05d.gguf", i + 1, n);
    size_t lp = strlen(path), lt = strlen(tail);
    return lp > lt && strcmp(path + lp - lt, tail) == 0 ? lp - lt : 0;
}

/* Whether kv (of part p) holds the same value as f's key of that name. */
static bool same_value(const kiln_gguf *f, const kiln_gguf *p, const gguf_kv *kv)
{
    int64_t j = kiln_gguf_kv_find(f, kv->key);
    if (j < 0) return false;
    const gguf_kv *a = &f->kvs[j];
    if (a->type != kv->type || a->arr_type != kv->arr_type || a->n != kv->n) return false;
    if (kv->type == KILN_GGUF_STRING) return strcmp(a->str, kv->str) == 0;
    if (kv->type == KILN_GGUF_ARRAY && kv->arr_type == KILN_GGUF_STRING) {
        for (uint64_t i = 0; i < kv->n; i++) {
            uint64_t la, lb;
            memcpy(&la, f->base + a->str_offs[i], 8);
            memcpy(&lb, p->base + kv->str_offs[i], 8);
            if (la != lb || memcmp(f->base + a->str_offs[i] + 8, p->base + kv->str_offs[i] + 8, (size_t)la) != 0) return false;
        }
        return true;
    }
    size_t sz = kiln_gguf_scalar_size(kv->type == KILN_GGUF_ARRAY ? kv->arr_type : kv->type);
    return memcmp(f->base + a->off, p->base + kv->off, (size_t)kv->n * sz) == 0;
}

/* Part i of n (opened alone) must say so, and may carry no metadata that the first part f lacks
 * or holds otherwise: kiln reads the first part's metadata only, as llama.cpp does. */
static kiln_status check_part(const kiln_gguf *f, const kiln_gguf *p, int i, int n, int64_t n_tensors)
{
    int64_t no = -1, count, tc;
    if (!key_int(p, "split.no", &no) || no != i)
        return kiln_ctx_fail(f->ctx, KILN_ERR_PARSE, "%s: split part %d of %d: its 'split.no' is %lld (-1: none), "
                             "expected %d (the parts do not belong together)", p->path, i + 1, n, (long long)no, i);
    if (!key_int(p, "split.count", &count) || count != n)
        return kiln_ctx_fail(f->ctx, KILN_ERR_PARSE, "%s: split part %d of %d: its 'split.count' is not %d (the parts "
                             "do not belong together)", p->path, i + 1, n, n);
    if (key_int(p, "split.tensors.count", &tc) && tc != n_tensors)
        return kiln_ctx_fail(f->ctx, KILN_ERR_PARSE, "%s: split part %d of %d: 'split.tensors.count' = %lld where the "
                             "first part says %lld", p->path, i + 1, n, (long long)tc, (long long)n_tensors);
    for (uint64_t k = 0; k < p->n_kv; k++) {
        const char *key = p->kvs[k].key;
        if (strncmp(key, "split.", 6) == 0 || strcmp(key, "general.alignment") == 0 || same_value(f, p, &p->kvs[k]))
            continue;
        return kiln_ctx_fail(f->ctx, KILN_ERR_PARSE, "%s: split part %d of %d: metadata '%s' %s the first part's; "
                             "only the first part's metadata is read, so parts that disagree are refused", p->path,
                             i + 1, n, key, kiln_gguf_kv_find(f, key) < 0 ? "is not among" : "differs from");
    }
    return KILN_OK;
}

/* The first part's split keys: *n parts (1: a single file) and the tensor count of the set. */
static kiln_status read_split_keys(const kiln_gguf *f, int *n, int64_t *n_tensors)
{
    int64_t count = 1, no = -1;
    *n = 1;
    if (kiln_gguf_kv_find(f, "split.count") < 0) return KILN_OK;
    if (!key_int(f, "split.count", &count) || count < 0 || count > MAX_PARTS)
        return kiln_ctx_fail(f->ctx, KILN_ERR_PARSE, "%s: metadata 'split.count' is not a part count (0 to %d)", f->path,
                             MAX_PARTS);
    if (count <= 1) return KILN_OK; /* llama.cpp: one file */
    if (!key_int(f, "split.no", &no))
        return kiln_ctx_fail(f->ctx, KILN_ERR_PARSE, "%s: 'split.count' = %lld without a 'split.no' (llama.cpp refuses "
                             "it too)", f->path, (long long)count);
    if (no != 0) {
        size_t lp = no > 0 && no < count ? split_prefix(f->path, (int)no, (int)count) : 0;
        char *first = lp ? part_path(f->path, lp, 0, (int)count) : NULL;
        kiln_status s = kiln_ctx_fail(f->ctx, KILN_ERR_PARSE, "%s: this is part %lld of a split GGUF of %lld parts "
                                      "('split.no' = %lld); open the first part%s%s", f->path, (long long)no + 1,
                                      (long long)count, (long long)no, first ? ", " : "", first ? first : "");
        free(first);
        return s;
    }
    if (!key_int(f, "split.tensors.count", n_tensors) || *n_tensors < 0)
        return kiln_ctx_fail(f->ctx, KILN_ERR_PARSE, "%s: split GGUF of %lld parts without a 'split.tensors.count' "
                             "(llama.cpp refuses it too)", f->path, (long long)count);
    *n = (int)count;
    return KILN_OK;
}

/* Moves every part's tensors after f's own into one table (names move, not copied) and re-hashes
 * them; a name in two parts is refused. */
static kiln_status merge_tensors(kiln_gguf *f, int64_t n_tensors)
{
    uint64_t total = f->n_tensors;
    for (int i = 0; i < f->n_parts - 1; i++) total += f->parts[i]->n_tensors;
    if (total != (uint64_t)n_tensors)
        return kiln_ctx_fail(f->ctx, KILN_ERR_PARSE, "%s: split GGUF: 'split.tensors.count' = %lld but its %d parts "
                             "hold %llu tensors", f->path, (long long)n_tensors, f->n_parts, (unsigned long long)total);
    gguf_tensor *all = calloc((size_t)total + 1, sizeof *all);
    if (!all) return kiln_ctx_fail(f->ctx, KILN_ERR_NOMEM, "%s: out of memory", f->path);
    HASH_CLEAR(hh, f->t_by_name);
    uint64_t k = 0;
    kiln_status s = KILN_OK;
    for (int i = 0; i < f->n_parts; i++) {
        kiln_gguf *p = i ? f->parts[i - 1] : f;
        for (uint64_t j = 0; j < p->n_tensors; j++, k++) {
            all[k] = p->tensors[j];
            all[k].home = i ? p : NULL;
            all[k].part = i;
            p->tensors[j].name = NULL; /* moved */
            gguf_tensor *dup = NULL;
            HASH_FIND_STR(f->t_by_name, all[k].name, dup);
            if (dup && s == KILN_OK)
                s = kiln_ctx_fail(f->ctx, KILN_ERR_PARSE, "%s: split GGUF: tensor '%s' is in part %d and in part %d",
                                  f->path, all[k].name, dup->part + 1, i + 1);
            if (!dup) HASH_ADD_KEYPTR(hh, f->t_by_name, all[k].name, strlen(all[k].name), &all[k]);
        }
        if (i) HASH_CLEAR(hh, p->t_by_name);
        p->n_tensors = 0;
    }
    free(f->tensors);
    f->tensors = all;
    f->n_tensors = total; /* every name is owned by f now, also on error (kiln_gguf_close frees them) */
    return s;
}

/* Opens parts 2..n (n_parts stays at what is open, so close frees exactly those). */
static kiln_status open_parts(kiln_gguf *f, int n, int64_t n_tensors)
{
    size_t lp = split_prefix(f->path, 0, n);
    if (!lp)
        return kiln_ctx_fail(f->ctx, KILN_ERR_PARSE, "%s: split GGUF of %d parts, but the name does not end in "
                             "-00001-of-%05d.gguf, so the other parts cannot be found (keep llama-gguf-split's names)",
                             f->path, n, n);
    if (!(f->parts = calloc((size_t)n, sizeof *f->parts))) return kiln_ctx_fail(f->ctx, KILN_ERR_NOMEM, "%s: out of memory", f->path);
    for (int i = 1; i < n; i++) {
        char *path = part_path(f->path, lp, i, n);
        if (!path) return kiln_ctx_fail(f->ctx, KILN_ERR_NOMEM, "%s: out of memory", f->path);
        kiln_gguf *p = NULL;
        kiln_status s = kiln_gguf_open_one(f->ctx, path, &p);
        if (s == KILN_ERR_IO) {
            char why[512]; /* the open's message ("PATH: cannot open: ..."), copied: the next one overwrites it */
            snprintf(why, sizeof why, "%s", kiln_ctx_error(f->ctx));
            kiln_ctx_fail(f->ctx, s, "%s: split GGUF: part %d of %d is missing or unreadable: %s", f->path, i + 1, n, why);
        }
        free(path);
        if (s != KILN_OK) return s; /* a parse error names the part's path and byte */
        f->parts[i - 1] = p;
        f->n_parts = i + 1;
        f->total += p->size;
        if ((s = check_part(f, p, i, n, n_tensors)) != KILN_OK) return s;
    }
    return KILN_OK;
}

kiln_status kiln_gguf_join_parts(kiln_gguf *f, bool by_path)
{
    int n;
    int64_t n_tensors = 0;
    kiln_status s = read_split_keys(f, &n, &n_tensors);
    if (s != KILN_OK || n == 1) return s;
    if (!by_path)
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED, "%s: the first part of a split GGUF of %d parts: open it by "
                             "path, so that the other parts can be found", f->path, n);
    if ((s = open_parts(f, n, n_tensors)) != KILN_OK) return s;
    return merge_tensors(f, n_tensors);
}
