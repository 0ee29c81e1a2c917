/* A plain main for the fuzz targets (no libFuzzer): feeds every file named on the command line,
 * or every file in a named directory, to LLVMFuzzerTestOneInput once. CI replays the seed corpus
 * (tests/fuzz/corpus) through it under ASan/UBSan; a crash there is a regression. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int files = 0, bad = 0;
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
