// The learning loop's traces (issue 38 part 4; LOCAL §2.2): every turn of a
// learning agent as one row of a SQLite database on disk, with the feedback
// that later attaches to it.
//
//   a row      response id, agent, adapter and version, prompt token ids,
//              sampled token ids, the text, tool calls (JSON), timings;
//              then reward, correction, feedback source and time
//   writes     record() and attach() only queue (a bounded queue: a full one
//              drops the trace and counts it, never blocks); one writer
//              thread owns the writes and commits what is queued as one
//              transaction. The decode path never waits for the disk.
//   reads      find() and the counters flush the queue first, so a read
//              sees what was recorded before it
//   retention  at most max_rows rows and max_bytes of token and text bytes;
//              beyond, the oldest rows that already have their feedback or
//              are older than expire_s go first, then the oldest of all
//   the file   WAL journal; schema version in `PRAGMA user_version` (2; a
//              version-1 file gains version 2's tables in place), ebb's
//              mark in `PRAGMA application_id`. A file that is not a SQLite
//              database, is another program's (another application id, or
//              tables without the mark) or has a newer schema is renamed
//              to PATH.bad-UNIXTIME and a fresh database takes its place;
//              open() says so through `note`. Never a crash.
//
// Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

struct sqlite3;

namespace ebb {

struct Trace {
  std::string response_id;
  std::string agent;
  std::string adapter;           // "" : the base model
  uint64_t adapter_version = 0;
  std::vector<int32_t> prompt;   // [n_prompt] token ids
  std::vector<int32_t> output;   // [n_output] sampled token ids
  std::string text;              // the output's text
  std::string tool_calls;        // JSON array ("" : none)
  double created_s = 0;          // Unix time
  double ttft_s = 0, total_s = 0;
  // Feedback (attach()):
  bool has_feedback = false;
  std::optional<double> reward;
  std::string correction;
  std::string feedback_source;   // "client", "rule", "tool"
  double feedback_s = 0;
};

struct TraceFeedback {
  std::optional<double> reward;
  std::string correction;
  std::string source = "client";
};

struct TraceStoreOptions {
  int64_t max_rows = 100000;
  int64_t max_bytes = int64_t{256} << 20;  // token ids (4 bytes each) and text
  double expire_s = 7 * 24 * 3600.0;       // rows older than this go first
  size_t max_queue = 1024;                 // pending writes
};

struct TraceCounts {
  int64_t rows = 0, bytes = 0, with_feedback = 0;
  int64_t recorded = 0;   // record() calls accepted since open
  int64_t dropped = 0;    // ... refused because the queue was full
  int64_t retired = 0;    // rows deleted by retention
  int64_t write_errors = 0;
};

class TraceStore {
 public:
  // Opens (or creates) the database at path; a bad file is moved aside (see
  // above) and `note` says so. Throws ebb::Error when not even a fresh
  // database can be made there (a directory that cannot be written).
  static std::unique_ptr<TraceStore> open(const std::string& path, TraceStoreOptions opts, std::string* note);
  ~TraceStore();  // writes what is queued, then closes
  TraceStore(const TraceStore&) = delete;
  TraceStore& operator=(const TraceStore&) = delete;

  // Queues a trace; false when the queue is full (the trace is dropped).
  bool record(Trace t);
  // Attaches feedback to the trace of that response id: false when there is
  // none. Waits for the writer (HTTP threads only, never the decode path).
  bool attach(const std::string& response_id, const TraceFeedback& fb);
  // The trace with that response id (what is queued written first).
  std::optional<Trace> find(const std::string& response_id);
  TraceCounts counts();
  // Waits until everything queued so far is committed.
  void flush();
  // Runs fn on the database's connection, between the writer's batches
  // (the learning state, learn_store.h, is saved in the same file through
  // the same connection, so the two never contend for SQLite's write lock).
  void with_db(const std::function<void(sqlite3*)>& fn);
  const std::string& path() const { return path_; }
  static constexpr int kSchemaVersion = 2;  // 2: the learning state's tables (learn_store.h); 1 is migrated
  static constexpr int32_t kApplicationId = 0x45424254;  // "EBBT"

 private:
  TraceStore(sqlite3* db, std::string path, TraceStoreOptions opts);
  void writer();
  void write_batch(std::deque<Trace>& batch);
  void retain();

  sqlite3* db_ = nullptr;
  const std::string path_;
  const TraceStoreOptions opts_;
  std::mutex db_mu_;  // the connection (writer thread and the synchronous calls)
  std::mutex mu_;     // the queue and counters
  std::condition_variable cv_, done_cv_;
  std::deque<Trace> queue_;
  uint64_t queued_seq_ = 0, written_seq_ = 0;
  bool stop_ = false;
  TraceCounts counts_;
  std::thread thread_;
};

}  // namespace ebb
