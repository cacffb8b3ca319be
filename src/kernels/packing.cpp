#include "kernels/packing.h"

#include <cstring>
#include <vector>

#include "kernels/quant_blocks.h"
#include "platform/error.h"

namespace ebb {

Packing packing_for(DType type, int64_t rows, int64_t cols) {
  if (type == DType::kQ4_0 && rows >= 8 && cols % kQK8_0 == 0) return Packing::kQ4_0x8;
  return Packing::kRows;
}

void pack_rows(Packing packing, DType type, void* data, int64_t rows, int64_t cols) {
  if (packing == Packing::kRows) return;
  EBB_CHECK_MSG(packing == Packing::kQ4_0x8 && type == DType::kQ4_0, "pack_rows: packing does not fit the type");
  EBB_CHECK(rows >= 0 && cols % kQK8_0 == 0);
  const int64_t nb = cols / kQK8_0;
  std::vector<BlockQ4_0> rows8(static_cast<size_t>(8 * nb));  // one group, plain
  auto* out = static_cast<BlockQ4_0x8*>(data);
  for (int64_t g = 0; g < rows / 8; ++g) {
    std::memcpy(rows8.data(), out + g * nb, rows8.size() * sizeof(BlockQ4_0));
    for (int64_t i = 0; i < nb; ++i) {
      BlockQ4_0x8& b = out[g * nb + i];
      for (int r = 0; r < 8; ++r) {
        const BlockQ4_0& x = rows8[r * nb + i];
        b.d[r] = x.d;
        for (int k = 0; k < 4; ++k) std::memcpy(b.qs + 32 * k + 4 * r, x.qs + 4 * k, 4);
      }
    }
  }
}

void unpack_row(const WeightView& w, int64_t r, void* out) {
  EBB_CHECK(r >= 0 && r < w.rows);
  const uint64_t rb = row_bytes(w.type, w.cols);
  if (w.packing == Packing::kRows || r >= w.rows / 8 * 8) {
    std::memcpy(out, w.row(r), rb);
    return;
  }
  EBB_CHECK(w.packing == Packing::kQ4_0x8 && w.type == DType::kQ4_0);
  const int64_t nb = w.cols / kQK8_0, g = r / 8, lane = r % 8;
  const auto* in = static_cast<const BlockQ4_0x8*>(w.data) + g * nb;
  auto* x = static_cast<BlockQ4_0*>(out);
  for (int64_t i = 0; i < nb; ++i) {
    x[i].d = in[i].d[lane];
    for (int k = 0; k < 4; ++k) std::memcpy(x[i].qs + 4 * k, in[i].qs + 32 * k + 4 * lane, 4);
  }
}

}  // namespace ebb
