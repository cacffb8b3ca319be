// A weight matrix for the kernel micro-benchmarks: `rows` rows of `type`,
// quantized from 64 distinct rows of `src` ([64, cols] floats) tiled down
// the matrix, so building a large one costs 64 rows' quantization.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/quantize.h"
#include "kernels/tensor.h"

namespace ebb::bench {

inline std::vector<uint8_t> tiled_weights(DType type, int64_t rows, int64_t cols, const std::vector<float>& src) {
  const uint64_t rb = row_bytes(type, cols);
  std::vector<uint8_t> tile(rb * 64);
  for (int r = 0; r < 64; ++r) quantize_row(type, src.data() + r * cols, tile.data() + r * rb, cols);
  std::vector<uint8_t> w(rb * rows + 64);  // + 64: kernels may read a vector past the end
  for (int64_t r = 0; r < rows; ++r) std::memcpy(w.data() + r * rb, tile.data() + (r % 64) * rb, rb);
  return w;
}

}  // namespace ebb::bench
