#include "runtime/device_plan.h"

#include <cstdio>

#include "kernels/tensor.h"
#include "platform/error.h"

namespace ebb {
namespace {

constexpr uint64_t kAlign = 256;  // DeviceForward aligns each piece of a layer's buffer to this

uint64_t aligned(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// A matrix as the device holds it: its own rows when the device multiplies
// its format, else widened to F16 (DeviceForward::stage_matrix).
uint64_t matrix_bytes(const Backend& be, DType type, int64_t rows, int64_t cols) {
  if (be.supports(OpKind::kMatmul, type)) return aligned(row_bytes(type, cols) * static_cast<uint64_t>(rows));
  return aligned(static_cast<uint64_t>(rows * cols) * 2);
}

std::string gib(uint64_t b) {
  char buf[32];
  if (b >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / double(uint64_t{1} << 30));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(b) / double(uint64_t{1} << 20));
  }
  return buf;
}

}  // namespace

uint64_t device_layer_weight_bytes(const Backend& be, const Model& model, int layer, int64_t max_batch) {
  uint64_t t = 0;
  for (const TensorSlot& s : model.layer_unit(layer).slots()) {
    if (s.dims.size() == 2) {
      t += matrix_bytes(be, s.type, s.dims[1], s.dims[0]);
    } else {
      // Norms as F32; biases replicated over the micro-batch (one add per step).
      const bool bias = s.name.find("bias") != std::string::npos;
      t += aligned(static_cast<uint64_t>(s.dims.empty() ? 0 : s.dims[0]) * sizeof(float) *
                   static_cast<uint64_t>(bias ? max_batch : 1));
    }
  }
  return t;
}

uint64_t DevicePlan::device_bytes() const {
  uint64_t t = fixed;
  for (int l = first_layer; l < n_layers; ++l) t += layer_bytes[l];
  return t;
}

std::string DevicePlan::summary(const std::string& device_id) const {
  std::string s = device_id + ": " + std::to_string(n_device()) + " of " + std::to_string(n_layers) + " layers (" +
                  gib(device_bytes()) + ")";
  s += n_cpu() > 0 ? ", " + std::to_string(n_cpu()) + " on the CPU" : ", none on the CPU";
  if (automatic && budget > 0) s += " (-ngl auto within " + gib(budget) + ")";
  return s;
}

DevicePlan plan_device_layers(const Backend& be, const Model& model, const DevicePlanOptions& o) {
  const ModelConfig& c = model.config();
  const std::string& id = be.info().id;
  if (o.n_gpu_layers == 0 || o.n_gpu_layers < -1)
    throw Error("-ngl " + std::to_string(o.n_gpu_layers) + ": a device plan needs at least one layer there");
  DevicePlan p;
  p.n_layers = model.n_layers();
  const uint64_t kv_layer = 2 * static_cast<uint64_t>(std::max<int64_t>(o.n_ctx, 1) * c.kv_dim()) * 2;  // K and V, F16
  p.layer_bytes.resize(static_cast<size_t>(p.n_layers));
  for (int l = 0; l < p.n_layers; ++l) p.layer_bytes[l] = device_layer_weight_bytes(be, model, l, o.max_batch) + kv_layer;
  const GlobalWeights g = model.globals();
  const uint64_t scratch = static_cast<uint64_t>(o.max_batch) * sizeof(float) *
                           static_cast<uint64_t>(2 * c.n_embd + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * c.n_ff +
                                                 c.rope_dim + c.n_vocab);
  p.fixed = matrix_bytes(be, g.output.type, g.output.rows, g.output.cols) + aligned(c.n_embd * sizeof(float)) + scratch;
  if (o.n_gpu_layers > 0) {
    p.first_layer = std::max(0, p.n_layers - o.n_gpu_layers);
    return p;
  }
  p.automatic = true;
  p.budget = o.budget > 0 ? o.budget : be.info().caps.device_memory_bytes;
  if (p.budget == 0) return p;  // unknown memory: all layers (a failed allocation names the device)
  // The last layers first (llama.cpp's order), as many as fit.
  uint64_t used = p.fixed;
  int first = p.n_layers;
  while (first > 0 && used <= p.budget && p.layer_bytes[first - 1] <= p.budget - used) used += p.layer_bytes[--first];
  if (first == p.n_layers) {
    throw Error("-ngl auto: " + gib(p.budget) + " of " + id + " memory" + (o.budget > 0 ? " (--device-memory)" : "") +
                " holds no layer: the output head and scratch take " + gib(p.fixed) + " and a layer " +
                gib(p.layer_bytes.back()) + " (weights and KV for " + std::to_string(o.n_ctx) +
                " tokens); give the device more with --device-memory, or run on the CPU (-ngl 0)");
  }
  p.first_layer = first;
  return p;
}

}  // namespace ebb
