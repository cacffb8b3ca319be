#include "model/weight_source.h"

#include "model/model.h"

namespace ebb {

LayerWeights ResidentWeights::acquire_layer(int l) { return model_.layer(l); }

MatrixRow ResidentWeights::embedding_row(int32_t t) { return {model_.globals().token_embd, t}; }

GlobalWeights ResidentWeights::acquire_head() {
  GlobalWeights g = model_.globals();
  g.token_embd = {};
  return g;
}

}  // namespace ebb
