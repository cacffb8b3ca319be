// Tensor element formats (numbered as in GGUF) and a view of a 2-D weight.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ebb {

// Values are the GGUF / ggml type ids, so a file's type field maps directly.
enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

// Storage layout of a format: elements per block and bytes per block.
struct TypeInfo {
  DType type;
  std::string_view name;
  uint32_t block_size;   // elements per block
  uint32_t block_bytes;  // bytes per block
  bool computable;       // ebb has kernels for it (others can be read, not run)
};

// nullptr when the id is not a format ebb knows the layout of.
const TypeInfo* type_info(uint32_t ggml_type_id);
const TypeInfo& type_info(DType t);
std::string_view dtype_name(DType t);
std::optional<DType> parse_dtype(std::string_view name);  // "q4_k", "F16", ...
// The weight formats ebb computes with, for messages: "F32, F16, ...".
std::string computable_type_names();

// Bytes of a row of n elements; n must be a multiple of the block size.
uint64_t row_bytes(DType t, int64_t n);

// How a weight matrix's rows sit in memory.
//   kRows:   as GGUF stores them, row after row.
//   kQ4_0x8, kQ8_0x8, kQ4_Kx8, kQ5_Kx8, kQ6_Kx8: Q4_0 / Q8_0 / Q4_K /
//            Q5_K / Q6_K rows interleaved in groups of eight (BlockQ4_0x8,
//            BlockQ8_0x8, BlockQ4_Kx8, BlockQ5_Kx8, BlockQ6_Kx8, see
//            kernels/packing.h): rows
//            [0, rows / 8 * 8) as groups, any remaining rows as plain rows
//            after them, at the offsets plain rows would have. Same bytes in
//            all; kernels read eight rows' blocks in one vector without
//            transposing them.
enum class Packing : uint8_t { kRows, kQ4_0x8, kQ8_0x8, kQ4_Kx8, kQ5_Kx8, kQ6_Kx8 };

// A 2-D weight matrix: rows of `cols` elements (ne0 = cols, ne1 = rows),
// each row `row_stride` bytes apart when packing is kRows.
struct WeightView {
  DType type = DType::kF32;
  int64_t cols = 0;  // ne0: the reduction dimension
  int64_t rows = 0;  // ne1: output features
  const void* data = nullptr;
  uint64_t row_stride = 0;  // bytes between rows (= row_bytes(type, cols))
  Packing packing = Packing::kRows;
  // Row r's bytes: kRows, or a packed view's rows past its last group.
  const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + r * row_stride; }
};

}  // namespace ebb
