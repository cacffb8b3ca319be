// Hybrid-swap eviction policy (mzCache Algorithm 1): simulate eviction to
// the end for several profiles and check the stage sequence, the KVonly
// split, the KVandW pairing, the balance of the two restore paths and the
// degenerate cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "memory/hybrid_policy.h"
#include "platform/error.h"

namespace ebb {
namespace {

struct Step {
  EvictStage stage;
  EvictAction action;
  PolicyCounts before;
};

struct Sim {
  std::vector<Step> steps;
  PolicyCounts end;
  int64_t kv_to_storage = 0;
  int64_t comp_to_storage = 0;
};

// Runs the policy from full residency until it answers kNone, applying each
// action to the counts the way the eviction machinery would.
Sim simulate(HybridSwapPolicy& p, int64_t n_kv, int64_t n_w) {
  Sim s;
  PolicyCounts c{n_kv, n_w, 0};
  const int64_t limit = 4 * (n_kv + n_w) + 8;
  for (int64_t i = 0; i <= limit; ++i) {
    const EvictStage st = p.stage(c);
    const EvictAction a = p.next(c);
    if (a == EvictAction::kNone) {
      EXPECT_EQ(st, EvictStage::kDone);
      s.end = c;
      return s;
    }
    s.steps.push_back({st, a, c});
    switch (a) {
      case EvictAction::kKvToCompressed:
        EXPECT_GT(c.kv_resident, 0);
        --c.kv_resident;
        ++c.kv_compressed_mem;
        break;
      case EvictAction::kKvToStorage:
        EXPECT_GT(c.kv_resident, 0);
        --c.kv_resident;
        ++s.kv_to_storage;
        break;
      case EvictAction::kDropWeightLayer:
        EXPECT_GT(c.w_resident, 0);
        --c.w_resident;
        break;
      case EvictAction::kCompressedToStorage:
        EXPECT_GT(c.kv_compressed_mem, 0);
        --c.kv_compressed_mem;
        ++s.comp_to_storage;
        break;
      case EvictAction::kNone:
        break;
    }
  }
  ADD_FAILURE() << "policy did not finish within " << limit << " steps";
  return s;
}

// The stage of each step, with consecutive repeats collapsed.
std::vector<EvictStage> stage_runs(const Sim& s) {
  std::vector<EvictStage> runs;
  for (const Step& st : s.steps) {
    if (runs.empty() || runs.back() != st.stage) runs.push_back(st.stage);
  }
  return runs;
}

std::string names(const std::vector<EvictStage>& v) {
  std::string s;
  for (EvictStage e : v) s += std::string(evict_stage_name(e)) + " ";
  return s;
}

struct Case {
  UnitTimes t;
  int64_t n_kv;
  int64_t n_w;
};

// Profiles: KV chunks of 1-2 MiB against layers of 10-60 MiB, as on a
// laptop SSD; plus a slow-storage phone-like one and an odd ratio.
const std::vector<Case> kCases = {
    {{0.001, 0.0005, 0.004}, 500, 28},    // cpl 4, T 112: KVonly first
    {{0.001, 0.0005, 0.004}, 60, 28},     // N_KV < T: KVandW then Wonly
    {{0.0003, 0.002, 0.0305}, 3000, 16},  // cpl 101, T 1616
    {{0.0003, 0.002, 0.0305}, 1616, 16},  // N_KV == T exactly
    {{0.002, 0.002, 0.007}, 97, 5},       // cpl 3 (7/2 floored), T 15
    {{0.0001, 0.00035, 0.01}, 7, 12},     // cpl 100, few chunks
};

TEST(HybridPolicy, ThresholdFormula) {
  for (const Case& k : kCases) {
    HybridSwapPolicy p(k.t, k.n_kv, k.n_w);
    const auto cpl = static_cast<int64_t>(std::floor(k.t.t_rw / k.t.t_d));
    EXPECT_EQ(p.chunks_per_layer(), std::max<int64_t>(cpl, 1));
    EXPECT_EQ(p.threshold(), k.n_w * std::max<int64_t>(cpl, 1));
    EXPECT_DOUBLE_EQ(p.compressed_share(), k.t.t_rkv / (k.t.t_d + k.t.t_rkv));
  }
  // floor, not round: 0.0099 / 0.001 = 9.9 -> 9
  HybridSwapPolicy p({0.001, 0.001, 0.0099}, 10, 3);
  EXPECT_EQ(p.chunks_per_layer(), 9);
  EXPECT_EQ(p.threshold(), 27);
}

TEST(HybridPolicy, StagesFollowAlgorithm1) {
  for (const Case& k : kCases) {
    HybridSwapPolicy p(k.t, k.n_kv, k.n_w);
    const Sim s = simulate(p, k.n_kv, k.n_w);
    const int64_t T = p.threshold();
    std::vector<EvictStage> want;
    if (k.n_kv > T) want.push_back(EvictStage::kKvOnly);
    want.push_back(EvictStage::kKvAndW);
    if (k.n_kv < T) want.push_back(EvictStage::kWOnly);
    want.push_back(EvictStage::kCompKv);
    EXPECT_EQ(names(stage_runs(s)), names(want)) << "n_kv " << k.n_kv << " T " << T;
    // Everything ends up on storage, nothing in memory.
    EXPECT_EQ(s.end.kv_resident, 0);
    EXPECT_EQ(s.end.w_resident, 0);
    EXPECT_EQ(s.end.kv_compressed_mem, 0);
    EXPECT_EQ(s.kv_to_storage + s.comp_to_storage, k.n_kv);
    // Each step's stage is what stage() says for its counts.
    for (const Step& st : s.steps) {
      if (st.before.kv_resident > T) {
        EXPECT_EQ(st.stage, EvictStage::kKvOnly);
      }
    }
  }
}

TEST(HybridPolicy, KvOnlySplitMatchesShareAtEveryPrefix) {
  for (const Case& k : kCases) {
    HybridSwapPolicy p(k.t, k.n_kv, k.n_w);
    const Sim s = simulate(p, k.n_kv, k.n_w);
    int64_t moves = 0, comp = 0;
    for (const Step& st : s.steps) {
      if (st.stage != EvictStage::kKvOnly) continue;
      ++moves;
      if (st.action == EvictAction::kKvToCompressed) {
        ++comp;
      } else {
        ASSERT_EQ(st.action, EvictAction::kKvToStorage);
      }
      ASSERT_LE(std::fabs(comp - p.compressed_share() * moves), 1.0) << "after " << moves << " KVonly moves";
    }
    if (k.n_kv > p.threshold()) {
      EXPECT_EQ(moves, k.n_kv - p.threshold());
      // Both paths got a real share (the cases have share well inside (0, 1)).
      EXPECT_GT(comp, 0);
      EXPECT_LT(comp, moves);
    } else {
      EXPECT_EQ(moves, 0);
    }
  }
}

TEST(HybridPolicy, KvAndWPairsChunksWithLayersAndRunsOutTogether) {
  for (const Case& k : kCases) {
    HybridSwapPolicy p(k.t, k.n_kv, k.n_w);
    const Sim s = simulate(p, k.n_kv, k.n_w);
    int64_t run = 0;
    bool seen = false;
    for (size_t i = 0; i < s.steps.size(); ++i) {
      const Step& st = s.steps[i];
      if (st.stage != EvictStage::kKvAndW) {
        if (seen && k.n_kv >= p.threshold()) {
          // The first step after KVandW: KV and weights ran out together.
          EXPECT_EQ(st.before.kv_resident, 0);
          EXPECT_EQ(st.before.w_resident, 0);
        }
        if (seen) break;
        continue;
      }
      seen = true;
      if (st.action == EvictAction::kKvToCompressed) {
        ++run;
      } else {
        ASSERT_EQ(st.action, EvictAction::kDropWeightLayer);
        // A full cycle, or the KV ran out and the layer closes the last cycle.
        if (run != p.chunks_per_layer()) {
          EXPECT_EQ(st.before.kv_resident, 0) << "layer dropped after " << run << " chunks";
          EXPECT_LT(run, p.chunks_per_layer());
          EXPECT_LT(k.n_kv, p.threshold());
        }
        run = 0;
      }
    }
    EXPECT_TRUE(seen);
  }
}

TEST(HybridPolicy, RestorePathsStayBalanced) {
  // With t_rw an exact multiple of t_d, every prefix of KVonly + KVandW
  // leaves the decompression and storage paths within one unit of each other.
  const UnitTimes t{1.0, 2.5, 6.0};  // exact in binary: cpl 6
  const int64_t n_kv = 400, n_w = 20;
  HybridSwapPolicy p(t, n_kv, n_w);
  const Sim s = simulate(p, n_kv, n_w);
  double dec = 0, sto = 0;
  for (const Step& st : s.steps) {
    if (st.stage != EvictStage::kKvOnly && st.stage != EvictStage::kKvAndW) break;
    if (st.action == EvictAction::kKvToCompressed) dec += t.t_d;
    if (st.action == EvictAction::kKvToStorage) sto += t.t_rkv;
    if (st.action == EvictAction::kDropWeightLayer) sto += t.t_rw;
    ASSERT_LE(std::fabs(dec - sto), t.t_rw + t.t_rkv) << "dec " << dec << " sto " << sto;
  }
  EXPECT_NEAR(dec, sto, t.t_rkv + t.t_d);  // at the end of KVandW
}

TEST(HybridPolicy, WithoutStorageNeverWritesToStorage) {
  for (const Case& k : kCases) {
    HybridSwapPolicy p(k.t, k.n_kv, k.n_w, {.allow_storage = false});
    EXPECT_EQ(p.compressed_share(), 1.0);
    const Sim s = simulate(p, k.n_kv, k.n_w);
    for (const Step& st : s.steps) {
      EXPECT_NE(st.action, EvictAction::kKvToStorage);
      EXPECT_NE(st.action, EvictAction::kCompressedToStorage);
      EXPECT_NE(st.stage, EvictStage::kCompKv);
    }
    EXPECT_EQ(s.end.kv_resident, 0);
    EXPECT_EQ(s.end.w_resident, 0);
    EXPECT_EQ(s.end.kv_compressed_mem, k.n_kv);
  }
}

TEST(HybridPolicy, DegenerateTimes) {
  // Free decompression: every chunk pairs with the first layer; no KVonly.
  {
    HybridSwapPolicy p({0.0, 0.001, 0.01}, 50, 4);
    EXPECT_EQ(p.chunks_per_layer(), HybridSwapPolicy::kMaxChunksPerLayer);
    EXPECT_GE(p.threshold(), 50);
    EXPECT_EQ(p.compressed_share(), 1.0);
    const Sim s = simulate(p, 50, 4);
    EXPECT_EQ(names(stage_runs(s)), names({EvictStage::kKvAndW, EvictStage::kWOnly, EvictStage::kCompKv}));
    for (int i = 0; i < 50; ++i) EXPECT_EQ(s.steps[i].action, EvictAction::kKvToCompressed);
  }
  // A layer reads faster than a chunk decompresses: one chunk per layer.
  {
    HybridSwapPolicy p({0.01, 0.001, 0.004}, 30, 6);
    EXPECT_EQ(p.chunks_per_layer(), 1);
    EXPECT_EQ(p.threshold(), 6);
    const Sim s = simulate(p, 30, 6);
    EXPECT_EQ(names(stage_runs(s)),
              names({EvictStage::kKvOnly, EvictStage::kKvAndW, EvictStage::kCompKv}));
  }
  // All times zero (no profile): equal split, one chunk per layer.
  {
    HybridSwapPolicy p({0, 0, 0}, 10, 2);
    EXPECT_EQ(p.chunks_per_layer(), 1);
    EXPECT_EQ(p.compressed_share(), 0.5);
  }
  // Free storage reads: KVonly sends everything to storage.
  {
    HybridSwapPolicy p({0.001, 0.0, 0.002}, 20, 2);
    const Sim s = simulate(p, 20, 2);
    for (const Step& st : s.steps) {
      if (st.stage == EvictStage::kKvOnly) {
        EXPECT_EQ(st.action, EvictAction::kKvToStorage);
      }
    }
  }
  EXPECT_THROW(HybridSwapPolicy({-1, 0, 0}, 1, 1), Error);
  EXPECT_THROW(HybridSwapPolicy({0, NAN, 0}, 1, 1), Error);
  EXPECT_THROW(HybridSwapPolicy({0, 0, INFINITY}, 1, 1), Error);
  EXPECT_THROW(HybridSwapPolicy({0, 0, 0}, -1, 1), Error);
}

TEST(HybridPolicy, NoKvOrNoWeights) {
  const UnitTimes t{0.001, 0.002, 0.01};
  {  // no KV at all: weights only, then nothing
    HybridSwapPolicy p(t, 0, 5);
    const Sim s = simulate(p, 0, 5);
    EXPECT_EQ(names(stage_runs(s)), names({EvictStage::kWOnly}));
    EXPECT_EQ(s.steps.size(), 5u);
  }
  {  // no evictable weights: T = 0, KV split over both paths, then CompKV
    HybridSwapPolicy p(t, 9, 0);
    EXPECT_EQ(p.threshold(), 0);
    const Sim s = simulate(p, 9, 0);
    EXPECT_EQ(names(stage_runs(s)), names({EvictStage::kKvOnly, EvictStage::kCompKv}));
    EXPECT_EQ(s.kv_to_storage, 3);  // share 2/3 compressed: 6 + 3
  }
  {  // nothing at all
    HybridSwapPolicy p(t, 0, 0);
    EXPECT_EQ(p.next({}), EvictAction::kNone);
    EXPECT_EQ(p.stage({}), EvictStage::kDone);
  }
}

TEST(HybridPolicy, ResetRestartsFromNewCounts) {
  const UnitTimes t{0.001, 0.001, 0.003};  // share 1/2, cpl 3
  HybridSwapPolicy p(t, 100, 4);
  simulate(p, 100, 4);
  p.reset(40, 2);
  EXPECT_EQ(p.threshold(), 6);
  const Sim s = simulate(p, 40, 2);
  // Same as a fresh policy with those totals.
  HybridSwapPolicy q(t, 40, 2);
  const Sim r = simulate(q, 40, 2);
  ASSERT_EQ(s.steps.size(), r.steps.size());
  for (size_t i = 0; i < s.steps.size(); ++i) EXPECT_EQ(s.steps[i].action, r.steps[i].action) << i;
  // The first KVonly move is deterministic: round(1 * 0.5) = 1 -> compressed.
  EXPECT_EQ(s.steps[0].action, EvictAction::kKvToCompressed);
  EXPECT_EQ(s.steps[1].action, EvictAction::kKvToStorage);
}

TEST(HybridPolicy, EvictionSequences) {
  EXPECT_EQ(eviction_sequence(EvictOrder::kBackward, 4), (std::vector<int64_t>{3, 2, 1, 0}));
  EXPECT_EQ(eviction_sequence(EvictOrder::kForward, 4), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_TRUE(eviction_sequence(EvictOrder::kRandom, 0).empty());
  const auto a = eviction_sequence(EvictOrder::kRandom, 64, 7);
  const auto b = eviction_sequence(EvictOrder::kRandom, 64, 7);
  const auto c = eviction_sequence(EvictOrder::kRandom, 64, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(64);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  EXPECT_NE(a, iota);
  // Every position is reachable: over many seeds, unit 0 lands everywhere.
  std::vector<int> where(8, 0);
  for (uint64_t seed = 1; seed <= 400; ++seed) {
    const auto s = eviction_sequence(EvictOrder::kRandom, 8, seed);
    ++where[std::find(s.begin(), s.end(), 0) - s.begin()];
  }
  for (int w : where) EXPECT_GT(w, 20);  // expected 50 each
  EXPECT_THROW(eviction_sequence(EvictOrder::kForward, -1), Error);
}

TEST(HybridPolicy, Names) {
  EXPECT_EQ(parse_evict_order("backward"), EvictOrder::kBackward);
  EXPECT_EQ(parse_evict_order("forward"), EvictOrder::kForward);
  EXPECT_EQ(parse_evict_order("random"), EvictOrder::kRandom);
  try {
    parse_evict_order("lru");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("backward"), std::string::npos);
  }
  EXPECT_EQ(evict_stage_name(EvictStage::kKvAndW), "KVandW");
  EXPECT_EQ(evict_action_name(EvictAction::kDropWeightLayer), "drop-weight-layer");
}

}  // namespace
}  // namespace ebb
