// Shared by the adapter readers (lora_gguf.cpp, lora_peft.cpp).
#pragma once

#include <cstdint>
#include <string_view>

#include "kernels/tensor.h"
#include "model/lora.h"

namespace ebb::detail {

// Parses a base tensor name ("blk.3.attn_q.weight", "output.weight",
// "token_embd.weight"); false when it is not one an adapter can target.
bool parse_lora_base_name(std::string_view base, int* layer, LoraTarget* target);

// Builds a pair from stored rows (F32, F16, BF16 or Q8_0), F16 in memory
// when every value is exactly an F16 (model/lora.h), else F32:
//   a_bytes: [rank rows of n_in]    (kTokenEmbd: [n_in = n_vocab rows of rank])
//   b_bytes: [n_out rows of rank]
// Shapes must have been checked by the caller.
LoraPair make_lora_pair(int layer, LoraTarget target, int64_t rank, int64_t n_in, int64_t n_out, float scale,
                        DType a_type, const uint8_t* a_bytes, DType b_type, const uint8_t* b_bytes,
                        Allocator& alloc);

// 0 when every value of p is finite, else 1 (in a) or 2 (in bt).
int lora_first_nonfinite(const LoraPair& p);

// True for the stored types adapters may use.
bool lora_type_supported(DType t);

}  // namespace ebb::detail
