/* Loads contracts/<op>.yaml through libyaml's document API into a flat `contract` struct.
 * Strict about what tests rely on (op name, tolerance map of known dtypes with numbers >= 0);
 * lenient about prose fields. Must not depend on any kiln internals beyond dtype names. */
#include "util/env.h"
#include "check/contract.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif
#ifndef KILN_CONTRACTS_INSTALL_DIR
#define KILN_CONTRACTS_INSTALL_DIR "/usr/local/share/kiln/contracts"
#endif

const char *kiln_contract_dir(void)
{
    static _Thread_local char buf[4096]; /* per thread: kiln_check may run on several contexts at once */
    const char *root = kiln_env(KILN_ENV_SOURCE_DIR);
    struct stat st;
    if (root && *root) {
        snprintf(buf, sizeof buf, "%s/contracts", root);
        return buf;
    }
    snprintf(buf, sizeof buf, "%s/contracts", KILN_SOURCE_DIR);
    if (stat(buf, &st) == 0 && S_ISDIR(st.st_mode))
        return buf;
    snprintf(buf, sizeof buf, "%s", KILN_CONTRACTS_INSTALL_DIR);
    return buf;
}

/* Scalar text of a node, or NULL when it is not a scalar. */
static const char *scalar(yaml_document_t *d, yaml_node_t *n)
{
    (void)d;
    if (!n || n->type != YAML_SCALAR_NODE)
        return NULL;
    return (const char *)n->data.scalar.value;
}

/* Value of key in a mapping node, or NULL. */
static yaml_node_t *map_get(yaml_document_t *d, yaml_node_t *m, const char *key)
{
    if (!m || m->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        const char *k = scalar(d, yaml_document_get_node(d, p->key));
        if (k && strcmp(k, key) == 0)
            return yaml_document_get_node(d, p->value);
    }
    return NULL;
}

static void copy_str(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src ? src : "");
}

/* Parses a tolerance value: a number >= 0, or the word "exact" (= 0). */
static bool parse_tol(const char *s, double *out)
{
    if (!s)
        return false;
    if (strcmp(s, "exact") == 0) {
        *out = 0.0;
        return true;
    }
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0.0) || isinf(v))
        return false;
    *out = v;
    return true;
}

/* The map `key` (dtype -> NMSE) into tol; an absent map is an error where required. */
static bool load_tolerance(yaml_document_t *d, yaml_node_t *t, const char *key, bool required, double *tol, const char *path,
                           char *err, size_t n)
{
    if (!t && !required) return true;
    if (!t || t->type != YAML_MAPPING_NODE) {
        snprintf(err, n, "%s: `%s` is missing or not a map of dtype -> NMSE", path, key);
        return false;
    }
    for (yaml_node_pair_t *p = t->data.mapping.pairs.start; p < t->data.mapping.pairs.top; p++) {
        const char *k = scalar(d, yaml_document_get_node(d, p->key));
        const char *v = scalar(d, yaml_document_get_node(d, p->value));
        kiln_dtype dt;
        if (!k || !kiln_dtype_parse(k, &dt)) {
            snprintf(err, n, "%s: %s key '%s' is not a dtype", path, key, k ? k : "?");
            return false;
        }
        if (!parse_tol(v, &tol[dt])) {
            snprintf(err, n, "%s: %s of %s ('%s') is not a number >= 0", path, key, k, v ? v : "?");
            return false;
        }
    }
    return true;
}

static void load_inputs(yaml_document_t *d, yaml_node_t *s, kiln_contract *c)
{
    if (!s || s->type != YAML_SEQUENCE_NODE)
        return;
    for (yaml_node_item_t *it = s->data.sequence.items.start; it < s->data.sequence.items.top; it++) {
        if (c->n_inputs == KILN_CONTRACT_MAX_INPUTS)
            break;
        yaml_node_t *m = yaml_document_get_node(d, *it);
        kiln_contract_input *in = &c->inputs[c->n_inputs++];
        copy_str(in->name, sizeof in->name, scalar(d, map_get(d, m, "name")));
        copy_str(in->rank, sizeof in->rank, scalar(d, map_get(d, m, "rank")));
        const char *opt = scalar(d, map_get(d, m, "optional"));
        in->optional = opt && strcmp(opt, "true") == 0;
        yaml_node_t *dts = map_get(d, m, "dtypes");
        if (!dts || dts->type != YAML_SEQUENCE_NODE)
            continue;
        for (yaml_node_item_t *j = dts->data.sequence.items.start; j < dts->data.sequence.items.top; j++) {
            kiln_dtype dt;
            const char *nm = scalar(d, yaml_document_get_node(d, *j));
            if (nm && kiln_dtype_parse(nm, &dt))
                in->dtypes |= 1u << dt;
        }
    }
}

static void load_edges(yaml_document_t *d, yaml_node_t *s, kiln_contract *c)
{
    if (!s || s->type != YAML_SEQUENCE_NODE)
        return;
    for (yaml_node_item_t *it = s->data.sequence.items.start; it < s->data.sequence.items.top; it++) {
        if (c->n_edges == KILN_CONTRACT_MAX_EDGES)
            break;
        copy_str(c->edges[c->n_edges++], sizeof c->edges[0], scalar(d, yaml_document_get_node(d, *it)));
    }
}

/* Fills c from the parsed document; false with a message on a missing required field. */
static bool load_doc(yaml_document_t *d, const char *op, const char *path, kiln_contract *c, char *err, size_t n)
{
    yaml_node_t *root = yaml_document_get_root_node(d);
    if (!root || root->type != YAML_MAPPING_NODE) {
        snprintf(err, n, "%s: top level is not a map", path);
        return false;
    }
    const char *name = scalar(d, map_get(d, root, "op"));
    if (!name || strcmp(name, op) != 0) {
        snprintf(err, n, "%s: `op` is '%s', expected '%s'", path, name ? name : "(missing)", op);
        return false;
    }
    copy_str(c->op, sizeof c->op, name);
    copy_str(c->summary, sizeof c->summary, scalar(d, map_get(d, root, "summary")));
    copy_str(c->flops, sizeof c->flops, scalar(d, map_get(d, root, "flops")));
    copy_str(c->bytes, sizeof c->bytes, scalar(d, map_get(d, root, "bytes")));
    load_inputs(d, map_get(d, root, "inputs"), c);
    load_edges(d, map_get(d, root, "edge_cases"), c);
    return load_tolerance(d, map_get(d, root, "tolerance"), "tolerance", true, c->tol, path, err, n) &&
           load_tolerance(d, map_get(d, root, "tolerance_f16_act"), "tolerance_f16_act", false, c->tol_f16act, path, err, n);
}

bool kiln_contract_load(const char *op, kiln_contract *out, char *err, size_t n)
{
    char path[4200];
    memset(out, 0, sizeof *out);
    for (int t = 0; t < KILN_DTYPE_COUNT; t++)
        out->tol[t] = out->tol_f16act[t] = NAN;
    snprintf(path, sizeof path, "%s/%s.yaml", kiln_contract_dir(), op ? op : "(null)");
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, n, "%s: cannot open: %s", path, strerror(errno));
        return false;
    }
    yaml_parser_t p;
    yaml_document_t d;
    bool ok = false;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_file(&p, f);
    if (!yaml_parser_load(&p, &d)) {
        snprintf(err, n, "%s:%zu:%zu: YAML error: %s", path, p.problem_mark.line + 1, p.problem_mark.column + 1,
                 p.problem ? p.problem : "unknown");
    } else {
        ok = load_doc(&d, op, path, out, err, n);
        yaml_document_delete(&d);
    }
    yaml_parser_delete(&p);
    fclose(f);
    return ok;
}

double kiln_contract_tol(const kiln_contract *c, kiln_dtype t)
{
    if (!c || (int)t < 0 || t >= KILN_DTYPE_COUNT)
        return NAN;
    return c->tol[t];
}

double kiln_contract_tol_prec(const kiln_contract *c, kiln_dtype t, int32_t precision)
{
    double v = precision == KILN_PREC_F16 && c && (int)t >= 0 && t < KILN_DTYPE_COUNT ? c->tol_f16act[t] : NAN;
    return isnan(v) ? kiln_contract_tol(c, t) : v;
}
