// ebb serve's answers beyond one plain choice, over loopback on stories260K:
// n choices (three of them; greedy ones identical; seeded ones
// reproducible), logprobs / top_logprobs (chat and the legacy completions
// shape), token ids of prompt and completion (vLLM's return_token_ids),
// stop token ids and logit_bias; streamed choices reassemble to the
// non-streamed response. That a reported log-probability is the model's own
// is checked against the engine's logits in test_choices.cpp; the official
// openai npm client runs the same requests (tests/openai_client_choices.mjs).
#include <gtest/gtest.h>

#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <map>
#include <thread>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "serve_support.h"
#include "support.h"

namespace {

using nlohmann::json;
using namespace ebb::test;

class ServeChoices : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--api-key", kKey, "--ctx", "512", "--quiet"});
    ASSERT_GT(server_->port(), 0) << "no port in the server's first line: '" << server_->first_line() << "'";
  }
  static void TearDownTestSuite() {
    if (server_) EXPECT_EQ(server_->stop(SIGTERM), 0);
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(server_ && server_->port() > 0);
    c_ = client(server_->port());
  }
  static json chat(json extra) {
    json r = {{"model", "stories260K"},
              {"messages", {{{"role", "user"}, {"content", "Tell me about a cat"}}}},
              {"max_tokens", 16},
              {"ignore_eos", true}};
    for (auto& [k, v] : extra.items()) r[k] = v;
    return r;
  }
  static json completion(json extra) {
    json r = {{"model", "stories260K"}, {"prompt", "Once upon a time"}, {"max_tokens", 16}, {"ignore_eos", true}};
    for (auto& [k, v] : extra.items()) r[k] = v;
    return r;
  }
  static std::string content(const json& choice) { return choice["message"]["content"].get<std::string>(); }
  std::string detokenize(const json& ids) {
    const Reply r = post(*c_, "/detokenize", json{{"tokens", ids}});
    EXPECT_EQ(r.status, 200) << r.raw;
    return r.body.value("content", "");
  }

  static ServerProcess* server_;
  std::unique_ptr<httplib::Client> c_;
};
ServerProcess* ServeChoices::server_ = nullptr;

TEST_F(ServeChoices, NThreeGivesThreeChoicesAndUsageCountsThemAll) {
  const Reply r = post(*c_, "/v1/chat/completions",
                       chat({{"n", 3}, {"temperature", 1.0}, {"seed", 5}, {"return_token_ids", true}}));
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["choices"].size(), 3u) << r.raw;
  int64_t tokens = 0;
  std::set<std::string> texts;
  for (int i = 0; i < 3; ++i) {
    const json& c = r.body["choices"][i];
    EXPECT_EQ(c["index"], i);
    EXPECT_EQ(c["finish_reason"], "length");
    tokens += static_cast<int64_t>(c["token_ids"].size());
    EXPECT_EQ(c["token_ids"].size(), 16u);
    texts.insert(content(c));
  }
  EXPECT_EQ(r.body["usage"]["completion_tokens"], tokens);
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], r.body["prompt_token_ids"].size()) << "the prompt counts once";
  EXPECT_GT(texts.size(), 1u) << "the choices sample on their own";
}

TEST_F(ServeChoices, GreedyChoicesAreIdenticalAndSeededOnesRepeat) {
  const Reply g = post(*c_, "/v1/chat/completions", chat({{"n", 2}, {"temperature", 0}}));
  ASSERT_EQ(g.status, 200) << g.raw;
  ASSERT_EQ(g.body["choices"].size(), 2u);
  EXPECT_EQ(content(g.body["choices"][0]), content(g.body["choices"][1]));
  const json seeded = chat({{"n", 3}, {"temperature", 1.0}, {"seed", 42}});
  const Reply a = post(*c_, "/v1/chat/completions", seeded);
  const Reply b = post(*c_, "/v1/chat/completions", seeded);
  ASSERT_EQ(a.status, 200) << a.raw;
  ASSERT_EQ(b.status, 200) << b.raw;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(content(a.body["choices"][i]), content(b.body["choices"][i])) << i;
  // Choice 0 samples with the request's seed: n = 1 gives it too.
  json one = seeded;
  one["n"] = 1;
  const Reply o = post(*c_, "/v1/chat/completions", one);
  ASSERT_EQ(o.status, 200) << o.raw;
  EXPECT_EQ(content(o.body["choices"][0]), content(a.body["choices"][0]));
}

TEST_F(ServeChoices, TooManyChoicesAreRefusedByName) {
  expect_openai_error(post(*c_, "/v1/chat/completions", chat({{"n", 9}})), 400, "", "n");
}

TEST_F(ServeChoices, ChatTopLogprobsAreSortedAndGreedyPicksTheFirst) {
  const Reply r = post(*c_, "/v1/chat/completions",
                       chat({{"temperature", 0}, {"logprobs", true}, {"top_logprobs", 5}}));
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& lp = r.body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 16u) << r.raw;
  std::string joined;
  for (const json& t : lp) {
    ASSERT_EQ(t["top_logprobs"].size(), 5u) << t;
    for (size_t i = 1; i < 5; ++i)
      EXPECT_GE(t["top_logprobs"][i - 1]["logprob"].get<double>(), t["top_logprobs"][i]["logprob"].get<double>());
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(t["token"], t["top_logprobs"][0]["token"]) << t;
    EXPECT_DOUBLE_EQ(t["logprob"].get<double>(), t["top_logprobs"][0]["logprob"].get<double>());
    std::string bytes;
    for (const json& b : t["bytes"]) bytes += static_cast<char>(b.get<int>());
    EXPECT_EQ(bytes, t["token"].get<std::string>());
    joined += t["token"].get<std::string>();
  }
  EXPECT_EQ(joined, content(r.body["choices"][0]));
  // Without top_logprobs: the chosen token's only.
  const Reply p = post(*c_, "/v1/chat/completions", chat({{"logprobs", true}}));
  ASSERT_EQ(p.status, 200) << p.raw;
  for (const json& t : p.body["choices"][0]["logprobs"]["content"]) EXPECT_TRUE(t["top_logprobs"].empty());
}

TEST_F(ServeChoices, CompletionLogprobsHaveTheLegacyShape) {
  const Reply r = post(*c_, "/v1/completions", completion({{"temperature", 0}, {"logprobs", 3}}));
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& c = r.body["choices"][0];
  const json& lp = c["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 16u) << r.raw;
  ASSERT_EQ(lp["token_logprobs"].size(), 16u);
  ASSERT_EQ(lp["top_logprobs"].size(), 16u);
  ASSERT_EQ(lp["text_offset"].size(), 16u);
  std::string joined;
  for (size_t i = 0; i < 16; ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<int64_t>(), static_cast<int64_t>(joined.size()));
    joined += lp["tokens"][i].get<std::string>();
    const json& top = lp["top_logprobs"][i];
    ASSERT_EQ(top.size(), 3u) << top;
    double best = -1e30;
    for (auto& [tok, v] : top.items()) best = std::max(best, v.get<double>());
    EXPECT_DOUBLE_EQ(lp["token_logprobs"][i].get<double>(), best) << "greedy picks the most likely";
  }
  EXPECT_EQ(joined, c["text"].get<std::string>());
}

TEST_F(ServeChoices, TokenIdsDetokeniseToTheText) {
  const Reply r = post(*c_, "/v1/completions", completion({{"return_token_ids", true}, {"seed", 3}}));
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& c = r.body["choices"][0];
  ASSERT_EQ(c["token_ids"].size(), 16u) << r.raw;
  EXPECT_EQ(detokenize(c["token_ids"]), c["text"].get<std::string>());
  const Reply t = post(*c_, "/tokenize", json{{"content", "Once upon a time"}, {"add_special", true}});
  ASSERT_EQ(t.status, 200) << t.raw;
  EXPECT_EQ(r.body["prompt_token_ids"], t.body["tokens"]);
  // Not asked for: absent.
  const Reply plain = post(*c_, "/v1/completions", completion({}));
  EXPECT_FALSE(plain.body.contains("prompt_token_ids"));
  EXPECT_FALSE(plain.body["choices"][0].contains("token_ids"));
}

// Streamed choices, put back together per index, are the non-streamed
// response: text, logprobs and token ids.
TEST_F(ServeChoices, StreamedChoicesReassembleToTheWholeResponse) {
  for (const bool is_chat : {true, false}) {
    SCOPED_TRACE(is_chat ? "chat" : "completions");
    const std::string path = is_chat ? "/v1/chat/completions" : "/v1/completions";
    json extra = {{"n", 2}, {"temperature", 1.0}, {"seed", 77}, {"return_token_ids", true}};
    if (is_chat) {
      extra["logprobs"] = true;
      extra["top_logprobs"] = 2;
    } else {
      extra["logprobs"] = 2;
    }
    const json req = is_chat ? chat(extra) : completion(extra);
    const Reply whole = post(*c_, path, req);
    ASSERT_EQ(whole.status, 200) << whole.raw;
    const Streamed s = stream(*c_, path, req, is_chat);
    ASSERT_TRUE(s.done_last);
    std::map<int, std::string> text;
    std::map<int, json> ids, lps;
    std::map<int, std::string> finish;
    json prompt_ids;
    for (const json& ch : s.chunks) {
      if (ch.contains("prompt_token_ids")) {
        EXPECT_TRUE(prompt_ids.is_null()) << "prompt_token_ids come once";
        prompt_ids = ch["prompt_token_ids"];
      }
      for (const json& c : ch["choices"]) {
        const int i = c["index"];
        if (is_chat && c["delta"].contains("content")) text[i] += c["delta"]["content"].get<std::string>();
        if (!is_chat) text[i] += c["text"].get<std::string>();
        for (const json& t : c["token_ids"]) ids[i].push_back(t);
        if (!c["logprobs"].is_null()) {
          if (is_chat) {
            for (const json& t : c["logprobs"]["content"]) lps[i].push_back(t);
          } else {
            for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
              for (const json& t : c["logprobs"][k]) lps[i][k].push_back(t);
          }
        }
        if (!c["finish_reason"].is_null()) finish[i] = c["finish_reason"];
      }
    }
    EXPECT_EQ(prompt_ids, whole.body["prompt_token_ids"]);
    for (int i = 0; i < 2; ++i) {
      const json& w = whole.body["choices"][i];
      EXPECT_EQ(text[i], is_chat ? content(w) : w["text"].get<std::string>()) << i;
      EXPECT_EQ(ids[i], w["token_ids"]) << i;
      EXPECT_EQ(lps[i], is_chat ? w["logprobs"]["content"] : w["logprobs"]) << i;
      EXPECT_EQ(finish[i], w["finish_reason"]) << i;
    }
  }
}

TEST_F(ServeChoices, AStopTokenIdEndsTheChoice) {
  const Reply free_run = post(*c_, "/v1/completions", completion({{"temperature", 0}, {"return_token_ids", true}}));
  ASSERT_EQ(free_run.status, 200) << free_run.raw;
  const json& ids = free_run.body["choices"][0]["token_ids"];
  ASSERT_GE(ids.size(), 6u);
  const int stop = ids[5];
  size_t first = 0;
  while (ids[first] != stop) ++first;
  json before = json::array();
  for (size_t i = 0; i < first; ++i) before.push_back(ids[i]);
  for (const json& form : {json{{"stop", {stop}}}, json{{"stop", stop}}, json{{"stop_token_ids", {stop}}}}) {
    SCOPED_TRACE(form.dump());
    json extra = {{"temperature", 0}, {"return_token_ids", true}};
    for (auto& [k, v] : form.items()) extra[k] = v;
    const Reply r = post(*c_, "/v1/completions", completion(extra));
    ASSERT_EQ(r.status, 200) << r.raw;
    const json& c = r.body["choices"][0];
    EXPECT_EQ(c["finish_reason"], "stop");
    ASSERT_EQ(c["token_ids"].size(), first + 1) << "the stop token is the last sampled";
    EXPECT_EQ(c["text"].get<std::string>(), detokenize(before)) << "and its text is not emitted";
  }
  expect_openai_error(post(*c_, "/v1/completions", completion({{"stop_token_ids", {999999}}})), 400, "",
                      "stop_token_ids");
}

TEST_F(ServeChoices, LogitBiasBansAndForcesTokens) {
  const Reply free_run = post(*c_, "/v1/completions", completion({{"temperature", 0}, {"return_token_ids", true}}));
  ASSERT_EQ(free_run.status, 200) << free_run.raw;
  const int first = free_run.body["choices"][0]["token_ids"][0];
  // Banned: never sampled, greedy or not.
  for (const double t : {0.0, 1.0}) {
    const Reply r = post(*c_, "/v1/completions",
                         completion({{"temperature", t},
                                     {"seed", 1},
                                     {"return_token_ids", true},
                                     {"logit_bias", {{std::to_string(first), -100}}}}));
    ASSERT_EQ(r.status, 200) << r.raw;
    for (const json& id : r.body["choices"][0]["token_ids"]) EXPECT_NE(id.get<int>(), first);
  }
  // Forced: every token is the biased one (chat too).
  const int forced = 300;
  const Reply f = post(*c_, "/v1/chat/completions",
                       chat({{"temperature", 1.0}, {"return_token_ids", true},
                             {"logit_bias", {{std::to_string(forced), 100}}}}));
  ASSERT_EQ(f.status, 200) << f.raw;
  ASSERT_EQ(f.body["choices"][0]["token_ids"].size(), 16u);
  for (const json& id : f.body["choices"][0]["token_ids"]) EXPECT_EQ(id.get<int>(), forced);
  // An id outside the vocabulary is named.
  const Reply bad = post(*c_, "/v1/completions", completion({{"logit_bias", {{"999999", 5}}}}));
  expect_openai_error(bad, 400, "", "logit_bias");
  EXPECT_NE(bad.raw.find("999999"), std::string::npos) << bad.raw;
}

// A streaming client of n = 3 that goes away cancels every choice: the
// request counts as one cancelled, and nothing keeps running.
TEST_F(ServeChoices, AClientThatGoesAwayCancelsEveryChoice) {
  const double before = metric_value(*c_, "ebb_requests_total{outcome=\"cancelled\"}");
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.set_header("Authorization", std::string("Bearer ") + kKey);
  req.body = completion({{"n", 3}, {"max_tokens", 450}, {"stream", true}}).dump();
  int chunks = 0;
  req.content_receiver = [&chunks](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 2; };
  auto c = client(server_->port());
  EXPECT_FALSE(c->send(req));  // the client stopped reading
  c->stop();
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  double after = before, running = 1;
  while (std::chrono::steady_clock::now() < end && (after <= before || running > 0)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    after = metric_value(*c_, "ebb_requests_total{outcome=\"cancelled\"}");
    running = metric_value(*c_, "ebb_running");
  }
  EXPECT_EQ(after, before + 1) << "one request, cancelled";
  EXPECT_EQ(running, 0) << "no choice runs on";
}

// The official openai npm client (installed by scripts/setup.sh into
// BUILD/npm) on the same server (tests/openai_client_choices.mjs).
TEST_F(ServeChoices, TheOfficialClientGetsChoicesLogprobsAndTokenIds) {
  const ScriptRun run = run_openai_script("openai_client_choices.mjs", server_->port());
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("openai client choices: all checks passed"), std::string::npos) << run.out;
}

}  // namespace
