/* Row kernels for the CPU backend: rms_norm, softmax, rope. Plain C written so the compiler can
 * vectorize the inner loops at the baseline ISA; single-threaded (the executor splits rows over
 * the pool when it wants to). Must not contain ISA intrinsics. */
#include <math.h>
#include <stdatomic.h>

#include "backends/cpu/cpu.h"
#include "util/fault.h"

void kiln_cpu_rms_norm(const float *x, const float *w, float eps, int64_t rows, int64_t d, float *y)
{
    const double fault = kiln_fault("cpu_rms_norm_scale") ? 1.001 : 1.0; /* test-only wrong scale */
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        double ss = 0;
        for (int64_t i = 0; i < d; i++)
            ss += (double)xr[i] * xr[i];
        /* The scale stays in f64: for |x| near the f32 limit it is below the smallest normal f32
         * (a denormal f32 scale loses digits, or flushes to zero). */
        double s = fault / sqrt(ss / (double)d + (double)eps);
        for (int64_t i = 0; i < d; i++)
            yr[i] = (float)(xr[i] * s * (w ? w[i] : 1.0f));
    }
    static atomic_int calls; /* test-only: every call after the first puts a NaN first */
    if (kiln_fault("cpu_rms_norm_nan_late") && atomic_fetch_add(&calls, 1) > 0 && rows > 0 && d > 0) y[0] = NAN;
}

void kiln_cpu_softmax(const float *x, int64_t rows, int64_t d, float *y)
{
    const int64_t skip = kiln_fault("cpu_softmax_off_by_one") && d > 1 ? 1 : 0; /* test-only off-by-one */
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        float mx = -INFINITY;
        for (int64_t i = 0; i < d; i++)
            mx = xr[i] > mx ? xr[i] : mx;
        double sum = 0;
        for (int64_t i = 0; i < d; i++) {
            yr[i] = expf(xr[i] - mx);
            sum += i < d - skip ? yr[i] : 0.0;
        }
        float is = (float)(1.0 / sum);
        for (int64_t i = 0; i < d; i++)
            yr[i] *= is;
    }
}

void kiln_cpu_rope(float *x, const int32_t *pos, int64_t n_tok, int64_t n_head, int64_t hd, int64_t rot, int mode,
                   float theta, const float *mult)
{
    const int64_t half = rot / 2; /* dims rot .. hd - 1 are left as they are */
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < half; i++) {
            /* Angles in double: positions up to 1e5+ lose digits in f32. */
            double ang = (double)pos[t] * pow((double)theta, -2.0 * (double)i / (double)rot);
            if (mult) ang *= (double)mult[i];
            float c = (float)cos(ang), s = (float)sin(ang);
            for (int64_t h = 0; h < n_head; h++) {
                float *xr = x + (t * n_head + h) * hd;
                int64_t a = mode == 0 ? 2 * i : i, b = mode == 0 ? 2 * i + 1 : i + half;
                float x0 = xr[a], x1 = xr[b];
                xr[a] = x0 * c - x1 * s;
                xr[b] = x0 * s + x1 * c;
            }
        }
}
