#include "kernels/packing.h"

#include <cstring>
#include <vector>

#include "kernels/quant_blocks.h"
#include "platform/error.h"

namespace ebb {
namespace {

// Both packed formats: a plain block is an F16 scale then q bytes of quants;
// a packed block the eight scales then the eight rows' quants interleaved in
// 4-byte pieces (piece k of row r at 32k + 4r).
struct Geometry {
  size_t block;  // plain block bytes
  size_t q;      // quant bytes per plain block
};

Geometry geometry(Packing p, DType t) {
  if (p == Packing::kQ4_0x8 && t == DType::kQ4_0) return {sizeof(BlockQ4_0), sizeof(BlockQ4_0::qs)};
  if (p == Packing::kQ8_0x8 && t == DType::kQ8_0) return {sizeof(BlockQ8_0), sizeof(BlockQ8_0::qs)};
  EBB_CHECK_MSG(false, "packing does not fit the weight type");
  __builtin_unreachable();
}

// Plain block `x` of row `lane` into packed block `b` (or back).
void pack_block(const Geometry& g, const uint8_t* x, int lane, uint8_t* b) {
  std::memcpy(b + 2 * lane, x, 2);
  for (size_t k = 0; k < g.q / 4; ++k) std::memcpy(b + 16 + 32 * k + 4 * lane, x + 2 + 4 * k, 4);
}
void unpack_block(const Geometry& g, const uint8_t* b, int lane, uint8_t* x) {
  std::memcpy(x, b + 2 * lane, 2);
  for (size_t k = 0; k < g.q / 4; ++k) std::memcpy(x + 2 + 4 * k, b + 16 + 32 * k + 4 * lane, 4);
}

}  // namespace

Packing packing_for(DType type, int64_t rows, int64_t cols) {
  if (rows < 8 || cols % kQK8_0 != 0) return Packing::kRows;
  if (type == DType::kQ4_0) return Packing::kQ4_0x8;
  if (type == DType::kQ8_0) return Packing::kQ8_0x8;
  return Packing::kRows;
}

void pack_rows(Packing packing, DType type, void* data, int64_t rows, int64_t cols) {
  if (packing == Packing::kRows) return;
  const Geometry g = geometry(packing, type);
  EBB_CHECK(rows >= 0 && cols % kQK8_0 == 0);
  const int64_t nb = cols / kQK8_0;
  const size_t group_bytes = 8 * nb * g.block;
  std::vector<uint8_t> plain(group_bytes);  // one group, as rows
  auto* out = static_cast<uint8_t*>(data);
  for (int64_t gi = 0; gi < rows / 8; ++gi) {
    uint8_t* grp = out + gi * group_bytes;
    std::memcpy(plain.data(), grp, group_bytes);
    for (int64_t i = 0; i < nb; ++i)
      for (int r = 0; r < 8; ++r) pack_block(g, plain.data() + (r * nb + i) * g.block, r, grp + i * 8 * g.block);
  }
}

void unpack_block(const WeightView& w, int64_t r, int64_t i, void* out) {
  const Geometry g = geometry(w.packing, w.type);
  const int64_t nb = w.cols / kQK8_0;
  EBB_CHECK(r >= 0 && r < w.rows / 8 * 8 && i >= 0 && i < nb);
  const auto* grp = static_cast<const uint8_t*>(w.data) + (r / 8) * 8 * nb * g.block;
  unpack_block(g, grp + i * 8 * g.block, static_cast<int>(r % 8), static_cast<uint8_t*>(out));
}

void unpack_row(const WeightView& w, int64_t r, void* out) {
  EBB_CHECK(r >= 0 && r < w.rows);
  if (w.packing == Packing::kRows || r >= w.rows / 8 * 8) {
    std::memcpy(out, w.row(r), row_bytes(w.type, w.cols));
    return;
  }
  const size_t block = geometry(w.packing, w.type).block;
  for (int64_t i = 0; i < w.cols / kQK8_0; ++i) unpack_block(w, r, i, static_cast<uint8_t*>(out) + i * block);
}

}  // namespace ebb
