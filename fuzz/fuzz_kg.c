/* Fuzz target: the .kg reader. Any bytes: parse; when that succeeds, print, parse the print again
 * and require the same hash and the same print; when the graph fits the cap, compile it on ref
 * and cpu (fused). Every input must give a status: no crash, leak, or allocation over 1 GiB. */
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1 << 16)) return 0;
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    kiln_ctx *ctx = fuzz_ctx();
    kiln_graph *g = NULL;
    kiln_status s = kiln_kg_parse(ctx, text, "fuzz.kg", &g);
    free(text);
    FUZZ_CHECK((s == KILN_OK) == (g != NULL), "status %d with graph %p", (int)s, (void *)g);
    if (s != KILN_OK) return 0;
    char *p1 = NULL, *p2 = NULL;
    if (kiln_kg_print(g, &p1) == KILN_OK) {
        kiln_graph *g2 = NULL;
        s = kiln_kg_parse(ctx, p1, "printed.kg", &g2);
        FUZZ_CHECK(s == KILN_OK, "the printed graph does not parse: %s\n%s", kiln_ctx_error(ctx), p1);
        char h1[33], h2[33];
        FUZZ_CHECK(kiln_graph_hash(g, h1) == KILN_OK && kiln_graph_hash(g2, h2) == KILN_OK, "hash failed");
        FUZZ_CHECK(strcmp(h1, h2) == 0, "hash changed through print/parse\n%s", p1);
        FUZZ_CHECK(kiln_kg_print(g2, &p2) == KILN_OK && strcmp(p1, p2) == 0, "second print differs\n%s\n---\n%s", p1,
                   p2 ? p2 : "");
        kiln_graph_free(g2);
    }
    free(p1);
    free(p2);
    if (kiln_graph_status(g) == KILN_OK && fuzz_graph_small(g)) {
        const char *be[] = {"ref", "cpu"};
        for (int b = 0; b < 2; b++) {
            kiln_plan *plan = NULL;
            s = kiln_compile(ctx, g, &(kiln_compile_options){.backend = be[b]}, &plan);
            FUZZ_CHECK((s == KILN_OK) == (plan != NULL), "compile status %d with plan %p", (int)s, (void *)plan);
            kiln_plan_free(plan);
        }
    }
    kiln_graph_free(g);
    fuzz_forget(ctx);
    return 0;
}
