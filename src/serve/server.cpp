#include "serve/server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "platform/error.h"
#include "platform/timer.h"
#include "serve/openai.h"

namespace ebb::serve {

using nlohmann::json;

namespace {

constexpr const char* kJson = "application/json";
// How long a streaming response waits for the next event before it checks
// that its client is still there.
constexpr double kPollSeconds = 0.25;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump(e.body()), kJson);
}

ApiError error_of(int status, std::string message, std::string type, std::string code) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

// Compares without an early exit, so the time taken says nothing of where a
// wrong key differs.
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  return diff == 0;
}

json parse_body(const httplib::Request& req) {
  try {
    return json::parse(req.body);
  } catch (const json::parse_error& e) {
    throw ApiException(invalid_request(std::string("the request body is not valid JSON: ") + e.what(), "", "invalid_json"));
  }
}

}  // namespace

struct Server::Impl {
  Engine& engine;
  Scheduler& sched;
  ServerOptions opts;
  httplib::Server http;
  RequestLimits limits;
  int64_t started = static_cast<int64_t>(std::time(nullptr));
  std::atomic<uint64_t> next_id{1};
  mutable std::mutex stats_mu;
  std::map<int, int64_t> responses;  // by HTTP status
  int64_t streams_cancelled = 0;     // streaming clients that went away
  int64_t bound_port = -1;
  // Completions in flight (their responses not yet fully written): stop()
  // lets them finish writing before it closes the server.
  std::mutex inflight_mu;
  std::condition_variable inflight_cv;
  int64_t inflight = 0;
  struct Ticket {
    Impl* impl;
    explicit Ticket(Impl* i) : impl(i) {
      std::lock_guard lock(impl->inflight_mu);
      ++impl->inflight;
    }
    ~Ticket() {
      {
        std::lock_guard lock(impl->inflight_mu);
        --impl->inflight;
      }
      impl->inflight_cv.notify_all();
    }
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
  };
  bool drain(double timeout_s) {
    std::unique_lock lock(inflight_mu);
    return inflight_cv.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return inflight == 0; });
  }

  Impl(Engine& e, Scheduler& s, ServerOptions o) : engine(e), sched(s), opts(std::move(o)) {
    limits.model_id = opts.model_id;
    limits.n_vocab = engine.config().n_vocab;
    limits.n_ctx = opts.n_ctx;
    routes();
  }

  bool authorized(const httplib::Request& req, httplib::Response& res) const {
    if (opts.api_key.empty()) return true;
    const std::string h = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (h.size() > prefix.size() && h.compare(0, prefix.size(), prefix) == 0 &&
        same_secret(h.substr(prefix.size()), opts.api_key))
      return true;
    send_error(res, error_of(401,
                             h.empty() ? "No API key given: send the header 'Authorization: Bearer KEY'"
                                       : "Incorrect API key given",
                             "invalid_request_error", "invalid_api_key"));
    res.set_header("WWW-Authenticate", "Bearer");
    return false;
  }

  // Every route but /health: the key is checked, ApiException becomes its
  // answer, anything else a 500 with its message.
  httplib::Server::Handler guarded(std::function<void(const httplib::Request&, httplib::Response&)> fn, bool open = false) {
    return [this, fn = std::move(fn), open](const httplib::Request& req, httplib::Response& res) {
      if (!open && !authorized(req, res)) return;
      try {
        fn(req, res);
      } catch (const ApiException& e) {
        send_error(res, e.error());
      } catch (const std::exception& e) {
        send_error(res, error_of(500, e.what(), "server_error", "internal_error"));
      }
    };
  }

  void routes() {
    http.set_payload_max_length(opts.max_body);
    http.set_keep_alive_timeout(2);
    http.set_read_timeout(30);
    http.set_write_timeout(30);
    const int threads = opts.http_threads > 0 ? opts.http_threads
                                              : std::max(8, 2 * sched.options().max_batch) + 4;
    http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };

    http.Get("/health", guarded([](const httplib::Request&, httplib::Response& res) {
               res.set_content(R"({"status":"ok"})", kJson);
             },
             /*open=*/true));
    http.Get("/v1/models", guarded([this](const httplib::Request&, httplib::Response& res) { models(res); }));
    http.Get("/metrics", guarded([this](const httplib::Request&, httplib::Response& res) {
               res.set_content(metrics(), "text/plain; version=0.0.4");
             }));
    http.Post("/v1/chat/completions", guarded([this](const httplib::Request& req, httplib::Response& res) {
                completion(req, res, Endpoint::kChat);
              }));
    http.Post("/v1/completions", guarded([this](const httplib::Request& req, httplib::Response& res) {
                completion(req, res, Endpoint::kCompletions);
              }));
    http.Post("/tokenize", guarded([this](const httplib::Request& req, httplib::Response& res) { tokenize(req, res); }));
    http.Post("/detokenize",
              guarded([this](const httplib::Request& req, httplib::Response& res) { detokenize(req, res); }));

    // What httplib answers itself (no route, a body over the limit, a bad
    // request line) gets OpenAI's shape too.
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      if (res.status == 404) {
        send_error(res, error_of(404, "No route " + req.method + " " + req.path +
                                          " (routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, "
                                          "GET /health, GET /metrics, POST /tokenize, POST /detokenize)",
                                 "invalid_request_error", "not_found"));
      } else if (res.status == 413) {
        send_error(res, error_of(413, "The request body is over the server's limit (--max-body)",
                                 "invalid_request_error", "request_too_large"));
      } else {
        send_error(res, error_of(res.status, "HTTP error " + std::to_string(res.status),
                                 res.status >= 500 ? "server_error" : "invalid_request_error", ""));
      }
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(res, error_of(500, what, "server_error", "internal_error"));
    });
    http.set_logger([this](const httplib::Request&, const httplib::Response& res) {
      std::lock_guard lock(stats_mu);
      ++responses[res.status];
    });
  }

  void models(httplib::Response& res) const {
    json data = json::array();
    data.push_back({{"id", opts.model_id}, {"object", "model"}, {"created", started}, {"owned_by", "ebb"}});
    std::vector<std::string> seen;
    for (const AdapterInfo& a : engine.adapters().list()) {
      if (std::find(seen.begin(), seen.end(), a.name) != seen.end()) continue;
      seen.push_back(a.name);
      data.push_back({{"id", opts.model_id + ":" + a.name},
                      {"object", "model"},
                      {"created", started},
                      {"owned_by", "ebb"},
                      {"parent", opts.model_id},
                      {"adapter", {{"name", a.name}, {"rank", a.rank}, {"targets", a.targets}}}});
    }
    res.set_content(dump(json{{"object", "list"}, {"data", data}}), kJson);
  }

  bool has_adapter(const std::string& name) const {
    for (const AdapterInfo& a : engine.adapters().list())
      if (a.name == name && a.published) return true;
    return false;
  }

  // The prompt's tokens as the session will hold them.
  std::vector<TokenId> prompt_tokens(const CompletionRequest& r, GenerateOptions& go) const {
    const Tokenizer& tok = engine.tokenizer();
    EncodeOptions eo;
    eo.add_bos = tok.add_bos_default();
    if (r.endpoint == Endpoint::kChat) {
      std::string text;
      try {
        text = apply_chat_template(opts.chat_format, r.messages, true);
      } catch (const Error& e) {
        throw ApiException(invalid_request(e.what(), "messages"));
      }
      for (const std::string& s : chat_stop_strings(opts.chat_format)) go.stop_strings.push_back(s);
      eo.parse_special = true;
      return tok.encode(text, eo);
    }
    if (r.prompt_is_tokens) return r.prompt_tokens;
    return tok.encode(r.prompt, eo);
  }

  void completion(const httplib::Request& req, httplib::Response& res, Endpoint ep) {
    const double t0 = now_seconds();
    auto ticket = std::make_shared<Ticket>(this);  // a streamed response holds it until written
    const json body = parse_body(req);
    CompletionRequest r = parse_completion_request(body, ep, limits);
    if (!r.adapter.empty() && !has_adapter(r.adapter)) {
      ApiError e;
      e.status = 404;
      e.message = "The model '" + r.model + "' does not exist: no adapter '" + r.adapter +
                  "' is loaded (GET /v1/models lists them)";
      e.param = r.model.find(':') != std::string::npos ? "model" : "adapter";
      e.code = "model_not_found";
      throw ApiException(e);
    }
    GenerationRequest g;
    g.options = r.gen;
    g.prompt = prompt_tokens(r, g.options);
    const char* what = ep == Endpoint::kChat ? "messages" : "prompt";
    if (g.prompt.empty()) throw ApiException(invalid_request("the prompt is empty", what));
    if (static_cast<int64_t>(g.prompt.size()) >= opts.n_ctx) {
      throw ApiException(invalid_request("the prompt has " + std::to_string(g.prompt.size()) +
                                             " tokens; the context holds " + std::to_string(opts.n_ctx) +
                                             " (a prompt must leave room for one generated token)",
                                         what, "context_length_exceeded"));
    }
    g.session = opts.session;
    if (r.cache_namespace_given) g.session.cache_namespace = r.cache_namespace;
    if (!r.adapter.empty()) g.adapters.push_back({r.adapter, 1.0f, 0});
    const int64_t n_prompt = static_cast<int64_t>(g.prompt.size());

    std::shared_ptr<GenerationStream> stream;
    try {
      stream = sched.submit_generation(std::move(g));
    } catch (const SchedulerBusy& e) {
      throw ApiException(error_of(503, e.what(), "server_error", "server_overloaded"));
    }
    const std::string id = (ep == Endpoint::kChat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
    const int64_t created = static_cast<int64_t>(std::time(nullptr));

    // The first event decides the status: an error before any text is
    // answered as an error, not inside a 200 stream.
    std::optional<GenerationEvent> first;
    while (!(first = stream->next(kPollSeconds))) {
    }
    if (first->kind == GenerationEvent::Kind::kError) {
      throw ApiException(first->invalid_request ? invalid_request(first->error)
                                                : error_of(500, first->error, "server_error", "internal_error"));
    }
    if (first->kind == GenerationEvent::Kind::kDone && first->stats.stop == StopReason::kCancelled &&
        first->stats.generated_tokens == 0) {
      // Cancelled before it ran: the server is shutting down (a client that
      // went away hears nothing).
      throw ApiException(error_of(503, "the server is shutting down; the request did not run", "server_error",
                                  "server_shutting_down"));
    }
    if (!r.stream) {
      std::string text;
      for (std::optional<GenerationEvent> ev = std::move(first);; ev = stream->next(kPollSeconds)) {
        if (!ev) continue;
        if (ev->kind == GenerationEvent::Kind::kText) {
          text += ev->text;
          continue;
        }
        if (ev->kind == GenerationEvent::Kind::kError)
          throw ApiException(error_of(500, ev->error, "server_error", "internal_error"));
        const Usage u = usage_of(n_prompt, ev->stats);
        res.set_content(dump(completion_response(r, id, created, text, ev->stats.stop, u)), kJson);
        log(req, 200, id, u, ev->stats.stop, now_seconds() - t0);
        return;
      }
    }
    stream_response(req, res, std::move(r), stream, std::move(*first), id, created, n_prompt, t0, std::move(ticket));
  }

  static Usage usage_of(int64_t n_prompt, const GenerateStats& st) {
    Usage u;
    u.prompt_tokens = n_prompt;
    u.completion_tokens = st.generated_tokens;
    u.cached_tokens = st.cached_tokens;
    return u;
  }

  void log(const httplib::Request& req, int status, const std::string& id, const Usage& u, StopReason stop,
           double seconds) const {
    if (!opts.log_requests) return;
    std::fprintf(stderr, "%s %s %d %s | prompt %" PRId64 " (cached %" PRId64 ") | gen %" PRId64 " | %s | %.1f ms\n",
                 req.method.c_str(), req.path.c_str(), status, id.c_str(), u.prompt_tokens, u.cached_tokens,
                 u.completion_tokens, std::string(stop_reason_name(stop)).c_str(), seconds * 1e3);
  }

  // Server-Sent Events: a chunk per piece of text, the last chunk with the
  // finish reason, the usage chunk when asked for, then [DONE]. A client
  // that goes away cancels its generation at the next step.
  void stream_response(const httplib::Request& req, httplib::Response& res, CompletionRequest r,
                       std::shared_ptr<GenerationStream> stream, GenerationEvent first, const std::string& id,
                       int64_t created, int64_t n_prompt, double t0, std::shared_ptr<Ticket> ticket) {
    struct State {
      std::shared_ptr<Ticket> ticket;
      CompletionRequest r;
      std::shared_ptr<GenerationStream> stream;
      std::optional<GenerationEvent> pending;
      std::string id;
      int64_t created = 0, n_prompt = 0;
      bool role_sent = false, ended = false;
      double t0 = 0;
      std::string method, path;
    };
    auto st = std::make_shared<State>();
    st->ticket = std::move(ticket);
    st->r = std::move(r);
    st->stream = std::move(stream);
    st->pending = std::move(first);
    st->id = id;
    st->created = created;
    st->n_prompt = n_prompt;
    st->t0 = t0;
    st->method = req.method;
    st->path = req.path;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st](size_t, httplib::DataSink& sink) {
          const auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
          if (st->ended) {
            sink.done();
            return true;
          }
          if (!st->role_sent && st->r.endpoint == Endpoint::kChat) {
            st->role_sent = true;
            if (!write(sse(stream_chunk(st->r, st->id, st->created, "", true, nullptr)))) return gone(*st);
          }
          std::optional<GenerationEvent> ev = std::move(st->pending);
          st->pending.reset();
          if (!ev) ev = st->stream->next(kPollSeconds);
          if (!ev) return sink.is_writable() ? true : gone(*st);
          if (ev->kind == GenerationEvent::Kind::kText) {
            if (!write(sse(stream_chunk(st->r, st->id, st->created, ev->text, false, nullptr)))) return gone(*st);
            return true;
          }
          st->ended = true;
          if (ev->kind == GenerationEvent::Kind::kError) {
            write(sse(error_of(500, ev->error, "server_error", "internal_error").body()));
            sink.done();
            return true;
          }
          const std::string fin = finish_reason(ev->stats.stop);
          const Usage u = usage_of(st->n_prompt, ev->stats);
          bool ok = write(sse(stream_chunk(st->r, st->id, st->created, "", false, &fin)));
          if (ok && st->r.include_usage) ok = write(sse(usage_chunk(st->r, st->id, st->created, u)));
          if (ok) ok = write("data: [DONE]\n\n");
          if (!ok) return false;
          sink.done();
          httplib::Request fake;
          fake.method = st->method;
          fake.path = st->path;
          log(fake, 200, st->id, u, ev->stats.stop, now_seconds() - st->t0);
          return true;
        },
        [this, st](bool success) {
          if (!success && !st->ended) gone(*st);
        });
  }

  // The streaming client went away: its generation ends before its next step.
  bool gone(const auto& st) {
    st.stream->cancel();
    std::lock_guard lock(stats_mu);
    ++streams_cancelled;
    return false;
  }

  void tokenize(const httplib::Request& req, httplib::Response& res) const {
    const json body = parse_body(req);
    if (!body.is_object() || !body.contains("content") || !body["content"].is_string())
      throw ApiException(invalid_request("'content' must be a string", "content"));
    EncodeOptions eo;
    eo.add_bos = false;
    if (body.contains("add_special")) {
      if (!body["add_special"].is_boolean())
        throw ApiException(invalid_request("'add_special' must be true or false", "add_special"));
      eo.add_bos = body["add_special"].get<bool>() && engine.tokenizer().add_bos_default();
    }
    if (body.contains("parse_special")) {
      if (!body["parse_special"].is_boolean())
        throw ApiException(invalid_request("'parse_special' must be true or false", "parse_special"));
      eo.parse_special = body["parse_special"].get<bool>();
    }
    const std::vector<TokenId> t = engine.tokenizer().encode(body["content"].get<std::string>(), eo);
    res.set_content(dump(json{{"tokens", t}}), kJson);
  }

  void detokenize(const httplib::Request& req, httplib::Response& res) const {
    const json body = parse_body(req);
    if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array())
      throw ApiException(invalid_request("'tokens' must be an array of token ids", "tokens"));
    std::vector<TokenId> t;
    for (const json& x : body["tokens"]) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= limits.n_vocab)
        throw ApiException(invalid_request("'tokens' must hold token ids in [0, " + std::to_string(limits.n_vocab) + ")",
                                           "tokens"));
      t.push_back(static_cast<TokenId>(x.get<int64_t>()));
    }
    res.set_content(dump(json{{"content", engine.tokenizer().decode(t)}}), kJson);
  }

  std::string metrics() const;
};

namespace {

void metric(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += " ";
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += " ";
  out += type;
  out += "\n";
}

void sample(std::string& out, const std::string& name, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, " %.17g\n", v);
  out += name;
  out += buf;
}

std::string label(const char* key, const std::string& value) {
  std::string v;
  for (char c : value) {
    if (c == '\\' || c == '"') v += '\\';
    if (c == '\n') {
      v += "\\n";
      continue;
    }
    v += c;
  }
  return std::string("{") + key + "=\"" + v + "\"}";
}

}  // namespace

std::string Server::Impl::metrics() const {
  const SchedulerMetrics m = sched.metrics();
  std::string o;
  metric(o, "ebb_requests_total", "counter", "Generation requests by outcome");
  sample(o, "ebb_requests_total" + label("outcome", "submitted"), static_cast<double>(m.fg_submitted));
  sample(o, "ebb_requests_total" + label("outcome", "completed"), static_cast<double>(m.fg_completed));
  sample(o, "ebb_requests_total" + label("outcome", "cancelled"), static_cast<double>(m.fg_cancelled));
  sample(o, "ebb_requests_total" + label("outcome", "failed"), static_cast<double>(m.fg_failed));
  sample(o, "ebb_requests_total" + label("outcome", "rejected"), static_cast<double>(m.fg_rejected));
  metric(o, "ebb_tokens_generated_total", "counter", "Tokens generated");
  sample(o, "ebb_tokens_generated_total", static_cast<double>(m.generated_tokens));
  metric(o, "ebb_prompt_tokens_total", "counter", "Prompt tokens of finished requests");
  sample(o, "ebb_prompt_tokens_total", static_cast<double>(m.prompt_tokens));
  metric(o, "ebb_prompt_tokens_cached_total", "counter", "Prompt tokens whose KV came from the prefix cache");
  sample(o, "ebb_prompt_tokens_cached_total", static_cast<double>(m.cached_tokens));
  metric(o, "ebb_decode_tokens_per_second", "gauge", "Tokens generated per second of foreground rounds (EMA)");
  sample(o, "ebb_decode_tokens_per_second", m.decode_tok_s);
  metric(o, "ebb_foreground_busy_seconds_total", "counter", "Time spent in foreground rounds");
  sample(o, "ebb_foreground_busy_seconds_total", m.fg_busy_s);
  metric(o, "ebb_background_busy_seconds_total", "counter", "Time spent in background steps");
  sample(o, "ebb_background_busy_seconds_total", m.bg_busy_s);
  metric(o, "ebb_rounds_total", "counter", "Foreground rounds (batched steps)");
  sample(o, "ebb_rounds_total", static_cast<double>(m.rounds));
  metric(o, "ebb_queue_length", "gauge", "Tasks waiting, by class");
  sample(o, "ebb_queue_length" + label("class", "foreground"), static_cast<double>(m.fg_waiting));
  sample(o, "ebb_queue_length" + label("class", "background"), static_cast<double>(m.bg_waiting));
  metric(o, "ebb_running", "gauge", "Foreground tasks running together");
  sample(o, "ebb_running", static_cast<double>(m.fg_running));
  metric(o, "ebb_queue_wait_seconds", "summary", "Foreground wait from submission to admission");
  sample(o, "ebb_queue_wait_seconds{quantile=\"0.5\"}", m.wait_p50_s);
  sample(o, "ebb_queue_wait_seconds{quantile=\"0.95\"}", m.wait_p95_s);
  sample(o, "ebb_queue_wait_seconds{quantile=\"0.99\"}", m.wait_p99_s);
  sample(o, "ebb_queue_wait_seconds_sum", m.wait_sum_s);
  sample(o, "ebb_queue_wait_seconds_count", static_cast<double>(m.wait_count));
  metric(o, "ebb_queue_wait_max_seconds", "gauge", "Longest foreground wait");
  sample(o, "ebb_queue_wait_max_seconds", m.wait_max_s);
  metric(o, "ebb_queue_wait_behind_seconds_total", "counter",
         "Foreground wait attributed to the kind of work that ran meanwhile");
  for (const auto& [kind, s] : m.wait_behind_s) sample(o, "ebb_queue_wait_behind_seconds_total" + label("kind", kind), s);
  metric(o, "ebb_background_tasks_total", "counter", "Background tasks by outcome");
  sample(o, "ebb_background_tasks_total" + label("outcome", "submitted"), static_cast<double>(m.bg_submitted));
  sample(o, "ebb_background_tasks_total" + label("outcome", "completed"), static_cast<double>(m.bg_completed));
  sample(o, "ebb_background_tasks_total" + label("outcome", "cancelled"), static_cast<double>(m.bg_cancelled));
  sample(o, "ebb_background_tasks_total" + label("outcome", "failed"), static_cast<double>(m.bg_failed));
  sample(o, "ebb_background_tasks_total" + label("outcome", "rejected"), static_cast<double>(m.bg_rejected));
  metric(o, "ebb_background_steps_total", "counter", "Background steps run");
  sample(o, "ebb_background_steps_total", static_cast<double>(m.bg_steps));
  metric(o, "ebb_background_deferred_total", "counter", "Times a background task was held back, by rule");
  sample(o, "ebb_background_deferred_total" + label("rule", "memory"), static_cast<double>(m.bg_deferred_memory));
  sample(o, "ebb_background_deferred_total" + label("rule", "window"), static_cast<double>(m.bg_deferred_window));
  metric(o, "ebb_prefix_cache_lookups_total", "counter", "Prefix cache lookups");
  sample(o, "ebb_prefix_cache_lookups_total", static_cast<double>(m.prefix_cache.lookups));
  metric(o, "ebb_prefix_cache_hits_total", "counter", "Prefix cache lookups that found a prefix");
  sample(o, "ebb_prefix_cache_hits_total", static_cast<double>(m.prefix_cache.hits));
  metric(o, "ebb_prefix_cache_hit_tokens_total", "counter", "Tokens served from the prefix cache");
  sample(o, "ebb_prefix_cache_hit_tokens_total", static_cast<double>(m.prefix_cache.hit_tokens));
  metric(o, "ebb_prefix_cache_dropped_chunks_total", "counter", "Prefix cache chunks dropped over its limit");
  sample(o, "ebb_prefix_cache_dropped_chunks_total", static_cast<double>(m.prefix_cache.dropped_chunks));
  const Footprint& f = m.footprint;
  metric(o, "ebb_memory_bytes", "gauge", "Memory the LLM holds, by category (engine footprint)");
  uint64_t weights = 0, kv = 0;
  for (uint64_t b : f.weights_per_layer) weights += b;
  for (uint64_t b : f.kv_per_layer) kv += b;
  const std::pair<const char*, uint64_t> cats[] = {
      {"weights", weights},       {"globals", f.globals},       {"kv", kv},
      {"scratch", f.scratch},     {"compressed", f.compressed}, {"io_buffers", f.io_buffers},
      {"adapters", f.adapters},   {"training", f.training},     {"kv_stored", f.kv_stored},
      {"weights_stored", f.weights_stored}};
  for (const auto& [name, bytes] : cats) sample(o, "ebb_memory_bytes" + label("category", name), static_cast<double>(bytes));
  metric(o, "ebb_memory_total_bytes", "gauge", "Memory the LLM holds in RAM");
  sample(o, "ebb_memory_total_bytes", static_cast<double>(f.total()));
  metric(o, "ebb_http_responses_total", "counter", "HTTP responses by status");
  {
    std::lock_guard lock(stats_mu);
    for (const auto& [status, n] : responses)
      sample(o, "ebb_http_responses_total" + label("status", std::to_string(status)), static_cast<double>(n));
    metric(o, "ebb_streams_cancelled_total", "counter", "Streaming clients that went away mid-answer");
    sample(o, "ebb_streams_cancelled_total", static_cast<double>(streams_cancelled));
  }
  return o;
}

Server::Server(Engine& engine, Scheduler& scheduler, ServerOptions opts)
    : impl_(std::make_unique<Impl>(engine, scheduler, std::move(opts))) {}

Server::~Server() { stop(0); }

int Server::bind() {
  const std::string& host = impl_->opts.host;
  int port = impl_->opts.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(host);
    if (port <= 0) throw Error("cannot listen on " + host + " (any port): is the address valid on this machine?");
  } else if (!impl_->http.bind_to_port(host, port)) {
    throw Error("cannot listen on " + host + ":" + std::to_string(port) +
                " (in use, or not an address of this machine; --port 0 picks a free one)");
  }
  impl_->bound_port = port;
  return port;
}

bool Server::listen() { return impl_->http.listen_after_bind(); }

bool Server::running() const { return impl_->http.is_running(); }

void Server::stop(double drain_s) {
  // httplib ends chunked responses once it stops: let those in flight
  // finish writing first (their generations have ended or will soon).
  if (drain_s > 0) impl_->drain(drain_s);
  impl_->http.stop();
}

}  // namespace ebb::serve
