#include "kernels/packing.h"

#include <cstring>
#include <vector>

#include "kernels/quant_blocks.h"
#include "platform/error.h"

namespace ebb {
namespace {

// Where a plain block's bytes go in a packed block of eight: runs of
// `piece` bytes; run k of row r's field sits at offset + 32k + piece r (or,
// for the 2-byte scales, at offset + 2r). The fields of one format, in
// packed-block order.
struct Field {
  size_t plain_offset;  // in the plain block
  size_t bytes;         // in the plain block
  size_t packed_offset; // in the packed block
  size_t piece;         // 2: one run per row, side by side; 4: 4-byte runs, 32 bytes apart
};

struct Layout {
  size_t block;     // plain block bytes
  int64_t elems;    // elements per block
  Field fields[5];
  int n_fields;
};

Layout layout(Packing p, DType t) {
  if (p == Packing::kQ4_0x8 && t == DType::kQ4_0)
    return {sizeof(BlockQ4_0), kQK8_0, {{0, 2, 0, 2}, {2, 16, 16, 4}}, 2};
  if (p == Packing::kQ8_0x8 && t == DType::kQ8_0)
    return {sizeof(BlockQ8_0), kQK8_0, {{0, 2, 0, 2}, {2, 32, 16, 4}}, 2};
  if (p == Packing::kQ4_Kx8 && t == DType::kQ4_K)
    return {sizeof(BlockQ4_K), kQK_K, {{0, 2, 0, 2}, {2, 2, 16, 2}, {4, 12, 32, 4}, {16, 128, 128, 4}}, 4};
  if (p == Packing::kQ5_Kx8 && t == DType::kQ5_K)
    return {sizeof(BlockQ5_K), kQK_K,
            {{0, 2, 0, 2}, {2, 2, 16, 2}, {4, 12, 32, 4}, {16, 32, 128, 4}, {48, 128, 384, 4}}, 5};
  if (p == Packing::kQ6_Kx8 && t == DType::kQ6_K)
    return {sizeof(BlockQ6_K), kQK_K, {{208, 2, 0, 2}, {192, 16, 16, 4}, {0, 128, 144, 4}, {128, 64, 1168, 4}}, 4};
  EBB_CHECK_MSG(false, "packing does not fit the weight type");
  __builtin_unreachable();
}

// Plain block `x` of row `lane` into packed block `b` (or back).
void pack_block(const Layout& l, const uint8_t* x, int lane, uint8_t* b) {
  for (int f = 0; f < l.n_fields; ++f) {
    const Field& fd = l.fields[f];
    if (fd.piece == 2) {
      std::memcpy(b + fd.packed_offset + 2 * lane, x + fd.plain_offset, 2);
      continue;
    }
    for (size_t k = 0; k < fd.bytes / 4; ++k)
      std::memcpy(b + fd.packed_offset + 32 * k + 4 * lane, x + fd.plain_offset + 4 * k, 4);
  }
}
void unpack_block(const Layout& l, const uint8_t* b, int lane, uint8_t* x) {
  for (int f = 0; f < l.n_fields; ++f) {
    const Field& fd = l.fields[f];
    if (fd.piece == 2) {
      std::memcpy(x + fd.plain_offset, b + fd.packed_offset + 2 * lane, 2);
      continue;
    }
    for (size_t k = 0; k < fd.bytes / 4; ++k)
      std::memcpy(x + fd.plain_offset + 4 * k, b + fd.packed_offset + 32 * k + 4 * lane, 4);
  }
}

}  // namespace

Packing packing_for(DType type, int64_t rows, int64_t cols) {
  if (rows < 8) return Packing::kRows;
  if (type == DType::kQ4_0 && cols % kQK8_0 == 0) return Packing::kQ4_0x8;
  if (type == DType::kQ8_0 && cols % kQK8_0 == 0) return Packing::kQ8_0x8;
  if (type == DType::kQ4_K && cols % kQK_K == 0) return Packing::kQ4_Kx8;
  if (type == DType::kQ5_K && cols % kQK_K == 0) return Packing::kQ5_Kx8;
  if (type == DType::kQ6_K && cols % kQK_K == 0) return Packing::kQ6_Kx8;
  return Packing::kRows;
}

void pack_rows(Packing packing, DType type, void* data, int64_t rows, int64_t cols) {
  if (packing == Packing::kRows) return;
  const Layout l = layout(packing, type);
  EBB_CHECK(rows >= 0 && cols % l.elems == 0);
  const int64_t nb = cols / l.elems;
  const size_t group_bytes = 8 * nb * l.block;
  std::vector<uint8_t> plain(group_bytes);  // one group, as rows
  auto* out = static_cast<uint8_t*>(data);
  for (int64_t gi = 0; gi < rows / 8; ++gi) {
    uint8_t* grp = out + gi * group_bytes;
    std::memcpy(plain.data(), grp, group_bytes);
    for (int64_t i = 0; i < nb; ++i)
      for (int r = 0; r < 8; ++r) pack_block(l, plain.data() + (r * nb + i) * l.block, r, grp + i * 8 * l.block);
  }
}

void unpack_block(const WeightView& w, int64_t r, int64_t i, void* out) {
  const Layout l = layout(w.packing, w.type);
  const int64_t nb = w.cols / l.elems;
  EBB_CHECK(r >= 0 && r < w.rows / 8 * 8 && i >= 0 && i < nb);
  const auto* grp = static_cast<const uint8_t*>(w.data) + (r / 8) * 8 * nb * l.block;
  unpack_block(l, grp + i * 8 * l.block, static_cast<int>(r % 8), static_cast<uint8_t*>(out));
}

void unpack_row(const WeightView& w, int64_t r, void* out) {
  EBB_CHECK(r >= 0 && r < w.rows);
  if (w.packing == Packing::kRows || r >= w.rows / 8 * 8) {
    std::memcpy(out, w.row(r), row_bytes(w.type, w.cols));
    return;
  }
  const Layout l = layout(w.packing, w.type);
  for (int64_t i = 0; i < w.cols / l.elems; ++i) unpack_block(w, r, i, static_cast<uint8_t*>(out) + i * l.block);
}

}  // namespace ebb
