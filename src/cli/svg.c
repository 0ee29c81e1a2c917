/* `kiln plan --svg FILE`: the roofline of every backend the plan uses (its profile: read bandwidth
 * and f32 FLOP/s peak) with each fused kernel placed at its arithmetic intensity and predicted
 * throughput, as an SVG file (the picture kiln.cost.roofline draws in Python, without matplotlib).
 * Only draws what kiln_plan_region and kiln_ctx_profile report; never runs the plan. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

#define W 760.0  /* plot width, pixels */
#define H 420.0  /* plot height */
#define L 80.0   /* left margin */
#define T 40.0   /* top margin */

static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};

typedef struct axes {
    double x0, x1, y0, y1; /* log10 ranges */
} axes;

static double px(const axes *a, double x) { return L + (log10(x) - a->x0) / (a->x1 - a->x0) * W; }
static double py(const axes *a, double y) { return T + H - (log10(y) - a->y0) / (a->y1 - a->y0) * H; }

/* Text with the five XML specials escaped. */
static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default: fputc(*s, f);
        }
    }
}

static void grid(FILE *f, const axes *a)
{
    fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='none' stroke='#444'/>\n", L, T, W, H);
    for (int e = (int)ceil(a->x0); e <= (int)floor(a->x1); e++) {
        double x = px(a, pow(10, e));
        fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#ddd'/>", x, T, x, T + H);
        fprintf(f, "<text x='%.1f' y='%.1f' font-size='11' text-anchor='middle'>1e%d</text>\n", x, T + H + 15, e);
    }
    for (int e = (int)ceil(a->y0); e <= (int)floor(a->y1); e++) {
        double y = py(a, pow(10, e));
        fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#ddd'/>", L, y, L + W, y);
        fprintf(f, "<text x='%.1f' y='%.1f' font-size='11' text-anchor='end'>1e%d</text>\n", L - 5, y + 4, e);
    }
    fprintf(f, "<text x='%.1f' y='%.1f' font-size='12' text-anchor='middle'>arithmetic intensity (FLOP / byte)</text>\n",
            L + W / 2, T + H + 33);
    fprintf(f, "<text x='16' y='%.1f' font-size='12' text-anchor='middle' transform='rotate(-90 16 %.1f)'>"
               "FLOP/s (roof: min(peak, bandwidth x intensity); dots: predicted)</text>\n", T + H / 2, T + H / 2);
}

/* The plan's kernels (with flops and bytes) and the backends they run on; the axes' ranges. */
static int collect(const kiln_ctx *ctx, const kiln_plan *p, kiln_region_info *r, int n, bool used[], axes *a)
{
    double xlo = 1e300, xhi = 0, ylo = 1e300, yhi = 0;
    int drawn = 0;
    for (int i = 0; i < n; i++) {
        if (kiln_plan_region(p, i, &r[i]) != KILN_OK || r[i].flops <= 0 || r[i].bytes <= 0) continue;
        for (int b = 0; b < kiln_backend_count(ctx); b++) {
            kiln_backend_info bi;
            if (kiln_backend_get(ctx, b, &bi) == KILN_OK && !strcmp(bi.name, r[i].backend)) used[b] = true;
        }
        double x = r[i].flops / r[i].bytes;
        for (int b = 0; b < KILN_MAX_BACKENDS; b++) {
            double t = r[i].predicted_s[b];
            if (t > 0) ylo = fmin(ylo, r[i].flops / t), yhi = fmax(yhi, r[i].flops / t);
        }
        xlo = fmin(xlo, x), xhi = fmax(xhi, x), drawn++;
    }
    for (int b = 0; b < kiln_backend_count(ctx); b++) {
        kiln_backend_info bi;
        kiln_device_profile pr;
        if (!used[b] || kiln_backend_get(ctx, b, &bi) != KILN_OK || kiln_ctx_profile(ctx, bi.name, &pr) != KILN_OK) continue;
        double peak = pr.peak_flops[KILN_DTYPE_F32];
        yhi = fmax(yhi, peak), xhi = fmax(xhi, 4 * peak / pr.mem_bw), ylo = fmin(ylo, pr.mem_bw * xlo);
    }
    if (!drawn) xlo = 0.1, xhi = 100, ylo = 1e8, yhi = 1e12;
    *a = (axes){floor(log10(xlo / 2)), ceil(log10(xhi * 2)), floor(log10(ylo / 2)), ceil(log10(yhi * 2))};
    return drawn;
}

static void roofs(FILE *f, const kiln_ctx *ctx, const bool used[], const axes *a)
{
    int row = 0;
    for (int b = 0; b < kiln_backend_count(ctx); b++) {
        kiln_backend_info bi;
        kiln_device_profile pr;
        if (!used[b] || kiln_backend_get(ctx, b, &bi) != KILN_OK || kiln_ctx_profile(ctx, bi.name, &pr) != KILN_OK) continue;
        double peak = pr.peak_flops[KILN_DTYPE_F32], knee = peak / pr.mem_bw, hi = pow(10, a->x1);
        double lo = fmax(pow(10, a->x0), pow(10, a->y0) / pr.mem_bw); /* where the slope enters the box */
        const char *c = colors[b % 6];
        fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2' points='%.1f,%.1f %.1f,%.1f %.1f,%.1f'/>\n", c,
                px(a, lo), py(a, pr.mem_bw * lo), px(a, knee), py(a, peak), px(a, hi), py(a, peak));
        fprintf(f, "<text x='%.1f' y='%.1f' font-size='12' fill='%s'>%s: %.3g GB/s, %.3g GFLOP/s f32</text>\n", L + 10,
                T + 18 + 16.0 * row++, c, bi.name, pr.mem_bw / 1e9, peak / 1e9);
    }
}

int kiln_cli_plan_svg(const kiln_ctx *ctx, const kiln_plan *p, const char *path, const char *title)
{
    int n = kiln_plan_kernel_count(p);
    kiln_region_info *r = calloc(n > 0 ? (size_t)n : 1, sizeof *r);
    bool used[KILN_MAX_BACKENDS] = {false};
    FILE *f = r ? fopen(path, "w") : NULL;
    if (!f) {
        fprintf(stderr, "kiln plan: --svg %s: cannot write it\n", path);
        free(r);
        return KILN_CLI_FAIL;
    }
    axes a;
    int drawn = collect(ctx, p, r, n, used, &a);
    double height = T + H + 60 + 15.0 * drawn;
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' font-family='sans-serif'>\n", L + W + 20, height);
    fprintf(f, "<rect width='100%%' height='100%%' fill='white'/>\n<text x='%.1f' y='22' font-size='14' text-anchor='middle'>",
            L + W / 2);
    xml_text(f, title);
    fprintf(f, "</text>\n");
    grid(f, &a);
    roofs(f, ctx, used, &a);
    double ly = T + H + 55;
    for (int i = 0; i < n; i++) {
        if (r[i].flops <= 0 || r[i].bytes <= 0) continue;
        int b = 0;
        for (; b < kiln_backend_count(ctx); b++) {
            kiln_backend_info bi;
            if (kiln_backend_get(ctx, b, &bi) == KILN_OK && !strcmp(bi.name, r[i].backend)) break;
        }
        double t = b < KILN_MAX_BACKENDS ? r[i].predicted_s[b] : 0, x = px(&a, r[i].flops / r[i].bytes);
        if (t > 0) {
            double y = py(&a, r[i].flops / t);
            fprintf(f, "<circle cx='%.1f' cy='%.1f' r='4' fill='%s'/><text x='%.1f' y='%.1f' font-size='10'>%d</text>\n", x, y,
                    colors[b % 6], x + 5, y - 4, i);
        }
        fprintf(f, "<text x='%.1f' y='%.1f' font-size='11' fill='%s'>%d  %s  %.3g us  ", L, ly, colors[b % 6], i, r[i].backend, t * 1e6);
        xml_text(f, r[i].ops);
        fprintf(f, "</text>\n");
        ly += 15;
    }
    fprintf(f, "</svg>\n");
    bool ok = !ferror(f);
    ok = fclose(f) == 0 && ok;
    free(r);
    if (!ok) {
        fprintf(stderr, "kiln plan: --svg %s: write failed\n", path);
        return KILN_CLI_FAIL;
    }
    fprintf(stderr, "kiln plan: roofline of %d kernels (of %d; moves have no FLOPs) written to %s\n", drawn, n, path);
    return KILN_CLI_OK;
}
