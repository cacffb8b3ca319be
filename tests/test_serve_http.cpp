// ebb serve's connection handling (src/serve/http_server.*), in-process and
// without a model: many one-shot and keep-alive connections opened and
// closed at once, streams abandoned mid-way, and connections over the caps.
// Checked: every request that is not abandoned gets its own response, and a
// connection over a cap gets a 503 that the client can read, never silence.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "serve/http_server.h"
#include "serve_support.h"

namespace {

using namespace std::chrono_literals;
using ebb::serve::HttpLimits;
using ebb::serve::HttpServer;

// An HttpServer on 127.0.0.1 (a free port) with three routes:
//   GET  /hello?n=N  -> "hello N"
//   POST /echo       -> the body
//   GET  /stream     -> 40 chunks "chunk i\n", 2 ms apart, until the client goes
class TestServer {
 public:
  explicit TestServer(const HttpLimits& limits,
                      std::function<ebb::serve::HttpRefusal(const ebb::serve::HttpHead&)> head_check = nullptr) {
    srv_.set_limits(limits);
    if (head_check) srv_.set_head_check(std::move(head_check));
    srv_.Get("/hello", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content("hello " + req.get_param_value("n"), "text/plain");
    });
    srv_.Post("/echo", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content(req.body, "text/plain");
    });
    srv_.Get("/stream", [this](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("text/plain", [this](size_t, httplib::DataSink& sink) {
        for (int i = 0; i < 40; ++i) {
          if (!sink.is_writable()) {
            ++abandoned_streams;
            return false;
          }
          const std::string s = "chunk " + std::to_string(i) + "\n";
          if (!sink.write(s.data(), s.size())) {
            ++abandoned_streams;
            return false;
          }
          std::this_thread::sleep_for(2ms);
        }
        sink.done();
        return true;
      });
    });
    port_ = srv_.bind_to_any_port("127.0.0.1");
    srv_.start_connections();
    thread_ = std::thread([this] { srv_.listen_after_bind(); });
  }
  ~TestServer() {
    srv_.stop();
    thread_.join();
    srv_.shutdown_connections();
  }
  int port() const { return port_; }
  HttpServer& http() { return srv_; }
  std::atomic<int> abandoned_streams{0};

 private:
  HttpServer srv_;
  int port_ = 0;
  std::thread thread_;
};

std::unique_ptr<httplib::Client> client(int port, bool keep_alive) {
  auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
  c->set_keep_alive(keep_alive);
  c->set_connection_timeout(10, 0);
  c->set_read_timeout(10, 0);
  c->set_write_timeout(10, 0);
  return c;
}

// A raw TCP connection to 127.0.0.1:port (-1 on failure).
// Everything the peer sends until it closes (or 10 s pass); `error` gets
// the read's errno text when the connection ends in an error (a reset).
std::string read_all(int fd, std::string* error) {
  std::string out;
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0) *error = std::strerror(errno);
    break;
  }
  return out;
}

// 8 clients, each 60 rounds of: a one-shot GET on a new connection, 4 GETs
// on one keep-alive connection, a POST with a body, a stream read to its
// end and (every third round) a stream abandoned after its first chunk,
// while the reactor accepts, sweeps and closes around them. Every request
// but the abandoned ones must be answered with its own body.
TEST(ServeHttp, ManyConnectionsOpenedAndClosedAtOnceAreEveryOneAnswered) {
  HttpLimits limits;
  limits.workers = 16;
  TestServer server(limits);
  ASSERT_GT(server.port(), 0);
  constexpr int kClients = 8, kRounds = 60;
  std::mutex mu;
  std::vector<std::string> failures;
  std::atomic<int> answered{0}, abandoned{0};
  const auto fail = [&](const std::string& what) {
    std::lock_guard lock(mu);
    failures.push_back(what);
  };
  const auto expect_body = [&](const httplib::Result& res, const std::string& what, const std::string& want) {
    if (!res) return fail(what + ": no response (" + httplib::to_string(res.error()) + ")");
    if (res->status != 200 || res->body != want)
      return fail(what + ": " + std::to_string(res->status) + " '" + res->body + "', not '" + want + "'");
    ++answered;
  };
  std::string full_stream;
  for (int i = 0; i < 40; ++i) full_stream += "chunk " + std::to_string(i) + "\n";
  std::vector<std::thread> ts;
  for (int ci = 0; ci < kClients; ++ci) {
    ts.emplace_back([&, ci] {
      for (int k = 0; k < kRounds; ++k) {
        const std::string n = std::to_string(ci * 1000 + k);
        expect_body(client(server.port(), false)->Get(("/hello?n=" + n).c_str()), "one-shot GET " + n, "hello " + n);
        {
          auto ka = client(server.port(), true);
          for (int j = 0; j < 4; ++j) {
            const std::string m = n + "." + std::to_string(j);
            expect_body(ka->Get(("/hello?n=" + m).c_str()), "keep-alive GET " + m, "hello " + m);
          }
        }
        const std::string body(static_cast<size_t>(100 + k * 37), static_cast<char>('a' + ci));
        expect_body(client(server.port(), false)->Post("/echo", body, "text/plain"), "POST " + n, body);
        if (k % 4 == 0) expect_body(client(server.port(), false)->Get("/stream"), "stream " + n, full_stream);
        if (k % 3 == 0) {
          int chunks = 0;
          client(server.port(), false)->Get("/stream", [&chunks](const char*, size_t) { return ++chunks < 1; });
          ++abandoned;
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  for (size_t i = 0; i < failures.size() && i < 10; ++i) ADD_FAILURE() << failures[i];
  EXPECT_EQ(failures.size(), 0u);
  EXPECT_EQ(answered.load(), kClients * kRounds * 6 + kClients * (kRounds / 4));
  // Every abandoned stream ended on the server (it saw the client go),
  // and no connection is left open.
  for (int i = 0; i < 500 && (server.abandoned_streams.load() < abandoned.load() ||
                               server.http().open_connections() > 0); ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server.abandoned_streams.load(), abandoned.load());
  EXPECT_EQ(server.http().open_connections(), 0);
}

// Over the connection cap (in all, then from one address) a client that has
// sent its request reads a complete 503 naming the cap, not a reset or an
// empty read; a connection closed under the cap makes room again.
TEST(ServeHttp, AConnectionOverTheCapIsAnswered503NotDropped) {
  for (const bool per_client : {false, true}) {
    SCOPED_TRACE(per_client ? "per-client cap" : "total cap");
    HttpLimits limits;
    limits.max_connections = per_client ? 64 : 3;
    limits.max_connections_per_client = per_client ? 3 : 64;
    TestServer server(limits);
    ASSERT_GT(server.port(), 0);
    std::vector<int> held;
    for (int i = 0; i < 3; ++i) {
      held.push_back(ebb::test::connect_loopback(server.port()));
      ASSERT_GE(held.back(), 0);
    }
    for (int i = 0; i < 200 && server.http().open_connections() < 3; ++i) std::this_thread::sleep_for(5ms);
    ASSERT_EQ(server.http().open_connections(), 3);
    // The request is sent at once, before the server has accepted: it is
    // in the server's receive queue when the refusal is written.
    for (int k = 0; k < 20; ++k) {
      const int fd = ebb::test::connect_loopback(server.port());
      ASSERT_GE(fd, 0);
      const std::string req = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
      ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
      std::string error;
      const std::string got = read_all(fd, &error);
      ::close(fd);
      EXPECT_EQ(got.rfind("HTTP/1.1 503 ", 0), 0u) << "got '" << got << "' (" << error << ")";
      EXPECT_NE(got.find(per_client ? "too many connections from 127.0.0.1" : "too many connections (3)"),
                std::string::npos)
          << got;
      EXPECT_EQ(error, "") << got;
    }
    // With httplib's client, as the tests and most clients see it.
    auto res = client(server.port(), false)->Post("/echo", "hello", "text/plain");
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 503);
    EXPECT_EQ(server.http().counters().refused_connections, 21u);
    ::close(held.back());
    held.pop_back();
    for (int i = 0; i < 200 && server.http().open_connections() > 2; ++i) std::this_thread::sleep_for(5ms);
    res = client(server.port(), false)->Post("/echo", "hello", "text/plain");
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->body, "hello");
    for (int fd : held) ::close(fd);
  }
}

// A client that shuts its side once its request is sent (nc -N, HTTP/1.0
// tools) still reads the answer: the end of its input after a whole head is
// not a disconnect.
TEST(ServeHttp, AClientThatShutsItsSideAfterTheRequestIsAnswered) {
  TestServer server(HttpLimits{});
  ASSERT_GT(server.port(), 0);
  for (int k = 0; k < 20; ++k) {
    const int fd = ebb::test::connect_loopback(server.port());
    ASSERT_GE(fd, 0);
    const std::string req = "GET /hello?n=" + std::to_string(k) + " HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    ::shutdown(fd, SHUT_WR);
    std::string error;
    const std::string got = read_all(fd, &error);
    ::close(fd);
    EXPECT_EQ(got.rfind("HTTP/1.1 200 ", 0), 0u) << "got '" << got << "' (" << error << ")";
    EXPECT_NE(got.find("\r\n\r\nhello " + std::to_string(k)), std::string::npos) << got;
  }
  for (int i = 0; i < 200 && server.http().open_connections() > 0; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(server.http().open_connections(), 0);
}

// A request refused on its head (413: Content-Length over max_body; 401: the
// head check) while its client is still writing the body: the client's
// further writes are not reset and it reads the refusal. (Closed with the
// body unread, the socket reset the client: its next write failed, and a
// client such as httplib's, which reads only once its request is written,
// never read the answer: 'no response (Write)'.)
TEST(ServeHttp, ARefusalBeforeTheBodyIsReadByAClientStillSendingIt) {
  HttpLimits limits;
  limits.max_body = 1024;
  TestServer server(limits, [](const ebb::serve::HttpHead& h) {
    ebb::serve::HttpRefusal r;
    if (h.path == "/private") {
      r.status = 401;
      r.body = "{\"error\":{\"message\":\"no key\"}}";
    }
    return r;
  });
  ASSERT_GT(server.port(), 0);
  const std::string part(64 << 10, 'x');
  for (const auto& [path, status] : {std::pair<std::string, int>{"/echo", 413}, {"/private", 401}}) {
    SCOPED_TRACE(path);
    const int fd = ebb::test::connect_loopback(server.port());
    ASSERT_GE(fd, 0);
    const std::string head = "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                             std::to_string(4 * part.size()) + "\r\n\r\n";
    ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
    ASSERT_EQ(::send(fd, part.data(), part.size(), MSG_NOSIGNAL), static_cast<ssize_t>(part.size()));
    // The refusal is written and the connection closed meanwhile; the rest
    // of the body then reaches a closed socket unless it lingers.
    pollfd p{fd, POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 10000), 1);
    std::this_thread::sleep_for(50ms);
    for (int i = 0; i < 3; ++i) {
      // A reset arrives as the answer to a write: the next one fails.
      const ssize_t w = ::send(fd, part.data(), part.size(), MSG_NOSIGNAL);
      const std::string why = w < 0 ? std::strerror(errno) : "";
      EXPECT_EQ(w, static_cast<ssize_t>(part.size())) << "write " << i << " of the rest of the body: " << why;
      std::this_thread::sleep_for(20ms);
    }
    std::string error;
    const std::string got = read_all(fd, &error);
    ::close(fd);
    EXPECT_EQ(got.rfind("HTTP/1.1 " + std::to_string(status) + " ", 0), 0u) << "got '" << got << "' (" << error << ")";
  }
  auto res = client(server.port(), false)->Post("/echo", "small", "text/plain");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->body, "small");
}

}  // namespace
