// Synthetic models: GGUF files with the exact tensor shapes and metadata of a
// real model (Qwen3, Llama 3.2, TinyLlama, ...) and seeded random weights, for
// benchmarks and tests without downloading weights. Files follow the GGUF
// conventions of the common converters and quantizers (tensor names, dims
// with ne0 = input features, metadata keys, llama ftype ids), so other GGUF
// engines load them too.
//
// Weights: every 2-D tensor is N(0, 0.02), every 1-D (norm) weight is
// 1 + N(0, 0.02). Each row has its own generator seeded from (seed, tensor
// index, row), so rows are generated in parallel and the bytes do not depend
// on the thread count; the same seed gives the same float weights in every
// type. Normals come from a 4096-segment piecewise-linear inverse CDF
// (tails cut at about 3.6 sigma, variance rescaled to exactly 1), which is
// about ten times cheaper than Box-Muller and indistinguishable for weights.
//
// Tokenizer: SentencePiece ("llama"): <unk>, <s>, </s>, the 256 byte tokens
// <0x00>..<0xFF>, synthetic pieces ("▁", printable ASCII, "▁a", "ab", "▁ab",
// "abc", "▁abc", ...) and "[PADn]" unused tokens (type 5) up to n_vocab.
// Any text round-trips (bytes without a piece use the byte tokens).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/tensor.h"

namespace ebb {

struct SynthShape {
  std::string name;  // "qwen3-0.6b"
  std::string arch;  // "llama" or "qwen3"
  int64_t n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t n_ff = 0;
  int64_t n_vocab = 0;
  bool tied = false;  // output head shares token_embd (no output.weight)
  float rope_base = 10000.0f;
  bool qk_norm = false;  // per-head Q/K RMSNorm weights (qwen3)
  int64_t n_ctx = 2048;  // context_length
  float rms_eps = 1e-5f;

  // Weights in the file (embedding, output head when untied, norms).
  uint64_t n_params() const;
};

// The built-in shapes: tiny, tiny-llama, qwen3-0.6b, qwen3-1.7b,
// llama3.2-1b, tinyllama-1.1b. nullptr for an unknown name.
const std::vector<SynthShape>& synth_shapes();
const SynthShape* find_synth_shape(std::string_view name);
std::vector<std::string> synth_shape_names();

// A single format for every 2-D tensor, or a quantizer-style mix.
//
// Per-tensor rules (1-D norm weights are always F32):
//  - plain type T: every 2-D tensor in T.
//  - q4_k_m / q5_k_m (base B = Q4_K / Q5_K), as llama.cpp's quantizer does:
//      output.weight (token_embd.weight when the head is tied)   Q6_K
//      attn_v and ffn_down of layer i when use_more_bits(i)        Q6_K
//      everything else (incl. token_embd when untied)              B
//    use_more_bits(i) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2
//    (integer division, n = n_layer): the first and last eighth of the
//    layers and every third layer in between, about half of them.
//  - Fallback: a tensor whose row length (ne0) is not a multiple of the
//    chosen format's block (256 for K-quants, 32 for Q4_0/Q8_0) is written
//    as Q8_0 when ne0 % 32 == 0, else as F16.
struct SynthType {
  enum class Mix { kNone, kQ4_K_M, kQ5_K_M };
  DType base = DType::kF16;  // the plain type, or the mix's base (Q4_K / Q5_K)
  Mix mix = Mix::kNone;
  bool operator==(const SynthType&) const = default;
};
// "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q4_k_m",
// "q5_k_m" (case-insensitive); nullopt otherwise.
std::optional<SynthType> parse_synth_type(std::string_view name);
std::string synth_type_name(SynthType t);  // "q4_k_m", "f16", ...
std::vector<std::string> synth_type_names();
// general.file_type (llama ftype): f32 0, f16 1, q4_0 2, q4_1 3, q8_0 7,
// q5_0 8, q5_1 9, q2_k 10, q3_k 11 (Q3_K_S, the closest id), q4_k 14
// (Q4_K_S), q4_k_m 15, q5_k 16 (Q5_K_S), q5_k_m 17, q6_k 18, iq4_nl 25,
// iq4_xs 30, bf16 32.
uint32_t synth_file_type(SynthType t);

// The tensor table of a synthetic file, in file order.
struct SynthTensor {
  std::string name;
  std::vector<int64_t> dims;  // ne0 first
  DType type = DType::kF32;
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  uint64_t offset = 0;  // in the data section (aligned to 32)
  bool norm = false;    // 1-D weight: 1 + N(0, 0.02)
};
struct SynthPlan {
  std::vector<SynthTensor> tensors;
  uint64_t n_params = 0;
  uint64_t header_bytes = 0;  // metadata + tensor infos, aligned
  uint64_t data_bytes = 0;
  uint64_t file_bytes = 0;  // exact size of the written file
};
// Validates the shape (throws ebb::Error naming the field) and returns the
// per-tensor types, shapes and the exact file size without writing anything.
// chat_template: a Jinja chat template to store (see SynthOptions).
SynthPlan plan_synth_model(const SynthShape& shape, SynthType type, const std::string& chat_template = {});

// The special tokens a chat template spells out: "<|...|>" markers,
// "[UPPER_CASE]" markers ([INST], [TOOL_CALLS]) and the <tool_call>,
// <tool_response> and <think> tags with their closing forms, in order of
// first appearance, each once. A synthetic model with the template gets
// each as one token, as the family's real vocabulary has them.
std::vector<std::string> synth_special_tokens(const std::string& chat_template);

struct SynthOptions {
  SynthShape shape;
  SynthType type;
  uint64_t seed = 1;
  int n_threads = 0;  // 0: all hardware threads
  // A Jinja chat template written as tokenizer.chat_template (empty: none).
  // Its special tokens (synth_special_tokens) join the vocabulary right
  // after the byte tokens; "<|im_end|>", "<|eot_id|>" or "<|end|>", when it
  // has one, becomes the end-of-sequence token.
  std::string chat_template;
  // progress(done_bytes, total_bytes), called on the calling thread; the
  // last call has done == total.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// Encodes one row of n floats as t (n a multiple of t's block size): fast
// single-pass round-to-nearest encoders for F16, Q8_0, Q4_0, Q4_K, Q5_K and
// Q6_K (no scale search, unlike quantize_row; same block layouts),
// quantize_row for F32 and BF16. This is what the writer uses.
void synth_encode_row(DType t, const float* src, void* dst, int64_t n);

// Writes the file (throws ebb::Error for an invalid shape or an I/O error;
// a partial file is removed).
void write_synth_model(const SynthOptions& opts, const std::string& path);

}  // namespace ebb
