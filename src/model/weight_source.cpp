#include "model/weight_source.h"

#include "model/model.h"

namespace ebb {

LayerWeights ResidentWeights::acquire_layer(int l) { return model_.layer(l); }

WeightView ResidentWeights::embedding_row(int32_t t) {
  WeightView e = model_.globals().token_embd;
  WeightView row = e;
  row.rows = 1;
  row.data = static_cast<const uint8_t*>(e.data) + static_cast<uint64_t>(t) * e.row_stride;
  return row;
}

GlobalWeights ResidentWeights::acquire_head() {
  GlobalWeights g = model_.globals();
  g.token_embd = {};
  return g;
}

}  // namespace ebb
