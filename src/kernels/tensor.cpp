#include "kernels/tensor.h"

#include <array>
#include <cctype>
#include <string>

#include "platform/error.h"

namespace ebb {
namespace {

// Block layouts of every ggml format ebb can at least read.
// Sizes as ggml defines the blocks (the i-quants' grids and the ternary and
// MXFP4 formats are read, listed and skipped, never computed).
constexpr std::array<TypeInfo, 32> kTypes = {{
    {DType::kF32, "F32", 1, 4, true},
    {DType::kF16, "F16", 1, 2, true},
    {DType::kQ4_0, "Q4_0", 32, 18, true},
    {DType::kQ4_1, "Q4_1", 32, 20, true},
    {DType::kQ5_0, "Q5_0", 32, 22, true},
    {DType::kQ5_1, "Q5_1", 32, 24, true},
    {DType::kQ8_0, "Q8_0", 32, 34, true},
    {DType::kQ8_1, "Q8_1", 32, 36, false},
    {DType::kQ2_K, "Q2_K", 256, 84, true},
    {DType::kQ3_K, "Q3_K", 256, 110, true},
    {DType::kQ4_K, "Q4_K", 256, 144, true},
    {DType::kQ5_K, "Q5_K", 256, 176, true},
    {DType::kQ6_K, "Q6_K", 256, 210, true},
    {DType::kQ8_K, "Q8_K", 256, 292, false},
    {DType::kIQ2_XXS, "IQ2_XXS", 256, 66, false},
    {DType::kIQ2_XS, "IQ2_XS", 256, 74, false},
    {DType::kIQ3_XXS, "IQ3_XXS", 256, 98, false},
    {DType::kIQ1_S, "IQ1_S", 256, 50, false},
    {DType::kIQ4_NL, "IQ4_NL", 32, 18, true},
    {DType::kIQ3_S, "IQ3_S", 256, 110, false},
    {DType::kIQ2_S, "IQ2_S", 256, 82, false},
    {DType::kIQ4_XS, "IQ4_XS", 256, 136, true},
    {DType::kI8, "I8", 1, 1, false},
    {DType::kI16, "I16", 1, 2, false},
    {DType::kI32, "I32", 1, 4, false},
    {DType::kI64, "I64", 1, 8, false},
    {DType::kF64, "F64", 1, 8, false},
    {DType::kIQ1_M, "IQ1_M", 256, 56, false},
    {DType::kBF16, "BF16", 1, 2, true},
    {DType::kTQ1_0, "TQ1_0", 256, 54, false},
    {DType::kTQ2_0, "TQ2_0", 256, 66, false},
    {DType::kMXFP4, "MXFP4", 32, 17, false},
}};

}  // namespace

const TypeInfo* type_info(uint32_t id) {
  for (const auto& t : kTypes)
    if (static_cast<uint32_t>(t.type) == id) return &t;
  return nullptr;
}

const TypeInfo& type_info(DType t) {
  const TypeInfo* info = type_info(static_cast<uint32_t>(t));
  EBB_CHECK(info != nullptr);
  return *info;
}

std::string_view dtype_name(DType t) { return type_info(t).name; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& t : kTypes) {
    if (t.name.size() != name.size()) continue;
    bool eq = true;
    for (size_t i = 0; i < name.size() && eq; ++i)
      eq = std::toupper(static_cast<unsigned char>(name[i])) == t.name[i];
    if (eq) return t.type;
  }
  return std::nullopt;
}

std::string computable_type_names() {
  std::string s;
  for (const auto& t : kTypes)
    if (t.computable) s += (s.empty() ? "" : ", ") + std::string(t.name);
  return s;
}

uint64_t row_bytes(DType t, int64_t n) {
  const TypeInfo& info = type_info(t);
  EBB_CHECK(n >= 0 && n % info.block_size == 0);
  return static_cast<uint64_t>(n / info.block_size) * info.block_bytes;
}

}  // namespace ebb
