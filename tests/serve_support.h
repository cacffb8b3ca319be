// What ebb serve's tests share: an `ebb serve` child process on a free
// port, an HTTP client, JSON requests, Server-Sent Events and metrics.
#pragma once

#include <httplib.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <nlohmann/json.hpp>
#include <functional>
#include <string>
#include <sys/types.h>
#include <vector>

namespace ebb::test {

inline constexpr const char* kKey = "test-key-123";

// A TCP socket connected to 127.0.0.1:port, or -1.
int connect_loopback(int port);

// An `ebb serve` child process on stories260K (1 thread, KV chunks of 16
// unless extra has --kv-chunk, batch 16) plus `extra` arguments; killed at
// the end unless stopped.
class ServerProcess {
 public:
  // Starts it and reads its port from the first line it prints; port() is 0
  // when no line comes within 20 s (first_line() says what came).
  // cgroup_procs: a cgroup's cgroup.procs file the child joins before it
  // execs (its memory is then charged there from the start).
  explicit ServerProcess(const std::vector<std::string>& extra, const std::string& model = "",
                         const std::string& cgroup_procs = "");
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& first_line() const { return first_line_; }
  // What it printed so far on stdout (the first line included) and on
  // stderr, each its last 256 KiB: readers drain both pipes, so a server
  // that logs every request never blocks on a full pipe.
  std::string out() const;
  std::string err() const;

  // Sends `sig` and waits up to `limit` for the exit; returns the exit
  // status, or -1 when it did not exit (it is killed then).
  int stop(int sig, std::chrono::milliseconds limit = std::chrono::milliseconds(10000));

 private:
  void drain(int fd, std::string* into);
  pid_t pid_ = -1;
  int out_ = -1, err_ = -1;
  mutable std::mutex mu_;
  std::string out_text_, err_text_;
  std::thread out_reader_, err_reader_;
  int port_ = 0;
  bool reaped_ = false;
  std::string first_line_;
};

// A client of 127.0.0.1:port with bounded timeouts, sending kKey unless told not to.
std::unique_ptr<httplib::Client> client(int port, bool with_key = true);

struct Reply {
  int status = 0;
  nlohmann::json body;  // discarded when the body is not JSON
  std::string raw;
};

// A failed connection adds a test failure and returns status 0.
Reply post(httplib::Client& c, const std::string& path, const std::string& body);
Reply post(httplib::Client& c, const std::string& path, const nlohmann::json& body);
Reply get(httplib::Client& c, const std::string& path);
// Polls GET path every `every` until done(its JSON body) or `limit`; a
// non-200 answer or the limit is a test failure naming the last body.
nlohmann::json poll_get(httplib::Client& c, const std::string& path,
                        const std::function<bool(const nlohmann::json&)>& done,
                        std::chrono::milliseconds limit = std::chrono::seconds(30),
                        std::chrono::milliseconds every = std::chrono::milliseconds(10));

// The data lines of a Server-Sent Events body, in order ("[DONE]" included).
std::vector<std::string> sse_data(const std::string& body);

struct Streamed {
  std::string text;
  std::vector<nlohmann::json> chunks;  // parsed, [DONE] excluded
  bool done = false;                   // ended with [DONE]
  bool done_last = false;              // ... as the last event
};

// POSTs body with "stream": true and collects the text of a completion
// (chat: the deltas' content).
Streamed stream(httplib::Client& c, const std::string& path, nlohmann::json body, bool chat);

// The OpenAI error shape, with the status (and code and param when given).
void expect_openai_error(const Reply& r, int status, const std::string& code = "", const std::string& param = "");

// A sample's value in GET /metrics (name with its labels); -1 when absent.
double metric_value(httplib::Client& c, const std::string& name);

// Runs tests/SCRIPT (a script driving the official `openai` npm client)
// against 127.0.0.1:port with kKey, model id "stories260K" and the npm
// package scripts/setup.sh installed beside the CLI (BUILD/npm). Node or the
// package missing is a test failure, not a skip. Returns the script's exit
// status (-1 when it could not run) and its output.
struct ScriptRun {
  int status = -1;
  std::string out;
};
ScriptRun run_openai_script(const std::string& script, int port);

// VmRSS of a process in bytes (0 when it cannot be read).
uint64_t rss_bytes(pid_t pid);

}  // namespace ebb::test
