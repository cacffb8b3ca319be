#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <random>
#include <cstdio>
#include <ctime>

#include "platform/error.h"
#include "platform/timer.h"
#include "serve/json_bounded.h"
#include "serve/server_impl.h"

namespace ebb::serve {

using nlohmann::json;

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

bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  return diff == 0;
}

json parse_body(const httplib::Request& req) {
  json j;
  JsonError err;
  if (!parse_json_bounded(req.body, JsonLimits{}, j, err)) {
    if (!err.field.empty())
      throw ApiException(invalid_request("'" + err.field + "': " + err.message, err.field, "invalid_value"));
    throw ApiException(invalid_request("the request body is not valid JSON: " + err.message, "", "invalid_json"));
  }
  return j;
}

void Server::Impl::routes() {
  {
    std::random_device rd;
    std::mt19937_64 g((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(now_seconds() * 1e9));
    char buf[32];
    std::snprintf(buf, sizeof buf, "%016" PRIx64 "-", g());
    id_prefix = buf;
  }
  HttpLimits hl = opts.http;
  hl.max_body = opts.max_body;
  hl.workers = opts.http_threads > 0 ? opts.http_threads : std::max(8, 2 * sched.options().max_batch) + 4;
  http.set_limits(hl);
  http.set_keep_alive_timeout(static_cast<time_t>(hl.idle_timeout_s));
  http.set_keep_alive_max_count(static_cast<size_t>(hl.max_requests_per_connection));
  http.set_read_timeout(static_cast<time_t>(hl.body_timeout_s));
  http.set_write_timeout(static_cast<time_t>(hl.write_timeout_s));
  // The key is checked on the request head, before a byte of the body is read.
  http.set_head_check([this](const HttpHead& h) {
    HttpRefusal r;
    if (open_route(h.path) || key_ok(h.authorization)) return r;
    r.status = 401;
    r.body = dump(unauthorized(h.authorization).body());
    r.www_authenticate = "Bearer";
    return r;
  });
  http.set_error_body([](int status, const std::string& message, const std::string& code) {
    return dump(error_of(status, message, status >= 500 ? "server_error" : "invalid_request_error", code).body());
  });

  http.Get("/health", guarded([](const httplib::Request&,
                                 httplib::Response& res) { res.set_content(R"({"status":"ok"})", kJson); },
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
  memory_routes();
  adapter_routes();
  training_routes();
  agent_routes();
  handoff_routes();
  learning_routes();
  web_routes();

  // What httplib answers itself (no route, a body over the limit, a bad
  // request line) gets OpenAI's shape too.
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      if (const std::string allow = http.allowed_methods(req.path); !allow.empty()) {
        send_error(res, error_of(405, req.path + " takes " + allow + ", not " + req.method, "invalid_request_error",
                                 "method_not_allowed"));
        res.status = 405;
        res.set_header("Allow", allow);
        return;
      }
      send_error(res, error_of(404,
                               "No route " + req.method + " " + req.path +
                                   " (routes: /v1/chat/completions, /v1/completions, /v1/models, /v1/memory, "
                                   "/v1/adapters, /v1/training/jobs, /v1/agents, /v1/handoffs, /v1/feedback, /v1/learning, "
                                   "/health, /metrics, /tokenize, /detokenize, /)",
                               "invalid_request_error", "not_found"));
    } else if (res.status == 413) {
      send_error(res, error_of(413, "The request body is over the server's limit (--max-body)", "invalid_request_error",
                               "request_too_large"));
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

void Server::Impl::models(httplib::Response& res) const {
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

bool Server::Impl::has_adapter(const std::string& name) const {
  for (const AdapterInfo& a : engine.adapters().list())
    if (a.name == name && a.published) return true;
  return false;
}

// Call ids for one response: make_call_id over a generator of its own.
CallIdFn call_ids() {
  auto rng = std::make_shared<std::mt19937_64>(std::random_device{}());
  return [rng] { return make_call_id(*rng); };
}

void Server::Impl::completion(const httplib::Request& req, httplib::Response& res, Endpoint ep) {
  const double t0 = now_seconds();
  auto ticket = std::make_shared<Ticket>(this);  // a streamed response holds it until written
  const json body = parse_body(req);
  CompletionRequest r = parse_completion_request(body, ep, limits);
  std::shared_ptr<AgentTurn> turn = apply_agent(r);  // the agent's prompt, namespace and adapter version
  // Its pending handoffs are consumed: their pre-prefilled prefix is in the
  // prefix cache (what is still missing, this request prefills itself).
  if (turn) consume_handoffs(turn->agent);
  if (!turn && !r.adapter.empty() && !has_adapter(r.adapter)) {
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
  ChatOutputFormat fmt;
  const ClientOrder order = client_order(r, req.body);
  g.prompt = prompt_tokens(r, g.options, fmt, order);
  g.options.constraint = constraint_for(r, fmt, order);
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
  if (!r.adapter.empty()) g.adapters.push_back({r.adapter, 1.0f, r.adapter_version});
  const int64_t n_prompt = static_cast<int64_t>(g.prompt.size());
  if (turn) {
    turn->prompt = g.prompt;
    turn->t0 = t0;
  }

  g.options.sampling.logit_bias = r.logit_bias;
  g.options.stop_tokens = r.stop_token_ids;
  g.options.logprobs = r.logprobs ? r.top_logprobs : -1;
  g.n_choices = r.n;
  std::vector<TokenId> prompt_ids;
  if (r.return_token_ids) prompt_ids = g.prompt;

  std::shared_ptr<GenerationStream> stream;
  try {
    stream = sched.submit_generation(std::move(g));
  } catch (const SchedulerBusy& e) {
    throw ApiException(error_of(503, e.what(), "server_error", "server_overloaded"));
  }
  const std::string id = new_id(ep == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
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
    throw ApiException(
        error_of(503, "the server is shutting down; the request did not run", "server_error", "server_shutting_down"));
  }
  if (!r.stream) {
    // Each choice's text and tokens, until every choice is done.
    std::vector<Choice> choices(static_cast<size_t>(r.n));
    int64_t cached = 0;
    int n_done = 0;
    GenerateStats stats0;  // choice 0's: an agent's trace
    // The next event is waited for only while a choice is still running (a
    // wait after the last one would hold the answer back for kPollSeconds).
    std::optional<GenerationEvent> ev = std::move(first);
    for (; n_done < r.n; ev.reset()) {
      if (!ev) ev = stream->next(kPollSeconds);
      if (!ev) continue;
      if (ev->kind == GenerationEvent::Kind::kError)
        throw ApiException(error_of(500, ev->error, "server_error", "internal_error"));
      Choice& c = choices.at(static_cast<size_t>(ev->choice));
      add_tokens(r, ev->tokens, c.logprobs, c.token_ids);
      if (ev->kind == GenerationEvent::Kind::kText) {
        c.text += ev->text;
        continue;
      }
      ++n_done;
      c.stop = ev->stats.stop;
      c.completion_tokens = ev->stats.generated_tokens;
      if (ev->choice == 0) {
        cached = ev->stats.cached_tokens;
        stats0 = ev->stats;
      }
      if (parse_chat(r)) c.parsed = parse_chat_output(fmt, c.text, calls_on(r), call_ids());
    }
    if (turn) {  // choice 0 is the turn's trace
      const json m = choices[0].parsed ? chat_message(*choices[0].parsed) : json::object();
      turn_done(*turn, id, stats0, m.contains("tool_calls") ? m["tool_calls"].dump() : "");
    }
    const Usage u = total_usage(n_prompt, cached, choices);
    res.set_content(dump(completion_response(r, id, created, choices, u, prompt_ids)), kJson);
    log(req, 200, id, u, choices[0].stop, now_seconds() - t0);
    return;
  }
  stream_response(req, res, std::move(r), stream, std::move(*first), id, created, n_prompt, std::move(prompt_ids), t0,
                  std::move(ticket), fmt, std::move(turn));
}

void Server::Impl::add_tokens(const CompletionRequest& r, std::span<const StepLogprobs> tokens,
                              std::vector<TokenLogprob>& logprobs, std::vector<TokenId>& ids) const {
  const Tokenizer& tok = engine.tokenizer();
  for (const StepLogprobs& t : tokens) {
    if (r.return_token_ids) ids.push_back(t.id);
    if (!r.logprobs) continue;
    TokenLogprob lp;
    lp.id = t.id;
    lp.text = tok.token_to_piece(t.id, /*special=*/true);
    lp.logprob = t.logprob;
    for (const TokenAlternative& a : t.top) lp.top.push_back({a.id, tok.token_to_piece(a.id, true), a.logprob});
    logprobs.push_back(std::move(lp));
  }
}

Usage Server::Impl::usage_of(int64_t n_prompt, const GenerateStats& st) {
  Usage u;
  u.prompt_tokens = n_prompt;
  u.completion_tokens = st.generated_tokens;
  u.cached_tokens = st.cached_tokens;
  return u;
}

void Server::Impl::log(const httplib::Request& req, int status, const std::string& id, const Usage& u, StopReason stop,
                       double seconds) const {
  if (!opts.log_requests) return;
  // On stdout, as the listening line: one stream tells what the server did.
  std::fprintf(stdout, "%s %s %d %s | prompt %" PRId64 " (cached %" PRId64 ") | gen %" PRId64 " | %s | %.1f ms\n",
               req.method.c_str(), req.path.c_str(), status, id.c_str(), u.prompt_tokens, u.cached_tokens,
               u.completion_tokens, std::string(stop_reason_name(stop)).c_str(), seconds * 1e3);
  std::fflush(stdout);
}

// Server-Sent Events: for chat, a first chunk per choice with the role;
// then a chunk per piece of a choice's text (tagged with its index, with
// the tokens sampled since its last chunk when logprobs or token ids are
// asked for), each choice's last chunk with its finish reason, the usage
// chunk when asked for, then [DONE]. A client that goes away cancels its
// generation (every choice) at the next step.

void Server::Impl::stream_response(const httplib::Request& req, httplib::Response& res, CompletionRequest r,
                                   std::shared_ptr<GenerationStream> stream, GenerationEvent first,
                                   const std::string& id, int64_t created, int64_t n_prompt,
                                   std::vector<TokenId> prompt_ids, double t0, std::shared_ptr<Ticket> ticket,
                                   const ChatOutputFormat& fmt, std::shared_ptr<AgentTurn> turn) {
  struct PerChoice {
    std::unique_ptr<ChatStreamParser> parser;  // chat through a template: deltas of content, reasoning, calls
    bool made_calls = false, done = false;
    std::vector<StepLogprobs> tokens;  // sampled, not yet sent
    int64_t token_offset = 0;          // completions: bytes of the tokens sent so far
    int64_t completion_tokens = 0;
  };
  struct State {
    std::vector<PerChoice> choices;
    std::shared_ptr<Ticket> ticket;
    CompletionRequest r;
    std::shared_ptr<GenerationStream> stream;
    std::optional<GenerationEvent> pending;
    std::vector<TokenId> prompt_ids;  // sent with the first chunk (return_token_ids)
    std::string id;
    int64_t created = 0, n_prompt = 0, cached = 0;
    int n_done = 0;
    StopReason stop0 = StopReason::kMaxTokens;
    bool started = false, ended = false;
    double t0 = 0;
    std::string method, path;
    std::shared_ptr<AgentTurn> turn;  // an agent's turn: choice 0's trace at the end
    GenerateStats stats0;
    ChatOutputFormat fmt;
  };
  auto st = std::make_shared<State>();
  st->ticket = std::move(ticket);
  st->choices.resize(static_cast<size_t>(r.n));
  if (parse_chat(r))
    for (PerChoice& c : st->choices) c.parser = std::make_unique<ChatStreamParser>(fmt, calls_on(r), call_ids());
  st->r = std::move(r);
  st->stream = std::move(stream);
  st->pending = std::move(first);
  st->prompt_ids = std::move(prompt_ids);
  st->id = id;
  st->created = created;
  st->n_prompt = n_prompt;
  st->t0 = t0;
  st->method = req.method;
  st->path = req.path;
  if (turn) st->fmt = fmt;
  st->turn = std::move(turn);
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
        const bool chat = st->r.endpoint == Endpoint::kChat;
        // One chunk for choice i: its deltas (chat) or text, the tokens
        // sampled since its last chunk, and its finish reason when it ends.
        const auto write_choice = [&](int i, std::vector<ChatDelta> deltas, std::string text, const std::string* fin,
                                      bool role) {
          PerChoice& pc = st->choices[static_cast<size_t>(i)];
          StreamChoice c;
          c.index = i;
          c.first = role;
          for (const ChatDelta& d : deltas) pc.made_calls |= d.kind == ChatDelta::Kind::kToolCall;
          c.deltas = std::move(deltas);
          c.text = std::move(text);
          if (fin) c.finish_reason = *fin;
          add_tokens(st->r, pc.tokens, c.logprobs, c.token_ids);
          pc.tokens.clear();
          c.text_offset = pc.token_offset;
          for (const TokenLogprob& t : c.logprobs) pc.token_offset += static_cast<int64_t>(t.text.size());
          const std::span<const TokenId> ids = st->started ? std::span<const TokenId>() : st->prompt_ids;
          st->started = true;
          return write(sse(stream_chunk(st->r, st->id, st->created, std::span<const StreamChoice>(&c, 1), ids)));
        };
        if (!st->started && chat) {
          for (int i = 0; i < st->r.n; ++i)
            if (!write_choice(i, {}, "", nullptr, true)) return gone(*st);
        }
        std::optional<GenerationEvent> ev = std::move(st->pending);
        st->pending.reset();
        if (!ev) ev = st->stream->next(kPollSeconds);
        if (!ev) return sink.is_writable() ? true : gone(*st);
        if (ev->kind == GenerationEvent::Kind::kError) {
          st->ended = true;
          write(sse(error_of(500, ev->error, "server_error", "internal_error").body()));
          sink.done();
          return true;
        }
        const int i = ev->choice;
        PerChoice& pc = st->choices.at(static_cast<size_t>(i));
        pc.tokens.insert(pc.tokens.end(), ev->tokens.begin(), ev->tokens.end());
        if (ev->kind == GenerationEvent::Kind::kText) {
          bool ok = true;
          if (pc.parser) {
            std::vector<ChatDelta> deltas = pc.parser->feed(ev->text);
            if (!deltas.empty()) ok = write_choice(i, std::move(deltas), "", nullptr, false);
          } else if (chat) {
            ok = write_choice(i, {ChatDelta{ChatDelta::Kind::kContent, ev->text, 0, {}, {}}}, "", nullptr, false);
          } else {
            ok = write_choice(i, {}, ev->text, nullptr, false);
          }
          return ok ? true : gone(*st);
        }
        // The choice's end.
        pc.done = true;
        pc.completion_tokens = ev->stats.generated_tokens;
        if (i == 0) {
          st->cached = ev->stats.cached_tokens;
          st->stop0 = ev->stats.stop;
          st->stats0 = ev->stats;
        }
        bool ok = true;
        if (pc.parser) {
          std::vector<ChatDelta> last = pc.parser->finish();
          for (const ChatDelta& d : last) pc.made_calls |= d.kind == ChatDelta::Kind::kToolCall;
          const std::string fin = finish_reason(ev->stats.stop, pc.made_calls);
          ok = write_choice(i, std::move(last), "", &fin, false);
        } else {
          const std::string fin = finish_reason(ev->stats.stop);
          ok = write_choice(i, {}, "", &fin, false);
        }
        if (!ok) return gone(*st);
        if (++st->n_done < st->r.n) return true;
        st->ended = true;
        Usage u;
        u.prompt_tokens = st->n_prompt;
        u.cached_tokens = st->cached;
        for (const PerChoice& c : st->choices) u.completion_tokens += c.completion_tokens;
        if (st->r.include_usage) ok = write(sse(usage_chunk(st->r, st->id, st->created, u)));
        if (ok) ok = write("data: [DONE]\n\n");
        if (st->turn) {
          std::string calls;
          if (parse_chat(st->r)) {
            const json m = chat_message(parse_chat_output(st->fmt, st->stats0.text, calls_on(st->r), call_ids()));
            if (m.contains("tool_calls")) calls = m["tool_calls"].dump();
          }
          turn_done(*st->turn, st->id, st->stats0, calls);
        }
        if (!ok) return false;
        sink.done();
        httplib::Request fake;
        fake.method = st->method;
        fake.path = st->path;
        log(fake, 200, st->id, u, st->stop0, now_seconds() - st->t0);
        return true;
      },
      [this, st](bool success) {
        if (!success && !st->ended) gone(*st);
      });
}

void Server::Impl::tokenize(const httplib::Request& req, httplib::Response& res) const {
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

void Server::Impl::detokenize(const httplib::Request& req, httplib::Response& res) const {
  const json body = parse_body(req);
  if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array())
    throw ApiException(invalid_request("'tokens' must be an array of token ids", "tokens"));
  std::vector<TokenId> t;
  for (const json& x : body["tokens"]) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= limits.n_vocab)
      throw ApiException(
          invalid_request("'tokens' must hold token ids in [0, " + std::to_string(limits.n_vocab) + ")", "tokens"));
    t.push_back(static_cast<TokenId>(x.get<int64_t>()));
  }
  res.set_content(dump(json{{"content", engine.tokenizer().decode(t)}}), kJson);
}

Server::Server(Engine& engine, Scheduler& scheduler, ServerOptions opts)
    : impl_(std::make_unique<Impl>(engine, scheduler, std::move(opts))) {}

Server::Impl::~Impl() {
  stop_pressure();
  stop_learning();
  stop_training();
}

Server::~Server() { stop(0); }

int Server::bind() {
  const std::string& host = impl_->opts.host;
  int port = impl_->opts.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(host);
    if (port <= 0) throw Error("cannot listen on " + host + " (any port): is the address valid on this machine?");
  } else if (!impl_->http.bind_to_port(host, port)) {
    const int err = errno;
    if (err == EADDRINUSE)
      throw Error("cannot listen on " + host + ":" + std::to_string(port) +
                  ": the port is in use (another ebb serve or another server holds it; --port 0 picks a free one)");
    throw Error("cannot listen on " + host + ":" + std::to_string(port) + ": " + std::strerror(err) +
                " (is it an address of this machine? --port 0 picks a free port)");
  }
  impl_->bound_port = port;
  return port;
}

bool Server::listen() {
  impl_->start_pressure();
  impl_->http.start_connections();
  return impl_->http.listen_after_bind();
}

bool Server::running() const { return impl_->http.is_running(); }

void Server::stop(double drain_s) {
  // httplib ends chunked responses once it stops: let those in flight
  // finish writing first (their generations have ended or will soon).
  impl_->stop_pressure();
  impl_->stop_learning();
  impl_->stop_training();
  if (drain_s > 0) impl_->drain(drain_s);
  impl_->http.stop();
  impl_->http.shutdown_connections();
}

}  // namespace ebb::serve
