// The learning loop's state on disk (issue 38 part 4: a restart keeps what
// the loop learned): in the trace database (trace_store.h, schema version
// 2's learn_* tables) beside the traces, and the weights of the versions it
// published as files beside the database.
//
//   learn_versions   every version record (gate, held-back losses, step,
//                    time), with the file of its weights
//   learn_published  the published version per adapter (a rollback moves it)
//   learn_counters   the loop's counters (feedback, samples, steps, versions,
//                    rollbacks, judge calls, ...)
//   learn_agents     each agent's REINFORCE baseline (mean, count), its
//                    held-back count, samples since its last round, rounds
//   learn_samples    each agent's replay buffer and held-back set (token ids,
//                    per-token weights)
//
// save() replaces the whole state in one transaction (the state is small:
// at most 64 versions, and each agent's 64 + 8 samples), so a kill -9 leaves
// the last saved state whole. Weight files are written to a temporary name,
// synced and renamed (write_weights), and files no saved record names are
// removed by save().
//
// It works through the TraceStore's connection (TraceStore::with_db), which
// has checked (and migrated) the file: a file that is not one is moved
// aside there, and the state starts empty. Thread-compatible: one thread
// saves (the server's learner thread).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/lora.h"
#include "runtime/learner.h"
#include "runtime/trace_store.h"

namespace ebb {

struct LearnVersionRow {
  std::string agent, adapter;
  uint64_t version = 0, against = 0;
  std::string gate;
  double loss = 0, loss_published = 0;
  bool published = false;
  int64_t step = 0;
  double at = 0;
  std::string file;  // relative to the database's directory; "" : no weights kept
};

struct LearnLoopRow {
  std::string agent;
  double baseline_mean = 0;
  int64_t baseline_n = 0, positives = 0, fresh = 0, rounds = 0;
  std::vector<LearnSample> replay;    // oldest first
  std::vector<TrainSample> heldout;
};

struct LearnSnapshot {
  std::vector<LearnVersionRow> versions;       // in the order they were recorded
  std::map<std::string, uint64_t> published;   // adapter -> its published version
  std::map<std::string, double> counters;
  std::vector<LearnLoopRow> loops;
};

class LearnStore {
 public:
  // traces: the open trace database (it outlives the LearnStore). Throws
  // ebb::Error when the database lacks the tables.
  explicit LearnStore(TraceStore& traces);
  LearnStore(const LearnStore&) = delete;
  LearnStore& operator=(const LearnStore&) = delete;

  // What was saved last (empty on a fresh database). Rows it cannot read
  // (a sample whose blobs are not whole ids and weights) are skipped and
  // counted in `skipped`.
  LearnSnapshot load(int64_t* skipped = nullptr);
  // Replaces the saved state with `s`, then removes weight files under
  // weights_dir() that no version row names. Throws ebb::Error on a write
  // failure (the previous state stays).
  void save(const LearnSnapshot& s);

  // Writes a version's weights (GGUF, F32) as weights_dir()/ADAPTER/vN.gguf;
  // returns the path relative to the database's directory.
  std::string write_weights(const std::string& adapter, uint64_t version, const LoraAdapter& lora) const;
  // The directory the weight files live in: DIR/learned.
  std::string weights_dir() const { return dir_ + "/learned"; }
  const std::string& dir() const { return dir_; }

 private:
  void save_on(sqlite3* db, const LearnSnapshot& s);
  void remove_unnamed(const LearnSnapshot& s) const;

  TraceStore& traces_;
  std::string dir_;  // the database's directory
};

}  // namespace ebb
