// matmul_t (kernels/train_ops.h): dx[T, n_in] += dy[T, n_out] · W, the
// gradient through a frozen projection y = W x, W in any computable format.
//
// It is a matrix product C = dx [M = T, N = n_in] += A = dy [T, K = n_out] ·
// B = W [n_out, n_in], with B dequantized on the fly. The plan:
//  1. dx's columns in chunks of whole blocks of W's format (W can be
//     dequantized a block range of a row at a time), W's rows in `parts`
//     ranges; a work item is one (chunk, range) pair, claimed by the threads
//     as they go. Items of range 0 add into dx itself; range p > 0 into
//     partial buffer p - 1 ([T, n_in] each, in the scratch), so no two
//     threads write the same element. There are only more ranges than one
//     when there are too few chunks to give every thread two items.
//  2. An item dequantizes its rows in tiles of kt rows x chunk columns into
//     the thread's scratch (F32 rows are read in place) and adds dy's
//     columns of the tile times the tile into its [T, chunk] of dx (the
//     target's GemmNN, train_lora_internal.h): every element of W is
//     dequantized once, and reused for all T rows of dy from cache.
//  3. The partial buffers are added into dx, split over the threads by
//     element.
// When all of dx fits in L2 (small T) a chunk is a whole row (up to 4096
// columns), so W streams from memory in order and the rows are split in as
// many ranges as make two items per thread. Otherwise a chunk is as wide as
// keeps its [T, chunk] of dx in L2 (256 KB), narrow enough to make two
// chunks per thread where n_in allows, but never under two cache lines of a
// row of W (narrower, each line of W would be fetched for several chunks).
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "kernels/matmul.h"
#include "kernels/packing.h"
#include "kernels/quant_blocks.h"
#include "kernels/tensor.h"
#include "kernels/train_lora_internal.h"
#include "kernels/train_ops.h"
#include "platform/error.h"
#include "platform/thread_pool.h"

namespace ebb {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t v, int64_t m) { return ceil_div(v, m) * m; }

constexpr int64_t kChunkL2Floats = 65536;    // [T, chunk] of dx: 256 KB
constexpr int64_t kMaxChunk = 4096;          // columns: a tile of 8 such rows is 128 KB
constexpr int64_t kMinChunkBytes = 128;      // of a row of W: two cache lines
// A dequantized tile: 128 KB, twice the rows of 64 KB for each load and
// store of dx's block (0.83-0.85x the time of 64 KB tiles on Q4_0 weights
// of qwen3-0.6b's projection shapes at T = 256; 256 KB tiles no better).
constexpr int64_t kTileFloats = 32768;
constexpr int64_t kPartialFloats = 8 << 20;  // the partial buffers: at most 32 MB, unless one is more

struct Plan {
  int64_t chunk = 0;          // columns per chunk, whole blocks (the last chunk may be narrower)
  int64_t n_chunks = 0;
  int64_t kt = 0;             // rows per dequantized tile, a multiple of 8
  int64_t ldt = 0;            // floats between the tile's rows
  int64_t parts = 1;          // ranges of W's rows
  int64_t plain_floats = 0;   // a chunk of one row as plain blocks (packed views), in floats
  int64_t thread_floats = 0;  // per thread: tile + plain blocks, a whole number of cache lines
};

Plan plan_for(const WeightView& w, int64_t T, int n_threads) {
  const int64_t n_in = w.cols, n_out = w.rows, threads = n_threads;
  const TypeInfo& ti = type_info(w.type);
  const int64_t b = ti.block_size;
  EBB_CHECK(T >= 1 && n_in >= 1 && n_in % b == 0 && n_threads >= 1);
  Plan p;
  if (T * n_in <= kChunkL2Floats) {
    // All of dx fits in L2: whole rows of W, read as they lie in memory.
    p.chunk = std::min(n_in, std::max(b, kMaxChunk / b * b));
  } else {
    // Chunks no narrower than two cache lines of W's rows (narrower, W's
    // lines are fetched for several chunks), no wider than keeps [T, chunk]
    // of dx in L2, and two per thread where that leaves room.
    const int64_t min_chunk =
        round_up(std::max<int64_t>(64, ceil_div(kMinChunkBytes * b, static_cast<int64_t>(ti.block_bytes))), b);
    const int64_t l2_chunk = std::max(min_chunk, kChunkL2Floats / T / b * b);
    const int64_t par_chunk = round_up(ceil_div(n_in, 2 * threads), b);
    p.chunk = std::min({n_in, std::clamp(par_chunk, min_chunk, l2_chunk), std::max(b, kMaxChunk / b * b)});
  }
  p.n_chunks = ceil_div(n_in, p.chunk);
  p.ldt = round_up(p.chunk, 16);
  p.kt = std::clamp<int64_t>(kTileFloats / p.ldt / 8 * 8, 8, 256);
  // Too few chunks for two per thread: W's rows in ranges too, each range
  // past the first summed in its own partial copy of dx.
  if (threads > 1 && p.n_chunks < 2 * threads) {
    const int64_t by_memory = 1 + std::max<int64_t>(1, kPartialFloats / (T * n_in));
    p.parts = std::min({ceil_div(2 * threads, p.n_chunks), ceil_div(n_out, p.kt), by_memory});
    p.parts = std::max<int64_t>(p.parts, 1);
  }
  if (w.packing != Packing::kRows) p.plain_floats = ceil_div(static_cast<int64_t>(row_bytes(w.type, p.chunk)), 4);
  p.thread_floats = round_up(p.kt * p.ldt + p.plain_floats, 16);
  return p;
}

// Blocks [i0, i0 + nb) of row r (in a group) of a packed Q4_0 / Q8_0 matrix
// as plain blocks: the row's scale and its 4-byte pieces of qs, 32 bytes
// apart (BlockQ4_0x8, BlockQ8_0x8 in kernels/quant_blocks.h). What
// unpack_block does for any packing, without its per-block set-up, which
// costs ten times the dequantization of these two formats.
template <class Packed, class Plain>
void unpack_x8_blocks(const WeightView& w, int64_t r, int64_t i0, int64_t nb, uint8_t* out) {
  const int64_t blocks = w.cols / kQK8_0;
  const auto* g = static_cast<const Packed*>(w.data) + r / 8 * blocks;
  const int lane = static_cast<int>(r % 8);
  for (int64_t i = 0; i < nb; ++i, out += sizeof(Plain)) {
    const Packed& b = g[i0 + i];
    std::memcpy(out + offsetof(Plain, d), &b.d[lane], sizeof(uint16_t));
    for (size_t k = 0; k < sizeof(Plain::qs) / 4; ++k)
      std::memcpy(out + offsetof(Plain, qs) + 4 * k, b.qs + 32 * k + 4 * lane, 4);
  }
}

// Rows [o0, o0 + kt) of W, columns [c0, c0 + n) (whole blocks), as floats
// into tile (rows ldt apart). `plain`: room for n columns of one row as
// plain blocks, for rows of a packed group.
void dequantize_tile(const FormatKernels& fk, const WeightView& w, int64_t o0, int64_t kt, int64_t c0, int64_t n,
                     float* tile, int64_t ldt, uint8_t* plain) {
  const TypeInfo& ti = type_info(w.type);
  const int64_t i0 = c0 / ti.block_size, nb = n / ti.block_size;
  const int64_t grouped = w.packing == Packing::kRows ? 0 : w.rows / 8 * 8;
  for (int64_t k = 0; k < kt; ++k) {
    const int64_t o = o0 + k;
    if (o >= grouped) {
      fk.to_float(w.row(o) + i0 * ti.block_bytes, tile + k * ldt, n);
      continue;
    }
    if (w.packing == Packing::kQ4_0x8) {
      unpack_x8_blocks<BlockQ4_0x8, BlockQ4_0>(w, o, i0, nb, plain);
    } else if (w.packing == Packing::kQ8_0x8) {
      unpack_x8_blocks<BlockQ8_0x8, BlockQ8_0>(w, o, i0, nb, plain);
    } else {
      for (int64_t i = 0; i < nb; ++i) unpack_block(w, o, i0 + i, plain + i * ti.block_bytes);
    }
    fk.to_float(plain, tile + k * ldt, n);
  }
}

}  // namespace

size_t matmul_t_scratch_floats(const WeightView& w, int64_t T, int n_threads) {
  // The most any batch of up to T rows needs (a smaller batch may need more:
  // whole rows and more ranges once all of dx fits in L2).
  size_t most = 0;
  for (int64_t t = 1; t <= T; ++t) {
    const Plan p = plan_for(w, t, n_threads);
    most = std::max(most, static_cast<size_t>(n_threads * p.thread_floats + (p.parts - 1) * t * w.cols));
  }
  return most;
}

void matmul_t(const KernelSet& ks, const WeightView& w,
              const float* dy,  // [T, w.rows]
              int64_t T,
              float* dx,  // [T, w.cols]  +=
              float* scratch, ThreadPool& pool) {
  const FormatKernels* fk = ks.format(w.type);
  EBB_CHECK_MSG(fk != nullptr && fk->to_float != nullptr, "matmul_t: no kernels for this weight format");
  EBB_CHECK(dy != nullptr && dx != nullptr && scratch != nullptr);
  if (T <= 0 || w.rows <= 0) return;
  const detail::GemmNN gemm = detail::train_gemm(ks.isa()).nn;
  const int64_t n_in = w.cols, n_out = w.rows;
  const Plan p = plan_for(w, T, pool.size());
  float* partials = scratch + static_cast<int64_t>(pool.size()) * p.thread_floats;  // [parts - 1][T, n_in]
  // F32 rows in place: B = W's rows themselves.
  const bool in_place = w.type == DType::kF32 && w.packing == Packing::kRows && w.row_stride % sizeof(float) == 0;

  pool.parallel_for_dynamic(p.n_chunks * p.parts, 1, [&](int64_t i0, int64_t i1, int thread) {
    float* tile = scratch + static_cast<int64_t>(thread) * p.thread_floats;  // [kt, ldt]
    auto* plain = reinterpret_cast<uint8_t*>(tile + p.kt * p.ldt);
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t part = item % p.parts, c0 = item / p.parts * p.chunk;
      const int64_t n = std::min(p.chunk, n_in - c0);
      // Range boundaries on whole groups of eight rows (packed views).
      const int64_t ob = n_out * part / p.parts / 8 * 8;
      const int64_t oe = part + 1 == p.parts ? n_out : n_out * (part + 1) / p.parts / 8 * 8;
      float* c = part == 0 ? dx : partials + (part - 1) * T * n_in;  // [T, n_in]
      if (part > 0)
        for (int64_t t = 0; t < T; ++t) std::fill_n(c + t * n_in + c0, n, 0.0f);
      for (int64_t o0 = ob; o0 < oe; o0 += p.kt) {
        const int64_t kt = std::min(p.kt, oe - o0);
        if (in_place) {
          const auto* b = reinterpret_cast<const float*>(w.row(o0)) + c0;
          gemm(T, n, kt, 1.0f, dy + o0, n_out, 1, b, static_cast<int64_t>(w.row_stride / sizeof(float)), c + c0,
               n_in);
          continue;
        }
        dequantize_tile(*fk, w, o0, kt, c0, n, tile, p.ldt, plain);
        gemm(T, n, kt, 1.0f, dy + o0, n_out, 1, tile, p.ldt, c + c0, n_in);
      }
    }
  });

  if (p.parts == 1) return;
  const int64_t n_elems = T * n_in;
  pool.parallel_for(n_elems, 4096, [&](int64_t e0, int64_t e1, int) {
    for (int64_t q = 0; q + 1 < p.parts; ++q) {
      const float* src = partials + q * n_elems;
      for (int64_t e = e0; e < e1; ++e) dx[e] += src[e];
    }
  });
}

}  // namespace ebb
