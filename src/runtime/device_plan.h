// Which of a model's layers run on a compute device: llama.cpp's -ngl N
// (the last N layers on the GPU, the first n_layers - N on the CPU), or
// -ngl auto: the most layers whose device bytes fit a budget of device
// memory. The plan is made from the layers' shapes and formats before
// anything is uploaded, counting what DeviceForward will allocate for them:
//
//   per layer  its matrices as the device holds them (a format without a
//              shader widened to F16), norms, biases replicated over the
//              micro-batch, and one session's F16 KV at the context;
//   fixed      the output norm and head, and the step's scratch (activations
//              and logits for max_batch rows).
//
// The output head goes with the device layers whenever there is one (one
// submission per step, the logits read back), where llama.cpp moves it to
// the GPU only when N > n_layers: N counts the same layers either way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace ebb {

struct DevicePlanOptions {
  // Layers on the device: -1 auto (as many as fit `budget`), N >= n_layers
  // all of them, 0 < N < n_layers the last N. (0 is the CPU: no plan.)
  int n_gpu_layers = -1;
  // Device memory auto may fill (bytes); 0: the device's reported memory
  // (BackendCaps::device_memory_bytes; when that is unknown too, all layers).
  uint64_t budget = 0;
  int64_t n_ctx = 4096;    // tokens of KV per layer the plan keeps room for (one session)
  int64_t max_batch = 64;  // rows per step (scratch, replicated biases)
};

struct DevicePlan {
  int n_layers = 0;     // the model's
  int first_layer = 0;  // layers [first_layer, n_layers) and the head on the device
  std::vector<uint64_t> layer_bytes;  // [n_layers] one layer's device bytes (weights + KV at n_ctx)
  uint64_t fixed = 0;   // output norm and head + step scratch
  uint64_t budget = 0;  // what auto filled (0: an explicit -ngl, or unknown memory)
  bool automatic = false;
  int n_device() const { return n_layers - first_layer; }
  int n_cpu() const { return first_layer; }
  uint64_t device_bytes() const;  // fixed + the device layers' bytes
  // "vulkan:0: 20 of 28 layers (1.10 GiB), 8 on the CPU" (the bytes: device_bytes()).
  std::string summary(const std::string& device_id) const;
};

// Throws ebb::Error naming the budget and what one layer needs when auto
// fits no layer, and when n_gpu_layers is 0 or below -1.
DevicePlan plan_device_layers(const Backend& be, const Model& model, const DevicePlanOptions& o);

// The bytes one layer's weights take on `be` (as DeviceForward uploads them).
uint64_t device_layer_weight_bytes(const Backend& be, const Model& model, int layer, int64_t max_batch);

}  // namespace ebb
