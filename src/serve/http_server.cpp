#include "serve/http_server.h"

#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "serve/http_wire.h"

namespace ebb::serve {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string addr_of(const sockaddr_storage& ss, int* port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    *port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    *port = ntohs(a->sin6_port);
  } else {
    *port = 0;
  }
  return buf;
}

// Writes all of `data` within timeout_s; false when the peer is gone or slow.
bool write_all(int fd, const char* data, size_t n, double timeout_s) {
  const auto t0 = Clock::now();
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w > 0) {
      data += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const double left = timeout_s - seconds_since(t0);
      if (left <= 0) return false;
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, static_cast<int>(left * 1e3) + 1) < 0 && errno != EINTR) return false;
      continue;
    }
    return false;
  }
  return true;
}

const char* reason(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return status >= 500 ? "Server Error" : "Client Error";
  }
}

}  // namespace

// One client connection. The reactor owns it while it waits for a request
// head (`busy` false), a worker while it handles requests (`busy` true). A
// new connection is born busy: the accepting thread owns it from the moment
// it is listed in `conns` until wait_for_head() hands it to the reactor.
// (Born idle, with waiting_since at the clock's epoch, a sweep that ran
// between the listing and wait_for_head() saw it idle for the machine's
// uptime and closed it unanswered: a client's "no response" under load.)
struct HttpServer::Conn {
  int fd = -1;
  std::string peer;
  int peer_port = 0;
  std::string local;
  int local_port = 0;
  std::string buf;        // received bytes not yet handled, from `off`
  size_t off = 0;
  Clock::time_point waiting_since = Clock::now();  // idle since, or the first byte of a pending head
  std::atomic<bool> busy{true};
  int requests = 0;
  bool peer_done = false;  // the client shut its side after sending: answer what came, then close

  std::string_view pending() const { return std::string_view(buf).substr(off); }
  void consume(size_t n) {
    off += n;
    if (off == buf.size()) {
      buf.clear();
      off = 0;
    } else if (off > buf.size() / 2) {
      buf.erase(0, off);
      off = 0;
    }
    if (buf.capacity() > (256u << 10) && buf.size() < (64u << 10)) buf.shrink_to_fit();
  }
};

struct HttpServer::Reactor {
  HttpLimits limits;
  std::function<HttpRefusal(const HttpHead&)> check;
  std::function<std::string(int, const std::string&, const std::string&)> error_body;

  int ep = -1;
  int wake = -1;
  std::thread thread;
  std::unique_ptr<httplib::ThreadPool> pool;
  std::atomic<bool> stopping{false};
  bool started = false;

  // Body bytes in flight (HttpLimits::max_inflight_body_bytes).
  std::mutex body_mu;
  std::condition_variable body_cv;
  size_t body_bytes = 0;

  mutable std::mutex mu;
  std::unordered_map<int, std::shared_ptr<Conn>> conns;  // every open connection, by fd
  std::map<std::string, int> per_peer;
  // Refused connections, answered and shut for writing, until the client
  // closes or the deadline passes (HttpLimits::refused_linger_s).
  struct Lingering {
    Clock::time_point deadline;
    size_t dropped = 0;  // input bytes read and dropped
  };
  std::unordered_map<int, Lingering> lingering;  // by fd
  HttpCounters counters;

  std::string body_of(int status, const std::string& message, const std::string& code) const {
    if (error_body) return error_body(status, message, code);
    return "{\"error\":{\"message\":\"" + message + "\"}}";
  }

  // A complete response that ends the connection.
  void refuse(Conn& c, int status, const std::string& body, const std::string& extra_headers = "") const {
    std::string r = "HTTP/1.1 " + std::to_string(status) + " " + reason(status) +
                    "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                    "\r\nConnection: close\r\n" + extra_headers + "\r\n" + body;
    write_all(c.fd, r.data(), r.size(), 1.0);
  }

  // Takes c out of the open connections; false when it was already.
  bool unlist(const std::shared_ptr<Conn>& c) {
    {
      std::lock_guard lock(mu);
      auto it = conns.find(c->fd);
      if (it == conns.end() || it->second != c) return false;
      conns.erase(it);
      if (--per_peer[c->peer] <= 0) per_peer.erase(c->peer);
    }
    if (ep >= 0) ::epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, nullptr);
    return true;
  }

  void close(const std::shared_ptr<Conn>& c) {
    if (!unlist(c)) return;
    ::shutdown(c->fd, SHUT_RDWR);
    ::close(c->fd);
  }

  // After refuse(): what the client may still be sending (the body of a
  // refused request) is read and dropped until it closes, so that its 4xx or
  // 503 is not lost to a reset (linger()).
  void close_refused(const std::shared_ptr<Conn>& c) {
    if (unlist(c)) linger(c->fd);
  }

  // A refused connection, its 503 written: its write side is shut (the
  // client reads the 503 and the end), and its input is read and dropped by
  // the reactor until the client closes, so that closing it does not reset
  // a client still writing its request. Closed at once when too many are
  // lingering or the reactor is stopping.
  void linger(int fd) {
    ::shutdown(fd, SHUT_WR);
    {
      std::lock_guard lock(mu);
      if (!stopping.load() && ep >= 0 && static_cast<int>(lingering.size()) < std::max(64, limits.max_connections)) {
        lingering[fd].deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(limits.refused_linger_s));
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLRDHUP;
        ev.data.fd = fd;
        if (::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0) return;
        lingering.erase(fd);
      }
    }
    ::close(fd);
  }

  // Reads and drops what a lingering connection sent; closes it at its end,
  // on an error or past refused_linger_bytes. True when `fd` is lingering.
  bool drain_lingering(int fd) {
    size_t dropped = 0;
    {
      std::lock_guard lock(mu);
      auto it = lingering.find(fd);
      if (it == lingering.end()) return false;
      dropped = it->second.dropped;
    }
    char tmp[16384];
    for (;;) {
      const ssize_t r = dropped < limits.refused_linger_bytes ? ::recv(fd, tmp, sizeof tmp, 0) : 0;
      if (r > 0) {
        dropped += static_cast<size_t>(r);
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        std::lock_guard lock(mu);
        lingering[fd].dropped = dropped;
        return true;
      }
      break;
    }
    end_lingering(fd);
    return true;
  }

  void end_lingering(int fd) {
    {
      std::lock_guard lock(mu);
      if (lingering.erase(fd) == 0) return;
    }
    ::epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
  }

  void start() {
    ep = ::epoll_create1(EPOLL_CLOEXEC);
    wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ep < 0 || wake < 0) throw std::runtime_error(std::string("epoll: ") + std::strerror(errno));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = wake;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, wake, &ev);
    pool = std::make_unique<httplib::ThreadPool>(static_cast<size_t>(std::max(1, limits.workers)));
    thread = std::thread([this] { loop(); });
    started = true;
  }

  // Back to waiting for the next request head, from its owner: a worker,
  // or for a new connection the accepting thread.
  void wait_for_head(const std::shared_ptr<Conn>& c) {
    c->waiting_since = Clock::now();
    c->busy = false;  // after the writes above: the reactor (loop, sweep) reads them once it sees busy false
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = c->fd;
    if (::epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) != 0) close(c);
  }

  void loop();
  void on_readable(const std::shared_ptr<Conn>& c, HttpServer* owner);
  void sweep();
  HttpServer* owner = nullptr;
};

void HttpServer::Reactor::loop() {
  epoll_event events[64];
  auto last_sweep = Clock::now();
  while (!stopping.load()) {
    const int n = ::epoll_wait(ep, events, 64, 100);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake) {
        uint64_t v;
        while (::read(wake, &v, sizeof v) > 0) {
        }
        continue;
      }
      std::shared_ptr<Conn> c;
      {
        std::lock_guard lock(mu);
        auto it = conns.find(fd);
        if (it != conns.end()) c = it->second;
      }
      if (c && !c->busy) on_readable(c, owner);
      else if (!c) drain_lingering(fd);
    }
    if (seconds_since(last_sweep) >= 0.1) {
      sweep();
      last_sweep = Clock::now();
    }
  }
}

void HttpServer::Reactor::on_readable(const std::shared_ptr<Conn>& c, HttpServer* srv) {
  char tmp[16384];
  for (;;) {
    const ssize_t r = ::recv(c->fd, tmp, sizeof tmp, 0);
    if (r > 0) {
      if (c->pending().empty()) c->waiting_since = Clock::now();  // a new request's first byte
      c->buf.append(tmp, static_cast<size_t>(r));
      if (c->pending().size() > limits.max_head_bytes) break;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // The client closed, or an error; a client that shut its side after a
    // whole request head (`printf ... | nc -N`) still gets its answer.
    if (r == 0 && head_end(c->pending())) {
      c->peer_done = true;
      break;
    }
    close(c);
    return;
  }
  const std::optional<size_t> end = head_end(c->pending());
  if (!end) {
    if (c->pending().size() > limits.max_head_bytes) {
      refuse(*c, 431, body_of(431, "The request head is over " + std::to_string(limits.max_head_bytes) + " bytes",
                              "request_header_too_large"));
      close_refused(c);
    }
    return;
  }
  ::epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, nullptr);
  c->busy = true;
  pool->enqueue([srv, c] { srv->serve(c); });
}

void HttpServer::Reactor::sweep() {
  std::vector<std::pair<std::shared_ptr<Conn>, bool>> expired;  // (conn, head timed out)
  std::vector<int> lingered;  // refused connections past their deadline
  {
    std::lock_guard lock(mu);
    const auto now = Clock::now();
    for (const auto& [fd, l] : lingering)
      if (now >= l.deadline) lingered.push_back(fd);
    for (auto& [fd, c] : conns) {
      if (c->busy) continue;
      const double waited = seconds_since(c->waiting_since);
      if (!c->pending().empty() && waited > limits.head_timeout_s) expired.push_back({c, true});
      else if (c->pending().empty() && waited > limits.idle_timeout_s) expired.push_back({c, false});
    }
  }
  for (auto& [c, head] : expired) {
    if (head) {
      {
        std::lock_guard lock(mu);
        ++counters.head_timeouts;
      }
      refuse(*c, 408,
             body_of(408, "The request head did not arrive within " + std::to_string(limits.head_timeout_s) + " s",
                     "request_timeout"));
      close_refused(c);
    } else {
      close(c);
    }
  }
  for (int fd : lingered) end_lingering(fd);
}

// The request as httplib reads it: the buffered head and body, and the
// connection's socket for the response.
namespace {
class RequestStream final : public httplib::Stream {
 public:
  RequestStream(HttpServer::Conn& c, std::string_view request, double write_timeout_s, int fd, std::string peer,
                int peer_port, std::string local, int local_port)
      : req_(request), write_timeout_s_(write_timeout_s), fd_(fd), peer_(std::move(peer)), peer_port_(peer_port),
        local_(std::move(local)), local_port_(local_port) {
    (void)c;
  }
  bool is_readable() const override { return pos_ < req_.size(); }
  bool is_writable() const override {
    if (failed_) return false;
    pollfd p{fd_, POLLOUT, 0};
    if (::poll(&p, 1, static_cast<int>(write_timeout_s_ * 1e3)) <= 0 || (p.revents & (POLLERR | POLLHUP))) return false;
    // The peer is still there: a read would not return end-of-stream.
    char b;
    const ssize_t r = ::recv(fd_, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return !(r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR));
  }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, req_.size() - pos_);
    std::memcpy(ptr, req_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (failed_ || !write_all(fd_, ptr, size, write_timeout_s_)) {
      failed_ = true;
      return -1;
    }
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = peer_;
    port = peer_port_;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = local_;
    port = local_port_;
  }
  socket_t socket() const override { return fd_; }
  bool failed() const { return failed_; }

 private:
  std::string_view req_;
  size_t pos_ = 0;
  double write_timeout_s_;
  int fd_;
  std::string peer_;
  int peer_port_;
  std::string local_;
  int local_port_;
  bool failed_ = false;
};
}  // namespace

HttpServer::HttpServer() : reactor_(std::make_unique<Reactor>()) {
  reactor_->owner = this;
  // Accepting only hands the socket to the reactor: one thread does it.
  new_task_queue = [] { return new httplib::ThreadPool(1); };
  // SO_REUSEADDR only (httplib's default adds SO_REUSEPORT, which lets a
  // second server bind the same port and share its connections).
  set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
}

HttpServer::~HttpServer() { shutdown_connections(); }

HttpServer& HttpServer::Get(const std::string& pattern, Handler h) {
  routes_.emplace_back(std::regex(pattern), "GET");
  httplib::Server::Get(pattern, std::move(h));
  return *this;
}

HttpServer& HttpServer::Post(const std::string& pattern, Handler h) {
  routes_.emplace_back(std::regex(pattern), "POST");
  httplib::Server::Post(pattern, std::move(h));
  return *this;
}

HttpServer& HttpServer::Delete(const std::string& pattern, Handler h) {
  routes_.emplace_back(std::regex(pattern), "DELETE");
  httplib::Server::Delete(pattern, std::move(h));
  return *this;
}

HttpServer& HttpServer::Patch(const std::string& pattern, Handler h) {
  routes_.emplace_back(std::regex(pattern), "PATCH");
  httplib::Server::Patch(pattern, std::move(h));
  return *this;
}

std::string HttpServer::allowed_methods(const std::string& path) const {
  std::string out;
  for (const auto& [re, method] : routes_) {
    if (!std::regex_match(path, re) || out.find(method) != std::string::npos) continue;
    out += (out.empty() ? "" : ", ") + method;
  }
  return out;
}

void HttpServer::start_connections() {
  // httplib listens with a backlog of 5: a burst of clients would have their
  // connections dropped and retried a second later. Linux takes a second
  // listen() on a listening socket as a new backlog.
  if (svr_sock_ != INVALID_SOCKET) ::listen(svr_sock_, std::max(64, reactor_->limits.max_connections));
  if (!reactor_->started) reactor_->start();
}

void HttpServer::set_limits(const HttpLimits& l) {
  reactor_->limits = l;
  set_payload_max_length(l.max_body);
}

void HttpServer::set_head_check(std::function<HttpRefusal(const HttpHead&)> check) {
  reactor_->check = std::move(check);
}

void HttpServer::set_error_body(std::function<std::string(int, const std::string&, const std::string&)> fn) {
  reactor_->error_body = std::move(fn);
}

HttpCounters HttpServer::counters() const {
  std::lock_guard lock(reactor_->mu);
  return reactor_->counters;
}

int HttpServer::open_connections() const {
  std::lock_guard lock(reactor_->mu);
  return static_cast<int>(reactor_->conns.size());
}

void HttpServer::shutdown_connections() {
  Reactor& r = *reactor_;
  if (!r.started || r.stopping.exchange(true)) return;
  {
    std::lock_guard lock(r.body_mu);  // a worker waiting for body room sees stopping
  }
  r.body_cv.notify_all();
  const uint64_t one = 1;
  (void)!::write(r.wake, &one, sizeof one);
  r.thread.join();
  std::vector<std::shared_ptr<Conn>> all;
  {
    std::lock_guard lock(r.mu);
    for (auto& [fd, c] : r.conns) all.push_back(c);
  }
  for (auto& c : all) {
    if (c->busy) ::shutdown(c->fd, SHUT_RDWR);  // its worker sees the end and closes it
    else r.close(c);
  }
  r.pool->shutdown();
  all.clear();
  {
    std::lock_guard lock(r.mu);
    for (auto& [fd, c] : r.conns) all.push_back(c);
  }
  for (auto& c : all) r.close(c);
  std::vector<int> lingered;
  {
    std::lock_guard lock(r.mu);
    for (const auto& [fd, l] : r.lingering) lingered.push_back(fd);
  }
  for (int fd : lingered) r.end_lingering(fd);
  ::close(r.ep);
  ::close(r.wake);
  r.ep = r.wake = -1;
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  Reactor& r = *reactor_;
  auto c = std::make_shared<Conn>();
  c->fd = sock;
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(sock, reinterpret_cast<sockaddr*>(&ss), &len) == 0) c->peer = addr_of(ss, &c->peer_port);
  len = sizeof ss;
  if (::getsockname(sock, reinterpret_cast<sockaddr*>(&ss), &len) == 0) c->local = addr_of(ss, &c->local_port);
  // Responses go out as a head and a body (or chunks) in separate writes:
  // with Nagle's algorithm the second waited for the client's delayed ACK
  // of the first (40 ms on Linux) on every non-streamed response.
  int one = 1;
  ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const int flags = ::fcntl(sock, F_GETFL, 0);
  ::fcntl(sock, F_SETFL, flags | O_NONBLOCK);
  if (!r.started) {  // start_connections() was not called: refuse rather than leak
    ::close(sock);
    return false;
  }
  std::string refusal;
  {
    std::lock_guard lock(r.mu);
    if (r.stopping.load()) {
      refusal = "the server is shutting down";
    } else if (static_cast<int>(r.conns.size()) >= r.limits.max_connections) {
      refusal = "too many connections (" + std::to_string(r.limits.max_connections) + ")";
    } else if (r.per_peer[c->peer] >= r.limits.max_connections_per_client) {
      refusal = "too many connections from " + c->peer + " (" + std::to_string(r.limits.max_connections_per_client) +
                " at most)";
    }
    if (!refusal.empty()) {
      if (r.per_peer[c->peer] == 0) r.per_peer.erase(c->peer);
      ++r.counters.refused_connections;
    } else {
      ++r.per_peer[c->peer];
      r.conns[sock] = c;
    }
  }
  if (!refusal.empty()) {
    r.refuse(*c, 503, r.body_of(503, "Connection refused: " + refusal, "too_many_connections"));
    r.linger(sock);
    return false;
  }
  r.wait_for_head(c);
  return true;
}

void HttpServer::serve(std::shared_ptr<Conn> c) {
  Reactor& r = *reactor_;
  const HttpLimits& lim = r.limits;
  for (;;) {
    if (r.stopping.load()) {
      r.close(c);
      return;
    }
    const std::string_view pend = c->pending();
    const std::optional<size_t> hend = head_end(pend);
    if (!hend) {  // cannot happen: only complete heads reach a worker
      r.close(c);
      return;
    }
    ParsedHead h;
    std::string bad;
    if (!parse_head(pend.substr(0, *hend), h, bad)) {
      r.refuse(*c, 400, r.body_of(400, "Malformed request: " + bad, "bad_request"));
      r.close_refused(c);
      return;
    }
    if (r.check) {
      HttpHead hh{h.method, h.path, h.version, h.authorization};
      const HttpRefusal ref = r.check(hh);
      if (ref.status != 0) {
        {
          std::lock_guard lock(r.mu);
          if (ref.status == 401) ++r.counters.refused_unauthorized;
        }
        r.refuse(*c, ref.status, ref.body,
                 ref.www_authenticate.empty() ? "" : "WWW-Authenticate: " + ref.www_authenticate + "\r\n");
        r.close_refused(c);
        return;
      }
    }
    if (!h.chunked && h.content_length > lim.max_body) {
      {
        std::lock_guard lock(r.mu);
        ++r.counters.refused_bodies;
      }
      r.refuse(*c, 413,
               r.body_of(413,
                         "The request body (" + std::to_string(h.content_length) + " bytes) is over the server's limit (" +
                             std::to_string(lim.max_body) + " bytes, --max-body)",
                         "request_too_large"));
      r.close_refused(c);
      return;
    }
    if (h.expect_continue && (h.chunked || h.content_length > 0)) {
      static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      if (!write_all(c->fd, kContinue, sizeof kContinue - 1, lim.write_timeout_s)) {
        r.close(c);
        return;
      }
    }
    // Room for the body among the bodies in flight, waited for within the
    // body's time; given back when the request is done.
    const size_t cap = lim.max_inflight_body_bytes > 0 ? lim.max_inflight_body_bytes : 2 * lim.max_body;
    const size_t claim = std::min(cap, h.chunked ? lim.max_body : static_cast<size_t>(h.content_length));
    {
      std::unique_lock lock(r.body_mu);
      if (r.body_bytes + claim > cap) {
        {
          std::lock_guard l2(r.mu);
          ++r.counters.body_waits;
        }
        if (!r.body_cv.wait_for(lock, std::chrono::duration<double>(lim.body_timeout_s),
                                [&] { return r.body_bytes + claim <= cap || r.stopping.load(); }) ||
            r.stopping.load()) {
          lock.unlock();
          r.refuse(*c, 503, r.body_of(503, "The server is busy reading other request bodies; try again", "server_busy"));
          r.close_refused(c);
          return;
        }
      }
      r.body_bytes += claim;
    }
    struct Release {
      Reactor& r;
      size_t n;
      ~Release() {
        {
          std::lock_guard lock(r.body_mu);
          r.body_bytes -= n;
        }
        r.body_cv.notify_all();
      }
    } release{r, claim};
    // The body, read within body_timeout_s; a chunked one decoded as it comes.
    const auto t0 = Clock::now();
    const auto fill = [&](size_t want_total) {  // until pending() holds want_total bytes
      char tmp[65536];
      while (c->pending().size() < want_total) {
        const double left = lim.body_timeout_s - seconds_since(t0);
        if (left <= 0 || r.stopping.load()) return false;
        pollfd p{c->fd, POLLIN, 0};
        const int pr = ::poll(&p, 1, static_cast<int>(std::min(left, 0.25) * 1e3) + 1);
        if (pr < 0 && errno != EINTR) return false;
        if (pr <= 0) continue;
        const ssize_t n = ::recv(c->fd, tmp, sizeof tmp, 0);
        if (n > 0) c->buf.append(tmp, static_cast<size_t>(n));
        else if (n == 0 || (errno != EAGAIN && errno != EINTR && errno != EWOULDBLOCK)) return false;
      }
      return true;
    };
    std::string rebuilt;  // the request handed to httplib when it differs from the bytes received
    size_t consumed = 0;  // bytes of pending() this request takes
    size_t body_bytes = 0;
    if (h.chunked) {
      ChunkedDecoder dec(lim.max_body);
      std::string body;
      size_t pos = *hend;
      for (;;) {
        const ChunkedDecoder::Result res = dec.feed(c->pending(), pos, body);
        if (res == ChunkedDecoder::Result::kDone) break;
        if (res == ChunkedDecoder::Result::kTooLarge || res == ChunkedDecoder::Result::kBad) {
          const bool large = res == ChunkedDecoder::Result::kTooLarge;
          {
            std::lock_guard lock(r.mu);
            if (large) ++r.counters.refused_bodies;
          }
          r.refuse(*c, large ? 413 : 400,
                   large ? r.body_of(413,
                                     "The chunked request body is over the server's limit (" +
                                         std::to_string(lim.max_body) + " bytes, --max-body)",
                                     "request_too_large")
                         : r.body_of(400, "Malformed chunked body: " + dec.error(), "bad_request"));
          r.close_refused(c);
          return;
        }
        // kMore: read more within the body's time.
        if (!fill(c->pending().size() + 1)) {
          std::lock_guard lock(r.mu);
          ++r.counters.body_timeouts;
          break;
        }
      }
      if (!dec.done()) {
        r.refuse(*c, 408, r.body_of(408, "The request body did not arrive in time", "request_timeout"));
        r.close_refused(c);
        return;
      }
      consumed = pos;
      body_bytes = body.size();
      rebuilt = h.rebuild_with_length(body.size());
      rebuilt += body;
    } else {
      if (!fill(*hend + h.content_length)) {
        {
          std::lock_guard lock(r.mu);
          ++r.counters.body_timeouts;
        }
        r.refuse(*c, 408, r.body_of(408, "The request body did not arrive in time", "request_timeout"));
        r.close_refused(c);
        return;
      }
      consumed = *hend + h.content_length;
      body_bytes = h.content_length;
      if (h.expect_continue) rebuilt = h.rebuild_with_length(h.content_length) + std::string(c->pending().substr(*hend, h.content_length));
    }
    const std::string_view request = rebuilt.empty() ? c->pending().substr(0, consumed) : std::string_view(rebuilt);
    const bool close_after =
        r.stopping.load() || ++c->requests >= lim.max_requests_per_connection || c->peer_done;
    RequestStream strm(*c, request, lim.write_timeout_s, c->fd, c->peer, c->peer_port, c->local, c->local_port);
    bool connection_closed = false;
    const bool ok = process_request(strm, close_after, connection_closed, nullptr);
    c->consume(consumed);
    rebuilt.clear();
    rebuilt.shrink_to_fit();
    // Large bodies leave large free blocks behind: give them back.
    if (body_bytes >= (1u << 20)) ::malloc_trim(0);
    if (!ok || connection_closed || close_after || strm.failed()) {
      r.close(c);
      return;
    }
    if (head_end(c->pending())) {
      std::lock_guard lock(r.mu);
      ++r.counters.pipelined;
      continue;
    }
    r.wait_for_head(c);
    return;
  }
}

}  // namespace ebb::serve
