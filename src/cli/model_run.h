/* A GGUF model loaded for the kiln tool's model commands (generate.c, model.c): open, page in,
 * build, compile, and one run of the decoder. Internal to src/cli. Must not exit the process: every
 * call returns a status or an exit code. */
#pragma once

#include "cli/cli.h"

/* A loaded model: file, its info, the compiled plan and run buffers. */
typedef struct model_run {
    kiln_ctx        *ctx;    /* context */
    kiln_gguf       *file;   /* the mapped file */
    kiln_model_info  info;   /* metadata */
    kiln_plan       *plan;   /* compiled decoder */
    int32_t         *pos;    /* positions [max_tok] */
    int32_t         *next;   /* argmax of the last token [1] */
    float           *logits; /* the last token's logits [n_vocab] (model_opts.logits), else NULL */
    double           load_s; /* open + page-in + build + compile */
} model_run;

/* Shared flags of generate and bench --model. */
typedef struct model_opts {
    const char *path;    /* MODEL.gguf */
    const char *backend; /* --backend or NULL (auto) */
    int64_t     threads; /* --threads; 0 = one per core */
    bool        json;    /* --json */
    bool        logits;  /* build the graph with a logits output (generate samples from it) */
    bool        moe_dense; /* --moe-dense (bench): experts in the dense form (kiln_model_options) */
    int64_t     gpus;    /* --gpus N (generate): a tensor-parallel split over N devices, 0/1: none */
    char        devices[320]; /* the split's kiln_compile_options.devices ("cuda:0,1", "cpu:0,1"), "" for none */
} model_opts;

/* Frees what kiln_cli_model_load made (each member may be NULL). */
void kiln_cli_model_free(model_run *m);
/* Opens, pages in, builds (max_ctx rows, max_tok tokens) and compiles. Exit code. */
int kiln_cli_model_load(const char *cmd, const model_opts *o, int64_t max_ctx, int64_t max_tok, model_run *m);
/* One run of n ids at positions start..; *out (may be NULL) = the argmax after the last one; with
 * model_opts.logits, m->logits gets the last token's logits. */
kiln_status kiln_cli_model_step(model_run *m, const int32_t *ids, int64_t n, int64_t start, int32_t *out);
/* --gpus N into o->devices ("cuda:0,1,...", or "cpu:0,1" with --backend cpu). Exit code. */
int kiln_cli_model_devices(const char *cmd, model_opts *o);
/* Parses --backend/--threads/--json; 1 when a->argv[a->i] was one, 0 when not, or an exit code
 * (negative: KILN_CLI_USAGE). */
int kiln_cli_model_flag(kiln_cli_args *a, model_opts *o);
