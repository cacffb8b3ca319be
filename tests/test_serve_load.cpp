// A bounded load test of ebb serve (loopback only; it stops by itself):
// 8 clients send 208 greedy requests (plain and streamed, base model and
// adapter, some abandoned mid-stream) while a control client evicts and
// restores memory and publishes a new version of the adapter. Checked: the
// server stays up, every completed answer equals the single-client answer
// of its prompt (for the adapter: of the version it ran on, before or after
// the publish), and its RSS comes back within 5% of where it started.
#include <gtest/gtest.h>

#include <signal.h>

#include <atomic>
#include <cmath>
#include <chrono>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "serve_support.h"
#include "support.h"

namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using namespace ebb::test;

constexpr int kClients = 8;
constexpr int kPerClient = 26;  // 208 requests
constexpr int64_t kTokens = 24;

const std::vector<std::string> kPrompts = {
    "Once upon a time", "Once upon a time, there was a little dog", "The sun was", "Lily and Tom went to the park",
    "One day, a big bird", "Once upon a time, there was a little girl named Sue"};

json request(const std::string& prompt, bool adapter) {
  json j = {{"prompt", prompt}, {"max_tokens", kTokens}, {"temperature", 0}, {"ignore_eos", true}};
  if (adapter) j["model"] = "stories260K:style";
  return j;
}

std::string answer(httplib::Client& c, const std::string& prompt, bool adapter) {
  const Reply r = post(c, "/v1/completions", request(prompt, adapter));
  EXPECT_EQ(r.status, 200) << r.raw;
  if (r.status != 200) return "";
  return r.body["choices"][0]["text"].get<std::string>();
}

// The answers of a single client, one request at a time.
std::vector<std::string> references(int port, bool adapter) {
  auto c = client(port);
  std::vector<std::string> out;
  for (const std::string& p : kPrompts) out.push_back(answer(*c, p, adapter));
  return out;
}

TEST(ServeLoad, EightClientsWithEvictionsDisconnectsAndAPublish) {
  TempDir dir("ebb-serve-load");
  const std::string base = model_path("stories260K.gguf");
  ASSERT_EQ(run_cli("adapter synth -m " + base + " --rank 4 --seed 11 -o " + dir.file("style.gguf")).status, 0);
  ASSERT_EQ(run_cli("adapter synth -m " + base + " --rank 4 --seed 12 -o " + dir.file("style2.gguf")).status, 0);
  ServerProcess server({"--api-key", kKey, "--adapter-dir", dir.path(), "--kv-codec", "none", "--max-batch", "8", "--max-queue", "64",
                        "--ctx", "512", "--quiet"});
  ASSERT_GT(server.port(), 0) << server.first_line();
  const int port = server.port();
  auto ctl = client(port);
  ASSERT_EQ(post(*ctl, "/v1/adapters/load", json{{"name", "style"}}).status, 200);

  const std::vector<std::string> base_ref = references(port, false);
  const std::vector<std::string> v1_ref = references(port, true);
  // A warm-up round at full concurrency, so that the server's threads and
  // allocator arenas exist before RSS is read.
  {
    std::vector<std::thread> ts;
    for (int i = 0; i < kClients; ++i)
      ts.emplace_back([&, i] {
        auto c = client(port);
        answer(*c, kPrompts[static_cast<size_t>(i) % kPrompts.size()], i % 2 == 1);
      });
    for (auto& t : ts) t.join();
  }
  const uint64_t rss_start = rss_bytes(server.pid());
  ASSERT_GT(rss_start, 0u);
  const double held_start = get(*ctl, "/v1/memory").body["footprint"]["total"].get<double>();

  struct Done {
    size_t prompt;
    bool adapter;
    std::string text;
  };
  std::mutex mu;
  std::vector<Done> done;
  std::atomic<int> abandoned{0}, failed{0};
  std::atomic<bool> stop_control{false};
  std::atomic<int> evictions{0}, restores{0};
  std::atomic<bool> published{false};
  std::atomic<int> finished_requests{0};

  std::thread control([&] {
    auto c = client(port);
    int round = 0;
    // Every 50 ms while the clients run, and at least one eviction and one
    // restore however fast they finish.
    while (!stop_control.load() || evictions.load() == 0 || restores.load() == 0) {
      std::this_thread::sleep_for(50ms);
      if (round % 2 == 0) {
        const Reply r = post(*c, "/v1/memory/evict", json{{"fraction", 0.5}});
        EXPECT_EQ(r.status, 200) << r.raw;
        ++evictions;
      } else {
        const Reply r = post(*c, "/v1/memory/restore", json::object());
        EXPECT_EQ(r.status, 200) << r.raw;
        ++restores;
      }
      ++round;
      if (!published.load() && finished_requests.load() >= kClients * kPerClient / 2) {
        const Reply staged = post(*c, "/v1/adapters/style/stage", json{{"file", "style2.gguf"}});
        ASSERT_EQ(staged.status, 200) << staged.raw;
        const Reply pub = post(*c, "/v1/adapters/style/publish", json{{"version", staged.body["version"]}});
        ASSERT_EQ(pub.status, 200) << pub.raw;
        published = true;
      }
    }
  });

  std::vector<std::thread> clients;
  for (int ci = 0; ci < kClients; ++ci) {
    clients.emplace_back([&, ci] {
      std::mt19937 rng(1000 + static_cast<unsigned>(ci));
      auto c = client(port);
      c->set_read_timeout(60, 0);
      for (int k = 0; k < kPerClient; ++k) {
        const size_t p = rng() % kPrompts.size();
        const bool adapter = rng() % 2 == 1;
        const int mode = static_cast<int>(rng() % 10);  // 0: abandoned mid-stream, 1-4: streamed, else plain
        json body = request(kPrompts[p], adapter);
        if (mode == 0) {
          httplib::Request req;
          req.method = "POST";
          req.path = "/v1/completions";
          req.set_header("Content-Type", "application/json");
          req.set_header("Authorization", std::string("Bearer ") + kKey);
          body["stream"] = true;
          req.body = body.dump();
          int chunks = 0;
          req.content_receiver = [&chunks](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 2; };
          auto gone = client(port);
          gone->send(req);
          ++abandoned;
        } else if (mode <= 4) {
          const Streamed s = stream(*c, "/v1/completions", body, false);
          if (!s.done) {
            ++failed;
          } else {
            std::lock_guard lock(mu);
            done.push_back({p, adapter, s.text});
          }
        } else {
          const Reply r = post(*c, "/v1/completions", body);
          if (r.status != 200) {
            ADD_FAILURE() << r.raw;
            ++failed;
          } else {
            std::lock_guard lock(mu);
            done.push_back({p, adapter, r.body["choices"][0]["text"].get<std::string>()});
          }
        }
        ++finished_requests;
      }
    });
  }
  for (auto& t : clients) t.join();
  stop_control = true;
  control.join();

  EXPECT_TRUE(published.load());
  EXPECT_GT(evictions.load(), 0);
  EXPECT_GT(restores.load(), 0);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(static_cast<int>(done.size()) + abandoned.load(), kClients * kPerClient);
  EXPECT_GE(done.size(), 150u);
  EXPECT_EQ(get(*ctl, "/health").status, 200);

  const std::vector<std::string> v2_ref = references(port, true);
  for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_NE(v1_ref[i], v2_ref[i]) << "the versions answer alike";
  int mismatched = 0;
  for (const Done& d : done) {
    const bool ok = d.adapter ? (d.text == v1_ref[d.prompt] || d.text == v2_ref[d.prompt]) : d.text == base_ref[d.prompt];
    if (!ok && ++mismatched <= 5)
      ADD_FAILURE() << "prompt '" << kPrompts[d.prompt] << "'" << (d.adapter ? " with the adapter" : "")
                    << " answered '" << d.text << "', alone '" << (d.adapter ? v1_ref[d.prompt] : base_ref[d.prompt])
                    << "'";
  }
  EXPECT_EQ(mismatched, 0);

  // Back where it started: everything restored, RSS within 5% of its start
  // plus what the engine holds more (the prefix cache now also holds the
  // new version's prefixes): nothing leaked on the way.
  ASSERT_EQ(post(*ctl, "/v1/memory/restore", json::object()).status, 200);
  std::this_thread::sleep_for(200ms);
  const uint64_t rss_end = rss_bytes(server.pid());
  const double held_end = get(*ctl, "/v1/memory").body["footprint"]["total"].get<double>();
  const double expected = static_cast<double>(rss_start) + (held_end - held_start);
  const double change = (static_cast<double>(rss_end) - expected) / static_cast<double>(rss_start);
  EXPECT_LE(std::abs(change), 0.05) << "RSS " << rss_start << " -> " << rss_end << " bytes; the engine held "
                                    << held_start << " -> " << held_end << " bytes";
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
