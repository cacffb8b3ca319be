// The state behind ebb serve's agents and learning loop, shared by
// server_agents.cpp (/v1/agents) and server_learning.cpp (traces, feedback,
// the learner, /v1/learning). Not a public header.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "runtime/agents.h"
#include "runtime/judge.h"
#include "runtime/learn_store.h"
#include "runtime/learner.h"
#include "runtime/trace_store.h"
#include "serve/server_impl.h"
#include "train/train_job.h"

namespace ebb::serve {

// A version a learning round committed, and what its gate said.
struct VersionRecord {
  std::string agent, adapter;
  uint64_t version = 0;
  uint64_t against = 0;        // the published version it was gated against (0: the base model)
  std::string gate;            // "passed", "rejected", "off" (published without a gate), "no_heldout"
  double loss = 0, loss_published = 0;  // held-back losses (gate "loss")
  bool published = false;
  int64_t step = 0;            // the round's optimizer step at the commit
  double at = 0;               // Unix time
};

// One learning agent's loop.
struct AgentLoop {
  explicit AgentLoop(size_t replay_capacity) : replay(replay_capacity) {}
  RewardBaseline baseline;
  ReplayBuffer replay;
  std::vector<TrainSample> heldout;  // the gate's set
  int64_t positives = 0;             // positive samples so far (every heldout_every-th is held back)
  int64_t fresh = 0;                 // samples added since the last round started
  int64_t rounds = 0;
  std::shared_ptr<TrainJob> job;     // the round running (null: none)
  std::string last_response;         // its last turn's response id (the rule judge's target)
};

struct Server::Impl::LearnState {
  std::unique_ptr<AgentRegistry> agents;
  std::unique_ptr<TraceStore> traces;  // null without --learn
  mutable std::mutex mu;               // everything below
  std::map<std::string, AgentLoop> loops;  // by agent
  std::deque<VersionRecord> versions;      // the most recent kMaxVersions (and the published ones: trim_versions)
  int64_t feedback = 0;            // feedback attached (client, rule, tool)
  int64_t feedback_unapplied = 0;  // ... that gave no training target (a rename with nothing to rename)
  int64_t samples = 0;             // judged samples made
  int64_t committed = 0, published = 0, rejected = 0, rollbacks = 0;
  int64_t retired_steps = 0;       // optimizer steps of rounds that ended
  int64_t rounds_failed = 0;
  std::string last_error;
  // Adapters whose first version a round is making: the registry publishes
  // a name's first version by itself, so until the gate has judged it,
  // agents bound to the name run on the base model.
  std::set<std::string> ungated_first;
  std::map<std::string, int> gates_pending;  // gate tasks queued or running, by adapter
  std::vector<std::string> notes;  // what start-up had to say (a state file moved aside)
  // Judge calls (server_learn_state.cpp): submitted, ended (answers parsed
  // or not), failed (unparseable, or the call could not run).
  struct Judged {
    std::string response_id, agent, correction;
    JudgeResult result;
    double at = 0;
  };
  int64_t judge_calls = 0, judge_failures = 0, judge_pending = 0;
  std::deque<Judged> judged;        // ended, not yet applied (the learner thread applies them)
  std::deque<nlohmann::json> judge_log;  // the latest kMaxJudgeLog ended calls, for /v1/learning
  // Persistence (runtime/learn_store.h): the state is saved by the learner
  // thread when `dirty`, at most every kSaveInterval seconds.
  std::unique_ptr<LearnStore> store;  // null without --learn
  bool dirty = false;
  bool saving = false;              // a save is being written
  double last_save = 0;
  int64_t saves = 0, save_failures = 0;
  double last_save_s = 0;           // how long the last save took (weights, then the transaction)
  std::deque<std::pair<std::string, uint64_t>> weights_pending;  // published versions to write
  std::map<std::pair<std::string, uint64_t>, std::string> weight_files;  // written, relative to the state dir
  nlohmann::json restored;          // what start-up brought back
  static constexpr size_t kMaxJudgeLog = 16;
  static constexpr double kSaveInterval = 0.5;
  // The learner thread: starts rounds.
  std::thread thread;
  std::condition_variable cv;
  bool stop = false;
  static constexpr size_t kMaxVersions = 64;
  // Drops the oldest version records beyond kMaxVersions, but never the
  // record of a version its adapter publishes now (`registry`: the adapter
  // registry's list), whose weights the saved state keeps. mu held.
  void trim_versions(const std::vector<AdapterInfo>& registry);
};

}  // namespace ebb::serve
