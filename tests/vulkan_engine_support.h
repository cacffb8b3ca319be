// Shared by the engine-level Vulkan tests (test_vulkan_engine, _kv, _lora,
// _split): how far a device's logits are from the CPU's, and the CPU engine
// they are compared with.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

#include "runtime/engine.h"
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

}  // namespace ebb::test
