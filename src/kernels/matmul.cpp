#include "kernels/matmul.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "kernels/lora.h"
#include "kernels/packing.h"
#include "kernels/quant_blocks.h"
#include "platform/error.h"
#include "platform/thread_pool.h"

namespace ebb {
namespace {

class TableKernelSet final : public KernelSet {
 public:
  TableKernelSet(Isa isa, FormatTable table) : isa_(isa), table_(table) {}
  const FormatKernels* format(DType weight) const override {
    const int i = kernel_format_index(weight);
    return i < 0 ? nullptr : &table_[i];
  }
  Isa isa() const override { return isa_; }

 private:
  Isa isa_;
  FormatTable table_;
};

constexpr size_t kCacheLine = 64;
constexpr int64_t kRowGrain = 16;  // rows per work unit: 16 floats of y = one cache line

// Rows per claimed piece of a one-token product: about eight pieces per
// thread (balance against the cost of a claim), in whole units of kRowGrain.
int64_t piece_rows(int64_t rows, int n_threads) {
  const int64_t per = rows / (static_cast<int64_t>(n_threads) * 8);
  return std::max(kRowGrain, per / kRowGrain * kRowGrain);
}

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Bytes between quantized activation rows in the scratch (0: x is used as is).
size_t act_row_stride(DType act, int64_t cols) {
  if (act == DType::kF32) return 0;
  return align_up(row_bytes(act, cols), kCacheLine);
}

const FormatKernels& scalar_row(DType weight) {
  static const TableKernelSet scalar(Isa::kScalar, scalar_format_table());
  const FormatKernels* fk = scalar.format(weight);
  EBB_CHECK_MSG(fk != nullptr, "no kernels for this weight format");
  return *fk;
}

}  // namespace

const KernelSet& kernel_set(Isa isa) {
  EBB_CHECK_MSG(isa_supported(isa), "instruction set not supported on this CPU");
  switch (isa) {
    case Isa::kScalar: {
      static const TableKernelSet ks(Isa::kScalar, scalar_format_table());
      return ks;
    }
#if defined(EBB_ARCH_X86)
    case Isa::kAvx2: {
      static const TableKernelSet ks(Isa::kAvx2, avx2_format_table());
      return ks;
    }
    case Isa::kAvx512: {
      static const TableKernelSet ks(Isa::kAvx512, avx512_format_table());
      return ks;
    }
#endif
#if defined(EBB_ARCH_ARM)
    case Isa::kNeon: {
      static const TableKernelSet ks(Isa::kNeon, neon_format_table());
      return ks;
    }
#endif
    case Isa::kRefEngine: {
      static const TableKernelSet ks(Isa::kRefEngine, ref_engine_format_table());
      return ks;
    }
    default: break;
  }
  EBB_CHECK_MSG(false, "instruction set not compiled in");
  __builtin_unreachable();
}

// Bytes between the activation sums of two tokens (packed Q4_0 and Q8_0).
size_t sums_stride_bytes(int64_t cols) { return align_up(static_cast<size_t>(cols / kQK8_0) * sizeof(Q8_0Sums), kCacheLine); }

size_t matmul_scratch_bytes(DType weight, int64_t cols, int64_t n_tokens) {
  size_t per_token = act_row_stride(scalar_row(weight).act, cols);
  // A batch of F16 products may hold its activations as floats (batch_act).
  if (weight == DType::kF16 && n_tokens > 1) per_token = align_up(row_bytes(DType::kF32, cols), kCacheLine);
  if (weight == DType::kQ4_0 || weight == DType::kQ8_0) per_token += sums_stride_bytes(cols);  // if packed
  return per_token * static_cast<size_t>(n_tokens);
}

namespace {

// Where the activation sums of a packed product go: after n_tok activation
// rows act_stride bytes apart.
Q8_0Sums* sums_area(void* scratch, size_t act_stride, int64_t n_tok) {
  return reinterpret_cast<Q8_0Sums*>(static_cast<uint8_t*>(scratch) + act_stride * static_cast<size_t>(n_tok));
}

const FormatKernels& packed_kernels(const FormatKernels* fk, const WeightView& w) {
  EBB_CHECK_MSG(w.packing == packing_for(w.type, w.rows, w.cols) && fk->x8_gemm && fk->x8_sums && fk->x8_dot,
                "a packed weight matrix on a kernel target without its packed kernels");
  return *fk;
}

// Rows [rb, re) of a packed matrix for one token: whole groups straight into
// y, a group the range cuts through a buffer, rows past the last group as
// plain rows (x8_dot: the same arithmetic).
void packed_rows_one(const FormatKernels& fk, const WeightView& w, const uint8_t* act, const Q8_0Sums* sums, int64_t rb,
                     int64_t re, float* y) {
  const uint64_t group_bytes = 8 * w.row_stride;
  const int64_t grouped = w.rows / 8 * 8;
  const auto* groups = static_cast<const uint8_t*>(w.data);
  int64_t r = rb;
  while (r < std::min(re, grouped)) {
    const int64_t g = r / 8;
    if (r == g * 8 && r + 8 <= re) {
      fk.x8_gemm(w.cols, groups + g * group_bytes, act, 0, sums, 0, 1, y + r, 0);
      r += 8;
      continue;
    }
    float part[8];
    fk.x8_gemm(w.cols, groups + g * group_bytes, act, 0, sums, 0, 1, part, 0);
    for (const int64_t end = std::min(re, g * 8 + 8); r < end; ++r) y[r] = part[r - g * 8];
  }
  for (; r < re; ++r) fk.x8_dot(w.cols, w.row(r), act, y + r);
}

// Rows [rb, re) (rb a multiple of 8) of a packed matrix for n_tok tokens:
// pairs of groups for eight tokens per kernel call where the target has
// x16_gemm (a group left over in pieces of four tokens), else groups for four
// tokens per call; the block of rows reused for every token.
void packed_rows_batch(const FormatKernels& fk, const WeightView& w, const uint8_t* act, size_t act_stride,
                       const Q8_0Sums* sums, int64_t sums_stride, int64_t n_tok, int64_t rb, int64_t re, float* y,
                       int64_t y_stride) {
  const uint64_t group_bytes = 8 * w.row_stride;
  const int64_t grouped = w.rows / 8 * 8, ge = std::min(re, grouped);
  const auto* groups = static_cast<const uint8_t*>(w.data);
  const int64_t step = fk.x16_gemm ? 8 : 4;
  for (int64_t t = 0; t < n_tok; t += step) {
    const int nt = static_cast<int>(std::min<int64_t>(step, n_tok - t));
    const uint8_t* a = act + t * act_stride;
    float* yt = y + t * y_stride;
    int64_t r = rb;
    if (fk.x16_gemm) {
      for (; r + 16 <= ge; r += 16)
        fk.x16_gemm(w.cols, groups + r / 8 * group_bytes, group_bytes, a, act_stride, sums + t * sums_stride,
                    sums_stride, nt, yt + r, y_stride);
    }
    for (; r + 8 <= ge; r += 8)
      for (int tt = 0; tt < nt; tt += 4)
        fk.x8_gemm(w.cols, groups + r / 8 * group_bytes, a + tt * act_stride, act_stride,
                   sums + (t + tt) * sums_stride, sums_stride, std::min(4, nt - tt), yt + tt * y_stride + r, y_stride);
    for (int64_t tt = 0; tt < nt; ++tt)
      for (int64_t r = std::max(rb, grouped); r < re; ++r)
        fk.x8_dot(w.cols, w.row(r), a + tt * act_stride, yt + tt * y_stride + r);
  }
}

// Rows [rb, re) of a plain matrix for n_tok tokens (a block sized for L2):
// tiles of TR rows x TT tokens, each tile's weight rows reused by its TT
// tokens and the block by every token; rows and tokens that do not fill a
// tile through tile_dot (else vec_dot), in the tile's arithmetic.
void rows_batch(const FormatKernels& fk, const WeightView& w, const uint8_t* act, size_t act_stride, int64_t n_tok,
                int64_t rb, int64_t re, float* y, int64_t y_stride) {
  const auto tile = fk.vec_dot_tile;
  const auto rest_dot = fk.tile_dot ? fk.tile_dot : fk.vec_dot;
  const int64_t cols = w.cols, TR = tile ? fk.tile_rows : 1, TT = tile ? fk.tile_tokens : 1;
  const int64_t re_tiled = rb + (re - rb) / TR * TR;
  int64_t t = 0;
  if (tile) {
    for (; t + TT <= n_tok; t += TT) {
      const uint8_t* a = act + t * act_stride;
      float* yt = y + t * y_stride;
      for (int64_t r = rb; r < re_tiled; r += TR)
        tile(cols, w.row(r), w.row_stride, a, act_stride, yt + r, y_stride);
      for (int64_t tt = 0; tt < TT; ++tt)
        for (int64_t r = re_tiled; r < re; ++r) rest_dot(cols, w.row(r), a + tt * act_stride, yt + tt * y_stride + r);
    }
  }
  for (; t < n_tok; ++t) {
    const uint8_t* a = act + t * act_stride;
    for (int64_t r = rb; r < re; ++r) rest_dot(cols, w.row(r), a, y + t * y_stride + r);
  }
}

// A batch's activations (n_tok >= 2), converted once for every product that
// reads them: rows act_stride bytes apart, and for packed weights each
// token's block sums (ss entries apart).
struct BatchAct {
  const uint8_t* act = nullptr;
  size_t act_stride = 0;
  Q8_0Sums* sums = nullptr;
  int64_t ss = 0;
};

// Converts args.x for a batch product with fk's kernels (quantized, rounded,
// or x itself for F32) and, for packed weights, computes the block sums: one
// pool dispatch for both, or none for a small batch (a few microseconds of
// work, which a fork-join would cost as much as).
BatchAct batch_act(const FormatKernels& fk, bool packed, const MatmulArgs& args, ThreadPool& pool) {
  const int64_t n_tok = args.n_tokens, cols = args.w->cols;
  BatchAct b;
  b.act = reinterpret_cast<const uint8_t*>(args.x);
  b.act_stride = static_cast<size_t>(args.x_stride) * sizeof(float);
  const bool use_batch_act = fk.quantize_batch_act != nullptr;
  const auto quantize = use_batch_act ? fk.quantize_batch_act : fk.quantize_act;
  const bool convert = fk.act != DType::kF32 || use_batch_act;
  auto* scratch = static_cast<uint8_t*>(args.scratch);
  if (convert) {
    EBB_CHECK(scratch != nullptr);
    b.act_stride = use_batch_act ? align_up(row_bytes(fk.batch_act, cols), kCacheLine) : act_row_stride(fk.act, cols);
    b.act = scratch;
  }
  if (packed) {
    b.sums = sums_area(scratch, b.act_stride, n_tok);
    b.ss = static_cast<int64_t>(sums_stride_bytes(cols) / sizeof(Q8_0Sums));
  }
  if (!convert && !packed) return b;
  auto rows = [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      if (convert) quantize(args.x + t * args.x_stride, scratch + t * b.act_stride, cols);
      if (packed) fk.x8_sums(cols, b.act + t * b.act_stride, b.sums + t * b.ss);
    }
  };
  constexpr int64_t kInlineFloats = 8192;  // 4 tokens of 2048
  if (n_tok * cols <= kInlineFloats) {
    rows(0, n_tok, 0);
  } else {
    pool.parallel_for(n_tok, 1, rows);
  }
  return b;
}

// Weight rows per piece of a batch product: a block that stays in L2 while
// every token of the batch reads it (whole groups for packed weights, whole
// tiles otherwise).
int64_t batch_block_rows(const FormatKernels& fk, const WeightView& w) {
  const uint64_t rstride = std::max<uint64_t>(w.row_stride, 1);
  if (w.packing != Packing::kRows)
    return std::clamp<int64_t>(static_cast<int64_t>((128u << 10) / rstride), 8, 64) / 8 * 8;
  const int64_t TR = fk.vec_dot_tile ? fk.tile_rows : 1;
  const int64_t br = std::clamp<int64_t>(static_cast<int64_t>((128u << 10) / rstride), 4, 64);
  return std::max<int64_t>(TR, br / TR * TR);
}

// Rows [r0, r1) of a batch product (n_tok >= 2), on one thread.
void batch_rows(const FormatKernels& fk, const WeightView& w, const BatchAct& b, int64_t n_tok, int64_t r0,
                int64_t r1, float* y, int64_t y_stride) {
  if (w.packing != Packing::kRows) {
    packed_rows_batch(fk, w, b.act, b.act_stride, b.sums, b.ss, n_tok, r0, r1, y, y_stride);
  } else {
    rows_batch(fk, w, b.act, b.act_stride, n_tok, r0, r1, y, y_stride);
  }
}

// Rank rows of A per claimed piece of a low-rank term's A x: two of the
// LoRA kernels' four-row passes over x (per row the same arithmetic as any
// other split), so a rank-16 term is two claims, not four: each claim is a
// contended atomic on the pool's threads, and pieces of four rows made the
// claims and their completions about 2% of a token's decode.
constexpr int64_t kDownRows = 8;

// Piece d of the low-rank terms' A x products (terms of args[0], then of
// args[1], ..., each term's rank in pieces of kDownRows rows): t[j] for its rows.
void low_rank_down(const LoraKernels& lk, const MatmulArgs* args, int n, int64_t d) {
  const int64_t cols = args[0].w->cols;
  for (int i = 0; i < n; ++i) {
    for (const LowRankTerm& lt : args[i].terms) {
      const int64_t pieces = (lt.rank + kDownRows - 1) / kDownRows;
      if (d >= pieces) {
        d -= pieces;
        continue;
      }
      const int64_t j0 = d * kDownRows, r = std::min(kDownRows, lt.rank - j0);
      if (lt.f16) {
        lk.down_f16(static_cast<const uint16_t*>(lt.a) + j0 * cols, args[0].x, cols, 1, r, cols, lt.t + j0);
      } else {
        lk.down(static_cast<const float*>(lt.a) + j0 * cols, args[0].x, cols, 1, r, cols, lt.t + j0);
      }
      return;
    }
  }
}

// y[r] += Σ_terms scale · (B t)[r] for r in [rb, re) of one product, the terms in order.
void low_rank_up(const LoraKernels& lk, const MatmulArgs& a, int64_t rb, int64_t re) {
  for (const LowRankTerm& lt : a.terms) {
    if (lt.f16) {
      lk.up_f16(static_cast<const uint16_t*>(lt.bt), lt.t, lt.scale, 1, lt.rank, a.w->rows, rb, re, a.y, 0);
    } else {
      lk.up(static_cast<const float*>(lt.bt), lt.t, lt.scale, 1, lt.rank, a.w->rows, rb, re, a.y, 0);
    }
  }
}

// One-token products args[0 .. n) of one input x whose kernels share an
// activation format (fks[i]->act): x converted once on the calling thread
// (a few microseconds at most; a fork-join would cost as much), the packed
// matrices' block sums once, then ONE pool dispatch. In it the threads first
// claim the low-rank terms' A x in pieces of kDownRows rows, then pieces of
// output rows over the union of all products (in whole cache lines of y);
// a piece gets W x of its rows and, for a product with terms, B (A x) of the
// same rows right after. Every A x piece was claimed before any row piece,
// so by the time a thread has finished a row piece they are done: the wait
// for them is almost never taken, and the terms cost no barrier.
void one_token(const KernelSet& ks, const FormatKernels* const* fks, const MatmulArgs* args, int n,
               ThreadPool& pool) {
  constexpr int kMax = 8;
  EBB_CHECK(n >= 1 && n <= kMax);
  const int64_t cols = args[0].w->cols;
  const uint8_t* act = reinterpret_cast<const uint8_t*>(args[0].x);
  if (fks[0]->act != DType::kF32) {
    EBB_CHECK(args[0].scratch != nullptr);
    fks[0]->quantize_act(args[0].x, args[0].scratch, cols);
    act = static_cast<const uint8_t*>(args[0].scratch);
  }
  // Packed matrices: the activation sums once (the packed formats share Q8_0 activations).
  Q8_0Sums* sums = nullptr;
  for (int i = 0; i < n && !sums; ++i)
    if (args[i].w->packing != Packing::kRows) {
      sums = sums_area(args[0].scratch, act_row_stride(fks[0]->act, cols), 1);
      packed_kernels(fks[i], *args[i].w).x8_sums(cols, act, sums);
    }
  int64_t first[kMax + 1];
  first[0] = 0;
  int64_t n_down = 0;
  for (int i = 0; i < n; ++i) {
    first[i + 1] = first[i] + args[i].w->rows;
    for (const LowRankTerm& lt : args[i].terms) {
      EBB_CHECK(lt.rank >= 1 && lt.a && lt.bt && lt.t);
      n_down += (lt.rank + kDownRows - 1) / kDownRows;
    }
  }
  const LoraKernels* lk = n_down > 0 ? &lora_kernels(ks.isa()) : nullptr;
  const int64_t total = first[n], grain = piece_rows(total, pool.size());
  struct alignas(kCacheLine) Counter {
    std::atomic<int64_t> v{0};
  };
  Counter next_down, downs_done, next_rows;
  auto body = [&](int, int) {
    int64_t mine = 0;  // A x pieces done here, published once (one atomic per thread, not per piece)
    for (int64_t d; (d = next_down.v.fetch_add(1, std::memory_order_relaxed)) < n_down; ++mine)
      low_rank_down(*lk, args, n, d);
    if (mine > 0) downs_done.v.fetch_add(mine, std::memory_order_release);
    bool downs_ready = n_down == 0;
    for (int64_t g0; (g0 = next_rows.v.fetch_add(grain, std::memory_order_relaxed)) < total;) {
      const int64_t g1 = std::min(total, g0 + grain);
      for (int i = 0; i < n; ++i) {
        const int64_t b = std::max(g0, first[i]) - first[i], e = std::min(g1, first[i + 1]) - first[i];
        if (b >= e) continue;
        const WeightView& w = *args[i].w;
        if (w.packing != Packing::kRows) {
          packed_rows_one(packed_kernels(fks[i], w), w, act, sums, b, e, args[i].y);
        } else {
          const auto vec_dot = fks[i]->vec_dot;
          for (int64_t r = b; r < e; ++r) vec_dot(cols, w.row(r), act, args[i].y + r);
        }
        if (args[i].terms.empty()) continue;
        while (!downs_ready) {
          downs_ready = downs_done.v.load(std::memory_order_acquire) == n_down;
          if (!downs_ready) std::this_thread::yield();
        }
        low_rank_up(*lk, args[i], b, e);
      }
    }
  };
  // A product of one piece (a small model) runs on the calling thread.
  if (pool.size() == 1 || total <= grain) {
    body(0, 1);
  } else {
    pool.run(body);
  }
}

}  // namespace

void matmul(const KernelSet& ks, const MatmulArgs& args, ThreadPool& pool) {
  const WeightView& w = *args.w;
  const FormatKernels* fk = ks.format(w.type);
  EBB_CHECK_MSG(fk != nullptr, "no kernels for this weight format");
  EBB_CHECK(w.cols % type_info(w.type).block_size == 0);
  EBB_CHECK(w.cols % type_info(fk->act).block_size == 0);
  EBB_CHECK(args.n_tokens >= 1 && args.x != nullptr && args.y != nullptr);
  const int64_t n_tok = args.n_tokens, rows = w.rows;

  // Several tokens: the activations converted once (with the packed
  // kernels' block sums), then output rows in runs the threads claim as
  // they go (long first, shrinking to one block: a thread slowed by the rest
  // of the device takes fewer, and each streams contiguous weights), each
  // block of weight rows sized to stay in L2 and reused for every token
  // before moving on, so weights stream from memory once.
  if (n_tok > 1) {
    EBB_CHECK_MSG(args.terms.empty(), "low-rank terms are for one-token products");
    const bool packed = w.packing != Packing::kRows;
    const FormatKernels& k = packed ? packed_kernels(fk, w) : *fk;
    EBB_CHECK_MSG(fk->quantize_batch_act == nullptr || fk->tile_dot, "batch activations need the batch's own dot");
    const BatchAct b = batch_act(k, packed, args, pool);
    const int64_t block_rows = batch_block_rows(k, w);
    pool.parallel_for_guided(rows, block_rows, [&](int64_t r0, int64_t r1, int) {
      for (int64_t rb = r0; rb < r1; rb += block_rows)  // a run of blocks, or one thread: the whole range
        batch_rows(k, w, b, n_tok, rb, std::min(r1, rb + block_rows), args.y, args.y_stride);
    });
    return;
  }

  const FormatKernels* one[1] = {fk};
  one_token(ks, one, &args, 1, pool);
}

namespace {

// Several batch products (n_tok >= 2) with one input and one kernel row
// (q/k/v, gate/up of one format): the input converted once, and every
// product's pieces claimed from one list in one pool dispatch.
void matmul_multi_batch(const FormatKernels& fk, const MatmulArgs* args, int n, ThreadPool& pool) {
  constexpr int kMax = 8;
  const bool packed = args[0].w->packing != Packing::kRows;
  const BatchAct b = batch_act(fk, packed, args[0], pool);
  const int64_t n_tok = args[0].n_tokens;
  int64_t block[kMax], first[kMax + 1];  // first[i]: product i's first piece
  first[0] = 0;
  for (int i = 0; i < n; ++i) {
    block[i] = batch_block_rows(fk, *args[i].w);
    first[i + 1] = first[i] + (args[i].w->rows + block[i] - 1) / block[i];
  }
  pool.parallel_for_guided(first[n], 1, [&](int64_t p0, int64_t p1, int) {
    for (int64_t p = p0; p < p1; ++p) {
      int i = 0;
      while (p >= first[i + 1]) ++i;
      const WeightView& w = *args[i].w;
      const int64_t r0 = (p - first[i]) * block[i];
      batch_rows(fk, w, b, n_tok, r0, std::min(w.rows, r0 + block[i]), args[i].y, args[i].y_stride);
    }
  });
}

}  // namespace

void matmul_multi(const KernelSet& ks, const MatmulArgs* args, int n, ThreadPool& pool) {
  constexpr int kMax = 8;
  EBB_CHECK(n >= 1);
  const FormatKernels* fks[kMax];
  bool same_input = n <= kMax;
  for (int i = 0; same_input && i < n; ++i) {
    fks[i] = ks.format(args[i].w->type);
    same_input = fks[i] != nullptr && args[i].x == args[0].x && args[i].x_stride == args[0].x_stride &&
                 args[i].n_tokens == args[0].n_tokens && args[i].w->cols == args[0].w->cols && args[i].y != nullptr;
  }
  const int64_t n_tok = args[0].n_tokens;
  if (same_input && n_tok > 1) {
    // A batch fuses products of one format and one packing (their
    // activations and sums are the same bytes); a mix runs each alone.
    bool one_kind = true;
    for (int i = 1; i < n; ++i)
      one_kind = one_kind && fks[i] == fks[0] && args[i].w->packing == args[0].w->packing;
    if (!one_kind) {
      for (int i = 0; i < n; ++i) matmul(ks, args[i], pool);
      return;
    }
    const bool packed = args[0].w->packing != Packing::kRows;
    const FormatKernels& k = packed ? packed_kernels(fks[0], *args[0].w) : *fks[0];
    for (int i = 0; i < n; ++i) {
      EBB_CHECK(args[i].w->cols % type_info(args[i].w->type).block_size == 0);
      EBB_CHECK(args[i].w->cols % type_info(fks[i]->act).block_size == 0);
      EBB_CHECK_MSG(args[i].terms.empty(), "low-rank terms are for one-token products");
    }
    EBB_CHECK_MSG(k.quantize_batch_act == nullptr || k.tile_dot, "batch activations need the batch's own dot");
    matmul_multi_batch(k, args, n, pool);
    return;
  }
  bool fused = same_input;
  for (int i = 0; fused && i < n; ++i) fused = fks[i]->act == fks[0]->act;
  if (!fused) {
    for (int i = 0; i < n; ++i) matmul(ks, args[i], pool);
    return;
  }
  for (int i = 0; i < n; ++i) {
    EBB_CHECK(args[i].w->cols % type_info(args[i].w->type).block_size == 0);
    EBB_CHECK(args[i].w->cols % type_info(fks[i]->act).block_size == 0);
  }
  one_token(ks, fks, args, n, pool);
}

void dequantize_row(const KernelSet& ks, const WeightView& w, int64_t r, float* dst) {
  const FormatKernels* fk = ks.format(w.type);
  EBB_CHECK_MSG(fk != nullptr, "no kernels for this weight format");
  EBB_CHECK(r >= 0 && r < w.rows);
  if (w.packing == Packing::kRows || r >= w.rows / 8 * 8) {
    fk->to_float(w.row(r), dst, w.cols);
    return;
  }
  const int64_t be = type_info(w.type).block_size;
  for (int64_t i = 0; i < w.cols / be; ++i) {  // block by block back to plain
    alignas(8) uint8_t b[sizeof(BlockQ6_K)];     // the largest of the packable blocks
    static_assert(sizeof(BlockQ6_K) >= sizeof(BlockQ4_K) && sizeof(BlockQ6_K) >= sizeof(BlockQ8_0) &&
                  sizeof(BlockQ6_K) >= sizeof(BlockQ4_0));
    unpack_block(w, r, i, b);
    fk->to_float(b, dst + i * be, be);
  }
}

}  // namespace ebb
