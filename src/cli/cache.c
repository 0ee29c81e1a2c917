/* `kiln cache ls|stats|clear [--json]`: the cache folder's entries (kind, size, whether each
 * passes its checks), their totals with the hit/miss counts kiln processes added up there, and
 * removing them. Reads the folder a context would use ($KILN_CACHE_DIR, else
 * $XDG_CACHE_HOME/kiln, else ~/.cache/kiln); never opens a context. */
#include <stdlib.h>
#include <string.h>

#include "util/env.h"
#include "cache/cache.h"
#include "cli/cli.h"

static void stats_json(const kiln_cache_stats *s)
{
    printf("\"mem_hits\": %llu, \"mem_misses\": %llu, \"disk_hits\": %llu, \"disk_misses\": %llu, "
           "\"disk_rejects\": %llu, \"disk_writes\": %llu, \"evictions\": %llu",
           (unsigned long long)s->mem_hits, (unsigned long long)s->mem_misses, (unsigned long long)s->disk_hits,
           (unsigned long long)s->disk_misses, (unsigned long long)s->disk_rejects, (unsigned long long)s->disk_writes,
           (unsigned long long)s->evictions);
}

static int cache_ls(const char *dir, bool json, bool stats_only)
{
    kiln_cache_entry_info *e = NULL;
    size_t n = 0;
    kiln_status s = kiln_cache_list(dir, &e, &n);
    if (s != KILN_OK) {
        fprintf(stderr, "kiln cache: cannot read '%s': %s\n", dir, kiln_status_str(s));
        free(e);
        return KILN_CLI_FAIL;
    }
    uint64_t bytes = 0, bad = 0, per_kind[KILN_CACHE_KIND_COUNT] = {0};
    for (size_t i = 0; i < n; i++) {
        bytes += e[i].bytes;
        bad += !e[i].ok;
        for (int k = 1; k < KILN_CACHE_KIND_COUNT; k++)
            if (strcmp(e[i].kind, kiln_cache_kind_ext((enum kiln_cache_kind)k)) == 0) per_kind[k]++;
    }
    kiln_cache_stats st = kiln_cache_folder_stats(dir);
    const char *mode = kiln_env(KILN_ENV_CACHE), *bad_max = NULL;
    uint64_t max = kiln_cache_max_bytes(&bad_max);
    if (bad_max)
        fprintf(stderr, "kiln cache: warning: %s='%s' is not a size; kiln uses %llu MiB\n", kiln_env_name(KILN_ENV_CACHE_MAX),
                bad_max, (unsigned long long)(max >> 20));
    if (json) {
        printf("{\"dir\": ");
        kiln_cli_json_str(stdout, dir);
        printf(", \"mode\": ");
        kiln_cli_json_str(stdout, mode && *mode ? mode : "on");
        printf(", \"entries\": %zu, \"bytes\": %llu, \"max_bytes\": %llu, \"invalid\": %llu, ", n, (unsigned long long)bytes,
               (unsigned long long)max, (unsigned long long)bad);
        for (int k = 1; k < KILN_CACHE_KIND_COUNT; k++)
            printf("\"%s\": %llu, ", kiln_cache_kind_ext((enum kiln_cache_kind)k), (unsigned long long)per_kind[k]);
        stats_json(&st);
        if (!stats_only) {
            printf(", \"list\": [");
            for (size_t i = 0; i < n; i++)
                printf("%s{\"file\": \"%s\", \"kind\": \"%s\", \"bytes\": %llu, \"ok\": %s, \"why\": \"%s\"}", i ? ", " : "",
                       e[i].name, e[i].kind, (unsigned long long)e[i].bytes, e[i].ok ? "true" : "false", e[i].why);
            printf("]");
        }
        printf("}\n");
    } else {
        if (!stats_only)
            for (size_t i = 0; i < n; i++)
                printf("%-40s %-5s %10llu%s%s\n", e[i].name, e[i].kind, (unsigned long long)e[i].bytes, e[i].ok ? "" : "  invalid: ",
                       e[i].why);
        printf("%s: %zu entries (cpu %llu, cuda %llu, vk %llu, plan %llu), %.2f MiB%s", dir, n,
               (unsigned long long)per_kind[KILN_CACHE_KIND_CPU], (unsigned long long)per_kind[KILN_CACHE_KIND_CUDA],
               (unsigned long long)per_kind[KILN_CACHE_KIND_VULKAN], (unsigned long long)per_kind[KILN_CACHE_KIND_PLAN],
               bytes / 1048576.0, max ? "" : " (no size bound)");
        if (max) printf(" of at most %.0f MiB (KILN_CACHE_MAX; least recently used leave first)", max / 1048576.0);
        if (mode && *mode) printf(", KILN_CACHE=%s", mode);
        printf("\n");
        if (bad) printf("%llu invalid (rebuilt on next use)\n", (unsigned long long)bad);
        if (stats_only)
            printf("plans in memory: %llu hits, %llu misses; disk: %llu hits, %llu misses (%llu files refused), %llu written, "
                   "%llu evicted\n",
                   (unsigned long long)st.mem_hits, (unsigned long long)st.mem_misses, (unsigned long long)st.disk_hits,
                   (unsigned long long)st.disk_misses, (unsigned long long)st.disk_rejects, (unsigned long long)st.disk_writes,
                   (unsigned long long)st.evictions);
    }
    free(e);
    return KILN_CLI_OK;
}

int kiln_cli_cache(int argc, char *const *argv)
{
    if (kiln_cli_wants_help(argc, argv, "cache")) return KILN_CLI_OK;
    const char *sub = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) json = true;
        else if (argv[i][0] == '-') return kiln_cli_unknown_flag("cache", argv[i]);
        else if (!sub) sub = argv[i];
        else {
            fprintf(stderr, "kiln cache: unexpected argument '%s' (see kiln cache --help)\n", argv[i]);
            return KILN_CLI_USAGE;
        }
    }
    if (!sub || (strcmp(sub, "ls") != 0 && strcmp(sub, "stats") != 0 && strcmp(sub, "clear") != 0)) {
        fprintf(stderr, "kiln cache: %s%s%s (one of ls, stats, clear; see kiln cache --help)\n", sub ? "unknown subcommand '" : "missing subcommand",
                sub ? sub : "", sub ? "'" : "");
        return KILN_CLI_USAGE;
    }
    char *dir = kiln_cache_default_dir();
    if (!dir) return kiln_cli_fail("cache", NULL, KILN_ERR_NOMEM, "cache folder");
    int rc;
    if (strcmp(sub, "clear") == 0) {
        size_t removed = 0;
        kiln_status s = kiln_cache_clear(dir, &removed);
        if (s != KILN_OK) fprintf(stderr, "kiln cache clear: could not remove every file of '%s'\n", dir);
        if (json) {
            printf("{\"dir\": ");
            kiln_cli_json_str(stdout, dir);
            printf(", \"removed\": %zu, \"ok\": %s}\n", removed, s == KILN_OK ? "true" : "false");
        } else {
            printf("%s: removed %zu files\n", dir, removed);
        }
        rc = s == KILN_OK ? KILN_CLI_OK : KILN_CLI_FAIL;
    } else {
        rc = cache_ls(dir, json, strcmp(sub, "stats") == 0);
    }
    free(dir);
    return rc;
}
