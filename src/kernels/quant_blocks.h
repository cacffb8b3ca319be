// Block layouts of the quantized formats, byte-for-byte as GGUF / ggml store
// them, and the internal interface between matmul.cpp and the per-target
// kernel files (quant_scalar.cpp, quant_avx2.cpp, quant_avx512.cpp,
// quant_neon.cpp).
#pragma once

#include <array>
#include <cstdint>

#include "kernels/matmul.h"

namespace ebb {

inline constexpr int kQK8_0 = 32;  // elements per Q8_0 / Q4_0 block
inline constexpr int kQK_K = 256;  // elements per K-quant super-block

// Q8_0: x[i] = d * qs[i].
struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ8_0) == 34);

// Q4_0: x[i] = d * ((qs[i] & 15) - 8), x[i + 16] = d * ((qs[i] >> 4) - 8), i < 16.
struct BlockQ4_0 {
  uint16_t d;  // fp16 scale
  uint8_t qs[kQK8_0 / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// Block i of eight Q4_0 rows r = 0..7, interleaved (Packing::kQ4_0x8): the
// eight scales, then qs[32k + 4r + j] = byte 4k + j of row r's qs (k < 4,
// j < 4). So the 32 bytes from 32k hold, in dword lane r, row r's elements
// 4k..4k+3 (low nibbles) and 16+4k..16+4k+3 (high nibbles).
struct BlockQ4_0x8 {
  uint16_t d[8];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ4_0x8) == 8 * sizeof(BlockQ4_0));

// The same for Q8_0: qs[32k + 4r + j] = row r's qs[4k + j] (k < 8), so the 32
// bytes from 32k hold row r's elements 4k..4k+3 in dword lane r.
struct BlockQ8_0x8 {
  uint16_t d[8];
  int8_t qs[256];
};
static_assert(sizeof(BlockQ8_0x8) == 8 * sizeof(BlockQ8_0));

// Per activation block of a Q8_0 row, for the packed kernels: m8 = 8 x the
// sum of the block's 32 bytes (the offset of Q4_0's q - 8), d its scale.
struct Q8_0Sums {
  int32_t m8;
  float d;
};

// Q4_K: 8 sub-blocks of 32. Sub-block j has a 6-bit scale sc[j] and a 6-bit
// min m[j] packed into scales[12] (see unpack_scale_min_k4);
// x = d * sc[j] * q - dmin * m[j], q a 4-bit value. qs[32*k + l] holds
// element 64k + l in its low nibble and element 64k + 32 + l in its high one.
struct BlockQ4_K {
  uint16_t d;     // fp16 super-block scale of the scales
  uint16_t dmin;  // fp16 super-block scale of the mins
  uint8_t scales[12];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

// Super-block i of eight Q4_K rows r = 0..7, interleaved (Packing::kQ4_Kx8):
// the eight d, the eight dmin, then row r's 12 scale bytes as three 4-byte
// pieces (piece p at 32p + 4r), then qs[32k + 4r + j] = byte 4k + j of row
// r's qs (k < 32). So the 32 bytes from 32k hold, in dword lane r, row r's
// elements 64(k / 8) + 4(k % 8) + 0..3 of sub-block 2(k / 8) (low nibbles)
// and the same 32 further on, of sub-block 2(k / 8) + 1 (high nibbles); and
// the scale pieces unpack for all eight rows with dword shifts and masks.
struct BlockQ4_Kx8 {
  uint16_t d[8];
  uint16_t dmin[8];
  uint8_t scales[96];
  uint8_t qs[1024];
};
static_assert(sizeof(BlockQ4_Kx8) == 8 * sizeof(BlockQ4_K));

// Q5_K: as Q4_K plus a fifth bit: bit j of qh[l] is the high bit of element
// 32*j + l.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

// Super-block i of eight Q5_K rows r = 0..7, interleaved (Packing::kQ5_Kx8):
// as BlockQ4_Kx8 (the eight d, the eight dmin, the scale pieces, qs[32k + 4r
// + j] = row r's qs[4k + j]) with qh[32m + 4r + j] = row r's qh[4m + j] (m <
// 8) before qs. So qs piece 8kk + mm and qh piece mm hold, in dword lane r,
// row r's elements 64kk + 4mm + 0..3 (low nibbles, fifth bit: bit 2kk of the
// qh bytes) and the same 32 further on (high nibbles, bit 2kk + 1).
struct BlockQ5_Kx8 {
  uint16_t d[8];
  uint16_t dmin[8];
  uint8_t scales[96];
  uint8_t qh[256];
  uint8_t qs[1024];
};
static_assert(sizeof(BlockQ5_Kx8) == 8 * sizeof(BlockQ5_K));

// Q6_K: 16 sub-blocks of 16 with int8 scales; x = d * scales[e / 16] * (q - 32),
// q 6 bits. For half h (128 elements) and l < 32, with ql' = ql + 64h,
// qh' = qh + 32h, e0 = 128h:
//   q[e0 + l]      = (ql'[l] & 15)      | ((qh'[l] >> 0) & 3) << 4
//   q[e0 + l + 32] = (ql'[l + 32] & 15) | ((qh'[l] >> 2) & 3) << 4
//   q[e0 + l + 64] = (ql'[l] >> 4)      | ((qh'[l] >> 4) & 3) << 4
//   q[e0 + l + 96] = (ql'[l + 32] >> 4) | ((qh'[l] >> 6) & 3) << 4
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// Super-block i of eight Q6_K rows r = 0..7, interleaved (Packing::kQ6_Kx8):
// the eight d, then scales[32p + 4r + j] = row r's scales[4p + j] (p < 4),
// ql[32k + 4r + j] = row r's ql[4k + j] (k < 32) and qh[32m + 4r + j] = row
// r's qh[4m + j] (m < 16). The scales come first, in the order the kernel
// reads them. So for half h and chunk c < 8, the 32 bytes of ql piece 16h +
// c hold, in dword lane r, row r's elements 128h + 4c + 0..3 (low nibbles)
// and 128h + 64 + 4c + 0..3 (high); ql piece 16h + 8 + c the elements 32
// further on; and qh piece 8h + c the high bits of all four (bits 2s..2s+1:
// element 128h + 32s + 4c + j).
struct BlockQ6_Kx8 {
  uint16_t d[8];
  int8_t scales[128];
  uint8_t ql[1024];
  uint8_t qh[512];
};
static_assert(sizeof(BlockQ6_Kx8) == 8 * sizeof(BlockQ6_K));

// Q8_K (activations of the K-quants): x = d * qs; bsums[g] = sum of qs[16g..16g+15].
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
static_assert(sizeof(BlockQ8_K) == 292);

// Q8_1 (activations of Q4_1 and Q5_1): Q8_0's bytes and scale plus s, the
// block's sum: s = fp16(d * sum qs) with d the unrounded float scale, as the
// reference engine stores it. The weight's min part is m * s.
struct BlockQ8_1 {
  uint16_t d;  // fp16 scale
  uint16_t s;  // fp16 d * sum of qs
  int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ8_1) == 36);

// Q4_1: x[i] = d * (qs[i] & 15) + m, x[i + 16] = d * (qs[i] >> 4) + m, i < 16.
struct BlockQ4_1 {
  uint16_t d;  // fp16 scale
  uint16_t m;  // fp16 offset (the block's minimum)
  uint8_t qs[kQK8_0 / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

// Q5_0: Q4_0's nibbles plus a fifth bit per element: bit i of qh (little
// endian) is the high bit of element i. x = d * (q - 16), q 5 bits.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK8_0 / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

// Q5_1: Q5_0's bits with Q4_1's offset: x = d * q + m.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK8_0 / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

// IQ4_NL: 4-bit indices into the non-linear codebook kIq4nlValues:
// x[i] = d * kIq4nlValues[qs[i] & 15], x[i + 16] = d * kIq4nlValues[qs[i] >> 4].
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK8_0 / 2];
};
static_assert(sizeof(BlockIQ4_NL) == 18);

// The IQ4_NL / IQ4_XS codebook (ggml's kvalues_iq4nl): int8, so a dot with
// Q8 activations stays in integers.
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// IQ4_XS: 8 sub-blocks of 32, each with a 6-bit scale ls[j] = (scales_l[j / 2]
// >> 4 (j % 2) & 15) | ((scales_h >> 2j) & 3) << 4; x = d * (ls[j] - 32) *
// kIq4nlValues[q], q 4 bits: sub-block j's element l < 16 in the low nibble of
// qs[16j + l], element l + 16 in its high nibble (IQ4_NL's order per 32).
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136);

// The 6-bit scale of sub-block j (0..7) of an IQ4_XS block, without the -32.
inline int iq4_xs_scale(const BlockIQ4_XS& b, int j) {
  return ((b.scales_l[j / 2] >> (4 * (j % 2))) & 15) | (((b.scales_h >> (2 * j)) & 3) << 4);
}

// Q2_K: 16 sub-blocks of 16; scales[g] holds sub-block g's 4-bit scale (low
// nibble) and 4-bit min (high nibble); x = d * sc * q - dmin * m, q 2 bits.
// For half h (128 elements), shift s < 4 and l < 32: element 128h + 32s + l
// is (qs[32h + l] >> 2s) & 3, in sub-block 8h + 2s + l / 16.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// Q3_K: 16 sub-blocks of 16 with 6-bit scales (q3_k_scale); x = d * (sc -
// 32) * q, q = low 2 bits - (high bit clear ? 4 : 0) in [-4, 3]. Element 128h
// + 32s + l (as Q2_K) has low bits (qs[32h + l] >> 2s) & 3 and high bit
// (hmask[l] >> (4h + s)) & 1.
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// The 6-bit scale of sub-block g (0..15) of a Q3_K block, without the -32:
// low 4 bits from byte g (g < 8, low nibble) or g - 8 (high nibble), high 2
// bits from byte 8 + g % 4 at bit 2 (g / 4).
inline int q3_k_scale(const uint8_t* scales, int g) {
  const int lo = g < 8 ? scales[g] & 15 : scales[g - 8] >> 4;
  return lo | (((scales[8 + g % 4] >> (2 * (g / 4))) & 3) << 4);
}

// Unpacks the 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block.
inline void unpack_scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// The formats with kernels, in table order. Q8_K and Q8_1 have rows too
// (to_float, quantize_act and a dot with themselves) so activations can be
// checked.
inline constexpr std::array<DType, 17> kKernelFormats = {
    DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,   DType::kQ4_0,  DType::kQ4_K,
    DType::kQ5_K, DType::kQ6_K, DType::kQ8_K, DType::kQ4_1,   DType::kQ5_0,  DType::kQ5_1,
    DType::kQ2_K, DType::kQ3_K, DType::kQ8_1, DType::kIQ4_NL, DType::kIQ4_XS};
using FormatTable = std::array<FormatKernels, kKernelFormats.size()>;

// Index of t in kKernelFormats, -1 when it has no kernels.
inline int kernel_format_index(DType t) {
  for (size_t i = 0; i < kKernelFormats.size(); ++i)
    if (kKernelFormats[i] == t) return static_cast<int>(i);
  return -1;
}

// Per-target tables. A SIMD table starts from the one below it and replaces
// the rows (or single kernels) it has faster versions of.
FormatTable scalar_format_table();
FormatTable ref_engine_format_table();  // the scalar table, summing in the reference engine's order
// The rows of Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q8_1, IQ4_NL and IQ4_XS
// (quant_lowbit_*.cpp), set into a table the per-target functions build.
void scalar_lowbit_rows(FormatTable& t);
void ref_engine_lowbit_rows(FormatTable& t);
#if defined(EBB_ARCH_X86)
FormatTable avx2_format_table();
FormatTable avx512_format_table();
void avx2_lowbit_rows(FormatTable& t);
#endif
#if defined(EBB_ARCH_ARM)
FormatTable neon_format_table();
void neon_lowbit_rows(FormatTable& t);
#endif

}  // namespace ebb
