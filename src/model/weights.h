// Weight units (DESIGN.md "The unit of memory"): one per transformer layer,
// holding all of that layer's tensors in a single aligned allocation, plus a
// globals unit (token embedding, output norm, output head). A unit knows the
// byte ranges of its tensors in the GGUF, so it can be dropped and read back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/tensor.h"
#include "platform/allocator.h"

namespace ebb {

class GgufFile;
struct ModelConfig;

// One tensor's place in the file and in its unit.
struct TensorSlot {
  std::string name;
  DType file_type = DType::kF32;  // as stored in the file
  DType type = DType::kF32;       // as held in the unit (small 1-D tensors become F32)
  std::vector<int64_t> dims;      // ne0 first
  uint64_t file_offset = 0;       // absolute offset in the GGUF
  uint64_t file_bytes = 0;
  uint64_t unit_offset = 0;  // offset inside the unit's allocation
  uint64_t unit_bytes = 0;
  // A 2-D slot's rows as the unit holds them: packed by convert_slots()
  // when the model was planned for a kernel target that packs (the file's
  // bytes, an mmap or a streaming window, are always kRows).
  Packing packing = Packing::kRows;
};

// A contiguous run of the file mirrored into the unit: file bytes
// [file_offset, file_offset + bytes) sit at unit bytes [unit_offset, ...).
// Offsets and sizes are multiples of 4 KiB, so a segment is one direct read
// straight into the unit (DESIGN.md: restoring a unit is a direct read).
struct UnitSegment {
  uint64_t file_offset = 0;
  uint64_t unit_offset = 0;
  uint64_t bytes = 0;
};

class WeightUnit {
 public:
  static constexpr uint64_t kPage = 4096;

  WeightUnit(int layer, MemCategory category) : layer_(layer), category_(category) {}

  // Adds a tensor to the unit's layout; returns its slot index.
  int add(const TensorSlot& slot);

  int layer() const { return layer_; }  // -1 for the globals unit
  uint64_t bytes() const { return bytes_; }
  bool resident() const { return loaded_; }
  const std::vector<TensorSlot>& slots() const { return slots_; }
  const std::vector<UnitSegment>& segments() const { return segments_; }

  // Allocates the unit and reads every tensor from the file (buffered reads;
  // used at start-up). Throws on I/O errors; the unit stays non-resident then.
  void load(const GgufFile& file, Allocator& alloc);

  // Restoring in two steps: allocate() gives the 4 KiB-aligned block that
  // the segments are read into (by direct I/O, at base() + unit_offset);
  // finish_load() widens the converted slots and makes the unit resident.
  void allocate(Allocator& alloc);
  uint8_t* base() { return buffer_.as<uint8_t>(); }
  void finish_load();

  // Frees the unit's memory (its backing store is the GGUF itself).
  void release() {
    loaded_ = false;
    buffer_.reset();
  }

  // With `base` the views point into a copy of the unit held elsewhere (a
  // streaming buffer of bytes() bytes, read by segments, then convert_slots()).
  const void* data(int slot, const uint8_t* base = nullptr) const;
  WeightView matrix(int slot, const uint8_t* base = nullptr) const;  // a 2-D slot as a weight view
  const float* vector(int slot, const uint8_t* base = nullptr) const;  // a 1-D F32 slot; nullptr for slot -1
  // Turns a unit image at `base`, as read from the file, into what the views
  // expect: widens the F16/BF16 1-D slots to F32 and packs the packed slots.
  void convert_slots(uint8_t* base) const;
  // Packs the resident unit's matrices for a kernel target that packs
  // (packing_for), in place, as a load planned with pack would have; later
  // loads pack them too. For a unit loaded in the file's row layout (a
  // device's split: the CPU's layers). Returns the matrices packed.
  int pack_in_place();

 private:
  void relayout();

  int layer_;
  MemCategory category_;
  std::vector<TensorSlot> slots_;
  std::vector<uint64_t> raw_offset_;  // [slot] where the file bytes of each slot sit in the unit
  std::vector<UnitSegment> segments_;
  uint64_t bytes_ = 0;
  bool loaded_ = false;
  Buffer buffer_;
};

// Slot indices of one layer's tensors (-1: absent).
struct LayerLayout {
  int attn_norm = -1, attn_q = -1, attn_k = -1, attn_v = -1, attn_output = -1;
  int q_norm = -1, k_norm = -1, q_bias = -1, k_bias = -1, v_bias = -1;
  int ffn_norm = -1, ffn_gate = -1, ffn_up = -1, ffn_down = -1;
};

// Views into a resident layer unit. Pointers are valid until the unit is released.
struct LayerWeights {
  WeightView q, k, v, o;      // q: [n_embd -> q_dim], k/v: [n_embd -> kv_dim], o: [q_dim -> n_embd]
  WeightView gate, up, down;  // gate/up: [n_embd -> n_ff], down: [n_ff -> n_embd]
  const float* attn_norm = nullptr;  // [n_embd]
  const float* ffn_norm = nullptr;   // [n_embd]
  const float* q_norm = nullptr;     // [head_dim] or null
  const float* k_norm = nullptr;     // [head_dim] or null
  const float* q_bias = nullptr;     // [q_dim] or null
  const float* k_bias = nullptr;     // [kv_dim] or null
  const float* v_bias = nullptr;     // [kv_dim] or null
};

struct GlobalWeights {
  WeightView token_embd;  // [n_embd, n_vocab]: row t is token t's embedding
  WeightView output;      // [n_embd -> n_vocab] (token_embd when tied)
  const float* output_norm = nullptr;  // [n_embd]
};

// Builds the unit layouts for a model and checks every tensor's presence,
// shape and type against the config. Throws naming the tensor.
struct WeightLayout {
  std::vector<WeightUnit> layers;
  std::vector<LayerLayout> layer_slots;
  WeightUnit globals{-1, MemCategory::kGlobals};
  int token_embd = -1, output = -1, output_norm = -1;
};
// With pack, matrices a kernel target can read packed get their packing
// (packing_for) in the units.
WeightLayout plan_weights(const GgufFile& file, const ModelConfig& config, bool pack = false);

LayerWeights layer_weights(const WeightUnit& unit, const LayerLayout& slots, const uint8_t* base = nullptr);

// A slot's tensor at `data` as a view (rows < 0: all of them). unit_image:
// data is in a unit image (convert_slots() done), so the view has the slot's
// packing; otherwise it is in the file's layout.
WeightView slot_view(const TensorSlot& s, const void* data, int64_t rows = -1, bool unit_image = false);

// A layer's views from `data(slot)`, the address of each present slot's
// tensor, wherever the caller keeps it (a unit image, an mmap, a streaming
// window: unit_image as for slot_view).
template <class DataFn>
LayerWeights layer_views(const std::vector<TensorSlot>& slots, const LayerLayout& s, DataFn data,
                         bool unit_image = false) {
  auto m = [&](int i) { return i < 0 ? WeightView{} : slot_view(slots[i], data(i), -1, unit_image); };
  auto v = [&](int i) { return i < 0 ? nullptr : static_cast<const float*>(static_cast<const void*>(data(i))); };
  LayerWeights w;
  w.q = m(s.attn_q);
  w.k = m(s.attn_k);
  w.v = m(s.attn_v);
  w.o = m(s.attn_output);
  w.gate = m(s.ffn_gate);
  w.up = m(s.ffn_up);
  w.down = m(s.ffn_down);
  w.attn_norm = v(s.attn_norm);
  w.ffn_norm = v(s.ffn_norm);
  w.q_norm = v(s.q_norm);
  w.k_norm = v(s.k_norm);
  w.q_bias = v(s.q_bias);
  w.k_bias = v(s.k_bias);
  w.v_bias = v(s.v_bias);
  return w;
}

}  // namespace ebb
