// Shared by the engine-level Vulkan tests (test_vulkan_engine, _kv, _lora,
// _split): how far a device's logits are from the CPU's, the CPU engine they
// are compared with, and the prompts and sessions the KV tests use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/session.h"
#include "support.h"

namespace ebb::test {

// Normalised mean squared error of got against ref: Σ(got - ref)² / Σ ref².
inline double nmse(std::span<const float> got, std::span<const float> ref) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    norm += double(ref[i]) * ref[i];
  }
  return err / std::max(norm, 1e-30);
}

inline int32_t argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// The reference: one thread, scalar kernels, on ../shared/models/MODEL.gguf.
inline EngineOptions cpu_options(const std::string& model) {
  EngineOptions eo;
  eo.model_path = model_path(model + ".gguf");
  eo.n_threads = 1;
  eo.isa = Isa::kScalar;
  return eo;
}

inline std::vector<float> copy(std::span<const float> v) { return {v.begin(), v.end()}; }

// stories260K's first golden prompt and its greedy continuation: 13 tokens or more.
inline std::vector<int32_t> long_tokens() {
  const std::vector<GoldenCase> golden = load_golden("stories260K");
  std::vector<int32_t> all = golden[0].prompt_tokens;
  for (int32_t t : golden[0].greedy_tokens) all.push_back(t);
  return all;
}

// Sessions with KV chunks of `chunk` tokens (small, so short prompts span several).
inline SessionOptions chunked(int64_t chunk = 4) {
  SessionOptions so;
  so.kv_chunk_size = chunk;
  return so;
}

}  // namespace ebb::test
