#include "model/weights.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "kernels/packing.h"
#include "model/config.h"
#include "model/gguf.h"
#include "platform/error.h"
#include "platform/fp16.h"

namespace ebb {

int WeightUnit::add(const TensorSlot& slot) {
  slots_.push_back(slot);
  relayout();
  return static_cast<int>(slots_.size()) - 1;
}

void WeightUnit::relayout() {
  // Segments: the slots' file ranges in file order, merged when the gap
  // between them is small, each widened to whole pages.
  constexpr uint64_t kMaxGap = 64 * 1024;
  std::vector<size_t> order(slots_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return slots_[a].file_offset < slots_[b].file_offset; });
  segments_.clear();
  raw_offset_.assign(slots_.size(), 0);
  std::vector<size_t> seg_of(slots_.size());
  uint64_t seg_end = 0;  // file end of the current segment's tensors
  for (size_t i : order) {
    const TensorSlot& s = slots_[i];
    const uint64_t begin = s.file_offset / kPage * kPage;
    if (segments_.empty() || s.file_offset > seg_end + kMaxGap || s.file_offset < seg_end) {
      segments_.push_back({begin, 0, 0});
      seg_end = s.file_offset;
    }
    seg_end = std::max(seg_end, s.file_offset + s.file_bytes);
    UnitSegment& g = segments_.back();
    g.bytes = (seg_end + kPage - 1) / kPage * kPage - g.file_offset;
    seg_of[i] = segments_.size() - 1;
  }
  uint64_t at = 0;
  for (UnitSegment& g : segments_) {
    g.unit_offset = at;
    at += g.bytes;
  }
  // Slots used as stored point into their segment; widened slots get their
  // own F32 area after the segments.
  for (size_t i = 0; i < slots_.size(); ++i) {
    TensorSlot& s = slots_[i];
    const UnitSegment& g = segments_[seg_of[i]];
    raw_offset_[i] = g.unit_offset + (s.file_offset - g.file_offset);
    if (s.type == s.file_type) {
      s.unit_offset = raw_offset_[i];
    } else {
      at = (at + 63) & ~uint64_t{63};
      s.unit_offset = at;
      at += s.unit_bytes;
    }
  }
  bytes_ = at;
}

void WeightUnit::allocate(Allocator& alloc) {
  loaded_ = false;
  buffer_.reset();
  buffer_ = alloc.allocate(bytes_, category_, kPage);
}

void WeightUnit::finish_load() {
  EBB_CHECK_MSG(!buffer_.empty(), "finish_load() without allocate()");
  convert_slots(buffer_.as<uint8_t>());
  loaded_ = true;
}

void WeightUnit::convert_slots(uint8_t* base) const {
  for (size_t i = 0; i < slots_.size(); ++i) {
    const TensorSlot& s = slots_[i];
    if (s.packing != Packing::kRows) pack_rows(s.packing, s.type, base + s.unit_offset, s.dims[1], s.dims[0]);
    if (s.type == s.file_type) continue;
    // A small 1-D tensor stored as F16/BF16: widen to F32.
    EBB_CHECK(s.type == DType::kF32 && s.unit_bytes == s.file_bytes * 2);
    const uint8_t* raw = base + raw_offset_[i];
    auto* out = reinterpret_cast<float*>(base + s.unit_offset);
    const size_t n = s.file_bytes / 2;
    for (size_t j = 0; j < n; ++j) {
      uint16_t h;
      std::memcpy(&h, raw + 2 * j, 2);
      out[j] = s.file_type == DType::kF16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
    }
  }
}

int WeightUnit::pack_in_place() {
  EBB_CHECK_MSG(resident(), "pack_in_place() on a unit that is not resident");
  int n = 0;
  for (TensorSlot& s : slots_) {
    if (s.dims.size() != 2 || s.packing != Packing::kRows) continue;
    const Packing p = packing_for(s.type, s.dims[1], s.dims[0]);
    if (p == Packing::kRows) continue;
    pack_rows(p, s.type, buffer_.as<uint8_t>() + s.unit_offset, s.dims[1], s.dims[0]);
    s.packing = p;
    ++n;
  }
  return n;
}

void WeightUnit::load(const GgufFile& file, Allocator& alloc) {
  allocate(alloc);
  try {
    for (const UnitSegment& g : segments_) {
      // The last page may run past the end of the file.
      const uint64_t n = std::min(g.bytes, file.file_size() - std::min(file.file_size(), g.file_offset));
      file.read(g.file_offset, base() + g.unit_offset, n);
      std::memset(base() + g.unit_offset + n, 0, g.bytes - n);
    }
  } catch (...) {
    release();
    throw;
  }
  finish_load();
}

const void* WeightUnit::data(int slot, const uint8_t* base) const {
  EBB_CHECK(slot >= 0 && slot < static_cast<int>(slots_.size()));
  if (base) return base + slots_[slot].unit_offset;
  EBB_CHECK_MSG(resident(), "weight unit used while not resident");
  return buffer_.as<uint8_t>() + slots_[slot].unit_offset;
}

WeightView WeightUnit::matrix(int slot, const uint8_t* base) const {
  if (slot < 0) return {};
  return slot_view(slots_[slot], data(slot, base), -1, true);
}

const float* WeightUnit::vector(int slot, const uint8_t* base) const {
  if (slot < 0) return nullptr;
  return static_cast<const float*>(data(slot, base));
}

namespace {

struct Planner {
  const GgufFile& file;
  const ModelConfig& cfg;
  bool pack;
  std::set<std::string> used;

  std::string where(const std::string& name) const {
    return std::filesystem::path(file.path()).filename().string() + ": tensor '" + name + "'";
  }

  static std::string dims_str(const std::vector<int64_t>& d) {
    std::string s = "[";
    for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
    return s + "]";
  }

  // Adds tensor `name` to `unit` after checking its shape. Returns -1 when the
  // tensor is optional and absent.
  int add(WeightUnit& unit, const std::string& name, std::vector<int64_t> shape, bool required) {
    const GgufTensorInfo* t = file.find_tensor(name);
    if (!t) {
      if (required) {
        throw Error(std::filesystem::path(file.path()).filename().string() + ": missing tensor '" + name +
                    "' required by architecture " + cfg.arch_name);
      }
      return -1;
    }
    if (t->dims != shape) {
      throw Error(where(name) + " has shape " + dims_str(t->dims) + ", expected " + dims_str(shape));
    }
    const TypeInfo& info = type_info(t->type);
    TensorSlot s;
    s.name = name;
    s.file_type = t->type;
    s.type = t->type;
    s.dims = t->dims;
    s.file_offset = t->file_offset;
    s.file_bytes = t->n_bytes;
    s.unit_bytes = t->n_bytes;
    if (shape.size() == 1) {
      // Norm weights and biases are used as F32.
      if (t->type == DType::kF16 || t->type == DType::kBF16) {
        s.type = DType::kF32;
        s.unit_bytes = t->n_bytes * 2;
      } else if (t->type != DType::kF32) {
        throw Error(where(name) + " has type " + std::string(info.name) +
                    "; 1-D tensors must be F32, F16 or BF16");
      }
    } else if (!info.computable) {
      throw Error(where(name) + " has type " + std::string(info.name) +
                  ", which ebb cannot compute with (supported: " + computable_type_names() + ")");
    } else if (pack) {
      s.packing = packing_for(s.type, s.dims[1], s.dims[0]);
    }
    used.insert(name);
    return unit.add(s);
  }
};

}  // namespace

WeightLayout plan_weights(const GgufFile& file, const ModelConfig& c, bool pack) {
  Planner p{file, c, pack, {}};
  WeightLayout out;
  out.token_embd = p.add(out.globals, "token_embd.weight", {c.n_embd, c.n_vocab}, true);
  out.output_norm = p.add(out.globals, "output_norm.weight", {c.n_embd}, true);
  out.output = c.tied_output ? out.token_embd : p.add(out.globals, "output.weight", {c.n_embd, c.n_vocab}, true);
  const bool bias = c.arch == Arch::kQwen2;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    WeightUnit unit(static_cast<int>(l), MemCategory::kWeights);
    LayerLayout s;
    const std::string b = "blk." + std::to_string(l) + ".";
    s.attn_norm = p.add(unit, b + "attn_norm.weight", {c.n_embd}, true);
    s.attn_q = p.add(unit, b + "attn_q.weight", {c.n_embd, c.q_dim()}, true);
    s.attn_k = p.add(unit, b + "attn_k.weight", {c.n_embd, c.kv_dim()}, true);
    s.attn_v = p.add(unit, b + "attn_v.weight", {c.n_embd, c.kv_dim()}, true);
    s.attn_output = p.add(unit, b + "attn_output.weight", {c.q_dim(), c.n_embd}, true);
    s.q_bias = p.add(unit, b + "attn_q.bias", {c.q_dim()}, bias);
    s.k_bias = p.add(unit, b + "attn_k.bias", {c.kv_dim()}, bias);
    s.v_bias = p.add(unit, b + "attn_v.bias", {c.kv_dim()}, bias);
    s.q_norm = p.add(unit, b + "attn_q_norm.weight", {c.head_dim}, c.qk_norm);
    s.k_norm = p.add(unit, b + "attn_k_norm.weight", {c.head_dim}, c.qk_norm);
    s.ffn_norm = p.add(unit, b + "ffn_norm.weight", {c.n_embd}, true);
    s.ffn_gate = p.add(unit, b + "ffn_gate.weight", {c.n_embd, c.n_ff}, true);
    s.ffn_up = p.add(unit, b + "ffn_up.weight", {c.n_embd, c.n_ff}, true);
    s.ffn_down = p.add(unit, b + "ffn_down.weight", {c.n_ff, c.n_embd}, true);
    out.layers.push_back(std::move(unit));
    out.layer_slots.push_back(s);
  }
  // A tensor the architecture does not use means a model ebb would run wrongly.
  for (const GgufTensorInfo& t : file.tensors()) {
    if (t.name == "rope_freqs.weight") continue;  // read into the config (read_model_config)
    if (p.used.count(t.name) == 0) {
      throw Error(p.where(t.name) + " is not used by architecture " + c.arch_name + " (unsupported tensor)");
    }
  }
  return out;
}

LayerWeights layer_weights(const WeightUnit& u, const LayerLayout& s, const uint8_t* b) {
  return layer_views(u.slots(), s, [&](int i) { return u.data(i, b); }, true);
}

WeightView slot_view(const TensorSlot& s, const void* data, int64_t rows, bool unit_image) {
  WeightView w;
  w.type = s.type;
  w.cols = s.dims[0];
  w.rows = rows >= 0 ? rows : (s.dims.size() > 1 ? s.dims[1] : 1);
  w.data = data;
  w.row_stride = row_bytes(s.type, w.cols);
  if (unit_image) {
    EBB_CHECK_MSG(s.packing == Packing::kRows || w.rows == (s.dims.size() > 1 ? s.dims[1] : 1),
                  "a packed matrix viewed in part");
    w.packing = s.packing;
  }
  return w;
}

}  // namespace ebb
