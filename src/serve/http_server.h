// ebb serve's HTTP/1.1 connection handling, under cpp-httplib's routing.
//
// httplib runs one thread per connection for the connection's whole life and
// reads bodies before any handler sees the request, so idle or slow clients
// (slowloris: a header byte a second) could hold every thread, a chunked body
// was read whole before --max-body was checked, and pipelined requests were
// lost with httplib's per-request read buffer. HttpServer keeps httplib's
// routing, handlers and response writing, and takes over the connections:
//
//   accept (httplib's listener) -> the reactor (one thread, epoll): a
//     connection waits here, holding no worker, until its request head
//     ("...\r\n\r\n") has arrived; a head not complete within
//     head_timeout_s, larger than max_head_bytes, or a keep-alive
//     connection idle past idle_timeout_s is closed (408 / 431).
//   -> a worker (a fixed pool): the head is checked before any body byte is
//     read: the API key (check_head), then the body's size: Content-Length
//     over max_body is a 413; a chunked body is decoded while it is read and
//     refused as soon as it passes max_body. The body must arrive within
//     body_timeout_s. Refusals close the connection (the unread body would
//     otherwise be read as the next request).
//   -> httplib's process_request runs on the complete, buffered request
//     (a chunked body handed on with a Content-Length), routes it and
//     writes the response (streamed responses write from the worker).
//   -> bytes after the request (a pipelined request) stay in the
//     connection's buffer and are answered in order; otherwise the
//     connection goes back to the reactor to wait for its next request.
//
// Connections are capped in total and per client address (a 503 and close
// beyond either; the close waits for the client, within refused_linger_s,
// so that the 503 is read). Memory: at most max_head_bytes per waiting connection,
// and one request (head + body <= max_body) per busy worker.
#pragma once

#include <httplib.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <regex>
#include <string>
#include <utility>
#include <vector>

namespace ebb::serve {

struct HttpLimits {
  double head_timeout_s = 10;      // from a request's first byte to its head's end
  double body_timeout_s = 30;      // the whole body, once the head is in
  double idle_timeout_s = 5;       // keep-alive: between requests
  double write_timeout_s = 30;     // one blocked write
  size_t max_head_bytes = 64 << 10;
  size_t max_body = 4u << 20;      // decoded body bytes
  int workers = 16;                // requests handled at once
  int max_connections = 512;       // open connections in all
  int max_connections_per_client = 64;  // ... from one client address
  int max_requests_per_connection = 1000;
  // A refused connection (over a cap: 503 at once; a request refused on its
  // head: 400/401/408/413/431) is kept half-open after its answer, its
  // input read and dropped, until the client closes it, this long passes or
  // this much was dropped: closed with input unread, the reset lost the
  // answer for a client still writing ("no response"). At most
  // max(64, max_connections) are kept so; beyond, they are closed at once.
  double refused_linger_s = 2;
  size_t refused_linger_bytes = 1u << 20;
  // Body bytes held by requests being read or handled at once (0: twice
  // max_body); a request whose body would pass it waits for room before
  // its body is read, so bodies in memory stay bounded whatever the
  // number of clients.
  size_t max_inflight_body_bytes = 0;
};

// What the head check sees of a request before its body.
struct HttpHead {
  std::string method, path, version;
  std::string authorization;       // the Authorization header ("" when absent)
};

// A refusal before the body: status and an OpenAI-shaped JSON body.
struct HttpRefusal {
  int status = 0;                  // 0: go on
  std::string body;
  std::string www_authenticate;    // for 401
};

struct HttpCounters {
  uint64_t refused_connections = 0;   // over a connection cap
  uint64_t head_timeouts = 0;         // 408: head not complete in time
  uint64_t body_timeouts = 0;         // body not complete in time
  uint64_t refused_bodies = 0;        // 413 before or while the body was read
  uint64_t refused_unauthorized = 0;  // 401 before the body was read
  uint64_t pipelined = 0;             // requests that were already buffered behind another
  uint64_t body_waits = 0;            // requests that waited for body room
};

class HttpServer : public httplib::Server {
 public:
  HttpServer();
  ~HttpServer() override;
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Before listen_after_bind().
  void set_limits(const HttpLimits& l);
  // Called on a worker with every request head before its body is read; a
  // status != 0 answers it and closes the connection.
  void set_head_check(std::function<HttpRefusal(const HttpHead&)> check);
  // JSON bodies for the refusals the server makes itself (408, 413, 431,
  // 503): status, message, code -> body.
  void set_error_body(std::function<std::string(int, const std::string&, const std::string&)> fn);

  // Starts the reactor and the workers; before listen_after_bind().
  void start_connections();
  // Closes every connection and joins the reactor and the workers; after
  // httplib's stop(). Idempotent.
  void shutdown_connections();

  HttpCounters counters() const;
  int open_connections() const;

  // httplib's route registration, with each route's pattern and method
  // recorded, so that a path asked with the wrong method is a 405 naming
  // the methods it has (allowed_methods), not a 404.
  HttpServer& Get(const std::string& pattern, Handler h);
  HttpServer& Post(const std::string& pattern, Handler h);
  HttpServer& Delete(const std::string& pattern, Handler h);
  HttpServer& Patch(const std::string& pattern, Handler h);
  // "GET, POST" for a path some route matches; "" for none.
  std::string allowed_methods(const std::string& path) const;

  struct Conn;
  struct Reactor;

 private:
  bool process_and_close_socket(socket_t sock) override;
  void serve(std::shared_ptr<Conn> c);  // on a worker

  std::unique_ptr<Reactor> reactor_;
  std::vector<std::pair<std::regex, std::string>> routes_;  // pattern, method
};

}  // namespace ebb::serve
