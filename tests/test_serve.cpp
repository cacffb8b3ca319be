// ebb serve, driven over loopback with cpp-httplib's client: OpenAI's
// completions and chat completions (plain and streamed), usage and cached
// tokens, concurrency, adapters, the API key, errors in OpenAI's shape,
// tokenize/detokenize, metrics, a client that goes away, a full queue and a
// graceful shutdown. Every server is started on a free port (--port 0, read
// from its first line) and killed at the end; every wait is bounded.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "serve_support.h"
#include "support.h"

namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using namespace ebb::test;

// One server for most tests: an API key, one adapter, a small body limit.
class Serve : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ebb::test::TempDir("ebb-serve");
    const ebb::test::CliResult synth = ebb::test::run_cli("adapter synth -m " + ebb::test::model_path("stories260K.gguf") +
                                                          " --rank 4 -o " + dir_->file("style.gguf"));
    ASSERT_EQ(synth.status, 0) << synth.err;
    server_ = new ServerProcess(
        {"--api-key", kKey, "--lora", dir_->file("style.gguf"), "--max-body", "65536", "--ctx", "512", "--quiet"});
    ASSERT_GT(server_->port(), 0) << "no port in the server's first line: '" << server_->first_line() << "'";
  }
  static void TearDownTestSuite() {
    if (server_) {
      EXPECT_EQ(server_->stop(SIGTERM), 0);
    }
    delete server_;
    delete dir_;
    server_ = nullptr;
    dir_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(server_ && server_->port() > 0);
    c_ = client(server_->port());
  }
  int port() const { return server_->port(); }

  static ebb::test::TempDir* dir_;
  static ServerProcess* server_;
  std::unique_ptr<httplib::Client> c_;
};
ebb::test::TempDir* Serve::dir_ = nullptr;
ServerProcess* Serve::server_ = nullptr;

TEST_F(Serve, PrintsItsAddressOnLoopback) {
  EXPECT_NE(server_->first_line().find("listening on http://127.0.0.1:"), std::string::npos) << server_->first_line();
}

TEST_F(Serve, HealthIsOpenAndModelsListTheBaseAndAdapters) {
  auto open = client(port(), /*with_key=*/false);
  Reply h = get(*open, "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.body["status"], "ok");
  Reply m = get(*c_, "/v1/models");
  ASSERT_EQ(m.status, 200) << m.raw;
  EXPECT_EQ(m.body["object"], "list");
  std::vector<std::string> ids;
  for (const json& d : m.body["data"]) ids.push_back(d["id"].get<std::string>());
  EXPECT_EQ(ids, (std::vector<std::string>{"stories260K", "stories260K:style"}));
}

TEST_F(Serve, AnApiKeyIsRequiredExceptForHealth) {
  auto none = client(port(), false);
  expect_openai_error(get(*none, "/v1/models"), 401, "invalid_api_key");
  expect_openai_error(post(*none, "/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 2}}), 401, "invalid_api_key");
  expect_openai_error(get(*none, "/metrics"), 401, "invalid_api_key");
  auto wrong = client(port(), false);
  wrong->set_bearer_token_auth("not-the-key");
  expect_openai_error(get(*wrong, "/v1/models"), 401, "invalid_api_key");
}

TEST_F(Serve, StreamedCompletionEqualsThePlainOneAndEbbRun) {
  const json req = {{"model", "stories260K"}, {"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}};
  Reply plain = post(*c_, "/v1/completions", req);
  ASSERT_EQ(plain.status, 200) << plain.raw;
  EXPECT_EQ(plain.body["object"], "text_completion");
  EXPECT_EQ(plain.body["model"], "stories260K");
  const json& choice = plain.body["choices"][0];
  const std::string text = choice["text"].get<std::string>();
  EXPECT_FALSE(text.empty());
  EXPECT_TRUE(choice["finish_reason"] == "length" || choice["finish_reason"] == "stop") << plain.raw;
  // Usage: the prompt as the tokenizer counts it (with BOS).
  Reply tok = post(*c_, "/tokenize", json{{"content", "Once upon a time"}, {"add_special", true}});
  ASSERT_EQ(tok.status, 200);
  const json& usage = plain.body["usage"];
  EXPECT_EQ(usage["prompt_tokens"], tok.body["tokens"].size());
  EXPECT_GE(usage["completion_tokens"].get<int>(), 1);
  EXPECT_LE(usage["completion_tokens"].get<int>(), 24);
  if (choice["finish_reason"] == "length") {
    EXPECT_EQ(usage["completion_tokens"], 24);
  }
  EXPECT_EQ(usage["total_tokens"], usage["prompt_tokens"].get<int>() + usage["completion_tokens"].get<int>());
  EXPECT_TRUE(usage["prompt_tokens_details"]["cached_tokens"].is_number_integer());

  json sreq = req;
  sreq["stream_options"] = {{"include_usage", true}};
  const Streamed s = stream(*c_, "/v1/completions", sreq, /*chat=*/false);
  EXPECT_TRUE(s.done && s.done_last);
  EXPECT_EQ(s.text, text);
  ASSERT_GE(s.chunks.size(), 2u);
  const json& last = s.chunks.back();  // the usage chunk
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["completion_tokens"], usage["completion_tokens"]);
  EXPECT_EQ(last["usage"]["prompt_tokens"], usage["prompt_tokens"]);
  EXPECT_EQ(s.chunks[s.chunks.size() - 2]["choices"][0]["finish_reason"], choice["finish_reason"]);

  // Greedy through the server is `ebb run`'s answer.
  const ebb::test::CliResult run = ebb::test::run_cli("run -m " + ebb::test::model_path("stories260K.gguf") +
                                                      " -p 'Once upon a time' -n 24 --temp 0 -t 1 --kv-chunk 16 --batch 16");
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(run.out, text + "\n");
}

TEST_F(Serve, StreamedChatEqualsThePlainOne) {
  const json req = {{"model", "stories260K"},
                    {"messages", {{{"role", "system"}, {"content", "You tell short stories."}},
                                  {{"role", "user"}, {"content", "Tell me about a dog."}}}},
                    {"max_completion_tokens", 20},
                    {"temperature", 0}};
  Reply plain = post(*c_, "/v1/chat/completions", req);
  ASSERT_EQ(plain.status, 200) << plain.raw;
  EXPECT_EQ(plain.body["object"], "chat.completion");
  const json& msg = plain.body["choices"][0]["message"];
  EXPECT_EQ(msg["role"], "assistant");
  const std::string text = msg["content"].get<std::string>();

  const Streamed s = stream(*c_, "/v1/chat/completions", req, /*chat=*/true);
  EXPECT_TRUE(s.done && s.done_last);
  EXPECT_EQ(s.text, text);
  ASSERT_GE(s.chunks.size(), 2u);
  EXPECT_EQ(s.chunks.front()["object"], "chat.completion.chunk");
  EXPECT_EQ(s.chunks.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(s.chunks.back()["choices"][0]["finish_reason"], plain.body["choices"][0]["finish_reason"]);
  for (size_t i = 0; i + 1 < s.chunks.size(); ++i) EXPECT_TRUE(s.chunks[i]["choices"][0]["finish_reason"].is_null());
}

TEST_F(Serve, ASecondTurnTakesTheFirstTurnsKvFromTheCache) {
  const std::string user1 =
      "Once upon a time there was a little girl named Lily who loved to play in the park with her friends every day.";
  json turn1 = {{"messages", {{{"role", "user"}, {"content", user1}}}}, {"max_tokens", 12}, {"temperature", 0},
                {"cache_namespace", "conversation-a"}};
  Reply r1 = post(*c_, "/v1/chat/completions", turn1);
  ASSERT_EQ(r1.status, 200) << r1.raw;
  const std::string answer = r1.body["choices"][0]["message"]["content"].get<std::string>();
  json turn2 = turn1;
  turn2["messages"].push_back({{"role", "assistant"}, {"content", answer}});
  turn2["messages"].push_back({{"role", "user"}, {"content", "What did she find?"}});
  Reply r2 = post(*c_, "/v1/chat/completions", turn2);
  ASSERT_EQ(r2.status, 200) << r2.raw;
  const int64_t cached = r2.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  EXPECT_GE(cached, 16) << r2.raw;  // at least one whole chunk of the first turn
  EXPECT_LT(cached, r2.body["usage"]["prompt_tokens"].get<int64_t>());
  // Another namespace never shares it.
  json other = turn2;
  other["cache_namespace"] = "conversation-b";
  Reply r3 = post(*c_, "/v1/chat/completions", other);
  ASSERT_EQ(r3.status, 200) << r3.raw;
  EXPECT_EQ(r3.body["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << r3.raw;
  EXPECT_EQ(r3.body["choices"][0]["message"]["content"], r2.body["choices"][0]["message"]["content"]);
}

TEST_F(Serve, ConcurrentRequestsMatchTheirSequentialAnswers) {
  std::vector<json> reqs;
  for (int i = 0; i < 4; ++i)
    reqs.push_back({{"prompt", "The " + std::string(i % 2 ? "big" : "small") + " cat number " + std::to_string(i) + " saw"},
                    {"max_tokens", 32},
                    {"temperature", 0},
                    {"ignore_eos", true}});
  std::vector<std::string> sequential;
  for (const json& r : reqs) {
    Reply a = post(*c_, "/v1/completions", r);
    ASSERT_EQ(a.status, 200) << a.raw;
    sequential.push_back(a.body["choices"][0]["text"].get<std::string>());
  }
  std::vector<std::future<Reply>> running;
  for (size_t i = 0; i < reqs.size(); ++i) {
    running.push_back(std::async(std::launch::async, [this, &reqs, i] {
      auto c = client(port());
      if (i % 2) {  // half streamed
        Streamed s = stream(*c, "/v1/completions", reqs[i], false);
        Reply r;
        r.status = s.done ? 200 : 0;
        r.body = {{"choices", {{{"text", s.text}}}}};
        return r;
      }
      return post(*c, "/v1/completions", reqs[i]);
    }));
  }
  for (size_t i = 0; i < running.size(); ++i) {
    ASSERT_EQ(running[i].wait_for(20s), std::future_status::ready);
    Reply r = running[i].get();
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["choices"][0]["text"], sequential[i]) << "request " << i;
  }
}

TEST_F(Serve, AdaptersArePickedByModelOrField) {
  const json base = {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}};
  for (const char* model : {"stories260K:style", "base:style"}) {
    json r = base;
    r["model"] = model;
    Reply a = post(*c_, "/v1/completions", r);
    EXPECT_EQ(a.status, 200) << model << ": " << a.raw;
    EXPECT_EQ(a.body["model"], model);
  }
  json f = base;
  f["adapter"] = "style";
  EXPECT_EQ(post(*c_, "/v1/completions", f).status, 200);
  json unknown = base;
  unknown["model"] = "base:nope";
  expect_openai_error(post(*c_, "/v1/completions", unknown), 404, "model_not_found");
  unknown["model"] = "gpt-4o";
  expect_openai_error(post(*c_, "/v1/completions", unknown), 404, "model_not_found", "model");
  json field = base;
  field["adapter"] = "nope";
  expect_openai_error(post(*c_, "/v1/completions", field), 404, "model_not_found");
}

TEST_F(Serve, BadRequestsGetOpenAiErrors) {
  expect_openai_error(post(*c_, "/v1/completions", std::string("{not json")), 400, "invalid_json");
  expect_openai_error(post(*c_, "/v1/completions", json{{"prompt", "a"}, {"max_tokens", "ten"}}), 400, "", "max_tokens");
  expect_openai_error(post(*c_, "/v1/completions", json{{"prompt", "a"}, {"max_tokens", 0}}), 400, "", "max_tokens");
  expect_openai_error(post(*c_, "/v1/completions", json{{"prompt", "a"}, {"temperature", -1}}), 400, "", "temperature");
  expect_openai_error(post(*c_, "/v1/completions", json{{"prompt", "a"}, {"top_p", 0}}), 400, "", "top_p");
  expect_openai_error(post(*c_, "/v1/completions", json{{"prompt", 5}}), 400, "", "prompt");
  expect_openai_error(post(*c_, "/v1/completions", json{{"prompt", "a"}, {"stream", "yes"}}), 400, "", "stream");
  expect_openai_error(post(*c_, "/v1/chat/completions", json{{"model", "stories260K"}}), 400, "", "messages");
  expect_openai_error(post(*c_, "/v1/chat/completions", json{{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}),
                      400, "", "messages[0].role");
  std::string longer;
  for (int i = 0; i < 1500; ++i) longer += "cat ";
  expect_openai_error(post(*c_, "/v1/completions", json{{"prompt", longer}}), 400, "context_length_exceeded");
  // Unknown route, and a body over --max-body.
  expect_openai_error(get(*c_, "/v1/nothing"), 404, "not_found");
  expect_openai_error(post(*c_, "/v1/completions", json{{"prompt", std::string(70000, 'a')}}), 413, "request_too_large");
  // The server still answers.
  EXPECT_EQ(post(*c_, "/v1/completions", json{{"prompt", "a"}, {"max_tokens", 1}}).status, 200);
}

TEST_F(Serve, TokenizeAndDetokenizeRoundTrip) {
  const std::string text = "Once upon a time, there was a cat named Tom.";
  Reply t = post(*c_, "/tokenize", json{{"content", text}});
  ASSERT_EQ(t.status, 200) << t.raw;
  ASSERT_TRUE(t.body["tokens"].is_array());
  EXPECT_FALSE(t.body["tokens"].empty());
  Reply d = post(*c_, "/detokenize", json{{"tokens", t.body["tokens"]}});
  ASSERT_EQ(d.status, 200) << d.raw;
  EXPECT_EQ(d.body["content"], text);
  Reply with_bos = post(*c_, "/tokenize", json{{"content", text}, {"add_special", true}});
  EXPECT_EQ(with_bos.body["tokens"].size(), t.body["tokens"].size() + 1);
  expect_openai_error(post(*c_, "/detokenize", json{{"tokens", {1, -3}}}), 400, "", "tokens");
  expect_openai_error(post(*c_, "/tokenize", json{{"text", "x"}}), 400, "", "content");
}

TEST_F(Serve, MetricsHaveTheCounters) {
  ASSERT_EQ(post(*c_, "/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 4}, {"ignore_eos", true}}).status, 200);
  // Counters of a request are published when its response has gone (the
  // HTTP status) and at the scheduler's next snapshot: read until they show.
  std::string m;
  for (const auto end = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < end;) {
    auto res = c_->Get("/metrics");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200);
    m = res->body;
    const size_t at = m.find("\nebb_tokens_generated_total ");
    if (m.find("ebb_http_responses_total{status=\"200\"} ") != std::string::npos && at != std::string::npos &&
        std::atof(m.c_str() + at + std::strlen("\nebb_tokens_generated_total ")) >= 4.0)
      break;
    std::this_thread::sleep_for(50ms);
  }
  for (const char* name :
       {"ebb_tokens_generated_total ", "ebb_prompt_tokens_total ", "ebb_prompt_tokens_cached_total ",
        "ebb_decode_tokens_per_second ", "ebb_queue_length{class=\"foreground\"} ", "ebb_queue_length{class=\"background\"} ",
        "ebb_queue_wait_seconds_count ", "ebb_queue_wait_seconds{quantile=\"0.99\"} ", "ebb_prefix_cache_hits_total ",
        "ebb_prefix_cache_lookups_total ", "ebb_memory_bytes{category=\"weights\"} ", "ebb_memory_bytes{category=\"kv\"} ",
        "ebb_memory_bytes{category=\"adapters\"} ", "ebb_requests_total{outcome=\"completed\"} ",
        "ebb_http_responses_total{status=\"200\"} ", "ebb_background_pending{reason=\"memory\"} ",
        "ebb_background_pending{reason=\"window\"} ", "ebb_offload_requests_total{result=\"requested\"} "})
    EXPECT_NE(m.find(name), std::string::npos) << name << "\n" << m;
  const size_t at = m.find("\nebb_tokens_generated_total ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_GE(std::atof(m.c_str() + at + std::strlen("\nebb_tokens_generated_total ")), 4.0);
}


TEST_F(Serve, AClientThatGoesAwayMidStreamIsCancelled) {
  const double before = metric_value(*c_, "ebb_requests_total{outcome=\"cancelled\"}");
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.set_header("Authorization", std::string("Bearer ") + kKey);
  req.body = json{{"prompt", "Once upon a time"}, {"max_tokens", 450}, {"ignore_eos", true}, {"stream", true}}.dump();
  int chunks = 0;
  req.content_receiver = [&chunks](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 2; };
  auto c = client(port());
  auto res = c->send(req);
  EXPECT_FALSE(res);  // the client stopped reading
  c->stop();
  const auto end = std::chrono::steady_clock::now() + 5s;
  double after = before;
  while (std::chrono::steady_clock::now() < end && after <= before) {
    std::this_thread::sleep_for(20ms);
    after = metric_value(*c_, "ebb_requests_total{outcome=\"cancelled\"}");
  }
  EXPECT_GT(after, before) << "the generation was not cancelled";
}

// A server of its own: one request at a time, one waiting; then SIGTERM.
TEST(ServeAlone, AFullQueueIs503AndSigtermShutsDownGracefully) {
  ServerProcess server({"--max-batch", "1", "--max-queue", "1", "--grace", "0.3", "--ctx", "4096", "--quiet"});
  ASSERT_GT(server.port(), 0) << server.first_line();
  // 4000 tokens: over a second on this model, time enough to fill the queue.
  const json slow = {{"prompt", "Once upon a time"}, {"max_tokens", 4000}, {"ignore_eos", true}, {"temperature", 0}};
  // A: streamed and running; B: waiting; C: no room.
  std::promise<void> a_started;
  std::atomic<bool> a_signalled{false};
  std::string a_body;
  std::thread a([&] {
    auto c = client(server.port(), false);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.set_header("Content-Type", "application/json");
    json body = slow;
    body["stream"] = true;
    req.body = body.dump();
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      a_body.append(d, n);
      if (!a_signalled.exchange(true)) a_started.set_value();
      return true;
    };
    c->send(req);
  });
  ASSERT_EQ(a_started.get_future().wait_for(10s), std::future_status::ready);
  auto b = std::async(std::launch::async, [&] {
    auto c = client(server.port(), false);
    return post(*c, "/v1/completions", slow);
  });
  auto probe = client(server.port(), false);
  const auto end = std::chrono::steady_clock::now() + 5s;
  while (metric_value(*probe, "ebb_queue_length{class=\"foreground\"}") < 1 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(5ms);
  ASSERT_EQ(metric_value(*probe, "ebb_queue_length{class=\"foreground\"}"), 1);
  expect_openai_error(post(*probe, "/v1/completions", slow), 503);

  EXPECT_EQ(server.stop(SIGTERM), 0);
  a.join();
  ASSERT_EQ(b.wait_for(5s), std::future_status::ready);
  const Reply br = b.get();
  expect_openai_error(br, 503, "server_shutting_down");  // B never ran
  // A was cancelled after the grace period and its stream closed properly.
  EXPECT_NE(a_body.find("data: "), std::string::npos);
  EXPECT_NE(a_body.find("data: [DONE]"), std::string::npos);
}

// The official OpenAI client (npm's `openai`, which scripts/setup.sh
// installs into BUILD/npm) against a server: model list, chat and
// completions plain and streamed, a wrong key, an unknown model, a
// disconnect mid-stream. Node or the package missing is a failure, not a skip.
TEST(ServeOpenAiClient, TheOfficialClientWorks) {
  ServerProcess server({"--api-key", kKey, "--ctx", "512", "--quiet"});
  ASSERT_GT(server.port(), 0) << server.first_line();
  const ScriptRun run = run_openai_script("openai_client.mjs", server.port());
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("openai client: all checks passed"), std::string::npos) << run.out;
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace

// stories260K's context is 128 tokens: the default KV chunk adapts to it
// (32 tokens), so two prompts that share a prefix share its KV; a chunk
// larger than the context (--kv-chunk 256, the old default) shares nothing.
TEST(ServeAlone, TheDefaultChunkFitsASmallContextSoPrefixesAreReused) {
  const std::string shared = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";
  for (const char* chunk : {"0", "256"}) {
    ServerProcess server({"--kv-chunk", chunk, "--quiet"});
    ASSERT_GT(server.port(), 0) << server.first_line();
    auto c = client(server.port(), false);
    int64_t cached = -1;
    for (const char* tail : {" One day", " Then"}) {
      const Reply r = post(*c, "/v1/completions",
                           json{{"prompt", shared + tail}, {"max_tokens", 4}, {"temperature", 0}});
      ASSERT_EQ(r.status, 200) << r.raw;
      ASSERT_GE(r.body["usage"]["prompt_tokens"].get<int64_t>(), 33) << r.raw;  // more than one chunk of 32
      cached = r.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    }
    // The prefix cache's counters reach /metrics in the scheduler's
    // snapshot, refreshed at most every 0.25 s: wait past two refreshes
    // (and, for the hit, until it shows).
    const double expected = std::string(chunk) == "0" ? 32 : 0;
    std::this_thread::sleep_for(600ms);
    const auto end = std::chrono::steady_clock::now() + 5s;
    double hit = metric_value(*c, "ebb_prefix_cache_hit_tokens_total");
    while (hit < expected && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(20ms);
      hit = metric_value(*c, "ebb_prefix_cache_hit_tokens_total");
    }
    EXPECT_EQ(cached, expected) << "chunk " << chunk << ": one whole chunk of the shared prefix, or none";
    EXPECT_EQ(hit, expected) << "chunk " << chunk;
    EXPECT_EQ(metric_value(*c, "ebb_prompt_tokens_cached_total"), expected) << "chunk " << chunk;
    EXPECT_EQ(server.stop(SIGTERM), 0);
  }
}

// The listening line, one line per request and the shutdown go to stdout
// (one stream tells what the server did); --quiet leaves the listening line
// alone: no load progress, no request lines.
TEST(ServeAlone, TheListeningLineAndRequestLogsShareStdoutQuietSilencesTheRest) {
  {
    ServerProcess server({"--progress-after", "0"});
    ASSERT_GT(server.port(), 0) << server.first_line();
    auto c = client(server.port(), false);
    ASSERT_EQ(post(*c, "/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 2}}).status, 200);
    // The line is written after the answer: wait for it a little.
    const auto end = std::chrono::steady_clock::now() + 5s;
    while (server.out().find("POST /v1/completions 200") == std::string::npos && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(10ms);
    EXPECT_EQ(server.stop(SIGTERM), 0);
    const std::string out = server.out(), err = server.err();
    const size_t listening = out.find("ebb serve: listening on http://");
    const size_t request = out.find("POST /v1/completions 200");
    ASSERT_NE(listening, std::string::npos) << out;
    ASSERT_NE(request, std::string::npos) << out;
    EXPECT_LT(listening, request);
    EXPECT_NE(out.find("ebb serve: stopped"), std::string::npos) << out;
    EXPECT_EQ(err.find("POST /v1/completions"), std::string::npos) << err;
    EXPECT_NE(err.find("loading stories260K.gguf: 100%"), std::string::npos) << err;
  }
  ServerProcess quiet({"--progress-after", "0", "-q"});
  ASSERT_GT(quiet.port(), 0) << quiet.first_line();
  auto c = client(quiet.port(), false);
  ASSERT_EQ(post(*c, "/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 2}}).status, 200);
  EXPECT_EQ(quiet.stop(SIGTERM), 0);
  EXPECT_NE(quiet.out().find("ebb serve: listening on http://"), std::string::npos) << quiet.out();
  EXPECT_EQ(quiet.out().find("POST /v1/completions"), std::string::npos) << quiet.out();
  EXPECT_EQ(quiet.err().find("loading "), std::string::npos) << quiet.err();
}
