// Streaming weight layers that a memory limit keeps out of RAM: the forward
// pass gets each non-resident layer from one of two window slots, read with
// direct I/O while the previous layer computes (issue 5, "one engine, two
// regimes"). Raising the limit lets the next request restore everything.
#include <algorithm>

#include "memory/elastic.h"
#include "platform/error.h"

namespace ebb {

uint64_t ElasticMemory::max_unit_bytes() const {
  uint64_t m = 0;
  for (int l = 0; l < model_.n_layers(); ++l) m = std::max(m, model_.layer_unit(l).bytes());
  return m;
}

int ElasticMemory::next_streamed_after(int layer) const {
  for (int l = layer + 1; l < model_.n_layers(); ++l)
    if (!model_.layer_unit(l).resident()) return l;
  return -1;
}

void ElasticMemory::stream_submit(StreamSlot& s, int layer) {
  if (s.buf.empty()) s.buf = alloc_.allocate(max_unit_bytes(), MemCategory::kIoBuffer, kDirectAlign);
  const WeightUnit& u = model_.layer_unit(layer);
  std::vector<IoRequest>& reqs = stream_reqs_;
  reqs.clear();
  for (const UnitSegment& g : u.segments())
    reqs.push_back({gguf_.fd(), g.file_offset, s.buf.as<uint8_t>() + g.unit_offset, g.bytes, false});
  s.layer = layer;
  s.ticket = io_->submit(reqs, model_.file().path());
  s.pending = true;
}

void ElasticMemory::stream_wait(StreamSlot& s) {
  // The slot counts as pending until its read is waited for and checked: a
  // failed read empties it, so no later pass takes its unread buffer.
  try {
    io_->wait(s.ticket);
    WeightUnit& u = model_.layer_unit(s.layer);
    u.convert_slots(s.buf.as<uint8_t>());
    weight_crc_.verify(s.layer, u, s.buf.as<uint8_t>(), model_.file().path());
  } catch (...) {
    s.pending = false;
    s.in_use = false;
    s.layer = -1;
    throw;
  }
  s.pending = false;
}

void ElasticMemory::stream_forget(StreamSlot& s) {
  if (s.pending) {
    try {
      io_->wait(s.ticket);
    } catch (const Error&) {
      // Its layer is not used: the error no longer matters.
    }
  }
  s.pending = false;
  s.in_use = false;
  s.layer = -1;
}

// Keeps the free slot busy with the next layer the pass will need.
void ElasticMemory::stream_prefetch() {
  int after = -1;
  for (const StreamSlot& s : stream_)
    if (s.in_use || s.pending) after = std::max(after, s.layer);
  const int next = next_streamed_after(after);
  if (next < 0) return;
  for (const StreamSlot& s : stream_)
    if (s.layer == next) return;
  for (StreamSlot& s : stream_)
    if (!s.in_use && !s.pending) {
      stream_submit(s, next);
      return;
    }
}

void ElasticMemory::stop_streaming() {
  for (StreamSlot& s : stream_) {
    stream_forget(s);
    s = StreamSlot{};
  }
  streaming_ = false;
}

void ElasticMemory::begin_pass(std::span<const int32_t>) {
  if (!streaming_) return;
  // The descriptor held since load is read, so a file replaced or deleted
  // under it is still fine; a file rewritten in place is not (and one
  // rewritten with its mtime kept fails the layer checksums).
  if (!descriptor_unchanged(gguf_.fd(), model_.file())) {
    throw Error(model_.file().path() +
                ": the model file changed on disk since it was loaded; its weights cannot be streamed "
                "(reload the model; the session's tokens are kept)");
  }
  for (StreamSlot& s : stream_) s.in_use = false;
  // The pass starts at layer 0: the slots should hold the first streamed layers.
  const int first = next_streamed_after(-1);
  bool have_first = false;
  for (const StreamSlot& s : stream_) have_first = have_first || s.layer == first;
  if (!have_first)
    for (StreamSlot& s : stream_) stream_forget(s);
  stream_prefetch();
  stream_prefetch();
}

EvictReport ElasticMemory::set_memory_limit(uint64_t bytes) {
  opts_.memory_limit = bytes;
  restore_pending_ = true;
  EvictReport r;
  const uint64_t in_ram = footprint().in_ram();
  if (bytes > 0 && in_ram > bytes) r = evict(in_ram - bytes);
  return r;
}

void ElasticMemory::release_layer(int l) {
  for (StreamSlot& s : stream_)
    if (s.in_use && s.layer == l) s.in_use = false;
  if (streaming_) stream_prefetch();
}

}  // namespace ebb
