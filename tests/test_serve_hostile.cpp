// ebb serve against what hostile or unlucky clients send, while a well-
// behaved client keeps asking: slow heads (slowloris), chunked and oversized
// bodies with and without the key, deep nesting, numbers that overflow,
// pipelined requests, connection caps; plus two servers on one port and
// response ids across a restart. Raw sockets, so the bytes are exactly
// those of the probe.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "serve_support.h"
#include "support.h"

namespace ebb::test {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t w = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (w <= 0) return false;
    off += static_cast<size_t>(w);
  }
  return true;
}

// Everything the server sends until it closes or `limit` passes.
std::string read_until_close(int fd, std::chrono::milliseconds limit) {
  std::string out;
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[65536];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Reads until `count` complete responses with a Content-Length have come.
std::vector<std::string> read_responses(int fd, size_t count, std::chrono::milliseconds limit) {
  std::string buf;
  std::vector<std::string> out;
  const auto end = std::chrono::steady_clock::now() + limit;
  while (out.size() < count && std::chrono::steady_clock::now() < end) {
    size_t he;
    while ((he = buf.find("\r\n\r\n")) != std::string::npos) {
      const size_t cl = buf.find("Content-Length: ");
      if (cl == std::string::npos || cl > he) break;
      const size_t len = std::stoul(buf.substr(cl + 16));
      if (buf.size() < he + 4 + len) break;
      out.push_back(buf.substr(0, he + 4 + len));
      buf.erase(0, he + 4 + len);
    }
    if (out.size() >= count) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char tmp[65536];
    const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) break;
    buf.append(tmp, static_cast<size_t>(n));
  }
  return out;
}

int status_of(const std::string& response) {
  if (response.rfind("HTTP/1.1 ", 0) != 0) return 0;
  return std::atoi(response.c_str() + 9);
}

json body_of(const std::string& response) {
  const size_t he = response.find("\r\n\r\n");
  if (he == std::string::npos) return nullptr;
  return json::parse(response.substr(he + 4), nullptr, false);
}

std::string post_head(const std::string& path, bool key, const std::string& framing) {
  std::string h = "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
  if (key) h += std::string("Authorization: Bearer ") + kKey + "\r\n";
  return h + framing + "\r\n";
}

std::string post_request(const std::string& path, const std::string& body) {
  return post_head(path, true, "Content-Length: " + std::to_string(body.size()) + "\r\n") + body;
}

const std::string kSmall = R"({"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})";

// A client that keeps asking /health and a short completion through every
// probe; each answer must come within `slow` and none may fail.
class Bystander {
 public:
  explicit Bystander(int port) : port_(port), th_([this] { run(); }) {}
  ~Bystander() { finish(); }
  void finish() {
    stop_ = true;
    if (th_.joinable()) th_.join();
  }
  int answered() const { return answered_; }
  int failed() const { return failed_; }
  double slowest() const { return slowest_; }

 private:
  void run() {
    auto c = client(port_);
    c->set_read_timeout(5, 0);
    while (!stop_) {
      const auto t0 = std::chrono::steady_clock::now();
      auto h = c->Get("/health");
      auto r = c->Post("/v1/completions", kSmall, "application/json");
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (h && h->status == 200 && r && r->status == 200) ++answered_;
      else ++failed_;
      if (dt > slowest_.load()) slowest_ = dt;
      std::this_thread::sleep_for(50ms);
    }
  }
  int port_;
  std::atomic<bool> stop_{false};
  std::atomic<int> answered_{0}, failed_{0};
  std::atomic<double> slowest_{0};
  std::thread th_;
};

class ServeHostile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--api-key", kKey, "--max-body", "1MiB", "--http-timeout", "2", "--body-timeout",
                                 "3", "--max-connections-per-client", "48", "--quiet"});
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_GT(server_->port(), 0) << server_->first_line(); }
  int port() const { return server_->port(); }
  static ServerProcess* server_;
};
ServerProcess* ServeHostile::server_ = nullptr;

// Slowloris: more connections than the server has workers, each sending a
// head a byte at a time; the bystander is answered throughout, and each
// slow connection is closed with a 408 once its head's time is up.
TEST_F(ServeHostile, SlowHeadsHoldNoWorkerAndAreClosedWhenTheirTimeIsUp) {
  Bystander by(port());
  std::vector<int> slow;
  for (int i = 0; i < 40; ++i) {
    const int fd = test::connect_loopback(port());
    ASSERT_GE(fd, 0);
    slow.push_back(fd);
  }
  const std::string head = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<bool> open(slow.size(), true);
  for (size_t i = 0; std::chrono::steady_clock::now() - t0 < 3500ms; ++i) {
    for (size_t k = 0; k < slow.size(); ++k)
      if (open[k] && !send_all(slow[k], std::string(1, head[std::min(i, head.size() - 1)]))) open[k] = false;
    std::this_thread::sleep_for(100ms);
  }
  by.finish();
  EXPECT_GT(by.answered(), 5);
  EXPECT_EQ(by.failed(), 0);
  EXPECT_LT(by.slowest(), 2.0) << "the bystander waited behind the slow clients";
  int timed_out = 0;
  for (int fd : slow) {
    const std::string r = read_until_close(fd, 2000ms);
    timed_out += status_of(r) == 408 ? 1 : 0;
    ::close(fd);
  }
  EXPECT_EQ(timed_out, 40);
}

// The key is checked on the head: a chunked body sent without it is
// answered 401 before the client has sent any of the body.
TEST_F(ServeHostile, TheKeyIsCheckedBeforeTheBodyIsRead) {
  const int fd = test::connect_loopback(port());
  ASSERT_TRUE(send_all(fd, post_head("/v1/completions", false, "Transfer-Encoding: chunked\r\n")));
  const std::string r = read_until_close(fd, 3000ms);
  EXPECT_EQ(status_of(r), 401) << r;
  EXPECT_NE(r.find("Connection: close"), std::string::npos);
  ::close(fd);
}

// A chunked body over --max-body is refused while it is read: the server
// answers 413 and closes long before the 8 MiB are sent, and holds no more
// memory afterwards.
TEST_F(ServeHostile, ChunkedBodiesAreBoundedWhileTheyAreRead) {
  const uint64_t rss0 = rss_bytes(server_->pid());
  const int fd = test::connect_loopback(port());
  ASSERT_TRUE(send_all(fd, post_head("/v1/completions", true, "Transfer-Encoding: chunked\r\n")));
  const std::string chunk(64 << 10, ' ');
  char size_line[32];
  std::snprintf(size_line, sizeof size_line, "%zx\r\n", chunk.size());
  size_t sent = 0;
  for (int i = 0; i < 128; ++i) {
    if (!send_all(fd, size_line + chunk + "\r\n")) break;
    sent += chunk.size();
  }
  const std::string r = read_until_close(fd, 3000ms);
  ::close(fd);
  EXPECT_EQ(status_of(r), 413) << r.substr(0, 200);
  EXPECT_LT(sent, 8u << 20) << "the server read the whole body";
  EXPECT_LT(rss_bytes(server_->pid()), rss0 + (16u << 20));

  // A declared Content-Length over the limit: 413 at once.
  const int fd2 = test::connect_loopback(port());
  ASSERT_TRUE(send_all(fd2, post_head("/v1/completions", true, "Content-Length: 200000000\r\n")));
  EXPECT_EQ(status_of(read_until_close(fd2, 3000ms)), 413);
  ::close(fd2);

  // A chunked body within the limit is decoded and answered.
  const int fd3 = test::connect_loopback(port());
  std::string req = post_head("/v1/completions", true, "Transfer-Encoding: chunked\r\n");
  for (size_t i = 0; i < kSmall.size(); i += 7) {
    const std::string piece = kSmall.substr(i, 7);
    char l[16];
    std::snprintf(l, sizeof l, "%zx\r\n", piece.size());
    req += l + piece + "\r\n";
  }
  req += "0\r\n\r\n";
  ASSERT_TRUE(send_all(fd3, req));
  const std::vector<std::string> rs = read_responses(fd3, 1, 10000ms);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(status_of(rs[0]), 200) << rs[0];
  EXPECT_EQ(body_of(rs[0])["object"], "text_completion");
  ::close(fd3);
}

// 1 MiB of "[" is refused at the nesting limit, eight at once, without the
// server's memory growing by more than a few MB.
TEST_F(ServeHostile, DeepNestingIsRefusedWithoutAmplifyingMemory) {
  const uint64_t rss0 = rss_bytes(server_->pid());
  std::vector<std::thread> ths;
  std::atomic<int> refused{0};
  for (int i = 0; i < 8; ++i) {
    ths.emplace_back([&] {
      const int fd = test::connect_loopback(port());
      send_all(fd, post_request("/v1/chat/completions", std::string((1u << 20) - 64, '[')));
      const std::vector<std::string> rs = read_responses(fd, 1, 10000ms);
      if (rs.size() == 1 && status_of(rs[0]) == 400 &&
          body_of(rs[0])["error"]["message"].get<std::string>().find("nested deeper") != std::string::npos)
        ++refused;
      ::close(fd);
    });
  }
  for (auto& t : ths) t.join();
  EXPECT_EQ(refused.load(), 8);
  EXPECT_LT(rss_bytes(server_->pid()), rss0 + (24u << 20));
}

TEST_F(ServeHostile, NumbersThatOverflowAreA400NamingTheField) {
  auto c = client(port());
  const Reply r = post(*c, "/v1/completions", std::string(R"({"prompt": "hi", "max_tokens": 1e400})"));
  expect_openai_error(r, 400, "", "max_tokens");
  const Reply r2 =
      post(*c, "/v1/chat/completions", std::string(R"({"messages": [{"role": "user", "content": -1e999}]})"));
  expect_openai_error(r2, 400, "", "messages[0].content");
}

// Two requests in one write on one connection get two answers, in order.
TEST_F(ServeHostile, PipelinedRequestsAreAllAnswered) {
  const int fd = test::connect_loopback(port());
  const std::string tok1 = R"({"content": "Once upon"})", tok2 = R"({"content": "a time there was"})";
  ASSERT_TRUE(send_all(fd, post_request("/tokenize", tok1) + post_request("/tokenize", tok2) +
                               "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::vector<std::string> rs = read_responses(fd, 3, 10000ms);
  ASSERT_EQ(rs.size(), 3u);
  auto c = client(port());
  EXPECT_EQ(body_of(rs[0]), post(*c, "/tokenize", tok1).body);
  EXPECT_EQ(body_of(rs[1]), post(*c, "/tokenize", tok2).body);
  EXPECT_EQ(body_of(rs[2])["status"], "ok");
  ::close(fd);
}

// Past the per-client cap a connection is answered 503 and closed; the
// ones already open still work.
TEST_F(ServeHostile, ConnectionsPerClientAreCapped) {
  std::vector<int> fds;
  for (int i = 0; i < 48; ++i) {  // each one answered once, so accepted and counted
    const int fd = test::connect_loopback(port());
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
    ASSERT_TRUE(send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
    ASSERT_EQ(read_responses(fd, 1, 5000ms).size(), 1u) << "connection " << i;
  }
  const int extra = test::connect_loopback(port());
  const std::string r = read_until_close(extra, 3000ms);
  EXPECT_EQ(status_of(r), 503) << r;
  ::close(extra);
  ASSERT_TRUE(send_all(fds[0], "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::vector<std::string> rs = read_responses(fds[0], 1, 5000ms);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(status_of(rs[0]), 200);
  for (int fd : fds) ::close(fd);
}

// A route asked with a method it does not take is a 405 naming the ones it
// does (not a 404 "no route"); a POST with no body where none is needed works.
TEST_F(ServeHostile, AWrongMethodIsA405NamingTheRightOne) {
  auto c = client(port());
  auto r = c->Get("/v1/chat/completions");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "method_not_allowed");
  auto m = c->Post("/v1/metrics", "", "application/json");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 404);  // no such route at all
  auto restore = c->Post("/v1/memory/restore");
  ASSERT_TRUE(restore);
  EXPECT_EQ(restore->status, 200) << restore->body;
}

// A second server on a port the first holds is refused with a clear error.
TEST(ServeHostilePort, ASecondServerOnTheSamePortIsRefused) {
  ServerProcess first({"--quiet"});
  ASSERT_GT(first.port(), 0) << first.first_line();
  const std::string cmd = std::string(EBB_CLI_PATH) + " serve -m " + model_path("stories260K.gguf") +
                          " --threads 1 --port " + std::to_string(first.port()) + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int st = ::pclose(p);
  EXPECT_NE(WEXITSTATUS(st), 0) << out;
  EXPECT_NE(out.find("in use"), std::string::npos) << out;
}

// Response ids are unique across a restart.
TEST(ServeHostileIds, ResponseIdsAreUniqueAcrossRestarts) {
  std::set<std::string> ids;
  for (int run = 0; run < 2; ++run) {
    ServerProcess s({"--quiet"});
    ASSERT_GT(s.port(), 0) << s.first_line();
    auto c = client(s.port());
    for (int i = 0; i < 3; ++i) {
      const Reply r = post(*c, "/v1/completions", json::parse(kSmall));
      ASSERT_EQ(r.status, 200);
      EXPECT_TRUE(ids.insert(r.body["id"].get<std::string>()).second) << r.body["id"];
    }
  }
  EXPECT_EQ(ids.size(), 6u);
}

}  // namespace
}  // namespace ebb::test
