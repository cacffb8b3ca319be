// ebb bench serve: decode through ebb serve's HTTP API (streamed
// completions on loopback, the server in this process) against the engine
// without HTTP, in the same run.
//
//   one client   decode tok/s seen by the client (a request for n tokens
//                less one for a single token), against one in-process stream's decode
//                (bench batch at one stream: the same engine, no server).
//                Bound: 1.0x (HTTP can only add to each step).
//   C clients    aggregate tok/s of C concurrent clients (all completion
//                tokens over the burst's wall time) against one client's
//                aggregate with the same definition; beside it, in-process
//                batched decode at C streams against one stream and its
//                bound (a step reads the weights once and computes each
//                row at about the prefill rate).
//
// Each client sends its own random token prompt, so the prefix cache never
// shortens a measured prefill. The in-process baselines run on the
// scheduler thread (Scheduler::call), which alone runs the engine.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/batch_rep.h"
#include "cli/options.h"
#include "platform/error.h"
#include "platform/timer.h"
#include "runtime/scheduler.h"
#include "runtime/session.h"
#include "runtime/stats.h"
#include "serve/server.h"

namespace ebb::cli {
namespace {

using nlohmann::json;

struct ServeBenchArgs {
  ModelArgs model;
  std::vector<int64_t> clients = {1, 8};
  int64_t prompt = 32;
  int64_t gen = 64;
  int64_t reps = 3;
  bool json = false;
};

// One streamed completion as its client saw it.
struct ClientRun {
  bool ok = false;
  std::string error;
  double t_start = 0, t_end = 0;  // now_seconds(): request sent, response complete
  int64_t tokens = 0;                                      // usage.completion_tokens
};

ClientRun stream_once(int port, const std::vector<TokenId>& prompt, int64_t gen) {
  ClientRun r;
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(600);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = json{{"prompt", prompt},
                  {"max_tokens", gen},
                  {"temperature", 0},
                  {"ignore_eos", true},
                  {"stream", true},
                  {"stream_options", {{"include_usage", true}}}}
                 .dump();
  std::string buf;
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    buf.append(d, n);
    size_t at;
    while ((at = buf.find("\n\n")) != std::string::npos) {
      const std::string ev = buf.substr(0, at);
      buf.erase(0, at + 2);
      if (ev.rfind("data: ", 0) != 0) continue;
      const std::string data = ev.substr(6);
      if (data == "[DONE]") continue;
      const json j = json::parse(data, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("usage") && j["usage"].is_object()) r.tokens = j["usage"].value("completion_tokens", int64_t{0});
    }
    return true;
  };
  r.t_start = now_seconds();
  auto res = c.send(req);
  r.t_end = now_seconds();
  if (!res) {
    r.error = "no response (" + httplib::to_string(res.error()) + ")";
  } else if (res->status != 200) {
    r.error = "HTTP " + std::to_string(res->status) + ": " + res->body;
  } else if (r.tokens != gen) {
    r.error = "the stream ended after " + std::to_string(r.tokens) + " of " + std::to_string(gen) + " tokens";
  } else {
    r.ok = true;
  }
  return r;
}

// Aggregate tok/s of `clients` concurrent streamed completions: all their
// tokens over the burst's wall time.
double run_burst(int port, int64_t clients, int64_t prompt, int64_t gen, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<TokenId>> prompts(static_cast<size_t>(clients));
  for (auto& p : prompts) {
    p.resize(static_cast<size_t>(prompt));
    for (TokenId& t : p) t = static_cast<TokenId>(1 + rng() % static_cast<uint32_t>(n_vocab - 1));
  }
  std::vector<ClientRun> runs(static_cast<size_t>(clients));
  std::vector<std::thread> threads;
  for (int64_t i = 0; i < clients; ++i)
    threads.emplace_back(
        [&, i] { runs[static_cast<size_t>(i)] = stream_once(port, prompts[static_cast<size_t>(i)], gen); });
  for (auto& t : threads) t.join();
  double start = 1e300, end = 0;
  int64_t tokens = 0;
  for (const ClientRun& r : runs) {
    if (!r.ok) throw Error("bench serve: a client failed: " + r.error);
    start = std::min(start, r.t_start);
    end = std::max(end, r.t_end);
    tokens += r.tokens;
  }
  return static_cast<double>(tokens) / (end - start);
}

// One client's decode tok/s: the latency of a request for `gen` tokens less
// that of one for a single token (prefill, first token and HTTP, with a
// prompt of the same length), over gen - 1 tokens. Independent of how the
// text falls into streamed chunks.
double client_decode_tok_s(int port, int64_t prompt, int64_t gen, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TokenId> p1(static_cast<size_t>(prompt)), pn(static_cast<size_t>(prompt));
  for (TokenId& t : p1) t = static_cast<TokenId>(1 + rng() % static_cast<uint32_t>(n_vocab - 1));
  for (TokenId& t : pn) t = static_cast<TokenId>(1 + rng() % static_cast<uint32_t>(n_vocab - 1));
  const ClientRun one = stream_once(port, p1, 1);
  const ClientRun all = stream_once(port, pn, gen);
  if (!one.ok || !all.ok) throw Error("bench serve: a client failed: " + (one.ok ? all.error : one.error));
  const double dt = (all.t_end - all.t_start) - (one.t_end - one.t_start);
  return dt > 0 ? static_cast<double>(gen - 1) / dt : 0;
}

struct Row {
  int64_t clients = 0;
  std::vector<double> http_reps, inproc_reps;
  double http_tok_s = 0, inproc_tok_s = 0;  // aggregate (HTTP) and batched decode (in process)
  double x_one_http = 0, x_one_inproc = 0, bound_x_one = 0;
};

int run_serve_bench(ServeBenchArgs& a) {
  if (a.prompt < 1 || a.gen < 2 || a.reps < 1) throw Error("bench serve: -p and --reps must be at least 1, -n at least 2");
  std::vector<int64_t> counts = a.clients;
  for (int64_t c : counts)
    if (c < 1) throw Error("bench serve: --clients takes positive counts, got " + std::to_string(c));
  if (std::find(counts.begin(), counts.end(), 1) == counts.end()) counts.insert(counts.begin(), 1);
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());

  a.model.prefix_cache = true;  // as ebb serve runs
  std::unique_ptr<Engine> engine = make_engine(a.model);
  const int64_t max_clients = counts.back();
  if (max_clients > engine->forward().max_batch())
    throw Error("bench serve: more clients than the step's rows (--batch " + std::to_string(engine->forward().max_batch()) + ")");
  const int64_t n_vocab = engine->config().n_vocab;
  const std::string isa(isa_name(engine->isa()));
  const int threads = engine->pool().size();
  serve::ServerOptions so;
  so.port = 0;
  so.model_id = "bench";
  so.session = session_options(a.model);
  so.session.n_ctx = a.prompt + a.gen + 8;
  so.n_ctx = so.session.n_ctx;
  so.log_requests = false;
  SchedulerOptions sched_opts;
  sched_opts.max_batch = static_cast<int>(max_clients);
  sched_opts.max_queue = static_cast<int>(std::max<int64_t>(64, 2 * max_clients));
  Scheduler sched(engine.get(), sched_opts);
  serve::Server server(*engine, sched, so);
  const int port = server.bind();
  std::thread listener([&] { server.listen(); });
  while (!server.running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  struct Stop {
    Scheduler& s;
    serve::Server& v;
    std::thread& t;
    ~Stop() {
      s.shutdown(0);
      v.stop(0);
      if (t.joinable()) t.join();
    }
  } stop{sched, server, listener};

  std::vector<Row> rows(counts.size());
  std::vector<double> one_decode_http, one_decode_inproc, one_prefill;
  for (int64_t r = 0; r <= a.reps; ++r) {  // r == 0: warm-up
    for (size_t i = 0; i < counts.size(); ++i) {
      const int64_t c = counts[i];
      std::fprintf(stderr, "bench serve: %s, %lld client(s)\n", r == 0 ? "warm-up" : ("rep " + std::to_string(r)).c_str(),
                   static_cast<long long>(c));
      const uint32_t seed = static_cast<uint32_t>(7919 * r + 31 * i + 1);
      const double agg = run_burst(port, c, a.prompt, a.gen, n_vocab, seed);
      const double dec = c == 1 ? client_decode_tok_s(port, a.prompt, a.gen, n_vocab, seed + 5) : 0;
      const BatchRep in = sched.call([&](Engine& e) { return run_batch_rep(e, c, a.prompt, a.gen, a.model.kv_chunk, seed + 17); }).get();
      if (r == 0) continue;
      rows[i].clients = c;
      rows[i].http_reps.push_back(agg);
      rows[i].inproc_reps.push_back(in.decode_tok_s);
      if (c == 1) {
        one_decode_http.push_back(dec);
        one_decode_inproc.push_back(in.decode_tok_s);
        one_prefill.push_back(in.prefill_tok_s);
      }
    }
  }
  const double http_one_decode = median(one_decode_http), inproc_one_decode = median(one_decode_inproc);
  const double prefill = median(one_prefill);
  double http_one = 0, inproc_one = 0;
  for (Row& row : rows) {
    row.http_tok_s = median(row.http_reps);
    row.inproc_tok_s = median(row.inproc_reps);
    if (row.clients == 1) http_one = row.http_tok_s, inproc_one = row.inproc_tok_s;
  }
  const double t1 = inproc_one > 0 ? 1.0 / inproc_one : 0;
  for (Row& row : rows) {
    row.x_one_http = http_one > 0 ? row.http_tok_s / http_one : 0;
    row.x_one_inproc = inproc_one > 0 ? row.inproc_tok_s / inproc_one : 0;
    const double step = std::max(t1, prefill > 0 ? static_cast<double>(row.clients) / prefill : 0);
    row.bound_x_one = step > 0 && inproc_one > 0 ? static_cast<double>(row.clients) / step / inproc_one : 0;
  }
  const double x_decode = inproc_one_decode > 0 ? http_one_decode / inproc_one_decode : 0;
  if (a.json) {
    json j;
    j["model"] = a.model.model;
    j["threads"] = threads;
    j["isa"] = isa;
    j["prompt_tokens"] = a.prompt;
    j["gen_tokens"] = a.gen;
    j["reps"] = a.reps;
    j["one_client"] = {{"http_decode_tok_s", http_one_decode},
                       {"http_decode_tok_s_reps", one_decode_http},
                       {"inproc_decode_tok_s", inproc_one_decode},
                       {"inproc_decode_tok_s_reps", one_decode_inproc},
                       {"ratio", x_decode},
                       {"bound_ratio", 1.0}};
    for (const Row& row : rows)
      j["clients"].push_back({{"clients", row.clients},
                              {"http_aggregate_tok_s", row.http_tok_s},
                              {"http_aggregate_tok_s_reps", row.http_reps},
                              {"http_ratio_to_one_client", row.x_one_http},
                              {"inproc_batch_decode_tok_s", row.inproc_tok_s},
                              {"inproc_ratio_to_one_stream", row.x_one_inproc},
                              {"bound_ratio_to_one_stream", row.bound_x_one}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("ebb bench serve: %s, %d threads, %s, prompt %lld, %lld generated per client, median of %lld reps\n",
              a.model.model.c_str(), threads, isa.c_str(), static_cast<long long>(a.prompt),
              static_cast<long long>(a.gen), static_cast<long long>(a.reps));
  std::printf("one client: decode %.1f tok/s through HTTP, %.1f tok/s in process: %.3fx (bound 1.000x)\n",
              http_one_decode, inproc_one_decode, x_decode);
  std::printf("%8s %16s %10s %18s %10s %14s\n", "clients", "HTTP agg tok/s", "x one", "in-proc batch tok/s", "x one",
              "bound x one");
  for (const Row& row : rows)
    std::printf("%8lld %16.1f %10.2f %18.1f %10.2f %14.2f\n", static_cast<long long>(row.clients), row.http_tok_s,
                row.x_one_http, row.inproc_tok_s, row.x_one_inproc, row.bound_x_one);
  std::printf("HTTP aggregate: all completion tokens (prefill included) over the burst's wall time; in-process: "
              "batched decode steps only; bound: a step reads the weights once and computes each row at the prefill "
              "rate\n");
  return 0;
}

}  // namespace

void add_bench_serve_command(CLI::App* bench, int* rc) {
  auto a = std::make_shared<ServeBenchArgs>();
  CLI::App* sub = bench->add_subcommand("serve", "Decode through ebb serve's HTTP API against the engine without it");
  add_model_options(sub, a->model);
  sub->add_option("--clients", a->clients, "Concurrent client counts to measure (one client is always measured)")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("-p,--prompt-tokens", a->prompt, "Prompt tokens per request")->capture_default_str();
  sub->add_option("-n,--gen-tokens", a->gen, "Tokens generated per request")->capture_default_str();
  sub->add_option("--reps", a->reps, "Timed repetitions (after one warm-up); medians are reported")
      ->capture_default_str();
  sub->add_flag("--json", a->json, "Print one JSON object instead of the table");
  sub->callback([a, rc] { *rc = run_serve_bench(*a); });
}

}  // namespace ebb::cli
