// AVX-512 helpers shared by ops_avx512.cpp and attention_avx512.cpp. Include
// only from *_avx512.cpp files (everything here needs their compile flags),
// after the GCC 12 diagnostic pragmas those files start with (bug 105593),
// and keep it static so no out-of-line copy can leak into baseline code.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace ebb::avx512 {

// Lane mask for the first n (<= 16) lanes, for masked loads and stores.
static inline __mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

// e^x as in avx2::exp_ps; scalef applies 2^n with correct overflow to inf
// and underflow through the subnormals to 0.
static inline __m512 exp_ps(__m512 x) {
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(89.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_scalef_ps(p, n);
  // NaN in, NaN out (min/max above dropped it).
  return _mm512_mask_mov_ps(p, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

}  // namespace ebb::avx512
