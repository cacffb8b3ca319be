// ebb serve's HTTP frontend: OpenAI-compatible routes over the cooperative
// scheduler (runtime/scheduler.h). Requests are read, rendered and tokenized
// on the HTTP threads; the scheduler thread runs them; results come back
// through each request's GenerationStream.
//
//   POST /v1/chat/completions, /v1/completions   (openai.h; "stream": SSE)
//   GET  /v1/models                              the base model, and ID:NAME per adapter
//   GET  /health                                 open even with an API key
//   GET  /metrics                                Prometheus text
//   POST /tokenize {"content", "add_special"?}   -> {"tokens"}
//   POST /detokenize {"tokens"}                  -> {"content"}
//
// Chat prompts are rendered through the model's Jinja template when it has
// one (ServerOptions::chat_template; server_chat.cpp), which also serves
// tools: calls forced (tool_choice required / a named function) or lazily
// constrained (auto) by a grammar, and read back into tool_calls (streamed
// as deltas) and reasoning_content. response_format / grammar / json_schema
// constrain the output with or without a template. Without a template chat
// uses the marker renderer (chat_format) and tools are refused.
//
// Errors are OpenAI's {"error": {message, type, param, code}}: 400 a bad
// request, 401 a missing or wrong API key, 404 an unknown route or model,
// 413 a body over max_body, 503 a full queue or a shutdown, 500 an internal
// error (with its message).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "model/chat_jinja.h"
#include "model/chat_parse.h"
#include "model/chat_template.h"
#include "serve/http_server.h"
#include "runtime/agents.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "runtime/session.h"

namespace ebb::serve {

// Agents and the online learning loop (serve/server_agents.cpp,
// serve/server_learning.cpp; docs/agents.md).
struct LearnOptions {
  // Agents persist here (DIR/agents.json) and, with learn, traces
  // (DIR/traces.sqlite). "": agents live in memory only and learn is refused.
  std::string state_dir;
  bool learn = false;            // record learning agents' turns and train on their feedback
  int64_t steps = 8;             // optimizer steps of one learning round
  int64_t commit_every = 8;      // a version is committed (and gated) every N steps
  std::string gate = "loss";     // "loss": publish when the held-back loss is not worse; "off": always
  JudgeSpec judge;               // the judge of agents that name none (--judge)
  double lr = 3e-3;              // AdamW peak learning rate of the rounds
  int64_t rank = 8;              // of a new adapter
  double alpha = 16;
  int64_t batch = 4;             // samples per step
  int64_t min_samples = 4;       // new judged samples that start a round
  size_t replay = 64;            // replay buffer per agent (samples)
  size_t heldout = 8;            // held-back samples per agent (the gate's set)
  int64_t heldout_every = 4;     // every N-th positive sample is held back (the first always)
  double correction_weight = 1.0;
  // Training phases of about this many seconds (the trainer sizes them from
  // measured costs): a request arriving mid-phase waits for its end, so
  // this bounds what learning adds to TTFT.
  double phase_s = 0.05;  // ebb serve: --background-step unless --learn-phase-seconds
  int64_t max_trace_rows = 100000;
  int64_t max_trace_bytes = int64_t{256} << 20;
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0: any free port (bind() says which)
  std::string api_key;             // "": no authentication
  size_t max_body = 4u << 20;      // request bodies at most (413 beyond)
  // A background prefill step (stale-coverage prefill of a staged version)
  // ends before a micro-batch that would take it past about this many
  // seconds: what a request arriving mid-step waits (0: 128 tokens a step).
  double background_step_s = 0.05;
  std::string model_id;            // the base model's id in /v1/models and responses
  SessionOptions session;          // each request's session (its cache namespace is the default one)
  ChatFormat chat_format = ChatFormat::kPlain;
  // The model's Jinja chat template (model/chat_jinja.h): chat prompts are
  // rendered through it from the request's messages, tools and
  // chat_template_kwargs, and tools are served. Null: the marker renderer of
  // chat_format, and requests with tools are refused.
  std::shared_ptr<const ChatTemplate> chat_template;
  // How the model writes reasoning and tool calls (model/chat_parse.h).
  ChatOutputFormat output_format;
  int64_t n_ctx = 0;               // the sessions' context (prompts must be shorter)
  int http_threads = 0;            // 0: max(8, 2 x the scheduler's batch) + 4
  // Connection limits and timeouts (http_server.h); max_body and the
  // worker count above take precedence over theirs.
  HttpLimits http;
  bool log_requests = true;        // one line per completion on stdout
  // Adapters load over HTTP from this directory only, by name ("": none
  // load over HTTP); trained adapters and their checkpoints are written here.
  std::string adapter_dir;
  // Memory pressure watching: "auto" (PSI, else cgroup v2, else cgroup v1),
  // "psi", "cgroup", "off". Each signal evicts pressure_step of the
  // footprint through elastic memory; the next request restores.
  std::string pressure = "off";
  double pressure_step = 0.25;
  // At most one signal (one eviction) per this many seconds; notifications
  // in between are folded. Short enough to keep up with a fast allocator:
  // 25 pp of a 400 MB footprint every 0.25 s gives back 400 MB/s.
  double pressure_interval_s = 0.25;
  LearnOptions learn;
};

class Server {
 public:
  // engine: read-only here (tokenizer, template, adapters' list); only the
  // scheduler runs it.
  Server(Engine& engine, Scheduler& scheduler, ServerOptions opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket; returns the port. Throws ebb::Error naming
  // the address when it cannot.
  int bind();
  // Serves until stop() (from another thread). False when the server could
  // not run.
  bool listen();
  // The listener is accepting connections (listen() has entered its loop).
  // A stop() before that would be lost by httplib, which sets itself
  // running when its loop starts: callers wait for this first.
  bool running() const;
  // Waits up to drain_s for the responses in flight to be written (a
  // request still waiting for the scheduler waits with them: shut the
  // scheduler down first), then stops accepting; listen() returns soon after.
  void stop(double drain_s = 5.0);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ebb::serve
