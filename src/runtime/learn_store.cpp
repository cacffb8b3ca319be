// The learning loop's state on disk (learn_store.h).
#include "runtime/learn_store.h"

#include <sqlite3.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <unistd.h>

#include "platform/error.h"

namespace ebb {

namespace fs = std::filesystem;

namespace {

struct Stmt {
  sqlite3_stmt* s = nullptr;
  Stmt(sqlite3* db, const char* sql) {
    if (sqlite3_prepare_v2(db, sql, -1, &s, nullptr) != SQLITE_OK)
      throw Error(std::string("learning state: cannot prepare '") + sql + "': " + sqlite3_errmsg(db));
  }
  ~Stmt() { sqlite3_finalize(s); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  void step_done(sqlite3* db) {
    if (sqlite3_step(s) != SQLITE_DONE) throw Error(std::string("learning state: ") + sqlite3_errmsg(db));
    sqlite3_reset(s);
  }
};

void exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    const std::string msg = err ? err : sqlite3_errmsg(db);
    sqlite3_free(err);
    throw Error(std::string("learning state: '") + sql + "': " + msg);
  }
}

std::string text(sqlite3_stmt* s, int col) {
  const unsigned char* t = sqlite3_column_text(s, col);
  return t ? reinterpret_cast<const char*>(t) : "";
}

template <class T>
bool blob(sqlite3_stmt* s, int col, std::vector<T>* out) {
  const void* p = sqlite3_column_blob(s, col);
  const int n = sqlite3_column_bytes(s, col);
  if (n < 0 || n % sizeof(T) != 0) return false;
  out->resize(static_cast<size_t>(n) / sizeof(T));
  if (p && !out->empty()) std::memcpy(out->data(), p, out->size() * sizeof(T));
  return true;
}

template <class T>
void bind_blob(sqlite3_stmt* s, int col, const std::vector<T>& v) {
  sqlite3_bind_blob(s, col, v.data(), static_cast<int>(v.size() * sizeof(T)), SQLITE_TRANSIENT);
}

}  // namespace

LearnStore::LearnStore(TraceStore& traces)
    : traces_(traces), dir_(fs::path(traces.path()).parent_path().string()) {
  if (dir_.empty()) dir_ = ".";
  traces_.with_db([&](sqlite3* db) {
    Stmt st(db, "SELECT count(*) FROM sqlite_master WHERE name LIKE 'learn_%' AND type = 'table'");
    if (sqlite3_step(st.s) != SQLITE_ROW || sqlite3_column_int64(st.s, 0) < 5)
      throw Error("'" + traces_.path() + "' lacks the learning state's tables (schema version 2)");
  });
}

LearnSnapshot LearnStore::load(int64_t* skipped) {
  LearnSnapshot out;
  int64_t bad = 0;
  traces_.with_db([&](sqlite3* db) {
  {
    Stmt st(db,
            "SELECT agent, adapter, version, against, gate, loss, loss_published, published, step, at, file "
            "FROM learn_versions ORDER BY seq");
    while (sqlite3_step(st.s) == SQLITE_ROW) {
      LearnVersionRow v;
      v.agent = text(st.s, 0);
      v.adapter = text(st.s, 1);
      v.version = static_cast<uint64_t>(sqlite3_column_int64(st.s, 2));
      v.against = static_cast<uint64_t>(sqlite3_column_int64(st.s, 3));
      v.gate = text(st.s, 4);
      v.loss = sqlite3_column_double(st.s, 5);
      v.loss_published = sqlite3_column_double(st.s, 6);
      v.published = sqlite3_column_int64(st.s, 7) != 0;
      v.step = sqlite3_column_int64(st.s, 8);
      v.at = sqlite3_column_double(st.s, 9);
      v.file = text(st.s, 10);
      out.versions.push_back(std::move(v));
    }
  }
  {
    Stmt st(db, "SELECT adapter, version FROM learn_published");
    while (sqlite3_step(st.s) == SQLITE_ROW)
      out.published[text(st.s, 0)] = static_cast<uint64_t>(sqlite3_column_int64(st.s, 1));
  }
  {
    Stmt st(db, "SELECT name, value FROM learn_counters");
    while (sqlite3_step(st.s) == SQLITE_ROW) out.counters[text(st.s, 0)] = sqlite3_column_double(st.s, 1);
  }
  std::map<std::string, size_t> at;
  {
    Stmt st(db, "SELECT agent, baseline_mean, baseline_n, positives, fresh, rounds FROM learn_agents ORDER BY agent");
    while (sqlite3_step(st.s) == SQLITE_ROW) {
      LearnLoopRow l;
      l.agent = text(st.s, 0);
      l.baseline_mean = sqlite3_column_double(st.s, 1);
      l.baseline_n = sqlite3_column_int64(st.s, 2);
      l.positives = sqlite3_column_int64(st.s, 3);
      l.fresh = sqlite3_column_int64(st.s, 4);
      l.rounds = sqlite3_column_int64(st.s, 5);
      at[l.agent] = out.loops.size();
      out.loops.push_back(std::move(l));
    }
  }
  {
    Stmt st(db, "SELECT agent, heldout, response_id, weight, tokens, weights FROM learn_samples ORDER BY agent, heldout, seq");
    while (sqlite3_step(st.s) == SQLITE_ROW) {
      const auto it = at.find(text(st.s, 0));
      LearnSample s;
      s.response_id = text(st.s, 2);
      s.weight = sqlite3_column_double(st.s, 3);
      if (it == at.end() || !blob(st.s, 4, &s.sample.tokens) || !blob(st.s, 5, &s.sample.weights) ||
          s.sample.tokens.size() != s.sample.weights.size()) {
        ++bad;
        continue;
      }
      LearnLoopRow& l = out.loops[it->second];
      if (sqlite3_column_int64(st.s, 1)) l.heldout.push_back(std::move(s.sample));
      else l.replay.push_back(std::move(s));
    }
  }
  });
  if (skipped) *skipped = bad;
  return out;
}

void LearnStore::save(const LearnSnapshot& s) {
  traces_.with_db([&](sqlite3* db) { save_on(db, s); });
  remove_unnamed(s);
}

void LearnStore::save_on(sqlite3* db, const LearnSnapshot& s) {
  exec(db, "BEGIN IMMEDIATE");
  try {
    for (const char* t : {"learn_versions", "learn_published", "learn_counters", "learn_agents", "learn_samples"})
      exec(db, (std::string("DELETE FROM ") + t).c_str());
    {
      Stmt st(db,
              "INSERT OR REPLACE INTO learn_versions (adapter, version, agent, against, gate, loss, loss_published, "
              "published, step, at, file, seq) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)");
      int64_t seq = 0;
      for (const LearnVersionRow& v : s.versions) {
        sqlite3_bind_text(st.s, 1, v.adapter.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st.s, 2, static_cast<int64_t>(v.version));
        sqlite3_bind_text(st.s, 3, v.agent.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st.s, 4, static_cast<int64_t>(v.against));
        sqlite3_bind_text(st.s, 5, v.gate.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_double(st.s, 6, v.loss);
        sqlite3_bind_double(st.s, 7, v.loss_published);
        sqlite3_bind_int64(st.s, 8, v.published ? 1 : 0);
        sqlite3_bind_int64(st.s, 9, v.step);
        sqlite3_bind_double(st.s, 10, v.at);
        sqlite3_bind_text(st.s, 11, v.file.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st.s, 12, seq++);
        st.step_done(db);
      }
    }
    {
      Stmt st(db, "INSERT INTO learn_published (adapter, version) VALUES (?,?)");
      for (const auto& [a, v] : s.published) {
        sqlite3_bind_text(st.s, 1, a.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st.s, 2, static_cast<int64_t>(v));
        st.step_done(db);
      }
    }
    {
      Stmt st(db, "INSERT INTO learn_counters (name, value) VALUES (?,?)");
      for (const auto& [n, v] : s.counters) {
        sqlite3_bind_text(st.s, 1, n.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_double(st.s, 2, v);
        st.step_done(db);
      }
    }
    {
      Stmt ag(db,
              "INSERT INTO learn_agents (agent, baseline_mean, baseline_n, positives, fresh, rounds) VALUES (?,?,?,?,?,?)");
      Stmt sm(db,
              "INSERT INTO learn_samples (agent, heldout, seq, response_id, weight, tokens, weights) "
              "VALUES (?,?,?,?,?,?,?)");
      for (const LearnLoopRow& l : s.loops) {
        sqlite3_bind_text(ag.s, 1, l.agent.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_double(ag.s, 2, l.baseline_mean);
        sqlite3_bind_int64(ag.s, 3, l.baseline_n);
        sqlite3_bind_int64(ag.s, 4, l.positives);
        sqlite3_bind_int64(ag.s, 5, l.fresh);
        sqlite3_bind_int64(ag.s, 6, l.rounds);
        ag.step_done(db);
        int64_t seq = 0;
        const auto put = [&](bool heldout, const std::string& id, double weight, const TrainSample& t) {
          sqlite3_bind_text(sm.s, 1, l.agent.c_str(), -1, SQLITE_TRANSIENT);
          sqlite3_bind_int64(sm.s, 2, heldout ? 1 : 0);
          sqlite3_bind_int64(sm.s, 3, seq++);
          sqlite3_bind_text(sm.s, 4, id.c_str(), -1, SQLITE_TRANSIENT);
          sqlite3_bind_double(sm.s, 5, weight);
          bind_blob(sm.s, 6, t.tokens);
          bind_blob(sm.s, 7, t.weights);
          sm.step_done(db);
        };
        for (const LearnSample& x : l.replay) put(false, x.response_id, x.weight, x.sample);
        for (const TrainSample& h : l.heldout) put(true, "", 1.0, h);
      }
    }
    exec(db, "COMMIT");
  } catch (...) {
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

void LearnStore::remove_unnamed(const LearnSnapshot& s) const {
  // Weight files no record names any more (rejected versions' never are:
  // only published ones are written).
  std::set<std::string> named;
  for (const LearnVersionRow& v : s.versions)
    if (!v.file.empty()) named.insert(fs::path(dir_ + "/" + v.file).lexically_normal().string());
  std::error_code ec;
  if (!fs::is_directory(weights_dir(), ec)) return;
  for (const auto& d : fs::directory_iterator(weights_dir(), ec)) {
    if (!d.is_directory()) continue;
    for (const auto& f : fs::directory_iterator(d.path(), ec)) {
      const std::string p = f.path().lexically_normal().string();
      if (f.path().extension() == ".gguf" && !named.count(p)) fs::remove(f.path(), ec);
    }
  }
}

std::string LearnStore::write_weights(const std::string& adapter, uint64_t version, const LoraAdapter& lora) const {
  const std::string rel = "learned/" + adapter + "/v" + std::to_string(version) + ".gguf";
  const fs::path path = fs::path(dir_) / rel;
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) throw Error("cannot make '" + path.parent_path().string() + "': " + ec.message());
  const std::string tmp = path.string() + ".tmp";
  write_lora_gguf(lora, tmp);
  if (FILE* f = std::fopen(tmp.c_str(), "rb")) {  // synced before the rename: a crash leaves old or new
    fsync(fileno(f));
    std::fclose(f);
  }
  fs::rename(tmp, path, ec);
  if (ec) throw Error("cannot rename '" + tmp + "' to '" + path.string() + "': " + ec.message());
  return rel;
}

}  // namespace ebb
