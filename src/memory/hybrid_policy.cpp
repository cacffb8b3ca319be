#include "memory/hybrid_policy.h"

#include <cmath>
#include <limits>
#include <string>

#include "platform/error.h"

namespace ebb {

std::string_view evict_stage_name(EvictStage s) {
  switch (s) {
    case EvictStage::kKvOnly: return "KVonly";
    case EvictStage::kKvAndW: return "KVandW";
    case EvictStage::kWOnly: return "Wonly";
    case EvictStage::kCompKv: return "CompKV";
    case EvictStage::kDone: return "done";
  }
  return "?";
}

std::string_view evict_order_name(EvictOrder o) {
  switch (o) {
    case EvictOrder::kBackward: return "backward";
    case EvictOrder::kForward: return "forward";
    case EvictOrder::kRandom: return "random";
  }
  return "?";
}

EvictOrder parse_evict_order(std::string_view name) {
  if (name == "backward") return EvictOrder::kBackward;
  if (name == "forward") return EvictOrder::kForward;
  if (name == "random") return EvictOrder::kRandom;
  throw Error("unknown eviction order '" + std::string(name) + "' (choices: backward, forward, random)");
}

std::string_view evict_action_name(EvictAction a) {
  switch (a) {
    case EvictAction::kKvToCompressed: return "kv->compressed";
    case EvictAction::kKvToStorage: return "kv->storage";
    case EvictAction::kDropWeightLayer: return "drop-weight-layer";
    case EvictAction::kCompressedToStorage: return "compressed->storage";
    case EvictAction::kNone: return "none";
  }
  return "?";
}

namespace {

void check_time(double t, const char* name) {
  if (!std::isfinite(t) || t < 0) {
    throw Error(std::string("hybrid swap policy: unit time ") + name + " = " + std::to_string(t) +
                " must be finite and >= 0 (a broken device profile?)");
  }
}

int64_t saturating_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::numeric_limits<int64_t>::max();
  return r;
}

}  // namespace

HybridSwapPolicy::HybridSwapPolicy(UnitTimes t, int64_t n_kv_total, int64_t n_w_total, Options o)
    : times_(t), opts_(o) {
  check_time(t.t_d, "t_d");
  check_time(t.t_rkv, "t_rkv");
  check_time(t.t_rw, "t_rw");

  // floor(t_rw / t_d), at least 1: a layer read shorter than one chunk's
  // decompression still pairs with one chunk. t_d == 0 means decompression
  // is free: as many chunks as a layer can cover, i.e. all of them.
  double per_layer = 1;
  if (t.t_d > 0) {
    per_layer = std::floor(t.t_rw / t.t_d);
  } else if (t.t_rw > 0) {
    per_layer = static_cast<double>(kMaxChunksPerLayer);
  }
  if (!(per_layer >= 1)) per_layer = 1;
  if (per_layer > static_cast<double>(kMaxChunksPerLayer)) per_layer = static_cast<double>(kMaxChunksPerLayer);
  chunks_per_layer_ = static_cast<int64_t>(per_layer);

  // Inverse proportion to the per-chunk times: the compressed stack's share
  // c satisfies c * t_d == (1 - c) * t_rkv, so both paths finish together.
  if (!opts_.allow_storage) {
    share_ = 1.0;
  } else if (t.t_d + t.t_rkv > 0) {
    share_ = t.t_rkv / (t.t_d + t.t_rkv);
  } else {
    share_ = 0.5;
  }
  reset(n_kv_total, n_w_total);
}

void HybridSwapPolicy::reset(int64_t n_kv_total, int64_t n_w_total) {
  if (n_kv_total < 0 || n_w_total < 0) {
    throw Error("hybrid swap policy: unit totals must be >= 0 (KV chunks " + std::to_string(n_kv_total) +
                ", weight layers " + std::to_string(n_w_total) + ")");
  }
  n_kv_total_ = n_kv_total;
  n_w_total_ = n_w_total;
  threshold_ = saturating_mul(n_w_total, chunks_per_layer_);
  kvonly_moves_ = 0;
  kvonly_compressed_ = 0;
  cycle_compressed_ = 0;
}

EvictStage HybridSwapPolicy::stage(const PolicyCounts& c) const {
  // Algorithm 1's KVandW step is one layer with its chunks: a cycle begun
  // (chunks compressed, layer not yet dropped) finishes before the counts
  // are looked at again, so the last chunks and the last layer go together.
  if (cycle_compressed_ > 0 && c.w_resident > 0) return EvictStage::kKvAndW;
  if (c.kv_resident > threshold_) return EvictStage::kKvOnly;
  if (c.kv_resident > 0 && c.w_resident > 0) return EvictStage::kKvAndW;
  if (c.w_resident > 0) return EvictStage::kWOnly;
  if (c.kv_resident > 0) return EvictStage::kKvOnly;  // KV left, no weight layer to pair it with
  if (opts_.allow_storage && c.kv_compressed_mem > 0) return EvictStage::kCompKv;
  return EvictStage::kDone;
}

EvictAction HybridSwapPolicy::next(const PolicyCounts& c) {
  const EvictStage st = stage(c);
  if (st != EvictStage::kKvAndW) cycle_compressed_ = 0;  // a cycle the caller's counts cut short
  switch (st) {
    case EvictStage::kKvOnly: {
      // Error diffusion: the (k+1)-th move goes to the compressed stack when
      // that keeps the compressed count at round((k+1) * share).
      const int64_t k = kvonly_moves_ + 1;
      const auto target = static_cast<int64_t>(std::floor(share_ * static_cast<double>(k) + 0.5));
      kvonly_moves_ = k;
      if (kvonly_compressed_ < target) {
        ++kvonly_compressed_;
        return EvictAction::kKvToCompressed;
      }
      return EvictAction::kKvToStorage;
    }
    case EvictStage::kKvAndW:
      if (cycle_compressed_ < chunks_per_layer_ && c.kv_resident > 0) {
        ++cycle_compressed_;
        return EvictAction::kKvToCompressed;
      }
      cycle_compressed_ = 0;
      return EvictAction::kDropWeightLayer;
    case EvictStage::kWOnly:
      return EvictAction::kDropWeightLayer;
    case EvictStage::kCompKv:
      return EvictAction::kCompressedToStorage;
    case EvictStage::kDone:
      return EvictAction::kNone;
  }
  return EvictAction::kNone;
}

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, bound) without modulo bias (rejection of the short tail).
uint64_t uniform_below(uint64_t& state, uint64_t bound) {
  const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % bound;
  uint64_t x = 0;
  do {
    x = splitmix64(state);
  } while (x >= limit);
  return x % bound;
}

}  // namespace

std::vector<int64_t> eviction_sequence(EvictOrder order, int64_t n, uint64_t seed) {
  if (n < 0) throw Error("eviction sequence: unit count must be >= 0, got " + std::to_string(n));
  std::vector<int64_t> seq(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) seq[static_cast<size_t>(i)] = i;
  switch (order) {
    case EvictOrder::kForward:
      break;
    case EvictOrder::kBackward:
      for (int64_t i = 0; i < n; ++i) seq[static_cast<size_t>(i)] = n - 1 - i;
      break;
    case EvictOrder::kRandom: {
      uint64_t state = seed;
      for (int64_t i = n - 1; i > 0; --i) {
        const auto j = static_cast<int64_t>(uniform_below(state, static_cast<uint64_t>(i) + 1));
        std::swap(seq[static_cast<size_t>(i)], seq[static_cast<size_t>(j)]);
      }
      break;
    }
  }
  return seq;
}

}  // namespace ebb
