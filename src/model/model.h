// A loaded model: its file, config, tokenizer and weight units.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/weights.h"

namespace ebb {

struct ModelOptions {
  // false: no unit is read; elastic restore or budget mode (which loads only
  // what its plan keeps) fills them later.
  bool load_weights = true;
  // Units hold the matrices a kernel target reads packed in that packing
  // (plan_weights); set when the engine's kernel set has packed kernels.
  bool pack_weights = false;
  // Called after each weight unit is read (from the loading thread) with the
  // bytes read so far and the total: a caller's progress display.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

class Model {
 public:
  // Parses and validates the file and reads every weight unit (see
  // ModelOptions). Throws ebb::Error naming the file and the problem.
  static std::unique_ptr<Model> load(const std::string& path, Allocator& alloc, const ModelOptions& opts = {});

  const GgufFile& file() const { return *file_; }
  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

  WeightUnit& mutable_globals_unit() { return layout_.globals; }
  const WeightLayout& layout() const { return layout_; }

  int n_layers() const { return static_cast<int>(layout_.layers.size()); }
  WeightUnit& layer_unit(int l) { return layout_.layers[l]; }
  const WeightUnit& layer_unit(int l) const { return layout_.layers[l]; }
  const WeightUnit& globals_unit() const { return layout_.globals; }

  LayerWeights layer(int l) const { return layer_weights(layout_.layers[l], layout_.layer_slots[l]); }
  // Views into an image of layer l's unit held elsewhere (streaming).
  LayerWeights layer_at(int l, const uint8_t* base) const {
    return layer_weights(layout_.layers[l], layout_.layer_slots[l], base);
  }
  GlobalWeights globals() const;

  uint64_t weight_bytes() const;  // all units, resident or not
  // The chat template text from the file (tokenizer.chat_template), or "".
  const std::string& chat_template() const { return chat_template_; }

 private:
  Model() = default;
  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  WeightLayout layout_;
  std::string chat_template_;
};

}  // namespace ebb
