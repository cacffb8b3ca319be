// Causal grouped-query attention over a chunk table, in one pass with online
// softmax (running max m, running sum l, accumulator rescaled by e^(m - m')).
//
// Work item: one KV head g, a few of its query heads and a tile of query rows,
// at most kMaxRows (query, head) rows in all. The item streams its positions
// chunk by chunk in blocks of at most kBlock positions; each K and V row of a
// block is loaded once per item and used by all of its rows, so decode reads
// every KV byte once and prefill reuses a block across the query tile.
//
// Decode with fewer items than threads (few KV heads, many threads) splits
// each item's positions into ranges ("split-K"); every thread leaves its
// partial (m, l, acc) in its scratch slice and a second pass merges them.
//
// Decode (one query row) over a long context sweeps instead: one thread per
// range of positions, each running every item together, block by block, and
// the partials merged as for split-K. Chunks are laid out [position][KV
// head][head_dim], so one KV head's rows are head_dim elements out of every
// n_kv_heads * head_dim: an item alone reads them at a stride the hardware
// prefetchers do not follow across pages (a new page every position or two),
// while the sweep reads each position's rows of all heads, which are
// contiguous, and prefetches the next block's. Its blocks are small
// (kSweepBlock): one head's rows of a block are a few KB apart and share a
// handful of L1 sets. Batches (n_q > 1) never sweep, so a row computed in a
// batch does not depend on how the batch was cut.
//
// F16 KV with f16_accumulator runs the half-precision semantics of
// attention.h (otherwise F16 KV is widened and computed as F32): the same blocks
// and scores, then per row the block's weights (seq_weights) and the
// position-by-position F16 accumulator updates (pv_seq). A split could not
// reproduce that sequential pass, so that arithmetic never splits the context; when
// items are fewer than threads it gives each item fewer query heads instead.
#include "kernels/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "kernels/attention_internal.h"
#include "platform/error.h"
#include "platform/fp16.h"
#include "platform/thread_pool.h"

namespace ebb {
namespace detail {
namespace {

// ---- scalar block kernels (the reference the SIMD ones are checked against)

template <class T>
inline float load_kv(const T* p) {
  if constexpr (sizeof(T) == 2)
    return fp16_to_fp32(*p);
  else
    return *p;
}

template <class T>
void qk_scalar(const float* q, int nr, const void* k, int64_t kv_stride, int np, int64_t hd, float* s,
               int64_t s_stride) {
  const T* kb = static_cast<const T*>(k);
  for (int j = 0; j < np; ++j) {
    const T* kr = kb + j * kv_stride;
    for (int r = 0; r < nr; ++r) {
      const float* qr = q + r * hd;
      float d = 0.0f;
      for (int64_t i = 0; i < hd; ++i) d += qr[i] * load_kv(kr + i);
      s[r * s_stride + j] = d;
    }
  }
}

// x rounded to the nearest F16 value (RNE; inf past the F16 range), as a float.
inline float round_f16(float x) {
  uint32_t u = fp32_to_bits(x);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x38800000u && a < 0x477ff000u) {  // F16 normal range, below the overflow midpoint
    u += 0xfffu + ((u >> 13) & 1u);           // round the low 13 bits to nearest even
    return fp32_from_bits(u & ~0x1fffu);
  }
  return fp16_to_fp32(fp32_to_fp16(x));  // subnormal, zero, overflow, inf, NaN
}

void seq_weights_scalar(float* s, float* ms, int n_valid, float scale, float* m, float* l) {
  float mx = *m, sum = *l;
  for (int j = 0; j < n_valid; ++j) {
    const float x = s[j] * scale;
    float a, b;
    if (x > mx) {
      a = std::exp(mx - x);  // 0 at the first position (mx = -inf)
      mx = x;
      b = 1.0f;
    } else {
      a = 1.0f;
      b = std::exp(x - mx);
    }
    ms[j] = a;
    s[j] = b;
    sum = sum * a + b;
  }
  *m = mx;
  *l = sum;
}

void pv_seq_scalar(const float* vs, const float* ms, int64_t stride, const int* nv, int nr, const void* v,
                   int64_t kv_stride, int64_t hd, float* acc) {
  const uint16_t* vb = static_cast<const uint16_t*>(v);
  for (int r = 0; r < nr; ++r) {
    float* a = acc + r * hd;
    for (int j = 0; j < nv[r]; ++j) {
      const float c = ms[r * stride + j], w = vs[r * stride + j];
      if (c != 1.0f)
        for (int64_t i = 0; i < hd; ++i) a[i] = round_f16(a[i] * c);
      const uint16_t* vr = vb + j * kv_stride;
      for (int64_t i = 0; i < hd; ++i) a[i] = round_f16(fmaf(fp16_to_fp32(vr[i]), w, a[i]));
    }
  }
}

float softmax_step_scalar(float* s, int n_valid, int np, float* m, float* l) {
  float bmax = s[0];
  for (int j = 1; j < n_valid; ++j) bmax = std::max(bmax, s[j]);
  const float m_new = std::max(*m, bmax);
  const float corr = std::exp(*m - m_new);  // 0 on the first block (m = -inf)
  float sum = 0.0f;
  for (int j = 0; j < n_valid; ++j) {
    s[j] = std::exp(s[j] - m_new);
    sum += s[j];
  }
  for (int j = n_valid; j < np; ++j) s[j] = 0.0f;
  *l = *l * corr + sum;
  *m = m_new;
  return corr;
}

template <class T>
void pv_scalar(const float* p, int64_t p_stride, const float* corr, int nr, const void* v, int64_t kv_stride, int np,
               int64_t hd, float* acc) {
  const T* vb = static_cast<const T*>(v);
  for (int r = 0; r < nr; ++r) {
    float* a = acc + r * hd;
    const float* pr = p + r * p_stride;
    for (int64_t i = 0; i < hd; ++i) a[i] *= corr[r];
    for (int j = 0; j < np; ++j) {
      const T* vr = vb + j * kv_stride;
      const float w = pr[j];
      for (int64_t i = 0; i < hd; ++i) a[i] += w * load_kv(vr + i);
    }
  }
}

// ---- driver

constexpr int kMaxRows = 16;    // (query, head) rows per work item
constexpr int kSliceRows = 64;  // rows a thread's slice holds: a sweep's rows, all items together
constexpr int kBlock = 64;      // positions per score block
constexpr int kSweepBlock = 16; // positions per sweep block: 16 x n_kv_heads x head_dim K and V elements
constexpr int64_t kMinSweepRange = 128;  // positions per thread below which decode does not sweep

int64_t round_up16(int64_t n) { return (n + 15) / 16 * 16; }

// One thread's scratch: q rows, accumulators, scores, rescale factors (F16
// KV), m, l, corr.
int64_t slice_floats(int64_t hd) { return round_up16(2 * kSliceRows * hd + 2 * kSliceRows * kBlock + 3 * kSliceRows); }

struct Slice {
  float* q;    // [kSliceRows, hd]
  float* acc;  // [kSliceRows, hd]
  float* s;    // [kSliceRows, kBlock]
  float* ms;   // [kSliceRows, kBlock] (F16 KV: per-position rescale factors)
  float* m;    // [kSliceRows]
  float* l;    // [kSliceRows]
  float* corr; // [kSliceRows]
};

Slice slice_at(float* scratch, int t, int64_t hd) {
  float* b = scratch + t * slice_floats(hd);
  Slice s;
  s.q = b;
  s.acc = s.q + kSliceRows * hd;
  s.s = s.acc + kSliceRows * hd;
  s.ms = s.s + kSliceRows * kBlock;
  s.m = s.ms + kSliceRows * kBlock;
  s.l = s.m + kSliceRows;
  s.corr = s.l + kSliceRows;
  return s;
}

// The rows [r0, ...) of a slice, as a slice of their own.
Slice rows_from(const Slice& sl, int64_t r0, int64_t hd) {
  return {sl.q + r0 * hd, sl.acc + r0 * hd, sl.s + r0 * kBlock, sl.ms + r0 * kBlock, sl.m + r0, sl.l + r0, sl.corr + r0};
}

// The shape of the work: items are (KV head, head sub-group, query tile).
struct Plan {
  int64_t n_kv;   // KV heads
  int64_t group;  // query heads per KV head
  int64_t hs;     // heads per item
  int64_t n_hsub; // head sub-groups per KV head
  int64_t qt;     // query rows per item
  int64_t n_qt;   // query tiles
  int64_t n_items;
};

struct Item {
  int64_t g, h0, h1, qa, qb;
};

Item item_at(const Plan& pl, int64_t idx) {
  // Last query tiles (the most positions) first, for the dynamic scheduler.
  const int64_t per_tile = pl.n_kv * pl.n_hsub;
  const int64_t tile = pl.n_qt - 1 - idx / per_tile;
  const int64_t rest = idx % per_tile;
  const int64_t g = rest / pl.n_hsub, sub = rest % pl.n_hsub;
  Item it;
  it.g = g;
  it.h0 = g * pl.group + sub * pl.hs;
  it.h1 = std::min(it.h0 + pl.hs, (g + 1) * pl.group);
  it.qa = tile * pl.qt;
  it.qb = it.qa + pl.qt;  // clipped by the caller
  return it;
}

void prefetch_rows(const void* base, int n, int64_t stride_bytes, int64_t row_bytes) {
  const auto* b = static_cast<const uint8_t*>(base);
  for (int j = 0; j < n; ++j)
    for (int64_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(b + j * stride_bytes + o, 0, 3);
}

// Loads an item's query rows into the slice and empties its (m, l, acc).
void init_rows(const AttentionArgs& a, const Item& it, const Slice& sl) {
  const int64_t hd = a.head_dim, nh = it.h1 - it.h0;
  const int nr = static_cast<int>((it.qb - it.qa) * nh);
  const bool half = a.kv_type == DType::kF16 && a.f16_accumulator;
  for (int64_t qi = it.qa; qi < it.qb; ++qi)
    for (int64_t h = it.h0; h < it.h1; ++h) {
      const float* src = a.q + (qi * a.n_heads + h) * hd;
      float* dst = sl.q + ((qi - it.qa) * nh + (h - it.h0)) * hd;
      if (half)  // q rounded to F16, the scale applied to the scores
        for (int64_t i = 0; i < hd; ++i) dst[i] = fp16_to_fp32(fp32_to_fp16(src[i]));
      else
        for (int64_t i = 0; i < hd; ++i) dst[i] = src[i] * a.scale;
    }
  std::fill(sl.acc, sl.acc + nr * hd, 0.0f);
  std::fill(sl.m, sl.m + nr, -INFINITY);
  std::fill(sl.l, sl.l + nr, 0.0f);
}

size_t kv_esize(const AttentionArgs& a) { return a.kv_type == DType::kF16 ? 2 : 4; }

// Where position p's row of KV head g starts in K (which) or V.
const void* kv_row(const AttentionArgs& a, bool v, int64_t p, int64_t g) {
  const int64_t c = p / a.chunk_size, slot = p % a.chunk_size;
  const size_t off = static_cast<size_t>((slot * a.n_kv_heads + g) * a.head_dim) * kv_esize(a);
  return static_cast<const uint8_t*>(v ? a.chunks[c].v : a.chunks[c].k) + off;
}

// Positions [p, p + np) (inside one chunk) into an item's (m, l, acc).
void run_block(const AttnKernels& kk, const AttentionArgs& a, const Item& it, int64_t p, int np, const Slice& sl) {
  const int64_t hd = a.head_dim, nh = it.h1 - it.h0;
  const int nr = static_cast<int>((it.qb - it.qa) * nh);
  const int64_t kv_stride = a.n_kv_heads * hd;  // elements between positions
  // Rows see positions up to their own: row r (query qa + r / nh) sees
  // [0, pos0 + qa + r / nh]. Rows that see none of this block are a prefix.
  int r0 = 0;
  while (r0 < nr && a.pos0 + it.qa + r0 / nh < p) ++r0;
  if (r0 == nr) return;
  const void* kp = kv_row(a, false, p, it.g);
  const void* vp = kv_row(a, true, p, it.g);
  kk.qk(sl.q + r0 * hd, nr - r0, kp, kv_stride, np, hd, sl.s + r0 * kBlock, kBlock);
  if (a.kv_type == DType::kF16 && a.f16_accumulator) {
    int nv[kMaxRows];
    for (int r = r0; r < nr; ++r) {
      const int64_t last = a.pos0 + it.qa + r / nh;  // inclusive
      nv[r] = static_cast<int>(std::min<int64_t>(np, last + 1 - p));
      kk.seq_weights(sl.s + r * kBlock, sl.ms + r * kBlock, nv[r], a.scale, sl.m + r, sl.l + r);
    }
    kk.pv_seq(sl.s + r0 * kBlock, sl.ms + r0 * kBlock, kBlock, nv + r0, nr - r0, vp, kv_stride, hd, sl.acc + r0 * hd);
    return;
  }
  for (int r = r0; r < nr; ++r) {
    const int64_t last = a.pos0 + it.qa + r / nh;  // inclusive
    const int n_valid = static_cast<int>(std::min<int64_t>(np, last + 1 - p));
    sl.corr[r] = kk.softmax_step(sl.s + r * kBlock, n_valid, np, sl.m + r, sl.l + r);
  }
  kk.pv(sl.s + r0 * kBlock, kBlock, sl.corr + r0, nr - r0, vp, kv_stride, np, hd, sl.acc + r0 * hd);
}

// Positions that make the next block starting at p: at most `block`, inside
// p's chunk and before pb.
int block_at(const AttentionArgs& a, int64_t p, int64_t pb, int block) {
  return static_cast<int>(std::min({int64_t{block}, a.chunk_size - p % a.chunk_size, pb - p}));
}

// Streams positions [pa, pb) of one item into the slice's (m, l, acc).
void run_item(const AttnKernels& kk, const AttentionArgs& a, const Item& it, int64_t pa, int64_t pb, const Slice& sl) {
  init_rows(a, it, sl);
  const int64_t hd = a.head_dim;
  const size_t esize = kv_esize(a);
  const int64_t kv_stride = a.n_kv_heads * hd;
  for (int64_t p = pa; p < pb;) {
    if (a.pos0 + it.qb - 1 < p) break;  // (cannot happen: pb <= pos0 + qb)
    const int np = block_at(a, p, pb, kBlock);
    // One KV head's rows are head_dim elements out of every n_kv_heads *
    // head_dim, a stride the hardware prefetchers follow poorly: ask for this
    // block's V (read after the scores) and the next block's K ahead of use.
    prefetch_rows(kv_row(a, true, p, it.g), np, kv_stride * esize, hd * esize);
    if (p + np < pb)
      prefetch_rows(kv_row(a, false, p + np, it.g), block_at(a, p + np, pb, kBlock), kv_stride * esize, hd * esize);
    run_block(kk, a, it, p, np, sl);
    p += np;
  }
}

// Streams positions [pa, pb) of every item of one query row, all at once:
// item i's rows are the slice's rows from i * hs.
void run_sweep(const AttnKernels& kk, const AttentionArgs& a, const Plan& pl, int64_t pa, int64_t pb,
               const Slice& sl) {
  const int64_t hd = a.head_dim, per_item = a.n_q * pl.hs;
  for (int64_t i = 0; i < pl.n_items; ++i) {
    Item it = item_at(pl, i);
    it.qb = a.n_q;
    init_rows(a, it, rows_from(sl, i * per_item, hd));
  }
  const int64_t pos_bytes = a.n_kv_heads * hd * static_cast<int64_t>(kv_esize(a));
  for (int64_t p = pa; p < pb;) {
    const int np = block_at(a, p, pb, kSweepBlock);
    // The next block's K and V, a share before each item's work, so the
    // requests spread over the block instead of filling the miss queue at once.
    const int64_t next_bytes = p + np < pb ? block_at(a, p + np, pb, kSweepBlock) * pos_bytes : 0;
    const int64_t share = (next_bytes / pl.n_items + 63) / 64 * 64;
    for (int64_t i = 0; i < pl.n_items; ++i) {
      const int64_t o = i * share, len = std::min(share, next_bytes - o);
      if (len > 0) {
        prefetch_rows(static_cast<const uint8_t*>(kv_row(a, false, p + np, 0)) + o, 1, 0, len);
        prefetch_rows(static_cast<const uint8_t*>(kv_row(a, true, p + np, 0)) + o, 1, 0, len);
      }
      Item it = item_at(pl, i);
      it.qb = a.n_q;
      run_block(kk, a, it, p, np, rows_from(sl, i * per_item, hd));
    }
    p += np;
  }
}

void write_out(const AttentionArgs& a, const Item& it, const Slice& sl) {
  const int64_t hd = a.head_dim, nh = it.h1 - it.h0;
  for (int64_t qi = it.qa; qi < it.qb; ++qi)
    for (int64_t h = it.h0; h < it.h1; ++h) {
      const int64_t r = (qi - it.qa) * nh + (h - it.h0);
      const float inv = 1.0f / sl.l[r];
      const float* src = sl.acc + r * hd;
      float* dst = a.out + (qi * a.n_heads + h) * hd;
      for (int64_t i = 0; i < hd; ++i) dst[i] = src[i] * inv;
    }
}

// f(r, out) for each of an item's rows r and where its output goes.
template <class F>
void for_each_row(const AttentionArgs& a, const Item& it, F&& f) {
  const int64_t nh = it.h1 - it.h0;
  for (int64_t qi = it.qa; qi < it.qb; ++qi)
    for (int64_t h = it.h0; h < it.h1; ++h) f((qi - it.qa) * nh + (h - it.h0), a.out + (qi * a.n_heads + h) * a.head_dim);
}

// Row r's partials part(0..n) merged into dst:
//   dst = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s, M = max_s m_s.
template <class Part>
void merge_row(Part&& part, int64_t n, int64_t r, int64_t hd, float* dst) {
  float mx = -INFINITY;
  for (int64_t s = 0; s < n; ++s) mx = std::max(mx, part(s).m[r]);
  std::fill(dst, dst + hd, 0.0f);
  float l = 0.0f;
  for (int64_t s = 0; s < n; ++s) {
    const Slice sl = part(s);
    if (sl.l[r] == 0.0f) continue;  // saw no position
    const float w = std::exp(sl.m[r] - mx);
    l += w * sl.l[r];
    const float* acc = sl.acc + r * hd;
    for (int64_t i = 0; i < hd; ++i) dst[i] += w * acc[i];
  }
  const float inv = 1.0f / l;
  for (int64_t i = 0; i < hd; ++i) dst[i] *= inv;
}

// half: the half-precision arithmetic (F16 KV with f16_accumulator).
const AttnKernels& select_kernels(Isa isa, DType kv, int64_t hd, bool half) {
#if defined(EBB_ARCH_X86)
  if (isa == Isa::kAvx512) {
    // Where AVX-512 runs in halves (Zen 4), AVX2's scores: attention 12-24%
    // faster there (bench_attention, 8-token query over 2k-8k positions). The
    // half-precision arithmetic keeps the AVX-512 ones, the reference engine's.
    if (!half && avx512_in_halves())
      if (const AttnKernels* k = attn_kernels_avx512_avx2_scores(kv, hd)) return *k;
    if (const AttnKernels* k = attn_kernels_avx512(kv, hd)) return *k;
  }
  // kAvx512 with head_dim a multiple of 8 but not of 16: the AVX2 kernels.
  if (isa == Isa::kAvx2 || isa == Isa::kAvx512)
    if (const AttnKernels* k = attn_kernels_avx2(kv, hd)) return *k;
#endif
  if (isa == Isa::kRefEngine) return attn_kernels_ref_engine(kv);
  return attn_kernels_scalar(kv);
}

}  // namespace

#if defined(EBB_ARCH_X86)
const AttnKernels* attn_kernels_avx512_avx2_scores(DType kv, int64_t head_dim) {
  if (!attn_kernels_avx512(kv, head_dim) || !attn_kernels_avx2(kv, head_dim)) return nullptr;
  // The tables depend on head_dim only in whether they exist (checked above).
  auto mixed = [](DType t) {
    AttnKernels k = *attn_kernels_avx512(t, 16);
    k.qk = attn_kernels_avx2(t, 16)->qk;
    return k;
  };
  static const AttnKernels f16 = mixed(DType::kF16), f32 = mixed(DType::kF32);
  return kv == DType::kF16 ? &f16 : &f32;
}
#endif

const AttnKernels& attn_kernels_scalar(DType kv) {
  static const AttnKernels f16{qk_scalar<uint16_t>, softmax_step_scalar, pv_scalar<uint16_t>, seq_weights_scalar,
                               pv_seq_scalar};
  static const AttnKernels f32{qk_scalar<float>, softmax_step_scalar, pv_scalar<float>};
  return kv == DType::kF16 ? f16 : f32;
}

}  // namespace detail

size_t attention_scratch_floats(int64_t n_threads, int64_t head_dim, int64_t chunk_size) {
  (void)chunk_size;  // blocks are at most 64 positions whatever the chunk size
  return static_cast<size_t>(std::max<int64_t>(n_threads, 1) * detail::slice_floats(head_dim));
}

void attention(Isa isa, const AttentionArgs& a, ThreadPool& pool) {
  EBB_CHECK_MSG(isa_supported(isa), "attention: instruction set not supported on this CPU");
  const bool half = a.kv_type == DType::kF16 && a.f16_accumulator;
  detail::attention_with(detail::select_kernels(isa, a.kv_type, a.head_dim, half), a, pool);
}

namespace detail {
namespace {

void check_args(const AttentionArgs& a) {
  EBB_CHECK(a.q && a.out && a.chunks && a.scratch);
  EBB_CHECK(a.n_q >= 0 && a.pos0 >= 0 && a.head_dim > 0 && a.chunk_size > 0);
  EBB_CHECK(a.n_kv_heads > 0 && a.n_heads >= a.n_kv_heads && a.n_heads % a.n_kv_heads == 0);
  EBB_CHECK_MSG(a.kv_type == DType::kF16 || a.kv_type == DType::kF32, "attention: KV type must be F16 or F32");
}

// How one attention call runs on nt threads: its items, and whether decode
// sweeps the context, items split it (split-K), or each item runs whole.
struct Route {
  enum Kind { kSweep, kSplit, kItems };
  Plan pl;
  Kind kind = kItems;
  int64_t splits = 1;
};

// Decode that can sweep: one query row (so no other batch computes that row
// in another order), F32 arithmetic, and its heads fit one slice.
bool sweepable(const AttentionArgs& a, const Plan& pl) {
  const bool half = a.kv_type == DType::kF16 && a.f16_accumulator;
  return !half && a.n_q == 1 && pl.n_hsub == 1 && a.n_heads <= kSliceRows;
}

Route route_for(const AttentionArgs& a, int nt) {
  const bool half = a.kv_type == DType::kF16 && a.f16_accumulator;
  Route r;
  Plan& pl = r.pl;
  pl.n_kv = a.n_kv_heads;
  pl.group = a.n_heads / a.n_kv_heads;
  auto set_heads_per_item = [&](int64_t hs) {
    pl.hs = hs;
    pl.n_hsub = (pl.group + pl.hs - 1) / pl.hs;
    pl.qt = std::max<int64_t>(1, kMaxRows / pl.hs);
    pl.n_qt = (a.n_q + pl.qt - 1) / pl.qt;
    pl.n_items = a.n_kv_heads * pl.n_hsub * pl.n_qt;
  };
  set_heads_per_item(std::min<int64_t>(pl.group, kMaxRows));
  if (half && pl.n_items < nt) {
    // No split-K for F16 KV (see the top of this file): spread each KV head's
    // query heads over the threads instead; each of those items reads the KV.
    const int64_t subs = std::min<int64_t>(pl.group, (nt + pl.n_kv - 1) / pl.n_kv);
    set_heads_per_item(std::min(pl.hs, (pl.group + subs - 1) / subs));
  }
  const int64_t ctx = a.pos0 + a.n_q;
  // Sweep: decode whose every thread gets a range worth streaming.
  if (sweepable(a, pl) && ctx / kMinSweepRange >= nt) {
    r.kind = Route::kSweep;
    return r;
  }
  // Split-K (F32 arithmetic only): only worth it when items are fewer than
  // threads and each range keeps a few full blocks.
  if (!half && pl.n_items < nt) r.splits = std::min<int64_t>(nt / pl.n_items, ctx / (4 * kBlock));
  r.kind = r.splits < 2 ? Route::kItems : Route::kSplit;
  return r;
}

}  // namespace

void attention_with(const AttnKernels& kk, const AttentionArgs& a, ThreadPool& pool) {
  check_args(a);
  if (a.n_q == 0) return;
  const int nt = pool.size();
  const Route r = route_for(a, nt);
  const Plan& pl = r.pl;
  const int64_t hd = a.head_dim;
  auto clip = [&](Item it) {
    it.qb = std::min(it.qb, a.n_q);
    return it;
  };

  const int64_t ctx = a.pos0 + a.n_q;
  if (r.kind == Route::kSweep) {
    auto bound = [&](int64_t t) { return t == nt ? ctx : ctx * t / nt / kSweepBlock * kSweepBlock; };
    pool.run([&](int t, int) { run_sweep(kk, a, pl, bound(t), bound(t + 1), slice_at(a.scratch, t, hd)); });
    const int64_t per_item = a.n_q * pl.hs;
    pool.parallel_for(pl.n_items, 1, [&](int64_t b0, int64_t b1, int) {
      for (int64_t b = b0; b < b1; ++b) {
        const Item it = clip(item_at(pl, b));
        for_each_row(a, it, [&](int64_t r, float* dst) {
          merge_row([&](int64_t s) { return rows_from(slice_at(a.scratch, static_cast<int>(s), hd), b * per_item, hd); },
                    nt, r, hd, dst);
        });
      }
    });
    return;
  }

  if (r.kind == Route::kItems) {
    std::atomic<int64_t> next{0};
    pool.run([&](int t, int) {
      const Slice sl = slice_at(a.scratch, t, hd);
      for (int64_t idx; (idx = next.fetch_add(1, std::memory_order_relaxed)) < pl.n_items;) {
        const Item it = clip(item_at(pl, idx));
        run_item(kk, a, it, 0, a.pos0 + it.qb, sl);
        write_out(a, it, sl);
      }
    });
    return;
  }

  // Split-K. Range s of item b is in the slice of thread b * splits + s.
  const int64_t splits = r.splits;
  const int64_t n_work = pl.n_items * splits;
  auto range_of = [&](const Item& it, int64_t s, int64_t* pa, int64_t* pb) {
    const int64_t end = a.pos0 + it.qb;
    *pa = s == 0 ? 0 : end * s / splits / kBlock * kBlock;
    *pb = s == splits - 1 ? end : end * (s + 1) / splits / kBlock * kBlock;
  };
  pool.run([&](int t, int) {
    if (t >= n_work) return;
    const Item it = clip(item_at(pl, t / splits));
    int64_t pa, pb;
    range_of(it, t % splits, &pa, &pb);
    const Slice sl = slice_at(a.scratch, t, hd);
    const int nr = static_cast<int>((it.qb - it.qa) * (it.h1 - it.h0));
    if (pa >= pb) {  // empty range: an empty partial
      std::fill(sl.m, sl.m + nr, -INFINITY);
      std::fill(sl.l, sl.l + nr, 0.0f);
      return;
    }
    run_item(kk, a, it, pa, pb, sl);
  });
  pool.parallel_for(pl.n_items, 1, [&](int64_t b0, int64_t b1, int) {
    for (int64_t b = b0; b < b1; ++b) {
      const Item it = clip(item_at(pl, b));
      for_each_row(a, it, [&](int64_t r, float* dst) {
        merge_row([&](int64_t s) { return slice_at(a.scratch, static_cast<int>(b * splits + s), hd); }, splits, r, hd,
                  dst);
      });
    }
  });
}

}  // namespace detail

void attention_batch(Isa isa, std::span<const AttentionArgs> args, ThreadPool& pool) {
  EBB_CHECK_MSG(isa_supported(isa), "attention: instruction set not supported on this CPU");
  if (args.size() == 1) return attention(isa, args[0], pool);
  const int nt = pool.size();
  // One pool dispatch claims, longest first: each decode call's whole
  // context as one sweep, then the items of the calls that run as whole
  // items. Sweeps split over threads and split-K run as their own calls.
  struct Part {
    const AttentionArgs* a;
    const detail::AttnKernels* kk;
    detail::Plan pl;
    bool sweep;      // one unit: the whole context swept on one thread
    int64_t first;   // index of its first unit in the list
    int64_t units;
  };
  constexpr size_t kMaxParts = 64;
  for (const AttentionArgs& a : args) {
    detail::check_args(a);
    // A thread's slice is at the same place for every call that shares the scratch.
    for (const AttentionArgs& b : args)
      EBB_CHECK_MSG(b.scratch != a.scratch || b.head_dim == a.head_dim,
                    "attention_batch: calls sharing a scratch must share head_dim");
  }
  // Each call is routed once: a decode sweep (into parts), the items of one
  // dispatch (into items, appended after the sweeps: longest units first),
  // or a call of its own now (split over threads, split-K, past kMaxParts).
  Part parts[kMaxParts], items[kMaxParts];
  size_t n_parts = 0, n_items = 0;
  for (const AttentionArgs& a : args) {
    if (a.n_q == 0) continue;
    const bool half = a.kv_type == DType::kF16 && a.f16_accumulator;
    const detail::AttnKernels& kk = detail::select_kernels(isa, a.kv_type, a.head_dim, half);
    const detail::Route r = detail::route_for(a, nt);
    const bool room = n_parts + n_items < kMaxParts;
    if (room && detail::sweepable(a, r.pl)) {
      parts[n_parts++] = {&a, &kk, r.pl, true, 0, 1};
    } else if (room && r.kind == detail::Route::kItems) {
      items[n_items++] = {&a, &kk, r.pl, false, 0, r.pl.n_items};
    } else {
      detail::attention_with(kk, a, pool);
    }
  }
  std::copy(items, items + n_items, parts + n_parts);
  n_parts += n_items;
  int64_t total = 0;
  for (size_t i = 0; i < n_parts; ++i) {
    parts[i].first = total;
    total += parts[i].units;
  }
  if (n_parts == 0) return;
  alignas(64) std::atomic<int64_t> next{0};
  pool.run([&](int t, int) {
    size_t j = 0;  // a thread's claims only grow: its part index only moves forward
    for (int64_t idx; (idx = next.fetch_add(1, std::memory_order_relaxed)) < total;) {
      while (idx >= parts[j].first + parts[j].units) ++j;
      const Part& p = parts[j];
      const AttentionArgs& a = *p.a;
      const int64_t hd = a.head_dim;
      const detail::Slice sl = detail::slice_at(a.scratch, t, hd);
      if (p.sweep) {
        detail::run_sweep(*p.kk, a, p.pl, 0, a.pos0 + a.n_q, sl);
        for (int64_t i = 0; i < p.pl.n_items; ++i) {
          detail::Item it = detail::item_at(p.pl, i);
          it.qb = a.n_q;
          detail::write_out(a, it, detail::rows_from(sl, i * p.pl.hs, hd));
        }
        continue;
      }
      detail::Item it = detail::item_at(p.pl, idx - p.first);
      it.qb = std::min(it.qb, a.n_q);
      detail::run_item(*p.kk, a, it, 0, a.pos0 + it.qb, sl);
      detail::write_out(a, it, sl);
    }
  });
}

}  // namespace ebb
