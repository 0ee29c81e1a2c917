/* The public face of the model presets (kiln_preset_name, kiln_preset_graph in kiln.h): defaults,
 * checks that name what is wrong, and errors into the context. The presets and the stack builder
 * are model/presets.c; this file must not build graphs itself. */
#include "sched/ctx.h"
#include "model/presets.h"

#include <stdio.h>
#include <string.h>

KILN_API const char *kiln_preset_name(int i)
{
    const kiln_preset *p = kiln_preset_at(i);
    return p ? p->name : NULL;
}

KILN_API kiln_status kiln_preset_graph(kiln_ctx *ctx, const char *name, const kiln_preset_options *opts,
                                       kiln_graph **out)
{
    if (!out)
        return kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "kiln_preset_graph: out is NULL");
    *out = NULL;
    const kiln_preset *p = kiln_preset_find(name);
    if (!p) {
        char list[256] = "";
        for (int i = 0; kiln_preset_at(i); i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", kiln_preset_at(i)->name);
        return kiln_ctx_fail(ctx, KILN_ERR_NAME, "kiln_preset_graph: unknown preset '%s' (presets: %s)",
                             name ? name : "(null)", list);
    }
    kiln_preset_options d = opts ? *opts : (kiln_preset_options){0};
    kiln_preset_build_opts o = {.wdtype = d.wdtype, .n_layers = d.n_layers ? d.n_layers : 1,
                                .max_ctx = d.max_ctx ? d.max_ctx : 1024, .max_tok = d.max_tok ? d.max_tok : 1,
                                .seed = d.seed ? d.seed : 1};
    if ((unsigned)o.wdtype >= KILN_DTYPE_COUNT || o.wdtype == KILN_DTYPE_I32)
        return kiln_ctx_fail(ctx, KILN_ERR_DTYPE, "kiln_preset_graph: weight dtype %s is not a float or block dtype",
                             kiln_dtype_name(o.wdtype));
    if (o.n_layers < 1 || o.max_ctx < 1 || o.max_tok < 1 || o.max_tok > o.max_ctx)
        return kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG,
                             "kiln_preset_graph: need n_layers >= 1 and 1 <= max_tok <= max_ctx (got %d, %lld, %lld)",
                             o.n_layers, (long long)o.max_tok, (long long)o.max_ctx);
    o.kvdtype = kiln_preset_kv_dtype(o.wdtype);
    char err[512];
    kiln_status s = kiln_preset_build_ex(p, &o, out, err, sizeof err);
    if (s != KILN_OK)
        return kiln_ctx_fail(ctx, s, "kiln_preset_graph %s: %s", p->name, err);
    return KILN_OK;
}
