/* Vector math shared by the AVX2 kernel files (gemv_avx2.c: attention softmax; gemm_avx2.c:
 * swiglu epilogue). Include only from files built with -mavx2 -mfma. */
#pragma once

#include <immintrin.h>

/* e^x for x <= 0: 2^n p(r) with n = round(x / ln 2), r = x - n ln 2 (Cody-Waite, two parts) and
 * the Cephes polynomial, about 1 ulp. Below -87.3 it returns e^-87.3 (about 1.2e-38). */
static inline __m256 kiln_avx2_exp_neg(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
