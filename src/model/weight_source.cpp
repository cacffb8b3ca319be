#include "model/weight_source.h"

#include "model/model.h"

namespace ebb {

LayerWeights ResidentWeights::acquire_layer(int l) { return model_.layer(l); }

MatrixRow ResidentWeights::embedding_row(int32_t t) { return {model_.globals().token_embd, t}; }

LayerWeights layer_shapes(const Model& model, int l) {
  const WeightLayout& lay = model.layout();
  return layer_views(lay.layers[static_cast<size_t>(l)].slots(), lay.layer_slots[static_cast<size_t>(l)],
                     [](int) -> const void* { return nullptr; }, /*unit_image=*/true);
}

WeightView head_shape(const Model& model) {
  const WeightLayout& lay = model.layout();
  return slot_view(lay.globals.slots()[static_cast<size_t>(lay.output)], nullptr, -1, /*unit_image=*/true);
}

GlobalWeights ResidentWeights::acquire_head() {
  GlobalWeights g = model_.globals();
  g.token_embd = {};
  return g;
}

}  // namespace ebb
