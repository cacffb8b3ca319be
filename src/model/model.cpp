#include "model/model.h"

#include <filesystem>

#include "platform/error.h"

namespace ebb {

std::unique_ptr<Model> Model::load(const std::string& path, Allocator& alloc, const ModelOptions& opts) {
  std::unique_ptr<Model> m(new Model());
  m->file_ = GgufFile::open(path);
  m->config_ = read_model_config(*m->file_);
  m->tokenizer_ = Tokenizer::from_gguf(*m->file_);
  if (m->tokenizer_->n_vocab() > m->config_.n_vocab) {
    throw Error(std::filesystem::path(path).filename().string() + ": tokenizer has " +
                std::to_string(m->tokenizer_->n_vocab()) + " tokens but token_embd.weight has " +
                std::to_string(m->config_.n_vocab) + " rows");
  }
  m->chat_template_ = m->file_->get_string("tokenizer.chat_template").value_or("");
  m->layout_ = plan_weights(*m->file_, m->config_, opts.pack_weights);
  if (!opts.load_weights) return m;
  const uint64_t total = m->weight_bytes();
  uint64_t done = 0;
  auto load = [&](WeightUnit& u) {
    u.load(*m->file_, alloc);
    done += u.bytes();
    if (opts.progress) opts.progress(done, total);
  };
  load(m->layout_.globals);
  for (WeightUnit& u : m->layout_.layers) load(u);
  return m;
}

GlobalWeights Model::globals() const {
  GlobalWeights g;
  g.token_embd = layout_.globals.matrix(layout_.token_embd);
  g.output = layout_.globals.matrix(layout_.output);
  g.output_norm = layout_.globals.vector(layout_.output_norm);
  return g;
}

uint64_t Model::weight_bytes() const {
  uint64_t b = layout_.globals.bytes();
  for (const WeightUnit& u : layout_.layers) b += u.bytes();
  return b;
}

}  // namespace ebb
