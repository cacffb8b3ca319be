#include "memory/budget_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "model/config.h"
#include "platform/direct_io.h"
#include "platform/error.h"

namespace ebb {
namespace {

constexpr uint64_t kHeadPartMin = 8ull << 20;  // smallest row range of a streamed head

uint64_t round64(uint64_t b) { return (b + 63) & ~uint64_t{63}; }

std::string mib(uint64_t b) {
  char buf[32];
  if (b < (1u << 20)) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(1 << 20));
  return buf;
}

// The 2-D tensor kinds of a layer, as slot indices into its unit.
struct Kinds {
  std::vector<int> attn, ffn;  // slot indices (same kinds in every layer)
};

Kinds kinds_of(const LayerLayout& s) {
  Kinds k;
  for (int i : {s.attn_q, s.attn_k, s.attn_v, s.attn_output})
    if (i >= 0) k.attn.push_back(i);
  for (int i : {s.ffn_gate, s.ffn_up, s.ffn_down})
    if (i >= 0) k.ffn.push_back(i);
  return k;
}

struct Planner {
  const WeightLayout& layout;
  const ModelConfig& cfg;
  int n_layers;

  // A preserved 2-D tensor sits at an offset congruent to its file offset
  // modulo 4 KiB, so it is read straight into place with direct I/O.
  uint64_t cost(int l, int slot) const { return round64(layout.layers[l].slots()[slot].unit_bytes) + kDirectAlign; }
  uint64_t kind_total(int slot) const {
    uint64_t t = 0;
    for (int l = 0; l < n_layers; ++l) t += cost(l, slot);
    return t;
  }
  const TensorSlot& head_slot() const { return layout.globals.slots()[layout.output]; }

  // Preserves `slot` in every layer where it still fits (FlexInfer's "one by one").
  void greedy_kind(BudgetPlan& p, int slot, uint64_t& avail) const {
    for (int l = 0; l < n_layers; ++l) {
      if (p.layers[l].preserved[slot]) continue;
      if (cost(l, slot) <= avail) {
        p.layers[l].preserved[slot] = true;
        avail -= cost(l, slot);
      }
    }
  }
  void all_layers(BudgetPlan& p, int slot, uint64_t& avail) const {
    for (int l = 0; l < n_layers; ++l) p.layers[l].preserved[slot] = true;
    avail -= kind_total(slot);
  }

  // Fills p.layers[].preserved for the 2-D tensors with `avail` bytes.
  void choose_layers(BudgetPlan& p, uint64_t avail) const {
    const Kinds k = kinds_of(layout.layer_slots[0]);
    std::vector<int> attn = k.attn;  // smallest first: most tensors for the bytes
    std::stable_sort(attn.begin(), attn.end(), [&](int a, int b) { return kind_total(a) < kind_total(b); });
    switch (p.system) {
      case BudgetSystem::kEbb:
      case BudgetSystem::kSync: {
        // Algorithm 1: all FFN if they fit with half the attention tensors;
        // else as many whole FFN kinds (across all layers) as fit, keeping
        // one back; then attention tensors one by one.
        uint64_t ffn_all = 0, attn_all = 0;
        for (int s : k.ffn) ffn_all += kind_total(s);
        for (int s : k.attn) attn_all += kind_total(s);
        if (avail >= ffn_all + attn_all / 2) {
          for (int s : k.ffn) all_layers(p, s, avail);
        } else {
          for (size_t i = 0; i + 1 < k.ffn.size() && kind_total(k.ffn[i]) <= avail; ++i) all_layers(p, k.ffn[i], avail);
        }
        for (int s : attn) greedy_kind(p, s, avail);
        break;
      }
      case BudgetSystem::kAttnFirst:
        for (int s : attn) greedy_kind(p, s, avail);
        for (int s : k.ffn) greedy_kind(p, s, avail);
        break;
      case BudgetSystem::kFfnFirst:
        for (int s : k.ffn) greedy_kind(p, s, avail);
        for (int s : attn) greedy_kind(p, s, avail);
        break;
      case BudgetSystem::kUnbalanced:
        for (int l = 0; l < n_layers; ++l) {
          const auto& slots = layout.layers[l].slots();
          for (int s = 0; s < static_cast<int>(slots.size()); ++s) {
            if (slots[s].dims.size() < 2) continue;
            if (cost(l, s) > avail) return;  // layer order: stop at the first that does not fit
            p.layers[l].preserved[s] = true;
            avail -= cost(l, s);
          }
        }
        break;
      case BudgetSystem::kPrefetch:
      case BudgetSystem::kMmap: break;
    }
  }

  // Per-layer byte counts, head parts and the window slot size of a plan.
  void finish(BudgetPlan& p) const {
    uint64_t s_layers = 0;
    for (int l = 0; l < n_layers; ++l) {
      LayerPlan& lp = p.layers[l];
      lp.resident_bytes = lp.streamed_bytes = lp.window_bytes = 0;
      const auto& slots = layout.layers[l].slots();
      for (size_t s = 0; s < slots.size(); ++s) {
        if (lp.preserved[s] && slots[s].dims.size() >= 2) {
          lp.resident_bytes += cost(l, static_cast<int>(s));
        } else if (lp.preserved[s]) {
          continue;  // 1-D: counted in small_bytes
        } else {
          lp.streamed_bytes += slots[s].file_bytes;
          lp.window_bytes += direct_span(slots[s].file_offset, slots[s].file_bytes);
        }
      }
      s_layers = std::max(s_layers, lp.window_bytes);
    }
    p.slot_bytes = s_layers;
    p.head_parts = 0;
    p.head_rows_per_part = 0;
    if (!p.head_preserved) {
      const TensorSlot& h = head_slot();
      const uint64_t stride = h.file_bytes / static_cast<uint64_t>(cfg.n_vocab);
      const uint64_t cap = std::max(s_layers, std::min(kHeadPartMin, direct_span(h.file_offset, h.file_bytes)));
      int64_t rows = cap > 2 * kDirectAlign ? static_cast<int64_t>((cap - 2 * kDirectAlign) / stride) : 1;
      rows = std::clamp<int64_t>(rows, 1, cfg.n_vocab);
      p.head_rows_per_part = rows;
      p.head_parts = static_cast<int>((cfg.n_vocab + rows - 1) / rows);
      p.slot_bytes = std::max(p.slot_bytes, align_up(rows * stride) + kDirectAlign);
    }
  }
};

}  // namespace

std::string_view budget_system_name(BudgetSystem s) {
  switch (s) {
    case BudgetSystem::kEbb: return "ebb";
    case BudgetSystem::kAttnFirst: return "attn-first";
    case BudgetSystem::kFfnFirst: return "ffn-first";
    case BudgetSystem::kUnbalanced: return "unbalanced";
    case BudgetSystem::kSync: return "sync";
    case BudgetSystem::kPrefetch: return "prefetch";
    case BudgetSystem::kMmap: return "mmap";
  }
  return "?";
}

std::optional<BudgetSystem> parse_budget_system(std::string_view name) {
  for (BudgetSystem s : {BudgetSystem::kEbb, BudgetSystem::kAttnFirst, BudgetSystem::kFfnFirst,
                         BudgetSystem::kUnbalanced, BudgetSystem::kSync, BudgetSystem::kPrefetch, BudgetSystem::kMmap}) {
    if (budget_system_name(s) == name) return s;
  }
  return std::nullopt;
}

uint64_t parse_size(std::string_view text, uint64_t model_bytes) {
  const std::string t(text);
  auto bad = [&](const char* why) { return Error("memory size '" + t + "': " + why); };
  size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  if (i == 0) throw bad("expected a number, e.g. 600MiB, 1.5GiB, 2G or 40%");
  double v = 0;
  try {
    v = std::stod(t.substr(0, i));
  } catch (const std::exception&) {
    throw bad("not a number");
  }
  std::string unit = t.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 0;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "%") mult = model_bytes / 100.0;
  else if (unit == "k" || unit == "kib") mult = 1024.0;
  else if (unit == "m" || unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "gb") mult = 1e9;
  else throw bad("unknown unit (use B, KiB, MiB, GiB, K, M, G, KB, MB, GB or %)");
  const double bytes = v * mult;
  if (!(bytes >= 1) || bytes > 1e18) throw bad("out of range");
  return static_cast<uint64_t>(bytes);
}

uint64_t direct_span(uint64_t offset, uint64_t bytes) { return align_up(offset + bytes) - align_down(offset); }

uint64_t BudgetPlan::resident_weight_bytes() const {
  uint64_t t = 0;
  for (const LayerPlan& l : layers) t += l.resident_bytes;
  if (head_preserved) t += round64(head_bytes) + kDirectAlign;
  if (embd_preserved && embd_bytes) t += round64(embd_bytes) + kDirectAlign;
  return t;  // the 1-D tensors are in small_bytes
}

uint64_t BudgetPlan::streamed_per_token() const {
  uint64_t t = 0;
  for (const LayerPlan& l : layers) t += l.streamed_bytes;
  if (!head_preserved) t += head_bytes;
  return t;
}

uint64_t BudgetPlan::total() const {
  return kv + scratch + small_bytes + embd_row_bytes + resident_weight_bytes() + window_bytes();
}

BudgetPlan plan_budget(const WeightLayout& layout, const ModelConfig& cfg, const BudgetOptions& opts,
                       const BudgetOverheads& ov) {
  if (opts.window < 1) throw Error("prefetch window must be at least 1 step, got " + std::to_string(opts.window));
  Planner pl{layout, cfg, static_cast<int>(layout.layers.size())};
  BudgetPlan base;
  base.system = opts.system;
  base.budget = opts.budget;
  base.prefetch = opts.system != BudgetSystem::kSync;
  base.window = base.prefetch ? opts.window : 1;
  base.kv = ov.kv;
  base.scratch = ov.scratch;
  base.layers.resize(layout.layers.size());
  for (int l = 0; l < pl.n_layers; ++l) {
    const auto& slots = layout.layers[l].slots();
    base.layers[l].preserved.assign(slots.size(), false);
    for (size_t s = 0; s < slots.size(); ++s) {
      if (slots[s].dims.size() < 2) {
        base.layers[l].preserved[s] = true;
        base.small_bytes += round64(slots[s].unit_bytes);
      }
    }
  }
  base.small_bytes += round64(layout.globals.slots()[layout.output_norm].unit_bytes);
  base.head_bytes = pl.head_slot().file_bytes;
  const TensorSlot& embd = layout.globals.slots()[layout.token_embd];
  base.embd_bytes = cfg.tied_output ? 0 : embd.file_bytes;
  const uint64_t embd_row = embd.file_bytes / static_cast<uint64_t>(cfg.n_vocab);
  const uint64_t row_buf = static_cast<uint64_t>(ov.max_batch) * (align_up(embd_row) + kDirectAlign);
  const uint64_t fixed = base.kv + base.scratch + base.small_bytes;

  // Everything fits: no streaming at all.
  BudgetPlan full = base;
  for (LayerPlan& lp : full.layers) lp.preserved.assign(lp.preserved.size(), true);
  full.head_preserved = full.embd_preserved = true;
  pl.finish(full);
  if (opts.budget >= full.total() && opts.system != BudgetSystem::kPrefetch) return full;

  // The minimum: nothing but the 1-D tensors resident, every step streamed.
  BudgetPlan empty = base;
  empty.embd_row_bytes = row_buf;
  pl.finish(empty);
  if (opts.budget < empty.total()) {
    throw Error("memory budget " + mib(opts.budget) + " is below the minimum " + mib(empty.total()) +
                " for this model: norms " + mib(empty.small_bytes) + " + KV " + mib(empty.kv) + " + scratch " +
                mib(empty.scratch) + " + embedding rows " + mib(row_buf) + " + window " +
                std::to_string(empty.window) + " x " + mib(empty.slot_bytes));
  }
  if (opts.system == BudgetSystem::kPrefetch) return empty;

  // A smaller window slot frees budget for more preserved tensors, which
  // shrinks the slot again: iterate while the slot shrinks.
  BudgetPlan best = empty;
  uint64_t slot = empty.slot_bytes;
  for (int iter = 0; iter < 16; ++iter) {
    const uint64_t used = fixed + slot * static_cast<uint64_t>(base.window);
    if (used > opts.budget) break;
    uint64_t avail = opts.budget - used;
    BudgetPlan p = base;
    // The paper keeps the output layer resident; a tied one then serves the
    // embedding rows too, so no row buffer is needed.
    const uint64_t head_cost = round64(p.head_bytes) + kDirectAlign + (cfg.tied_output ? 0 : row_buf);
    if (head_cost <= avail) {
      p.head_preserved = true;
      p.embd_preserved = cfg.tied_output;
      avail -= head_cost;
    } else {
      if (row_buf > avail) break;
      avail -= row_buf;
    }
    p.embd_row_bytes = p.embd_preserved ? 0 : row_buf;
    pl.choose_layers(p, avail);
    pl.finish(p);
    if (p.slot_bytes > slot || p.total() > opts.budget) break;
    best = p;
    if (p.slot_bytes == slot) break;
    slot = p.slot_bytes;
  }
  return best;
}

std::string describe_plan(const BudgetPlan& p, const WeightLayout& layout) {
  auto short_name = [](const std::string& n) {
    std::string s = n;
    if (s.rfind("blk.", 0) == 0) s = s.substr(s.find('.', 4) + 1);
    const size_t w = s.rfind(".weight");
    if (w != std::string::npos && w + 7 == s.size()) s.resize(w);
    return s;
  };
  std::string out = "budget plan (" + std::string(budget_system_name(p.system)) + "): budget " + mib(p.budget) + "\n";
  const int n = static_cast<int>(p.layers.size());
  for (int l0 = 0; l0 < n;) {
    int l1 = l0;
    while (l1 + 1 < n && p.layers[l1 + 1].preserved == p.layers[l0].preserved) ++l1;
    std::string res, str;
    const auto& slots = layout.layers[l0].slots();
    for (size_t s = 0; s < slots.size(); ++s) {
      if (slots[s].dims.size() < 2) continue;
      std::string& to = p.layers[l0].preserved[s] ? res : str;
      to += ' ';
      to += short_name(slots[s].name);
    }
    char buf[96];
    std::snprintf(buf, sizeof buf, "  layers %2d-%-2d resident:", l0, l1);
    out += buf + (res.empty() ? std::string(" (norms only)") : res) + " | streamed:" + (str.empty() ? " -" : str) +
           " (" + mib(p.layers[l0].streamed_bytes) + "/layer)\n";
    l0 = l1 + 1;
  }
  out += "  output head: " + std::string(p.head_preserved ? "resident" : "streamed") + " (" + mib(p.head_bytes) + ")";
  if (!p.head_preserved) out += " in " + std::to_string(p.head_parts) + " parts of " + std::to_string(p.head_rows_per_part) + " rows";
  out += "; token embedding: " + std::string(p.embd_preserved ? "resident" : "rows read on demand") + "\n";
  out += "  resident weights " + mib(p.resident_weight_bytes()) + " + norms " + mib(p.small_bytes) + " + KV " +
         mib(p.kv) + " + scratch " + mib(p.scratch) + " + embedding rows " + mib(p.embd_row_bytes) + " + window " +
         std::to_string(p.window) + " x " + mib(p.slot_bytes) + " = " + mib(p.total()) + "\n";
  out += "  streamed per token " + mib(p.streamed_per_token()) + ", headroom " + mib(p.headroom()) +
         (p.prefetch ? "" : ", no prefetch") + "\n";
  return out;
}

}  // namespace ebb
