// KV chunk codecs: lossy, idempotent compression of one KV chunk for the
// in-memory compressed swap stack (mzCache §4, §6.5). Kernels layer: a codec
// knows a chunk's shape and element type, nothing of models or policy.
//
// A chunk is K rows then V rows, chunk_tokens rows each, row_dim elements per
// row, F16 or F32. Only the first n_tokens rows of K and of V are encoded;
// the rest decode as zero.
//
// Blob: a 16-byte header (codec id, type, n_tokens, row_dim, chunk_tokens),
// then the payload. Its size depends on the shape only.
//  - int8: per valid row (K rows, then V rows): F16 scales of the row's groups
//    of 64 (the last group shorter), then row_dim int8 codes; value = d * q,
//    q in [-127, 127]. 8.25 bits per value: 48% smaller than F16.
//  - int4 (KIVI-style): K per channel, V per token, 4-bit asymmetric with F16
//    minimum m and step d; value = m + d * q, q in [0, 15].
//      K: per group of 64 tokens: m[row_dim], d[row_dim] (F16), then the
//         group's rows of codes, two per byte (low nibble first).
//      V: per valid row: m[groups], d[groups] (F16) of the row's groups of
//         64, then the row's codes, two per byte.
//    About 4.5 bits per value: ~72% smaller than F16.
// Decoded values are rounded to the chunk's type.
//
// Idempotency: compress(decompress(compress(x))) == compress(x) byte for
// byte, for every NaN-free input. compress() guarantees it by construction:
// it only returns an encoding b with E(D(b)) == b, refining b <- E(D(b)) a
// few times when needed. A group that does not settle (never seen on real
// data; possible only on adversarial inputs) is stored as a constant group,
// which is a fixed point by design (int8: zero; int4: its minimum).
// Values beyond what the F16 parameters reach (F32 chunks with |x| > ~8e6)
// saturate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kernels/cpu.h"
#include "kernels/tensor.h"

namespace ebb {

class ThreadPool;

enum class KvCodecId : uint8_t { kInt8 = 1, kInt4 = 2 };

struct KvChunkShape {
  int64_t chunk_tokens;  // rows of K (and of V) in the chunk storage
  int64_t n_tokens;      // valid rows (<= chunk_tokens); rows beyond are not encoded and decode as zero
  int64_t row_dim;       // elements per row (n_kv_heads * head_dim)
  DType type;            // kF16 or kF32 (storage type of the chunk)
};

// What compress() did, for tests and benchmarks.
struct KvCodecStats {
  int64_t groups = 0;     // quantization groups encoded
  int64_t refined = 0;    // blocks that needed at least one b <- E(D(b)) step
  int64_t fallbacks = 0;  // groups stored as constants because they did not settle
};

class KvCodec {
 public:
  virtual ~KvCodec() = default;
  virtual KvCodecId id() const = 0;
  virtual std::string_view name() const = 0;  // "int8", "int4"
  // Exact size of the blob for this shape (compress() always writes this many).
  virtual size_t max_compressed_bytes(const KvChunkShape&) const = 0;
  // src: the chunk storage (K rows then V rows, chunk_tokens rows each).
  // Returns bytes written to dst. stats, when given, is added to. pool, when
  // given, encodes the blob's records on all its threads: the same bytes.
  virtual size_t compress(const KvChunkShape&, const void* src, void* dst, KvCodecStats* stats,
                          ThreadPool* pool) const = 0;
  size_t compress(const KvChunkShape& s, const void* src, void* dst, KvCodecStats* stats) const {
    return compress(s, src, dst, stats, nullptr);
  }
  size_t compress(const KvChunkShape& s, const void* src, void* dst) const {
    return compress(s, src, dst, nullptr, nullptr);
  }
  // dst: the chunk storage (chunk_tokens rows of K then of V). Throws
  // ebb::Error when n or the header does not match the shape (a corrupt blob).
  virtual void decompress(const KvChunkShape&, const void* src, size_t n, void* dst) const = 0;
};

// The codec for a target (Isa from kernels/cpu.h); the scalar one is the
// reference. The target must be supported by this CPU.
const KvCodec& kv_codec(KvCodecId id, Isa isa);
KvCodecId parse_kv_codec(std::string_view name);  // "int8"/"int4"; Error listing the choices otherwise
std::string_view kv_codec_name(KvCodecId id);

namespace detail {

// Inner loops of the codecs, one table per target. The drivers in
// kv_codec.cpp (layout, parameter choice, refinement) are shared, so every
// target produces the same bytes when these loops agree with the scalar ones.
// `f16` selects the chunk type: true F16, false F32.
struct KvCodecKernels {
  // y[i] = float(x[i]) for x of the chunk type.
  void (*to_f32)(const void* x, bool f16, int64_t n, float* y);
  float (*absmax)(const float* x, int64_t n);
  void (*minmax)(const float* x, int64_t n, float* lo, float* hi);
  // lo[c], hi[c] over rows of x [rows, cols].
  void (*col_minmax)(const float* x, int64_t rows, int64_t cols, float* lo, float* hi);
  // q[i] = clamp(round(x[i] * id), -127, 127).
  void (*quant_i8)(const float* x, int64_t n, float id, int8_t* q);
  // y[i] = type(d * q[i]) stored in the chunk type.
  void (*dequant_i8)(const int8_t* q, int64_t n, float d, bool f16, void* y);
  // q = clamp(round((x - m) * id), 0, 15), two per byte (low nibble first);
  // _cols: per-element m[i], id[i]. n odd: the last high nibble is 0.
  void (*quant_u4)(const float* x, int64_t n, float m, float id, uint8_t* q);
  void (*quant_u4_cols)(const float* x, int64_t n, const float* m, const float* id, uint8_t* q);
  // y[i] = type(m + d * q[i]); _cols: per-element F16 m[i], d[i].
  void (*dequant_u4)(const uint8_t* q, int64_t n, float m, float d, bool f16, void* y);
  void (*dequant_u4_cols)(const uint8_t* q, int64_t n, const uint16_t* m, const uint16_t* d, bool f16, void* y);
};

const KvCodecKernels& kv_codec_kernels_scalar();
#if defined(EBB_ARCH_X86)
const KvCodecKernels& kv_codec_kernels_avx2();
#endif

}  // namespace detail
}  // namespace ebb
