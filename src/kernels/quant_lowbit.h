// Internal to the kernels of Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL and IQ4_XS
// (quant_lowbit_*.cpp, quantize_lowbit.cpp): the element values of one block
// as the scalar reference decodes them (the SIMD files' tests and fallbacks
// share them), the Q8_1 activation quantizer and the weight quantizers.
#pragma once

#include <cstdint>

#include "kernels/quant_blocks.h"

namespace ebb {

// The high bit (0 or 1) of element e (0..31) of a Q5_0 / Q5_1 block.
int q5_high_bit(const uint8_t* qh, int e);
// q[32]: the integer values of a block's elements, before the scale.
void q4_1_values(const BlockQ4_1& b, int* q);   // 0..15
void q5_0_values(const BlockQ5_0& b, int* q);   // -16..15
void q5_1_values(const BlockQ5_1& b, int* q);   // 0..31
void iq4_nl_values(const uint8_t* qs, int* q);  // codebook values of 16 bytes
// q[256]: a super-block's values, before the sub-block scales.
void q2_k_values(const BlockQ2_K& b, int* q);  // 0..3
void q3_k_values(const BlockQ3_K& b, int* q);  // -4..3

// Q8_1 activations: src[n] floats -> n / 32 BlockQ8_1.
void quantize_q8_1(const float* src, void* dst, int64_t n);

// Weight quantizers (kernels/quantize.h's quantize_row for these formats):
// src[n] floats -> n / block size blocks. span: how many candidate scales
// each block tries on either side of its first guess (kSearchSpan for
// quantize_row; 0, the first guess refit once, for quantize_row_fast).
inline constexpr int kSearchSpan = 4;
void quantize_q4_1(const float* src, void* dst, int64_t n, int span);
void quantize_q5_0(const float* src, void* dst, int64_t n, int span);
void quantize_q5_1(const float* src, void* dst, int64_t n, int span);
void quantize_iq4_nl(const float* src, void* dst, int64_t n, int span);
void quantize_iq4_xs(const float* src, void* dst, int64_t n, int span);
void quantize_q2_k(const float* src, void* dst, int64_t n, int span);
void quantize_q3_k(const float* src, void* dst, int64_t n, int span);

}  // namespace ebb
