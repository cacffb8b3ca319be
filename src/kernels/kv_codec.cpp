// KV codec drivers: blob layout, parameter choice and the refinement that
// makes compress() idempotent (see kv_codec.h). Shared by every target; the
// inner loops come from a detail::KvCodecKernels table.
#include "kernels/kv_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "platform/error.h"
#include "platform/fp16.h"
#include "platform/thread_pool.h"

namespace ebb {
namespace {

using detail::KvCodecKernels;

constexpr int64_t kGroup = 64;       // values per group along a row (int8, int4 V)
constexpr int64_t kTokenGroup = 64;  // tokens per group along a channel (int4 K)
constexpr size_t kHeaderBytes = 16;
constexpr int kMaxRefine = 4;        // b <- E(D(b)) steps before falling back

int64_t n_groups(int64_t n, int64_t g) { return (n + g - 1) / g; }
float h2f(uint16_t h) { return fp16_to_fp32(h); }

// ---- parameters (shared by every target, so they agree bit for bit) ----------

// int8: d = amax / 127, as F16, capped so that 127 * d stays finite in the chunk type.
uint16_t scale_i8(float amax, bool f16) {
  const float dmax = f16 ? 515.5f : 65504.f;  // round16(127 * 515.5) = 65472
  return fp32_to_fp16(std::min(amax / 127.f, dmax));
}

// F16 spacing at |h|.
float ulp16(uint16_t h) {
  const int e = (h >> 10) & 31;
  return e == 0 ? std::ldexp(1.f, -24) : std::ldexp(1.f, e - 25);
}

// int4: minimum m and step d (both F16). d is kept >= 4 F16 ulps of m, so
// that rounding a decoded value to F16 moves it by < d/4 and its code
// survives recompression; it is lowered if m + 15 d would overflow F16.
void params_u4(float lo, float hi, bool f16, uint16_t* m16, uint16_t* d16) {
  lo = std::clamp(lo, -65504.f, 65504.f);
  const uint16_t mh = fp32_to_fp16(lo);
  const float m = h2f(mh);
  float span = (hi - m) / 15.f;
  if (!(span > 0.f)) span = 0.f;
  uint16_t dh = fp32_to_fp16(std::min(span, 65504.f));
  const uint16_t floor_h = fp32_to_fp16(4.f * ulp16(mh));
  if (h2f(dh) < h2f(floor_h)) dh = floor_h;
  if (f16) {
    while (dh > 0 && !(std::fabs(m + h2f(dh) * 15.f) < 65520.f)) --dh;
  }
  *m16 = mh;
  *d16 = dh;
}

void put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
uint16_t get16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Work buffers of one compress() call, reused across its blocks.
struct Scratch {
  std::vector<float> lo, hi, m, id;  // ColU4 per-channel parameters
  std::vector<uint8_t> rec2, typed;  // refinement: E(D(b)) and D(b) in the chunk type
  std::vector<float> y;              // D(b) as floats
};

// ---- blocks: the unit the refinement works on ----------------------------------
// encode(x, rec): x [count()] floats -> rec [rec_bytes()]
// decode(rec, y): rec -> y [count()] in the chunk type
// same(a, b, g): group g is encoded identically in records a and b
// flatten(rec, y, g): sets group g of the floats y to its constant fallback value

struct RowI8 {  // one row, groups of kGroup along it
  const KvCodecKernels& k;
  int64_t dim;
  bool f16;
  int64_t ng() const { return n_groups(dim, kGroup); }
  int64_t count() const { return dim; }
  size_t rec_bytes() const { return static_cast<size_t>(2 * ng() + dim); }
  void encode(const float* x, uint8_t* rec) const {
    int8_t* q = reinterpret_cast<int8_t*>(rec + 2 * ng());
    for (int64_t g = 0; g < ng(); ++g) {
      const int64_t a = g * kGroup, n = std::min(kGroup, dim - a);
      const uint16_t dh = scale_i8(k.absmax(x + a, n), f16);
      const float d = h2f(dh);
      put16(rec + 2 * g, dh);
      k.quant_i8(x + a, n, d > 0.f ? 1.f / d : 0.f, q + a);
    }
  }
  void decode(const uint8_t* rec, void* y) const {
    const int8_t* q = reinterpret_cast<const int8_t*>(rec + 2 * ng());
    const size_t es = f16 ? 2 : 4;
    for (int64_t g = 0; g < ng(); ++g) {
      const int64_t a = g * kGroup;
      k.dequant_i8(q + a, std::min(kGroup, dim - a), h2f(get16(rec + 2 * g)), f16, static_cast<uint8_t*>(y) + a * es);
    }
  }
  int64_t groups() const { return ng(); }
  bool same(const uint8_t* a, const uint8_t* b, int64_t g) const {
    const int64_t o = 2 * ng() + g * kGroup, n = std::min(kGroup, dim - g * kGroup);
    return get16(a + 2 * g) == get16(b + 2 * g) && std::memcmp(a + o, b + o, n) == 0;
  }
  void flatten(const uint8_t*, float* y, int64_t g) const {
    std::fill(y + g * kGroup, y + std::min(dim, (g + 1) * kGroup), 0.f);
  }
};

struct RowU4 {  // one V row, asymmetric groups of kGroup along it
  const KvCodecKernels& k;
  int64_t dim;
  bool f16;
  int64_t ng() const { return n_groups(dim, kGroup); }
  int64_t count() const { return dim; }
  size_t rec_bytes() const { return static_cast<size_t>(4 * ng() + (dim + 1) / 2); }
  void encode(const float* x, uint8_t* rec) const {
    uint8_t* q = rec + 4 * ng();
    for (int64_t g = 0; g < ng(); ++g) {
      const int64_t a = g * kGroup, n = std::min(kGroup, dim - a);
      float lo, hi;
      k.minmax(x + a, n, &lo, &hi);
      uint16_t mh, dh;
      params_u4(lo + 0.f, hi + 0.f, f16, &mh, &dh);
      put16(rec + 2 * g, mh);
      put16(rec + 2 * (ng() + g), dh);
      const float d = h2f(dh);
      k.quant_u4(x + a, n, h2f(mh), d > 0.f ? 1.f / d : 0.f, q + a / 2);
    }
  }
  void decode(const uint8_t* rec, void* y) const {
    const uint8_t* q = rec + 4 * ng();
    const size_t es = f16 ? 2 : 4;
    for (int64_t g = 0; g < ng(); ++g) {
      const int64_t a = g * kGroup;
      k.dequant_u4(q + a / 2, std::min(kGroup, dim - a), h2f(get16(rec + 2 * g)), h2f(get16(rec + 2 * (ng() + g))),
                   f16, static_cast<uint8_t*>(y) + a * es);
    }
  }
  int64_t groups() const { return ng(); }
  bool same(const uint8_t* a, const uint8_t* b, int64_t g) const {
    const int64_t o = 4 * ng() + g * kGroup / 2, n = (std::min(kGroup, dim - g * kGroup) + 1) / 2;
    return get16(a + 2 * g) == get16(b + 2 * g) && get16(a + 2 * (ng() + g)) == get16(b + 2 * (ng() + g)) &&
           std::memcmp(a + o, b + o, n) == 0;
  }
  void flatten(const uint8_t* rec, float* y, int64_t g) const {
    std::fill(y + g * kGroup, y + std::min(dim, (g + 1) * kGroup), h2f(get16(rec + 2 * g)));
  }
};

struct ColU4 {  // `rows` K rows; each channel is one asymmetric group
  const KvCodecKernels& k;
  int64_t dim;
  int64_t rows;
  bool f16;
  Scratch* ws;
  int64_t pitch() const { return (dim + 1) / 2; }  // code bytes per row
  int64_t count() const { return rows * dim; }
  // Padded to an even size so that the next record's F16 arrays stay 2-aligned.
  size_t rec_bytes() const { return static_cast<size_t>(4 * dim + (rows * pitch() + 1) / 2 * 2); }
  void encode(const float* x, uint8_t* rec) const {
    if ((rows * pitch()) & 1) rec[rec_bytes() - 1] = 0;
    std::vector<float>&lo = ws->lo, &hi = ws->hi, &m = ws->m, &id = ws->id;
    for (auto* v : {&lo, &hi, &m, &id}) v->resize(static_cast<size_t>(dim));
    k.col_minmax(x, rows, dim, lo.data(), hi.data());
    for (int64_t c = 0; c < dim; ++c) {
      uint16_t mh, dh;
      params_u4(lo[c] + 0.f, hi[c] + 0.f, f16, &mh, &dh);
      put16(rec + 2 * c, mh);
      put16(rec + 2 * (dim + c), dh);
      m[c] = h2f(mh);
      const float d = h2f(dh);
      id[c] = d > 0.f ? 1.f / d : 0.f;
    }
    for (int64_t r = 0; r < rows; ++r) k.quant_u4_cols(x + r * dim, dim, m.data(), id.data(), rec + 4 * dim + r * pitch());
  }
  void decode(const uint8_t* rec, void* y) const {
    const uint16_t* m = reinterpret_cast<const uint16_t*>(rec);  // 2-aligned: records start at even offsets
    const size_t es = f16 ? 2 : 4;
    for (int64_t r = 0; r < rows; ++r)
      k.dequant_u4_cols(rec + 4 * dim + r * pitch(), dim, m, m + dim, f16, static_cast<uint8_t*>(y) + r * dim * es);
  }
  int64_t groups() const { return dim; }
  bool same(const uint8_t* a, const uint8_t* b, int64_t c) const {
    if (get16(a + 2 * c) != get16(b + 2 * c) || get16(a + 2 * (dim + c)) != get16(b + 2 * (dim + c))) return false;
    const int sh = 4 * (c & 1);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t o = 4 * dim + r * pitch() + c / 2;
      if (((a[o] >> sh) & 15) != ((b[o] >> sh) & 15)) return false;
    }
    return true;
  }
  void flatten(const uint8_t* rec, float* y, int64_t c) const {
    const float m = h2f(get16(rec + 2 * c));
    for (int64_t r = 0; r < rows; ++r) y[r * dim + c] = m;
  }
};

// Encodes x into rec so that E(D(rec)) == rec (the idempotency contract).
template <class Block>
void encode_settled(const Block& b, const float* x, uint8_t* rec, Scratch& ws, KvCodecStats* stats) {
  const size_t rb = b.rec_bytes();
  const int64_t n = b.count();
  const size_t es = b.f16 ? 2 : 4;
  std::vector<uint8_t>& rec2 = ws.rec2;
  std::vector<uint8_t>& typed = ws.typed;
  std::vector<float>& y = ws.y;
  rec2.resize(rb);
  typed.resize(static_cast<size_t>(n) * es);
  y.resize(static_cast<size_t>(n));
  auto step = [&]() {  // rec2 = E(D(rec)); y = D(rec) as floats
    b.decode(rec, typed.data());
    b.k.to_f32(typed.data(), b.f16, n, y.data());
    b.encode(y.data(), rec2.data());
  };
  b.encode(x, rec);
  if (stats) stats->groups += b.groups();
  for (int it = 0; it < kMaxRefine; ++it) {
    step();
    if (std::memcmp(rec, rec2.data(), rb) == 0) return;
    if (stats && it == 0) ++stats->refined;
    std::memcpy(rec, rec2.data(), rb);
  }
  // Not settled: keep the groups that are fixed points, flatten the others.
  step();
  for (int64_t g = 0; g < b.groups(); ++g) {
    if (!b.same(rec, rec2.data(), g)) {
      b.flatten(rec, y.data(), g);
      if (stats) ++stats->fallbacks;
    }
  }
  b.encode(y.data(), rec);
}

struct Header {
  uint8_t codec;
  uint8_t f16;
  uint16_t zero;
  uint32_t n_tokens, row_dim, chunk_tokens;
};
static_assert(sizeof(Header) == kHeaderBytes);

void check_shape(const KvChunkShape& s) {
  if (s.type != DType::kF16 && s.type != DType::kF32)
    throw Error("KV codec: chunk type must be F16 or F32, not " + std::string(dtype_name(s.type)));
  if (s.chunk_tokens < 1 || s.chunk_tokens > (1 << 24) || s.n_tokens < 0 || s.n_tokens > s.chunk_tokens ||
      s.row_dim < 1 || s.row_dim > (1 << 24)) {
    throw Error("KV codec: bad chunk shape (chunk_tokens " + std::to_string(s.chunk_tokens) + ", n_tokens " +
                std::to_string(s.n_tokens) + ", row_dim " + std::to_string(s.row_dim) + ")");
  }
}

class Codec final : public KvCodec {
 public:
  Codec(KvCodecId id, const KvCodecKernels& k) : id_(id), k_(k) {}
  KvCodecId id() const override { return id_; }
  std::string_view name() const override { return kv_codec_name(id_); }

  size_t max_compressed_bytes(const KvChunkShape& s) const override {
    check_shape(s);
    const bool f16 = s.type == DType::kF16;
    const size_t rows = static_cast<size_t>(s.n_tokens);
    if (id_ == KvCodecId::kInt8) return kHeaderBytes + 2 * rows * RowI8{k_, s.row_dim, f16}.rec_bytes();
    size_t k_bytes = 0;
    for (int64_t t = 0; t < s.n_tokens; t += kTokenGroup)
      k_bytes += ColU4{k_, s.row_dim, std::min(kTokenGroup, s.n_tokens - t), f16, nullptr}.rec_bytes();
    return kHeaderBytes + k_bytes + rows * RowU4{k_, s.row_dim, f16}.rec_bytes();
  }

  size_t compress(const KvChunkShape& s, const void* src, void* dst, KvCodecStats* stats,
                  ThreadPool* pool) const override {
    const size_t total = max_compressed_bytes(s);
    const bool f16 = s.type == DType::kF16;
    const size_t row_bytes = static_cast<size_t>(s.row_dim) * (f16 ? 2 : 4);
    const uint8_t* in = static_cast<const uint8_t*>(src);
    uint8_t* out = static_cast<uint8_t*>(dst);
    const Header h{static_cast<uint8_t>(id_), f16, 0, static_cast<uint32_t>(s.n_tokens),
                   static_cast<uint32_t>(s.row_dim), static_cast<uint32_t>(s.chunk_tokens)};
    std::memcpy(out, &h, kHeaderBytes);
    auto row = [&](int part, int64_t t) { return in + (part * s.chunk_tokens + t) * row_bytes; };
    // Records, each encoded on its own into its fixed place in the blob:
    // int8, one per row of K then of V; int4, one per token group of K, then
    // one per row of V.
    struct Record {
      int part;
      int64_t t, n;   // first token, tokens (K groups of int4; 1 otherwise)
      size_t offset;  // in the blob
    };
    std::vector<Record> recs;
    size_t at = kHeaderBytes;
    if (id_ == KvCodecId::kInt8) {
      const size_t rb = RowI8{k_, s.row_dim, f16}.rec_bytes();
      for (int part = 0; part < 2; ++part)
        for (int64_t t = 0; t < s.n_tokens; ++t, at += rb) recs.push_back({part, t, 1, at});
    } else {
      for (int64_t t = 0; t < s.n_tokens; t += kTokenGroup) {
        const int64_t n = std::min(kTokenGroup, s.n_tokens - t);
        recs.push_back({0, t, n, at});
        at += ColU4{k_, s.row_dim, n, f16, nullptr}.rec_bytes();
      }
      const size_t rb = RowU4{k_, s.row_dim, f16}.rec_bytes();
      for (int64_t t = 0; t < s.n_tokens; ++t, at += rb) recs.push_back({1, t, 1, at});
    }
    EBB_CHECK(at == total);
    auto encode_range = [&](int64_t r0, int64_t r1, KvCodecStats* st) {
      Scratch ws;
      std::vector<float> x;
      for (int64_t r = r0; r < r1; ++r) {
        const Record& rc = recs[static_cast<size_t>(r)];
        x.resize(static_cast<size_t>(rc.n * s.row_dim));
        k_.to_f32(row(rc.part, rc.t), f16, rc.n * s.row_dim, x.data());
        if (id_ == KvCodecId::kInt8) {
          encode_settled(RowI8{k_, s.row_dim, f16}, x.data(), out + rc.offset, ws, st);
        } else if (rc.part == 0) {
          encode_settled(ColU4{k_, s.row_dim, rc.n, f16, &ws}, x.data(), out + rc.offset, ws, st);
        } else {
          encode_settled(RowU4{k_, s.row_dim, f16}, x.data(), out + rc.offset, ws, st);
        }
      }
    };
    const auto n_recs = static_cast<int64_t>(recs.size());
    if (!pool || pool->size() == 1) {
      encode_range(0, n_recs, stats);
      return total;
    }
    std::vector<KvCodecStats> per(static_cast<size_t>(pool->size()));
    pool->parallel_for_dynamic(n_recs, 16, [&](int64_t r0, int64_t r1, int th) {
      encode_range(r0, r1, stats ? &per[static_cast<size_t>(th)] : nullptr);
    });
    if (stats)
      for (const KvCodecStats& p : per) {
        stats->groups += p.groups;
        stats->refined += p.refined;
        stats->fallbacks += p.fallbacks;
      }
    return total;
  }

  void decompress(const KvChunkShape& s, const void* src, size_t n, void* dst) const override {
    const size_t total = max_compressed_bytes(s);
    if (n != total) {
      throw Error("KV codec " + std::string(name()) + ": blob of " + std::to_string(n) + " bytes, the chunk shape needs " +
                  std::to_string(total) + " (corrupt blob)");
    }
    const bool f16 = s.type == DType::kF16;
    Header h;
    std::memcpy(&h, src, kHeaderBytes);
    if (h.codec != static_cast<uint8_t>(id_) || h.f16 != f16 || h.zero != 0 ||
        h.n_tokens != static_cast<uint32_t>(s.n_tokens) || h.row_dim != static_cast<uint32_t>(s.row_dim) ||
        h.chunk_tokens != static_cast<uint32_t>(s.chunk_tokens)) {
      throw Error("KV codec " + std::string(name()) + ": blob header does not match the chunk shape (corrupt blob)");
    }
    const size_t row_bytes = static_cast<size_t>(s.row_dim) * (f16 ? 2 : 4);
    const uint8_t* in = static_cast<const uint8_t*>(src) + kHeaderBytes;
    uint8_t* out = static_cast<uint8_t*>(dst);
    auto row = [&](int part, int64_t t) { return out + (part * s.chunk_tokens + t) * row_bytes; };
    if (id_ == KvCodecId::kInt8) {
      const RowI8 b{k_, s.row_dim, f16};
      for (int part = 0; part < 2; ++part) {
        for (int64_t t = 0; t < s.n_tokens; ++t, in += b.rec_bytes()) b.decode(in, row(part, t));
      }
    } else {
      for (int64_t t = 0; t < s.n_tokens; t += kTokenGroup) {
        const ColU4 b{k_, s.row_dim, std::min(kTokenGroup, s.n_tokens - t), f16, nullptr};
        b.decode(in, row(0, t));
        in += b.rec_bytes();
      }
      const RowU4 b{k_, s.row_dim, f16};
      for (int64_t t = 0; t < s.n_tokens; ++t, in += b.rec_bytes()) b.decode(in, row(1, t));
    }
    const size_t tail = static_cast<size_t>(s.chunk_tokens - s.n_tokens) * row_bytes;
    if (tail > 0) {
      std::memset(row(0, s.n_tokens), 0, tail);
      std::memset(row(1, s.n_tokens), 0, tail);
    }
  }

 private:
  KvCodecId id_;
  const KvCodecKernels& k_;
};

}  // namespace

std::string_view kv_codec_name(KvCodecId id) {
  switch (id) {
    case KvCodecId::kInt8: return "int8";
    case KvCodecId::kInt4: return "int4";
  }
  return "?";
}

KvCodecId parse_kv_codec(std::string_view name) {
  for (KvCodecId id : {KvCodecId::kInt8, KvCodecId::kInt4})
    if (kv_codec_name(id) == name) return id;
  throw Error("unknown KV codec '" + std::string(name) + "' (choices: int8, int4)");
}

const KvCodec& kv_codec(KvCodecId id, Isa isa) {
  EBB_CHECK_MSG(isa_supported(isa), "kv_codec: instruction set not supported on this CPU");
  EBB_CHECK(id == KvCodecId::kInt8 || id == KvCodecId::kInt4);
  static const Codec scalar8(KvCodecId::kInt8, detail::kv_codec_kernels_scalar());
  static const Codec scalar4(KvCodecId::kInt4, detail::kv_codec_kernels_scalar());
#if defined(EBB_ARCH_X86)
  static const Codec avx2_8(KvCodecId::kInt8, detail::kv_codec_kernels_avx2());
  static const Codec avx2_4(KvCodecId::kInt4, detail::kv_codec_kernels_avx2());
  // kAvx512 runs the AVX2 loops (AVX-512 CPUs have AVX2).
  if (isa == Isa::kAvx2 || isa == Isa::kAvx512) return id == KvCodecId::kInt8 ? avx2_8 : avx2_4;
#endif
  // kNeon: the scalar loops for now.
  return id == KvCodecId::kInt8 ? scalar8 : scalar4;
}

}  // namespace ebb
