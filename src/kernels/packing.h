// Weight packings (Packing in kernels/tensor.h): rearranging a matrix's rows
// so a kernel reads several rows' blocks as one vector. Done in place, once,
// when a weight unit is read (the bytes do not change size).
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace ebb {

// The packing a matrix of this type and shape gets when its kernel set
// packs (FormatKernels::x8_gemm), or kRows.
Packing packing_for(DType type, int64_t rows, int64_t cols);

// Rearranges a kRows matrix at `data` into `packing`, in place. Rows past the
// last whole group stay as they are. Allocates one group's worth of bytes.
void pack_rows(Packing packing, DType type, void* data, int64_t rows, int64_t cols);

// Row r of a packed matrix, in plain row layout: row_bytes(type, cols) bytes.
void unpack_row(const WeightView& w, int64_t r, void* out);

// Block i of row r (r in a group) of a packed matrix, as a plain block.
void unpack_block(const WeightView& w, int64_t r, int64_t i, void* out);

}  // namespace ebb
