// The SQLite trace store (trace_store.h).
#include "runtime/trace_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "platform/error.h"
#include "platform/thread_name.h"
#include "platform/wall_clock.h"

namespace ebb {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSchema =
    "CREATE TABLE traces ("
    " id INTEGER PRIMARY KEY,"
    " response_id TEXT NOT NULL UNIQUE,"
    " agent TEXT NOT NULL,"
    " adapter TEXT NOT NULL,"
    " adapter_version INTEGER NOT NULL,"
    " prompt BLOB NOT NULL,"       // int32 little-endian token ids
    " output BLOB NOT NULL,"
    " text TEXT NOT NULL,"
    " tool_calls TEXT NOT NULL,"
    " created REAL NOT NULL,"
    " ttft REAL NOT NULL,"
    " seconds REAL NOT NULL,"
    " bytes INTEGER NOT NULL,"     // prompt + output + text bytes (retention)
    " reward REAL,"
    " correction TEXT,"
    " feedback_source TEXT,"
    " feedback_at REAL);"
    "CREATE INDEX traces_agent ON traces(agent, id);";

// Version 2: the learning loop's state beside the traces (learn_store.h),
// so that a restart keeps it. A version-1 file is migrated in place.
constexpr const char* kSchemaV2 =
    "CREATE TABLE learn_versions ("
    " adapter TEXT NOT NULL, version INTEGER NOT NULL, agent TEXT NOT NULL,"
    " against INTEGER NOT NULL, gate TEXT NOT NULL, loss REAL NOT NULL, loss_published REAL NOT NULL,"
    " published INTEGER NOT NULL, step INTEGER NOT NULL, at REAL NOT NULL,"
    " file TEXT NOT NULL,"          // its weights, relative to the database's directory ("" : none)
    " seq INTEGER NOT NULL,"        // the order of the records
    " PRIMARY KEY (adapter, version));"
    "CREATE TABLE learn_published (adapter TEXT PRIMARY KEY, version INTEGER NOT NULL);"
    "CREATE TABLE learn_counters (name TEXT PRIMARY KEY, value REAL NOT NULL);"
    "CREATE TABLE learn_agents ("
    " agent TEXT PRIMARY KEY, baseline_mean REAL NOT NULL, baseline_n INTEGER NOT NULL,"
    " positives INTEGER NOT NULL, fresh INTEGER NOT NULL, rounds INTEGER NOT NULL);"
    "CREATE TABLE learn_samples ("
    " agent TEXT NOT NULL, heldout INTEGER NOT NULL, seq INTEGER NOT NULL, response_id TEXT NOT NULL,"
    " weight REAL NOT NULL, tokens BLOB NOT NULL, weights BLOB NOT NULL,"  // int32 ids, float32 weights
    " PRIMARY KEY (agent, heldout, seq));";

// Binds token ids as an int32 blob. An empty list is a zero-length blob, not
// NULL (sqlite3_bind_blob binds NULL for a null pointer, which the NOT NULL
// columns refuse, and the trace would be dropped).
void bind_ids(sqlite3_stmt* s, int col, const std::vector<int32_t>& ids) {
  if (ids.empty()) sqlite3_bind_zeroblob(s, col, 0);
  else sqlite3_bind_blob(s, col, ids.data(), static_cast<int>(ids.size() * sizeof(int32_t)), SQLITE_TRANSIENT);
}

// A prepared statement, finalized at the end of its scope.
struct Stmt {
  sqlite3_stmt* s = nullptr;
  Stmt(sqlite3* db, const char* sql) {
    if (sqlite3_prepare_v2(db, sql, -1, &s, nullptr) != SQLITE_OK)
      throw Error(std::string("trace store: cannot prepare '") + sql + "': " + sqlite3_errmsg(db));
  }
  ~Stmt() { sqlite3_finalize(s); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
};

int64_t scalar(sqlite3* db, const char* sql) {
  Stmt st(db, sql);
  const int rc = sqlite3_step(st.s);
  if (rc != SQLITE_ROW) throw Error(std::string("'") + sql + "': " + sqlite3_errmsg(db));
  return sqlite3_column_int64(st.s, 0);
}

void exec_on(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    const std::string msg = err ? err : sqlite3_errmsg(db);
    sqlite3_free(err);
    throw Error(std::string("'") + sql + "': " + msg);
  }
}

std::vector<int32_t> blob_ids(sqlite3_stmt* s, int col) {
  const void* p = sqlite3_column_blob(s, col);
  const int n = sqlite3_column_bytes(s, col);
  std::vector<int32_t> out(static_cast<size_t>(n) / sizeof(int32_t));
  if (p && !out.empty()) std::memcpy(out.data(), p, out.size() * sizeof(int32_t));
  return out;
}

std::string text_col(sqlite3_stmt* s, int col) {
  const unsigned char* t = sqlite3_column_text(s, col);
  return t ? reinterpret_cast<const char*>(t) : "";
}

// Opens path as ebb's trace database (creating the schema in an empty
// file); throws ebb::Error saying why it is not one.
sqlite3* open_checked(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    const std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    throw Error("cannot open: " + msg);
  }
  try {
    sqlite3_busy_timeout(db, 5000);
    const int64_t app = scalar(db, "PRAGMA application_id");  // fails on a file that is not SQLite
    const int64_t version = scalar(db, "PRAGMA user_version");
    const int64_t tables = scalar(db, "SELECT count(*) FROM sqlite_master");
    if (app == 0 && tables == 0) {
      exec_on(db, "PRAGMA journal_mode=WAL");
      exec_on(db, "BEGIN");
      exec_on(db, kSchema);
      exec_on(db, kSchemaV2);
      exec_on(db, ("PRAGMA application_id=" + std::to_string(TraceStore::kApplicationId)).c_str());
      exec_on(db, ("PRAGMA user_version=" + std::to_string(TraceStore::kSchemaVersion)).c_str());
      exec_on(db, "COMMIT");
    } else if (app != TraceStore::kApplicationId) {
      throw Error("is another program's SQLite database (application_id " + std::to_string(app) + ", " +
                  std::to_string(tables) + " schema entries; ebb's traces have " +
                  std::to_string(TraceStore::kApplicationId) + ")");
    } else if (version == 1) {  // migrate: add what version 2 has
      exec_on(db, "BEGIN");
      exec_on(db, kSchemaV2);
      exec_on(db, "PRAGMA user_version=2");
      exec_on(db, "COMMIT");
    } else if (version != TraceStore::kSchemaVersion) {
      throw Error("has trace schema version " + std::to_string(version) + "; this ebb reads version " +
                  std::to_string(TraceStore::kSchemaVersion));
    } else {
      Stmt st(db, "PRAGMA quick_check");
      if (sqlite3_step(st.s) != SQLITE_ROW || text_col(st.s, 0) != "ok")
        throw Error("fails SQLite's integrity check: " + text_col(st.s, 0));
    }
    exec_on(db, "PRAGMA journal_mode=WAL");
    exec_on(db, "PRAGMA synchronous=NORMAL");  // WAL: a process crash loses nothing committed
  } catch (...) {
    sqlite3_close(db);
    throw;
  }
  return db;
}

}  // namespace

std::unique_ptr<TraceStore> TraceStore::open(const std::string& path, TraceStoreOptions opts, std::string* note) {
  sqlite3* db = nullptr;
  try {
    db = open_checked(path);
  } catch (const Error& e) {
    const std::string aside = path + ".bad-" + std::to_string(std::time(nullptr));
    std::error_code ec;
    fs::rename(path, aside, ec);
    for (const char* suffix : {"-wal", "-shm"}) {
      std::error_code ec2;
      fs::rename(path + suffix, aside + suffix, ec2);
    }
    if (note)
      *note = "the trace database '" + path + "' " + e.what() + "; it was moved to '" +
              (ec ? std::string("(could not move it: ") + ec.message() + ")" : aside) + "' and a fresh one started";
    if (ec) throw Error("the trace database '" + path + "' " + e.what() + " and cannot be moved aside: " + ec.message());
    try {
      db = open_checked(path);
    } catch (const Error& e2) {
      throw Error("cannot create the trace database '" + path + "': " + e2.what());
    }
  }
  return std::unique_ptr<TraceStore>(new TraceStore(db, path, opts));
}

TraceStore::TraceStore(sqlite3* db, std::string path, TraceStoreOptions opts)
    : db_(db), path_(std::move(path)), opts_(opts) {
  counts_.rows = scalar(db_, "SELECT count(*) FROM traces");
  counts_.bytes = scalar(db_, "SELECT coalesce(sum(bytes), 0) FROM traces");
  counts_.with_feedback = scalar(db_, "SELECT count(*) FROM traces WHERE feedback_at IS NOT NULL");
  thread_ = std::thread([this] { writer(); });
}

TraceStore::~TraceStore() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  sqlite3_close(db_);
}

bool TraceStore::record(Trace t) {
  {
    std::lock_guard lock(mu_);
    if (queue_.size() >= opts_.max_queue) {
      ++counts_.dropped;
      return false;
    }
    queue_.push_back(std::move(t));
    ++queued_seq_;
    ++counts_.recorded;
  }
  cv_.notify_one();
  return true;
}

void TraceStore::writer() {
  set_current_thread_name("ebb-traces");
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty() && stop_) return;
    std::deque<Trace> batch;
    batch.swap(queue_);
    const uint64_t seq = queued_seq_;
    lock.unlock();
    write_batch(batch);
    lock.lock();
    written_seq_ = seq;
    done_cv_.notify_all();
  }
}

void TraceStore::write_batch(std::deque<Trace>& batch) {
  std::lock_guard dblock(db_mu_);
  int64_t rows = 0, bytes = 0, errors = 0;
  try {
    exec_on(db_, "BEGIN");
    Stmt st(db_,
            "INSERT OR IGNORE INTO traces (response_id, agent, adapter, adapter_version, prompt, output, text, "
            "tool_calls, created, ttft, seconds, bytes) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)");
    for (const Trace& t : batch) {
      const int64_t b = static_cast<int64_t>((t.prompt.size() + t.output.size()) * sizeof(int32_t) + t.text.size());
      sqlite3_reset(st.s);
      sqlite3_bind_text(st.s, 1, t.response_id.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(st.s, 2, t.agent.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(st.s, 3, t.adapter.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int64(st.s, 4, static_cast<int64_t>(t.adapter_version));
      bind_ids(st.s, 5, t.prompt);
      bind_ids(st.s, 6, t.output);
      sqlite3_bind_text(st.s, 7, t.text.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(st.s, 8, t.tool_calls.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_double(st.s, 9, t.created_s > 0 ? t.created_s : unix_now());
      sqlite3_bind_double(st.s, 10, t.ttft_s);
      sqlite3_bind_double(st.s, 11, t.total_s);
      sqlite3_bind_int64(st.s, 12, b);
      if (sqlite3_step(st.s) != SQLITE_DONE) {
        ++errors;
        continue;
      }
      if (sqlite3_changes(db_) > 0) {
        ++rows;
        bytes += b;
      }
    }
    exec_on(db_, "COMMIT");
  } catch (const Error&) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    errors += static_cast<int64_t>(batch.size());
    rows = bytes = 0;
  }
  {
    std::lock_guard lock(mu_);
    counts_.rows += rows;
    counts_.bytes += bytes;
    counts_.write_errors += errors;
  }
  retain();
}

// Deletes rows beyond the bounds (the caller holds db_mu_).
void TraceStore::retain() {
  for (;;) {
    int64_t rows, bytes;
    {
      std::lock_guard lock(mu_);
      rows = counts_.rows;
      bytes = counts_.bytes;
    }
    if (rows <= opts_.max_rows && bytes <= opts_.max_bytes) return;
    const int64_t n = std::max<int64_t>(1, std::min<int64_t>(256, rows - opts_.max_rows));
    Stmt sel(db_,
             "SELECT id, bytes, feedback_at IS NOT NULL FROM traces "
             "ORDER BY (feedback_at IS NOT NULL OR created < ?) DESC, id ASC LIMIT ?");
    sqlite3_bind_double(sel.s, 1, unix_now() - opts_.expire_s);
    sqlite3_bind_int64(sel.s, 2, n);
    std::vector<int64_t> ids;
    int64_t freed = 0, fed = 0;
    while (sqlite3_step(sel.s) == SQLITE_ROW) {
      ids.push_back(sqlite3_column_int64(sel.s, 0));
      freed += sqlite3_column_int64(sel.s, 1);
      fed += sqlite3_column_int64(sel.s, 2);
    }
    if (ids.empty()) return;
    Stmt del(db_, "DELETE FROM traces WHERE id = ?");
    exec_on(db_, "BEGIN");
    for (int64_t id : ids) {
      sqlite3_reset(del.s);
      sqlite3_bind_int64(del.s, 1, id);
      sqlite3_step(del.s);
    }
    exec_on(db_, "COMMIT");
    std::lock_guard lock(mu_);
    counts_.rows -= static_cast<int64_t>(ids.size());
    counts_.bytes -= freed;
    counts_.with_feedback -= fed;
    counts_.retired += static_cast<int64_t>(ids.size());
  }
}

void TraceStore::flush() {
  std::unique_lock lock(mu_);
  const uint64_t seq = queued_seq_;
  done_cv_.wait(lock, [&] { return written_seq_ >= seq; });
}

bool TraceStore::attach(const std::string& response_id, const TraceFeedback& fb) {
  flush();
  std::lock_guard dblock(db_mu_);
  Stmt st(db_,
          "UPDATE traces SET reward = ?, correction = ?, feedback_source = ?, feedback_at = ? WHERE response_id = ?");
  if (fb.reward) sqlite3_bind_double(st.s, 1, *fb.reward);
  else sqlite3_bind_null(st.s, 1);
  if (fb.correction.empty()) sqlite3_bind_null(st.s, 2);
  else sqlite3_bind_text(st.s, 2, fb.correction.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st.s, 3, fb.source.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_double(st.s, 4, unix_now());
  sqlite3_bind_text(st.s, 5, response_id.c_str(), -1, SQLITE_TRANSIENT);
  // Whether the row had feedback before (the counter counts rows, not calls).
  Stmt had(db_, "SELECT feedback_at IS NOT NULL FROM traces WHERE response_id = ?");
  sqlite3_bind_text(had.s, 1, response_id.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(had.s) != SQLITE_ROW) return false;
  const bool before = sqlite3_column_int64(had.s, 0) != 0;
  if (sqlite3_step(st.s) != SQLITE_DONE || sqlite3_changes(db_) == 0) return false;
  if (!before) {
    std::lock_guard lock(mu_);
    ++counts_.with_feedback;
  }
  return true;
}

std::optional<Trace> TraceStore::find(const std::string& response_id) {
  flush();
  std::lock_guard dblock(db_mu_);
  Stmt st(db_,
          "SELECT response_id, agent, adapter, adapter_version, prompt, output, text, tool_calls, created, ttft, "
          "seconds, reward, correction, feedback_source, feedback_at FROM traces WHERE response_id = ?");
  sqlite3_bind_text(st.s, 1, response_id.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(st.s) != SQLITE_ROW) return std::nullopt;
  Trace t;
  t.response_id = text_col(st.s, 0);
  t.agent = text_col(st.s, 1);
  t.adapter = text_col(st.s, 2);
  t.adapter_version = static_cast<uint64_t>(sqlite3_column_int64(st.s, 3));
  t.prompt = blob_ids(st.s, 4);
  t.output = blob_ids(st.s, 5);
  t.text = text_col(st.s, 6);
  t.tool_calls = text_col(st.s, 7);
  t.created_s = sqlite3_column_double(st.s, 8);
  t.ttft_s = sqlite3_column_double(st.s, 9);
  t.total_s = sqlite3_column_double(st.s, 10);
  if (sqlite3_column_type(st.s, 11) != SQLITE_NULL) t.reward = sqlite3_column_double(st.s, 11);
  t.correction = text_col(st.s, 12);
  t.feedback_source = text_col(st.s, 13);
  t.has_feedback = sqlite3_column_type(st.s, 14) != SQLITE_NULL;
  t.feedback_s = t.has_feedback ? sqlite3_column_double(st.s, 14) : 0;
  return t;
}

void TraceStore::with_db(const std::function<void(sqlite3*)>& fn) {
  std::lock_guard dblock(db_mu_);
  fn(db_);
}

TraceCounts TraceStore::counts() {
  flush();
  std::lock_guard lock(mu_);
  return counts_;
}

}  // namespace ebb
