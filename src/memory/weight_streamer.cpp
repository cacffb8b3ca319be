#include "memory/weight_streamer.h"

#include <algorithm>
#include <cstring>

#include "memory/weight_verify.h"
#include "model/model.h"
#include "platform/checksum.h"
#include "platform/error.h"
#include "platform/fp16.h"
#include "platform/timer.h"

namespace ebb {
namespace {

// Offset >= cursor, 64-byte aligned, congruent to file_offset modulo 4 KiB:
// read_range then reads the tensor's middle straight into place.
uint64_t congruent(uint64_t cursor, uint64_t file_offset) {
  cursor = (cursor + 63) & ~uint64_t{63};
  const uint64_t want = file_offset % kDirectAlign, have = cursor % kDirectAlign;
  return cursor + (want + kDirectAlign - have) % kDirectAlign;
}

// Reads a 1-D tensor and widens F16/BF16 to F32 (as WeightUnit::load does).
void read_small(IoEngine& io, const DirectFile& f, const TensorSlot& s, uint8_t* dst) {
  if (s.type == s.file_type) {
    read_range(io, f, s.file_offset, dst, s.file_bytes);
    return;
  }
  EBB_CHECK(s.type == DType::kF32 && s.unit_bytes == s.file_bytes * 2);
  uint8_t* tmp = dst + s.file_bytes;
  read_range(io, f, s.file_offset, tmp, s.file_bytes);
  auto* out = reinterpret_cast<float*>(dst);
  for (uint64_t i = 0; i < s.file_bytes / 2; ++i) {
    uint16_t h;
    std::memcpy(&h, tmp + 2 * i, 2);
    out[i] = s.file_type == DType::kF16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
  }
}


}  // namespace

WeightStreamer::WeightStreamer(const Model& model, const BudgetPlan& plan, Allocator& alloc, StreamerOptions opts,
                               KvReplan replan)
    : model_(model),
      plan_(plan),
      alloc_(alloc),
      file_(DirectFile::open_read(model.file().path())),
      io_(IoOptions{.queue_depth = opts.queue_depth, .use_uring = opts.use_uring}),
      replan_(std::move(replan)) {
  EBB_CHECK(static_cast<int>(plan_.layers.size()) == model_.n_layers());
  k_ = plan_.window;
  build_steps();
  load_resident();
  if (plan_.slot_bytes > 0) {
    window_ = alloc_.allocate(plan_.slot_bytes * k_, MemCategory::kIoBuffer, kDirectAlign);
  }
  slots_.resize(k_);
}

WeightStreamer::~WeightStreamer() { drain(); }

void WeightStreamer::build_steps() {
  const WeightLayout& lay = model_.layout();
  steps_.assign(plan_.steps_per_pass(), Step{});
  for (int l = 0; l < model_.n_layers(); ++l) {
    uint64_t dest = 0;
    const auto& slots = lay.layers[l].slots();
    for (size_t s = 0; s < slots.size(); ++s) {
      if (plan_.layers[l].preserved[s]) continue;
      Piece p;
      p.slot = static_cast<int>(s);
      p.file_offset = slots[s].file_offset;
      p.span_offset = align_down(p.file_offset);
      p.span = direct_span(p.file_offset, slots[s].file_bytes);
      p.bytes = slots[s].file_bytes;
      p.dest = dest;
      dest += p.span;
      steps_[l].pieces.push_back(p);
    }
    EBB_CHECK(dest <= plan_.slot_bytes);
  }
  if (!plan_.head_preserved) {
    const TensorSlot& h = lay.globals.slots()[lay.output];
    const int64_t n_vocab = model_.config().n_vocab;
    const uint64_t stride = h.file_bytes / static_cast<uint64_t>(n_vocab);
    for (int part = 0; part < plan_.head_parts; ++part) {
      Step& st = steps_[model_.n_layers() + part];
      st.head_row0 = part * plan_.head_rows_per_part;
      st.head_rows = std::min(plan_.head_rows_per_part, n_vocab - st.head_row0);
      Piece p;
      p.file_offset = h.file_offset + static_cast<uint64_t>(st.head_row0) * stride;
      p.span_offset = align_down(p.file_offset);
      p.bytes = static_cast<uint64_t>(st.head_rows) * stride;
      p.span = direct_span(p.file_offset, p.bytes);
      EBB_CHECK(p.span <= plan_.slot_bytes);
      st.pieces.push_back(p);
    }
  }
}

void WeightStreamer::load_resident(const BudgetPlan* old) {
  const WeightLayout& lay = model_.layout();
  resident_.resize(model_.n_layers());
  resident_off_.resize(model_.n_layers());
  for (int l = 0; l < model_.n_layers(); ++l) {
    if (old && old->layers[l].preserved == plan_.layers[l].preserved) continue;  // in place already
    const auto& slots = lay.layers[l].slots();
    std::vector<uint64_t> off(slots.size(), 0);
    uint64_t cursor = 0;
    for (size_t s = 0; s < slots.size(); ++s) {
      if (!plan_.layers[l].preserved[s]) continue;
      off[s] = slots[s].dims.size() < 2 ? (cursor + 63) & ~uint64_t{63} : congruent(cursor, slots[s].file_offset);
      cursor = off[s] + slots[s].unit_bytes;
    }
    Buffer buf = alloc_.allocate(cursor, MemCategory::kWeights, kDirectAlign);
    auto* base = buf.as<uint8_t>();
    for (size_t s = 0; s < slots.size(); ++s) {
      if (!plan_.layers[l].preserved[s]) continue;
      if (old && old->layers[l].preserved[s]) {  // kept: moved, not read again
        std::memcpy(base + off[s], resident_[l].as<uint8_t>() + resident_off_[l][s], slots[s].unit_bytes);
      } else if (slots[s].dims.size() < 2) {
        read_small(io_, file_, slots[s], base + off[s]);
      } else {
        read_range(io_, file_, slots[s].file_offset, base + off[s], slots[s].file_bytes);
      }
    }
    resident_[l] = std::move(buf);
    resident_off_[l] = std::move(off);
  }
  const auto& g = lay.globals.slots();
  if (!old) {
    norm_ = alloc_.allocate(g[lay.output_norm].unit_bytes, MemCategory::kGlobals);
    read_small(io_, file_, g[lay.output_norm], norm_.as<uint8_t>());
  }
  auto load_big = [&](const TensorSlot& s, Buffer& buf, uint64_t& off) {
    off = s.file_offset % kDirectAlign;
    buf = alloc_.allocate(off + s.file_bytes, MemCategory::kGlobals, kDirectAlign);
    read_range(io_, file_, s.file_offset, buf.as<uint8_t>() + off, s.file_bytes);
  };
  const bool separate_embd = lay.token_embd != lay.output;
  if (!plan_.head_preserved) head_.reset();
  if (!plan_.embd_preserved || !separate_embd) embd_.reset();
  if (plan_.embd_preserved) rows_.reset();
  if (plan_.head_preserved && head_.empty()) load_big(g[lay.output], head_, head_off_);
  if (plan_.embd_preserved && separate_embd && embd_.empty()) load_big(g[lay.token_embd], embd_, embd_off_);
  if (!plan_.embd_preserved) {
    const TensorSlot& e = g[lay.token_embd];
    row_slot_bytes_ = align_up(row_bytes(e.type, e.dims[0])) + kDirectAlign;
    const uint64_t n_rows = plan_.embd_row_bytes / row_slot_bytes_;
    EBB_CHECK(n_rows >= 1);
    if (rows_.size() != n_rows * row_slot_bytes_) {
      rows_.reset();
      rows_ = alloc_.allocate(n_rows * row_slot_bytes_, MemCategory::kIoBuffer, kDirectAlign);
    }
  }
}

void WeightStreamer::set_plan(const BudgetPlan& plan) {
  EBB_CHECK(static_cast<int>(plan.layers.size()) == model_.n_layers());
  EBB_CHECK_MSG(released_ == pass_base_, "set_plan() inside a pass");
  drain();  // the reads in flight (the next pass's first steps) target the old window
  const BudgetPlan old = plan_;
  plan_ = plan;
  k_ = plan_.window;
  build_steps();
  // Tensors that leave the resident set go first, then the window changes
  // size, so the two plans' buffers are never all held at once.
  load_resident(&old);
  if (window_.size() != plan_.slot_bytes * static_cast<uint64_t>(k_)) {
    window_.reset();
    if (plan_.slot_bytes > 0) window_ = alloc_.allocate(plan_.slot_bytes * k_, MemCategory::kIoBuffer, kDirectAlign);
  }
  slots_.assign(k_, SlotState{});
  next_issue_ = released_ = pass_base_;
}

void WeightStreamer::follow_kv() {
  if (!replan_.enabled()) return;
  const Ledger* ledger = alloc_.ledger();
  const uint64_t used = ledger ? static_cast<uint64_t>(std::max<int64_t>(ledger->bytes(MemCategory::kKvCache), 0)) : 0;
  uint64_t want = used + std::max(replan_.kv_margin, replan_.kv_step);
  if (replan_.kv_cap > 0) want = std::min(want, std::max(replan_.kv_cap, used));
  // Grow before the KV can outgrow the plan (a turn's next chunk in every
  // layer must fit); shrink only when the plan holds over twice what is
  // wanted, so a plan does not flap between two sizes.
  const bool grow = used + replan_.kv_step > plan_.kv && want > plan_.kv;
  const bool shrink = plan_.kv > 2 * want;
  if (!grow && !shrink) return;
  BudgetPlan next;
  try {
    next = replan_.plan(want);  // nothing changes when the budget cannot hold it
  } catch (const Error& e) {
    throw Error("the memory budget cannot hold the KV in use (" + std::to_string(used >> 20) +
                " MiB) and the next batch's: " + e.what());
  }
  set_plan(next);
  ++replans_;
}

uint64_t WeightStreamer::held_bytes() const {
  uint64_t t = head_.size() + embd_.size() + norm_.size() + rows_.size() + window_.size();
  for (const Buffer& b : resident_) t += b.size();
  return t;
}

void WeightStreamer::issue(int64_t g) {
  EBB_CHECK(g == next_issue_);
  ++next_issue_;
  submit_step(g);
}

void WeightStreamer::submit_step(int64_t g) {
  const Step& st = steps_[g % static_cast<int64_t>(steps_.size())];
  SlotState& ss = slots_[g % k_];
  EBB_CHECK(!ss.ticket);
  ss.step = g;
  if (st.pieces.empty()) return;
  uint8_t* base = window_.as<uint8_t>() + (g % k_) * plan_.slot_bytes;
  std::vector<IoRequest> reqs;
  reqs.reserve(st.pieces.size());
  for (const Piece& p : st.pieces) reqs.push_back({file_.fd(), p.span_offset, base + p.dest, p.span, false});
  ss.ticket = io_.submit(reqs, file_.path());
}

void WeightStreamer::top_up() {
  if (!plan_.prefetch) return;
  while (next_issue_ < released_ + k_) issue(next_issue_);
}

uint8_t* WeightStreamer::wait_step(int64_t g) {
  if (next_issue_ <= g) {  // sync mode (or the window has not reached it yet)
    EBB_CHECK(next_issue_ == g && released_ == g);
    issue(g);
  }
  SlotState& ss = slots_[g % k_];
  if (ss.step == -1 && !ss.ticket) submit_step(g);  // its read failed: acquiring it again reads it again
  EBB_CHECK(ss.step == g);
  const Step& st = steps_[g % static_cast<int64_t>(steps_.size())];
  uint8_t* slot = window_.empty() ? nullptr : window_.as<uint8_t>() + (g % k_) * plan_.slot_bytes;
  if (ss.ticket) {
    // The slot holds step g only once its read is waited for and checked: a
    // failed read or check leaves it holding no step, so nothing (this pass
    // or a later one) can take its unread buffer for step g.
    const double t0 = now_seconds();
    try {
      io_.wait(*ss.ticket);
      ss.ticket.reset();
      io_wait_s_ += now_seconds() - t0;
      for (const Piece& p : st.pieces) {
        bytes_streamed_ += p.span;
        file_.drop_cache(p.span_offset, p.span);
      }
      verify_step(g, slot);
    } catch (...) {
      ss.ticket.reset();  // a failed ticket is consumed by its wait
      ss.step = -1;
      throw;
    }
  }
  return slot;
}

void WeightStreamer::verify_step(int64_t g, const uint8_t* slot) {
  const int64_t n_steps = static_cast<int64_t>(steps_.size());
  const Step& st = steps_[g % n_steps];
  // Pass p checks step p mod n_steps (and every range's first read): the
  // checksum costs about 1/n_steps of the streamed bytes per pass, not a
  // second sweep over all of them (measured: checking every read took 27-33%
  // of the decode time of qwen3-0.6b F16 at 600 MiB on 2 cores).
  const bool rotating_turn = (g / n_steps) % n_steps == g % n_steps;
  const double t0 = now_seconds();
  for (const Piece& p : st.pieces) {
    auto it = first_crc_.find(p.file_offset);
    const bool first = it == first_crc_.end() || it->second.first != p.bytes;  // (a new plan's head parts)
    if (!first && !rotating_turn) continue;
    const uint32_t c = crc32c(slot + p.dest + (p.file_offset - p.span_offset), p.bytes);
    if (first) {
      first_crc_[p.file_offset] = {p.bytes, c};
    } else if (c != it->second.second) {
      const int64_t step = g % static_cast<int64_t>(steps_.size());
      const std::string what = p.slot >= 0 ? "layer " + std::to_string(step) + " tensor " +
                                                 model_.layer_unit(static_cast<int>(step)).slots()[p.slot].name
                                           : "output head rows " + std::to_string(st.head_row0) + "-" +
                                                 std::to_string(st.head_row0 + st.head_rows - 1);
      throw Error(weights_changed_message(file_.path(), what, c, it->second.second));
    }
  }
  verify_s_ += now_seconds() - t0;
}

void WeightStreamer::release_step(int64_t g) {
  EBB_CHECK(g == released_);
  slots_[g % k_].step = -1;
  ++released_;
  top_up();
}

void WeightStreamer::drain() {
  for (SlotState& ss : slots_) {
    if (ss.ticket) {
      try {
        io_.wait(*ss.ticket);
      } catch (const Error&) {
        // The pass that wanted it is gone; its error no longer matters.
      }
      ss.ticket.reset();
    }
    ss.step = -1;
  }
  if (rows_ticket_) {
    try {
      io_.wait(*rows_ticket_);
    } catch (const Error&) {
    }
    rows_ticket_.reset();
  }
}

void WeightStreamer::begin_pass(std::span<const int32_t> tokens) {
  // The descriptor read since load still shows the file as loaded (cheap:
  // one fstat); a rewrite that kept size, inode and mtime is left to the
  // rotating checksums (verify_step).
  if (!descriptor_unchanged(file_.fd(), model_.file())) {
    throw Error(file_.path() + ": the model file changed on disk since it was loaded; its weights cannot be "
                "streamed (reload the model)");
  }
  follow_kv();
  head_part_ = 0;
  row_index_ = 0;
  pass_tokens_.assign(tokens.begin(), tokens.end());
  top_up();
  if (!plan_.embd_preserved) {
    const WeightLayout& lay = model_.layout();
    const TensorSlot& e = lay.globals.slots()[lay.token_embd];
    const uint64_t rb = row_bytes(e.type, e.dims[0]);
    EBB_CHECK(tokens.size() * row_slot_bytes_ <= rows_.size());
    std::vector<IoRequest> reqs;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const uint64_t off = e.file_offset + static_cast<uint64_t>(tokens[i]) * rb;
      reqs.push_back({file_.fd(), align_down(off), rows_.as<uint8_t>() + i * row_slot_bytes_, direct_span(off, rb),
                      false});
    }
    rows_ticket_ = io_.submit(reqs, file_.path());
  }
}

void WeightStreamer::end_pass() {
  const int64_t end = pass_base_ + static_cast<int64_t>(steps_.size());
  if (released_ != end) {
    // The pass stopped early (an error): forget the window and start clean.
    drain();
    next_issue_ = released_ = end;
  }
  if (rows_ticket_) {  // the pass failed before reading its embedding rows
    const uint64_t tk = *rows_ticket_;
    rows_ticket_.reset();
    try {
      io_.wait(tk);
    } catch (const Error&) {
    }
  }
  pass_base_ = end;
}

LayerWeights WeightStreamer::acquire_layer(int l) {
  const int64_t g = pass_base_ + l;
  EBB_CHECK(g == released_);
  const uint8_t* win = wait_step(g);
  const WeightUnit& u = model_.layer_unit(l);
  const auto& slots = u.slots();
  std::vector<const void*> data(slots.size(), nullptr);
  for (size_t s = 0; s < slots.size(); ++s)
    if (plan_.layers[l].preserved[s]) data[s] = resident_[l].as<uint8_t>() + resident_off_[l][s];
  for (const Piece& p : steps_[l].pieces) data[p.slot] = win + p.dest + (p.file_offset - p.span_offset);
  const LayerLayout& s = model_.layout().layer_slots[l];
  return layer_views(slots, s, [&](int i) { return data[i]; });
}

void WeightStreamer::release_layer(int l) { release_step(pass_base_ + l); }

MatrixRow WeightStreamer::embedding_row(int32_t t) {
  const WeightLayout& lay = model_.layout();
  const TensorSlot& e = lay.globals.slots()[lay.token_embd];
  const uint64_t rb = row_bytes(e.type, e.dims[0]);
  const uint8_t* row = nullptr;
  if (plan_.embd_preserved) {
    const uint8_t* base = lay.token_embd == lay.output ? head_.as<uint8_t>() + head_off_ : embd_.as<uint8_t>() + embd_off_;
    row = base + static_cast<uint64_t>(t) * rb;
  } else {
    EBB_CHECK(row_index_ < pass_tokens_.size() && pass_tokens_[row_index_] == t);
    if (rows_ticket_) {
      const uint64_t tk = *rows_ticket_;
      rows_ticket_.reset();
      io_.wait(tk);
    }
    const uint64_t off = e.file_offset + static_cast<uint64_t>(t) * rb;
    row = rows_.as<uint8_t>() + row_index_ * row_slot_bytes_ + (off - align_down(off));
    ++row_index_;
  }
  return {slot_view(e, row, 1), 0};
}

GlobalWeights WeightStreamer::acquire_head() {
  const WeightLayout& lay = model_.layout();
  const TensorSlot& h = lay.globals.slots()[lay.output];
  GlobalWeights g;
  g.output_norm = norm_.as<float>();
  if (plan_.head_preserved) {
    g.output = slot_view(h, head_.as<uint8_t>() + head_off_);
    return g;
  }
  EBB_CHECK(head_part_ < plan_.head_parts);
  const int64_t step = model_.n_layers() + head_part_;
  const int64_t gs = pass_base_ + step;
  EBB_CHECK(gs == released_);
  const uint8_t* win = wait_step(gs);
  const Step& st = steps_[step];
  const Piece& p = st.pieces[0];
  g.output = slot_view(h, win + p.dest + (p.file_offset - p.span_offset), st.head_rows);
  return g;
}

void WeightStreamer::release_head() {
  if (plan_.head_preserved) return;
  release_step(pass_base_ + model_.n_layers() + head_part_);
  ++head_part_;
}

}  // namespace ebb
