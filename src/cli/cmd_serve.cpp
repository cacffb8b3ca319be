// ebb serve: an OpenAI-compatible HTTP server on the cooperative scheduler
// (src/serve/server.h, src/runtime/scheduler.h).
//
// Threads: the engine's compute pool, the scheduler's (which alone runs the
// engine), httplib's listener and workers, and this one, which waits for
// SIGINT or SIGTERM. Both signals are blocked in every thread (the mask is
// set before any thread starts, and threads inherit it), so they reach only
// the sigwait() here: a signal stops taking requests, lets running answers
// finish for --grace seconds, cancels what is left, and exits 0.
#include <pthread.h>
#include <signal.h>

#include <chrono>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>

#include "cli/options.h"
#include "memory/budget_plan.h"
#include "model/chat_jinja.h"
#include "model/chat_parse.h"
#include "model/chat_template.h"
#include "platform/cgroup.h"
#include "platform/error.h"
#include "runtime/agents.h"
#include "runtime/offload_admission.h"
#include "runtime/scheduler.h"
#include "serve/server.h"

namespace ebb::cli {
namespace {

struct ServeArgs {
  ModelArgs model;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  std::string max_body = "4MiB";
  std::string judge;  // --judge: the default judge of agents that name none
  std::string kv_spare = "256MiB";
  std::string background_memory;  // "": the machine's free memory
  std::string policy = "foreground-first";
  std::string format;
  std::string chat_template;  // --chat-template NAME|FILE
  int max_batch = 8;
  double background_window = 0.5;  // W_bg, seconds
  double background_step = 0.05;   // seconds of one background step (training phase, prefill chunk)
  double train_share = 0.5;        // training's guaranteed share of the engine's time
  double background_starvation = 5;  // seconds
  int max_queue = 64;
  double grace = 5.0;
  bool quiet = false;
  std::string adapter_dir;
  std::string pressure = "off";
  double pressure_step = 25;  // percentage points of the footprint per signal
  double pressure_interval = 0.25;  // seconds between signals, at least
  double http_timeout = 10;        // a request head's time, from its first byte
  double body_timeout = 30;        // a request body's time, once its head is in
  int max_connections = 512;
  int max_connections_per_client = 64;
  serve::LearnOptions learn;  // --state-dir, --learn and the learner's settings
};

std::string model_id_of(const std::string& path) {
  std::string id = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  if (id.size() > 5 && id.compare(id.size() - 5, 5, ".gguf") == 0) id.resize(id.size() - 5);
  return id.empty() ? "model" : id;
}

// Under a cgroup memory limit (and no --memory-limit), the engine's limit
// for weights and KV is what the cgroup leaves once the server runs: less
// what the process holds outside the ledger (code, tokenizer, heap, thread
// stacks: measured now that every thread has started, not assumed) and a
// reserve for requests on their way in (HTTP buffers, JSON, tokenization:
// 32 MiB and four bodies at --max-body). Generations whose KV would pass
// the limit then wait (Scheduler), so the process stays inside the cgroup.
void fit_cgroup_limit(const ServeArgs& a, Scheduler& sched, uint64_t max_body) {
  if (!a.model.memory_limit.empty()) return;
  const std::optional<CgroupMemoryLimit> cg = cgroup_memory_limit(a.model.cgroup_root);
  if (!cg) return;
  struct Seen {
    bool elastic = false;
    Footprint f;
  };
  const Seen seen = sched.call([](Engine& e) { return Seen{e.elastic() != nullptr, e.footprint()}; }).get();
  if (!seen.elastic) return;
  const uint64_t held = resident_bytes();
  const uint64_t ledger = seen.f.total();
  const uint64_t outside = held > ledger ? held - ledger : 0;
  const uint64_t reserve = (32ull << 20) + 4 * max_body;
  const uint64_t beside = seen.f.globals + seen.f.scratch + seen.f.adapters + outside + reserve;
  if (cg->bytes <= beside + (16ull << 20)) {
    std::fprintf(stderr,
                 "ebb serve: warning: the cgroup memory limit %s (%s) leaves no room for weights and KV beside what "
                 "the process holds (%s outside the ledger, %s reserved for requests); it may be killed\n",
                 format_bytes(cg->bytes).c_str(), cg->file.c_str(), format_bytes(outside).c_str(),
                 format_bytes(reserve).c_str());
    return;
  }
  const uint64_t limit = cg->bytes - beside;
  sched.call([limit](Engine& e) { return e.set_memory_limit(limit); }).get();
  std::fprintf(stderr,
               "note: ebb serve in cgroup limit %s: weights and KV within %s (beside them: globals and scratch %s, "
               "%s measured outside the ledger, %s reserved for requests); requests whose KV would pass it wait\n",
               format_bytes(cg->bytes).c_str(), format_bytes(limit).c_str(),
               format_bytes(seen.f.globals + seen.f.scratch + seen.f.adapters).c_str(), format_bytes(outside).c_str(),
               format_bytes(reserve).c_str());
}

// The Jinja template chat prompts are rendered with: --chat-template FILE,
// else the GGUF's (unless --format or --chat-template NAME picks a marker
// renderer, which may change chat_format). A GGUF template that is absent
// or does not parse falls back to the marker renderer, said in one line; a
// FILE that cannot be read or parsed is an error.
std::shared_ptr<const ChatTemplate> jinja_template(const ServeArgs& a, const Engine& engine, ChatFormat& marker) {
  const Tokenizer& tok = engine.tokenizer();
  const std::string bos = tok.bos() >= 0 ? tok.token_to_piece(tok.bos(), true) : "";
  const std::string eos = tok.eos() >= 0 ? tok.token_to_piece(tok.eos(), true) : "";
  if (!a.chat_template.empty()) {
    if (auto f = parse_chat_format(a.chat_template)) {
      marker = *f;
      return nullptr;
    }
    constexpr uintmax_t kMaxTemplate = 1u << 20;
    std::error_code ec;
    const uintmax_t size = std::filesystem::file_size(a.chat_template, ec);
    if (ec)
      throw UsageError("--chat-template '" + a.chat_template +
                       "' is neither a format name (chatml, llama3, llama2, plain) nor a readable file: " + ec.message());
    if (size > kMaxTemplate)
      throw UsageError("--chat-template '" + a.chat_template + "' is " + std::to_string(size) +
                       " bytes; a chat template may have 1 MiB at most");
    std::ifstream in(a.chat_template, std::ios::binary);
    std::string source(static_cast<size_t>(size), '\0');
    if (!in.read(source.data(), static_cast<std::streamsize>(size)))
      throw UsageError("--chat-template '" + a.chat_template + "': cannot read the file");
    try {
      return std::make_shared<const ChatTemplate>(std::move(source), bos, eos);
    } catch (const Error& e) {
      throw UsageError("--chat-template '" + a.chat_template + "': " + e.what());
    }
  }
  if (!a.format.empty()) return nullptr;
  const std::string& source = engine.model().chat_template();
  if (source.empty()) {
    std::fprintf(stderr, "ebb serve: the model has no chat template; chat prompts use the %s marker format, tools are "
                         "refused (--chat-template FILE gives one)\n",
                 std::string(chat_format_name(marker)).c_str());
    return nullptr;
  }
  try {
    return std::make_shared<const ChatTemplate>(source, bos, eos);
  } catch (const Error& e) {
    std::fprintf(stderr, "ebb serve: the model's chat template does not parse (%s); chat prompts use the %s marker "
                         "format, tools are refused\n",
                 e.what(), std::string(chat_format_name(marker)).c_str());
    return nullptr;
  }
}

int serve(ServeArgs& a) {
  auto policy = parse_sched_policy(a.policy);
  if (!policy) throw UsageError("--policy '" + a.policy + "' is not one of foreground-first, round-robin, fifo");
  if (a.port < 0 || a.port > 65535) throw UsageError("--port " + std::to_string(a.port) + ": must be in [0, 65535]");
  if (a.max_batch < 1) throw UsageError("--max-batch must be >= 1");
  if (!(a.background_window > 0 && a.background_window <= 60))
    throw UsageError("--background-window must be in (0, 60] seconds");
  if (!(a.train_share >= 0 && a.train_share <= 1)) throw UsageError("--train-share must be in [0, 1]");
  if (!(a.background_starvation >= 0 && a.background_starvation <= 3600))
    throw UsageError("--background-starvation must be in [0, 3600] seconds (0: never)");
  if (a.max_queue < 1) throw UsageError("--max-queue must be >= 1");
  if (a.grace < 0) throw UsageError("--grace must be >= 0");
  if (a.pressure != "auto" && a.pressure != "psi" && a.pressure != "cgroup" && a.pressure != "off")
    throw UsageError("--pressure '" + a.pressure + "' is not one of auto, psi, cgroup, off");
  if (!(a.pressure_step > 0 && a.pressure_step <= 100))
    throw UsageError("--pressure-step must be in (0, 100] percentage points of the footprint");
  if (!(a.pressure_interval >= 0.01 && a.pressure_interval <= 60))
    throw UsageError("--pressure-interval must be in [0.01, 60] seconds");
  if (!a.adapter_dir.empty() && !std::filesystem::is_directory(a.adapter_dir))
    throw UsageError("--adapter-dir '" + a.adapter_dir + "' is not a directory");
  if (!a.learn.state_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(a.learn.state_dir, ec);
    if (!std::filesystem::is_directory(a.learn.state_dir))
      throw UsageError("--state-dir '" + a.learn.state_dir + "' is not a directory and cannot be made one");
  }
  if (a.learn.learn && a.learn.state_dir.empty())
    throw UsageError("--learn needs --state-dir DIR (the traces database and the agents are kept there)");
  if (a.learn.gate != "loss" && a.learn.gate != "off") throw UsageError("--learn-gate must be loss or off");
  if (!a.judge.empty()) {
    if (!a.learn.learn) throw UsageError("--judge needs --learn (judges turn learning agents' feedback into rewards)");
    nlohmann::json j;
    if (a.judge.front() == '{') {
      j = nlohmann::json::parse(a.judge, nullptr, false);
      if (j.is_discarded()) throw UsageError("--judge: '" + a.judge + "' is not a JSON object");
    } else if (a.judge.rfind("prompt:", 0) == 0) {
      const std::string file = a.judge.substr(7);
      std::ifstream in(file, std::ios::binary);
      if (file.empty() || !in) throw UsageError("--judge prompt:FILE: cannot read '" + file + "'");
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      j = {{"kind", "prompt"}, {"prompt", text}};
    } else {
      j = {{"kind", a.judge}};
    }
    try {
      a.learn.judge = judge_from_json(j);
    } catch (const AgentError& e) {
      throw UsageError(std::string("--judge: ") + e.what());
    }
  }
  if (a.learn.steps < 1 || a.learn.commit_every < 1) throw UsageError("--learn-steps and --commit-every must be >= 1");
  if (!(a.learn.lr > 0 && a.learn.lr <= 1)) throw UsageError("--learn-lr must be in (0, 1]");
  if (a.learn.rank < 1 || a.learn.rank > 256) throw UsageError("--learn-rank must be in [1, 256]");
  if (a.learn.min_samples < 1) throw UsageError("--learn-min-samples must be >= 1");
  if (!(a.background_step > 0 && a.background_step <= a.background_window))
    throw UsageError("--background-step must be in (0, --background-window]");
  if (a.learn.phase_s == 0) a.learn.phase_s = a.background_step;  // not given
  if (!(a.learn.phase_s > 0 && a.learn.phase_s <= 60)) throw UsageError("--learn-phase-seconds must be in (0, 60]");
  uint64_t max_body = 0;
  try {
    max_body = parse_size(a.max_body, 0);
  } catch (const Error& e) {
    throw UsageError(std::string("--max-body: ") + e.what());
  }
  if (max_body == 0) throw UsageError("--max-body must be at least 1 byte");
  uint64_t kv_spare = 0;
  try {
    kv_spare = parse_size(a.kv_spare, 0);
  } catch (const Error& e) {
    throw UsageError(std::string("--kv-spare: ") + e.what());
  }
  uint64_t background_memory = 0;
  if (!a.background_memory.empty()) {
    try {
      background_memory = parse_size(a.background_memory, 0);
    } catch (const Error& e) {
      throw UsageError(std::string("--background-memory: ") + e.what());
    }
    if (background_memory == 0) throw UsageError("--background-memory must be at least 1 byte");
  }
  if (a.api_key.empty()) {
    if (const char* k = std::getenv("EBB_API_KEY")) a.api_key = k;
  }

  // Before any thread starts: SIGINT and SIGTERM wait for sigwait() below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a client that went away is an error on its socket, not the end of the server

  // Conversations reuse their KV across requests through the prefix cache
  // (on a device too: its chunks are kept on the host, runtime/device_kv.h).
  a.model.prefix_cache = true;
  a.model.quiet = a.model.quiet || a.quiet;  // --quiet: no load progress or notes either
  std::unique_ptr<Engine> engine = make_engine(a.model);
  SessionOptions sopts = session_options(a.model);
  int64_t n_ctx = 0;
  {
    Session probe(*engine, sopts);
    n_ctx = probe.n_ctx();
    // The chunk the context gets (the scheduler sizes requests' KV by it).
    sopts.kv_chunk_size = probe.options().kv_chunk_size;
  }

  serve::ServerOptions so;
  so.host = a.host;
  so.port = a.port;
  so.api_key = a.api_key;
  so.max_body = static_cast<size_t>(max_body);
  so.background_step_s = a.background_step;
  so.model_id = model_id_of(a.model.model);
  so.session = sopts;
  so.n_ctx = n_ctx;
  so.log_requests = !a.quiet;  // on stdout, after the listening line
  so.adapter_dir = a.adapter_dir;
  so.learn = a.learn;
  so.pressure = a.pressure;
  so.pressure_step = a.pressure_step / 100.0;
  so.pressure_interval_s = a.pressure_interval;
  so.http.head_timeout_s = a.http_timeout;
  so.http.body_timeout_s = a.body_timeout;
  so.http.max_connections = a.max_connections;
  so.http.max_connections_per_client = a.max_connections_per_client;
  if (a.format.empty()) {
    so.chat_format = detect_chat_format(engine->model().chat_template(), engine->config().arch_name);
  } else {
    auto f = parse_chat_format(a.format);
    if (!f) throw UsageError("--format '" + a.format + "' is not one of chatml, llama3, llama2, plain");
    so.chat_format = *f;
  }
  so.chat_template = jinja_template(a, *engine, so.chat_format);
  so.output_format = detect_chat_output_format(so.chat_template ? so.chat_template->source() : std::string(),
                                               engine->config().arch_name);

  SchedulerOptions sched_opts;
  sched_opts.policy = *policy;
  sched_opts.max_batch = a.max_batch;
  sched_opts.background_window_s = a.background_window;
  sched_opts.window_starvation_s = a.background_starvation;
  sched_opts.background_shares.clear();
  if (a.train_share > 0) sched_opts.background_shares["train"] = a.train_share;
  sched_opts.shares_over_foreground = a.train_share > 0;
  sched_opts.max_queue = a.max_queue;
  sched_opts.kv_spare_bytes = kv_spare;
  if (background_memory > 0) {
    // M_free for background admission: the budget less what KV (sessions'
    // and the prefix cache's), spare KV buffers, compressed KV and training
    // state hold now.
    Engine* e = engine.get();
    sched_opts.free_memory = [e, background_memory] {
      const Footprint f = e->footprint();
      const uint64_t used = f.kv() + f.kv_spare + f.compressed + f.training;
      return background_memory > used ? background_memory - used : 0;
    };
  }
  // Offload before admission (LOCAL §6.2): a training or cache-maintenance
  // task short of memory gets room from the spare KV buffers and the prefix
  // cache's coldest chunks. Declared before the scheduler: it outlives it.
  CacheOffloader offloader(*engine);
  sched_opts.offload = offloader.hook();
  Scheduler scheduler(engine.get(), sched_opts);  // owns the engine from here on
  serve::Server server(*engine, scheduler, so);
  const int port = server.bind();

  std::atomic<bool> listen_failed{false};
  const pthread_t main_thread = pthread_self();
  std::thread listener([&] {
    if (!server.listen()) {
      listen_failed = true;
      pthread_kill(main_thread, SIGTERM);
    }
  });
  // "listening" only once httplib's accept loop runs: a signal that came
  // earlier would reach a stop() that httplib then forgets, and the server
  // would never exit.
  while (!server.running() && !listen_failed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!listen_failed) fit_cgroup_limit(a, scheduler, static_cast<uint64_t>(max_body));
  std::printf("ebb serve: listening on http://%s:%d (model %s, context %lld, chat format %s, policy %s%s)\n",
              a.host.c_str(), port, so.model_id.c_str(), static_cast<long long>(n_ctx),
              so.chat_template ? ("jinja, " + std::string(tool_call_syntax_name(so.output_format.syntax)) + " calls").c_str()
                               : std::string(chat_format_name(so.chat_format)).c_str(), std::string(sched_policy_name(*policy)).c_str(),
              a.api_key.empty() ? "" : ", API key required");
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  if (!listen_failed) {
    std::printf("ebb serve: %s: finishing running answers (up to %.1f s), then exiting\n",
                sig == SIGINT ? "SIGINT" : "SIGTERM", a.grace);
    std::fflush(stdout);
  }
  scheduler.shutdown(a.grace);  // new requests get 503; running ones finish or are cancelled
  server.stop();
  listener.join();
  if (listen_failed) throw Error("the HTTP server stopped unexpectedly on " + a.host + ":" + std::to_string(port));
  std::printf("ebb serve: stopped\n");
  std::fflush(stdout);
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app, int* rc) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* sub = app.add_subcommand("serve", "Serve the model over HTTP: OpenAI-compatible completions, metrics");
  add_model_options(sub, a->model);
  sub->add_option("--host", a->host, "Address to listen on (loopback unless you say otherwise)")->capture_default_str();
  sub->add_option("--port", a->port, "Port to listen on (0: a free one, printed on start)")->capture_default_str();
  sub->add_option("--api-key", a->api_key,
                  "Require 'Authorization: Bearer KEY' on every route but /health (default: $EBB_API_KEY, else none)");
  sub->add_option("--max-body", a->max_body, "Largest request body (bytes, or 64KiB, 4MiB, ...); 413 beyond")
      ->capture_default_str();
  sub->add_option("--kv-spare", a->kv_spare,
                  "KV chunk buffers of finished requests kept for the next ones (bytes, or 256MiB, ...; 0: none), "
                  "given back after 2 s idle, under pressure, or when a memory limit is set")
      ->capture_default_str();
  sub->add_option("--background-memory", a->background_memory,
                  "Memory background work (training, cache warm-up) may use, less what KV and training state "
                  "hold (bytes, or 512MiB, ...; default: the machine's free memory); a task short of it asks "
                  "the prefix cache to offload first");
  sub->add_option("--policy", a->policy, "Scheduling policy: foreground-first, round-robin, fifo")->capture_default_str();
  sub->add_option("--format", a->format, "Chat template: chatml, llama3, llama2, plain (default: the model's)");
  sub->add_option("--chat-template", a->chat_template,
                  "A Jinja chat template FILE (1 MiB at most) to render chat prompts with, or a marker format NAME "
                  "(chatml, llama3, llama2, plain); default: the model's template");
  sub->add_option("--max-batch", a->max_batch, "Requests decoded together at most")->capture_default_str();
  sub->add_option("--train-share", a->train_share,
                  "Training's guaranteed share of the engine's recent time: below it, a training step (one that "
                  "fits --background-window) goes before other background work and between requests' rounds "
                  "(0: training only in idle time)")
      ->capture_default_str();
  sub->add_option("--background-window", a->background_window,
                  "W_bg: the longest a new request may wait for a background step (training, warm-up), seconds")
      ->capture_default_str();
  sub->add_option("--background-step", a->background_step,
                  "Seconds of one background step: a training phase, a stale-coverage or pre-prefill chunk ends "
                  "before a piece that would take it past this (what a request arriving mid-step waits, about)")
      ->capture_default_str();
  sub->add_option("--background-starvation", a->background_starvation,
                  "A background task whose steps are longer than the window runs anyway after waiting this many "
                  "seconds on an idle server, until a request comes (0: never)")
      ->capture_default_str();
  sub->add_option("--max-queue", a->max_queue, "Requests waiting at most (503 beyond)")->capture_default_str();
  sub->add_option("--grace", a->grace, "On SIGINT/SIGTERM, seconds running answers get to finish")->capture_default_str();
  sub->add_flag("-q,--quiet", a->quiet, "No load progress, notes or line per request (the listening line stays)");
  sub->add_option("--adapter-dir", a->adapter_dir,
                  "Directory adapters load from over HTTP (by name: NAME.gguf or a PEFT directory NAME/), "
                  "and where trained adapters are written");
  sub->add_option("--state-dir", a->learn.state_dir,
                  "Directory the agents (/v1/agents) persist in, and with --learn the traces database");
  sub->add_flag("--learn", a->learn.learn,
                "Online learning: learning agents' turns are traces (DIR/traces.sqlite) and their feedback "
                "(/v1/feedback) trains their adapters in the background (docs/agents.md)");
  sub->add_option("--learn-steps", a->learn.steps, "Optimizer steps of one learning round")->capture_default_str();
  sub->add_option("--commit-every", a->learn.commit_every,
                  "Learning: a version is committed, staged and gated every N optimizer steps")
      ->capture_default_str();
  sub->add_option("--learn-gate", a->learn.gate,
                  "Learning: loss (publish a version whose held-back loss is not worse than the published "
                  "version's) or off (publish every version)")
      ->capture_default_str();
  sub->add_option("--judge", a->judge,
                  "Learning: the judge of agents that name none: rule (default), client, prompt:FILE (FILE holds "
                  "the judge prompt template), or a JSON object as the agents' \"judge\" field");
  sub->add_option("--learn-lr", a->learn.lr, "Learning: AdamW peak learning rate")->capture_default_str();
  sub->add_option("--learn-rank", a->learn.rank, "Learning: rank of an agent's new adapter")->capture_default_str();
  sub->add_option("--learn-min-samples", a->learn.min_samples,
                  "Learning: judged samples (from feedback) that start a round")
      ->capture_default_str();
  a->learn.phase_s = 0;  // --background-step's
  sub->add_option("--learn-phase-seconds", a->learn.phase_s,
                  "Learning: training phases of about this many seconds (a request arriving mid-phase waits "
                  "for its end) [default: --background-step]");
  sub->add_option("--trace-max-rows", a->learn.max_trace_rows,
                  "Learning: traces kept at most (the oldest with feedback or expired go first)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--pressure", a->pressure,
                  "React to the device's memory pressure: auto (PSI, else cgroup), psi, cgroup, off")
      ->capture_default_str();
  sub->add_option("--pressure-step", a->pressure_step,
                  "Percentage points of the footprint evicted per pressure signal")
      ->capture_default_str();
  sub->add_option("--pressure-interval", a->pressure_interval,
                  "Seconds between pressure signals, at least (notifications in between are folded)")
      ->capture_default_str();
  sub->add_option("--http-timeout", a->http_timeout,
                  "Seconds a request's head may take from its first byte (408 and close beyond; slow clients "
                  "hold no worker while they send it)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--body-timeout", a->body_timeout, "Seconds a request's body may take once its head is in")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--max-connections", a->max_connections, "Open connections at most (503 and close beyond)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--max-connections-per-client", a->max_connections_per_client,
                  "Open connections from one client address at most (503 and close beyond)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->callback([a, rc] { *rc = serve(*a); });
}

}  // namespace ebb::cli
