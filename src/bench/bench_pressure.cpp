// ebb bench pressure: mzCache's real-world multitasking run (Figure 15) on
// Linux. `ebb serve` (this binary) runs inside a cgroup v1 memory group with
// a limit; it holds one conversation; then, for each of --rounds rounds, a
// pressure generator (a child in the same group, "the other apps") grows its
// anonymous memory at --rate up to --fill of the limit and holds it for
// --hold seconds, is killed (the user comes back), and the conversation gets
// its next turn (the request's TTFT is "TTFT on return").
//
// Systems, one after the other, each in a fresh group:
//   ebb N pp   --pressure cgroup --pressure-step N (for each of --steps)
//   baseline   --pressure off: nothing is given back (weights and KV are
//              anonymous memory; without swap the kernel can only kill).
// The generator is the foreground app: the server's oom_score_adj is 1000
// (raising it needs no privilege; lowering the generator's to -1000 would
// need CAP_SYS_RESOURCE), so the group's OOM killer takes the server, as Android's low-memory killer takes
// the background LLM. A killed server is a dead round; it is started again
// (a cold start: load, then the whole conversation recomputed) and that is
// its TTFT on return. The memory trace (group usage, server RSS, generator)
// is written as an SVG. Needs root (it creates the group).
#include <fcntl.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/options.h"
#include "memory/budget_plan.h"
#include "platform/error.h"
#include "platform/timer.h"

namespace ebb::cli {
namespace {

using nlohmann::json;

struct PressureArgs {
  std::string model;
  int rounds = 10;
  std::string limit = "1200MiB";
  std::string steps = "25,15";
  bool no_baseline = false;
  // Generator target, of the limit: with qwen3-0.6b Q4_0 (474 MB after the
  // conversation, ~190 MB when all is evicted) 0.72 leaves room for ebb but
  // not for a server that gives nothing back.
  double fill = 0.72;
  double rate_mb_s = 200;   // generator growth
  double hold_s = 1.0;      // generator holds its memory this long
  int64_t conversation = 512;  // tokens of the held conversation
  int64_t turn = 32;           // tokens added per round
  int threads = 0;
  std::string svg = "pressure_trace.svg";
  std::string log_dir = "/tmp";
  bool json = false;
};

void write_file(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) throw Error("bench pressure: cannot open " + path + ": " + std::strerror(errno));
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int e = errno;
  ::close(fd);
  if (n < 0) throw Error("bench pressure: writing '" + text + "' to " + path + " failed: " + std::strerror(e));
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A cgroup v1 memory group with a limit; the destructor kills what is left
// in it and removes it (also when the bench fails).
class BenchCgroup {
 public:
  BenchCgroup(const std::string& name, uint64_t limit) {
    const std::string root = "/sys/fs/cgroup/memory";
    if (::access((root + "/cgroup.procs").c_str(), W_OK) != 0)
      throw Error("bench pressure: needs a writable cgroup v1 memory hierarchy at " + root +
                  " (run as root on a host with the v1 memory controller)");
    path_ = root + "/" + name;
    if (::mkdir(path_.c_str(), 0755) != 0 && errno != EEXIST)
      throw Error("bench pressure: cannot create " + path_ + ": " + std::strerror(errno));
    try {
      write_file(path_ + "/memory.limit_in_bytes", std::to_string(limit));
    } catch (...) {
      ::rmdir(path_.c_str());
      throw;
    }
  }
  ~BenchCgroup() {
    for (int i = 0; i < 100; ++i) {
      std::istringstream in(read_text(path_ + "/cgroup.procs"));
      bool any = false;
      for (pid_t p; in >> p;) any = true, ::kill(p, SIGKILL);
      if (!any && ::rmdir(path_.c_str()) == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::fprintf(stderr, "bench pressure: could not remove %s: %s\n", path_.c_str(), std::strerror(errno));
  }
  BenchCgroup(const BenchCgroup&) = delete;
  BenchCgroup& operator=(const BenchCgroup&) = delete;
  const std::string& path() const { return path_; }
  uint64_t usage() const {
    try {
      return std::stoull(read_text(path_ + "/memory.usage_in_bytes"));
    } catch (const std::exception&) {
      return 0;
    }
  }

 private:
  std::string path_;
};

// What runs inside the group: the server and the generator. Everything
// the child needs is prepared before fork() (only async-signal-safe calls after).
struct Child {
  pid_t pid = -1;
  int out = -1;  // its stdout (server) or progress pipe (generator)
  bool alive() {
    if (pid <= 0) return false;
    int st = 0;
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      status = st;
      pid = -1;
      return false;
    }
    return true;
  }
  void kill_and_wait(int sig = SIGKILL) {
    if (pid > 0) {
      ::kill(pid, sig);
      ::waitpid(pid, &status, 0);
      pid = -1;
    }
    if (out >= 0) ::close(out), out = -1;
  }
  int status = 0;
};

// Joins the group and sets oom_score_adj, in the child.
void enter_group(const char* procs, const char* adj) {
  int fd = ::open(procs, O_WRONLY);
  if (fd >= 0) {
    if (::write(fd, "0", 1) < 0) ::_exit(120);
    ::close(fd);
  }
  fd = ::open("/proc/self/oom_score_adj", O_WRONLY);
  if (fd >= 0) {
    if (::write(fd, adj, std::strlen(adj)) < 0) ::_exit(121);
    ::close(fd);
  }
}

Child spawn_server(const BenchCgroup& cg, const std::vector<std::string>& argv_s, const std::string& log) {
  std::vector<char*> argv;
  for (const std::string& s : argv_s) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  const std::string procs = cg.path() + "/cgroup.procs";
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) throw Error("bench pressure: pipe failed");
  const int logfd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (logfd < 0) throw Error("bench pressure: cannot open " + log);
  const pid_t pid = ::fork();
  if (pid < 0) throw Error("bench pressure: fork failed");
  if (pid == 0) {
    enter_group(procs.c_str(), "1000");
    ::dup2(pipefd[1], 1);
    ::dup2(logfd, 2);
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  ::close(pipefd[1]);
  ::close(logfd);
  return Child{pid, pipefd[0]};
}

// Reads the server's stdout up to "listening on http://HOST:PORT"; -1 when it died first.
int wait_listening(Child& c, double timeout_s) {
  std::string buf;
  const double t0 = now_seconds();
  while (now_seconds() - t0 < timeout_s) {
    pollfd p{c.out, POLLIN, 0};
    if (::poll(&p, 1, 100) > 0) {
      char b[512];
      const ssize_t n = ::read(c.out, b, sizeof b);
      if (n <= 0) return -1;
      buf.append(b, static_cast<size_t>(n));
      const size_t at = buf.find("listening on http://");
      if (at != std::string::npos) {
        const size_t colon = buf.find(':', at + 20);
        const size_t end = buf.find_first_not_of("0123456789", colon + 1);
        if (colon != std::string::npos && end != std::string::npos) return std::stoi(buf.substr(colon + 1, end - colon - 1));
      }
    }
    if (!c.alive()) return -1;
  }
  return -1;
}

// The generator: grows anonymous memory in 8 MiB steps at `rate` bytes/s to
// `target` bytes, touching every page, then holds it until killed. Reports
// its total after each step on the pipe.
Child spawn_generator(const BenchCgroup& cg, uint64_t target, double rate) {
  const std::string procs = cg.path() + "/cgroup.procs";
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) != 0) throw Error("bench pressure: pipe failed");
  const pid_t pid = ::fork();
  if (pid < 0) throw Error("bench pressure: fork failed");
  if (pid == 0) {
    enter_group(procs.c_str(), "0");
    constexpr uint64_t kStep = uint64_t{8} << 20;
    const double step_s = static_cast<double>(kStep) / rate;
    uint64_t total = 0;
    timespec t0{};
    ::clock_gettime(CLOCK_MONOTONIC, &t0);
    while (total < target) {
      void* p = ::mmap(nullptr, kStep, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) break;
      for (uint64_t off = 0; off < kStep; off += 4096) static_cast<volatile char*>(p)[off] = 1;
      total += kStep;
      if (::write(pipefd[1], &total, sizeof total) < 0) {
        // the bench reads when it samples; a full pipe only loses a report
      }
      const double due = step_s * static_cast<double>(total / kStep);
      timespec now{};
      ::clock_gettime(CLOCK_MONOTONIC, &now);
      const double el = static_cast<double>(now.tv_sec - t0.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec - t0.tv_nsec);
      if (due > el) {
        const double w = due - el;
        timespec ts{static_cast<time_t>(w), static_cast<long>((w - std::floor(w)) * 1e9)};
        ::nanosleep(&ts, nullptr);
      }
    }
    const uint64_t done = ~uint64_t{0};
    if (::write(pipefd[1], &done, sizeof done) < 0) ::_exit(122);
    for (;;) ::pause();
  }
  ::close(pipefd[1]);
  return Child{pid, pipefd[0]};
}

uint64_t rss_of(pid_t pid) {
  std::istringstream in(read_text("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

struct Sample {
  double t;
  double usage_mb, server_mb, gen_mb;
};

struct Mark {
  double t;
  std::string kind;  // "kill", "request", "start"
};

struct SystemResult {
  std::string name, pressure;
  int step_pp = 0;
  int survived = 0;
  std::vector<int> killed_rounds;
  std::vector<double> ttft_s;  // per round: TTFT on return (cold start included when killed)
  std::vector<Sample> trace;
  std::vector<Mark> marks;
  double footprint_mb = 0;  // server RSS after the conversation's first request
  int64_t signals = 0, evictions = 0;
  double evicted_mb = 0;
  std::string log;
};

// Non-streamed, one token: its wall time is the time to first token.
double request(int port, const std::vector<int>& prompt, std::string* err) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(600);
  c.set_connection_timeout(10);
  const std::string body = json{{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}}.dump();
  const double t0 = now_seconds();
  auto res = c.Post("/v1/completions", body, "application/json");
  const double s = now_seconds() - t0;
  if (!res) {
    *err = "no response (" + httplib::to_string(res.error()) + ")";
    return -1;
  }
  if (res->status != 200) {
    *err = "HTTP " + std::to_string(res->status) + ": " + res->body.substr(0, 200);
    return -1;
  }
  return s;
}

class Rig {
 public:
  Rig(const PressureArgs& a, SystemResult& r, uint64_t limit) : a_(a), r_(r), limit_(limit) {}

  void sample(BenchCgroup& cg, Child* server, uint64_t gen_bytes) {
    const double mb = 1e6;
    const bool up = server && server->pid > 0;
    r_.trace.push_back(Sample{now_seconds() - t0_, cg.usage() / mb, up ? rss_of(server->pid) / mb : 0.0,
                              gen_bytes / mb});
  }
  // Samples every 50 ms for `seconds` (or until `until` says stop); marks the server's death.
  void watch(BenchCgroup& cg, Child& server, double seconds, const std::function<bool()>& until = nullptr) {
    const double end = now_seconds() + seconds;
    while (now_seconds() < end) {
      if (server.pid > 0 && !server.alive()) {
        r_.marks.push_back({now_seconds() - t0_, "kill"});
        killed_now_ = true;
      }
      read_gen();
      sample(cg, &server, gen_bytes_);
      if (until && until()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  // The request on its own thread while this one samples; -1 (and *err) when it failed.
  double timed_request(BenchCgroup& cg, Child& server, int port, const std::vector<int>& conv, std::string* err) {
    std::atomic<bool> done{false};
    double s = -1;
    std::string e;
    std::thread req([&] {
      s = request(port, conv, &e);
      done = true;
    });
    watch(cg, server, 600, [&] { return done.load(); });
    req.join();
    *err = e;
    return s;
  }
  void read_gen() {
    if (gen_.out < 0) return;
    uint64_t v = 0;
    while (::read(gen_.out, &v, sizeof v) == sizeof v) {
      if (v == ~uint64_t{0}) {
        gen_done_ = true;
      } else {
        gen_bytes_ = v;
      }
    }
  }

  int start_server(BenchCgroup& cg, Child& server) {
    std::vector<std::string> argv = {"ebb", "serve", "-m", a_.model, "--port", "0", "--quiet", "--pressure", r_.pressure};
    if (r_.pressure != "off") argv.insert(argv.end(), {"--pressure-step", std::to_string(r_.step_pp)});
    if (a_.threads > 0) argv.insert(argv.end(), {"-t", std::to_string(a_.threads)});
    // The model's file pages out of the page cache, so that loading charges them to the group
    // (the reclaimable part of the server's memory, as an app's file pages are).
    if (const int fd = ::open(a_.model.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
    r_.marks.push_back({now_seconds() - t0_, "start"});
    server = spawn_server(cg, argv, r_.log);
    const int port = wait_listening(server, 300);
    if (port < 0) throw Error("bench pressure: ebb serve did not start (see " + r_.log + ")");
    return port;
  }

  void run() {
    BenchCgroup cg("ebb-bench-" + std::to_string(::getpid()), limit_);
    Child server;
    t0_ = now_seconds();
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> tok(100, 4999);
    std::vector<int> conv(static_cast<size_t>(a_.conversation));
    for (int& t : conv) t = tok(rng);
    int port = start_server(cg, server);
    std::string err;
    if (timed_request(cg, server, port, conv, &err) < 0) throw Error("bench pressure: the conversation's first request failed: " + err);
    watch(cg, server, 0.5);
    r_.footprint_mb = server.pid > 0 ? rss_of(server.pid) / 1e6 : 0;
    const uint64_t target = static_cast<uint64_t>(a_.fill * static_cast<double>(limit_));
    for (int round = 1; round <= a_.rounds; ++round) {
      killed_now_ = false;
      gen_bytes_ = 0;
      gen_done_ = false;
      gen_ = spawn_generator(cg, target, a_.rate_mb_s * 1e6);
      watch(cg, server, 120, [&] { return gen_done_ || !gen_.alive(); });
      // The group's OOM killer may take the generator too, right after the
      // server (before the server's memory is back): that round is the
      // server's death, not a broken generator.
      if (!gen_done_ && gen_.pid < 0) watch(cg, server, 1.0);  // the server's exit may come a little later
      if (!gen_done_ && gen_.pid < 0 && !killed_now_) {
        const int st = gen_.status;
        throw Error("bench pressure: round " + std::to_string(round) + ": the memory generator " +
                    (WIFSIGNALED(st) ? "was killed by signal " + std::to_string(WTERMSIG(st))
                                     : "exited with status " + std::to_string(WEXITSTATUS(st))) +
                    " before it held its memory (120: could not join the group, 121: could not set its oom_score_adj)");
      }
      watch(cg, server, a_.hold_s);
      gen_.kill_and_wait();
      gen_bytes_ = 0;
      watch(cg, server, 0.3);
      for (int t = 0; t < a_.turn; ++t) conv.push_back(tok(rng));
      r_.marks.push_back({now_seconds() - t0_, "request"});
      double ttft = -1;
      if (server.pid > 0 && !killed_now_) {
        ttft = timed_request(cg, server, port, conv, &err);
        if (ttft < 0 && !killed_now_)
          throw Error("bench pressure: round " + std::to_string(round) + ": the request failed: " + err);
      }
      if (ttft >= 0) {
        ++r_.survived;
      } else {
        // Dead (before or during the request): a cold start, then the whole conversation again.
        r_.killed_rounds.push_back(round);
        server.kill_and_wait();
        const double t = now_seconds();
        port = start_server(cg, server);
        if (timed_request(cg, server, port, conv, &err) < 0)
          throw Error("bench pressure: round " + std::to_string(round) + ": the request after a restart failed: " + err);
        ttft = now_seconds() - t;
      }
      r_.ttft_s.push_back(ttft);
      std::fprintf(stderr, "bench pressure: %s round %d/%d: %s, TTFT on return %.2f s\n", r_.name.c_str(), round,
                   a_.rounds, r_.killed_rounds.empty() || r_.killed_rounds.back() != round ? "survived" : "OOM-killed",
                   ttft);
      watch(cg, server, 0.3);
    }
    if (server.pid > 0) {
      ::kill(server.pid, SIGTERM);
      for (int i = 0; i < 100 && server.alive(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    server.kill_and_wait();
  }

 private:
  const PressureArgs& a_;
  SystemResult& r_;
  uint64_t limit_;
  double t0_ = 0;
  Child gen_;
  uint64_t gen_bytes_ = 0;
  bool gen_done_ = false;
  bool killed_now_ = false;
};

// Pressure lines of the server's log (over all its lives).
void count_log(SystemResult& r) {
  std::istringstream in(read_text(r.log));
  for (std::string line; std::getline(in, line);) {
    if (line.find("ebb serve: memory pressure (") == std::string::npos) continue;
    ++r.signals;
    const size_t at = line.find("): evicted ");
    if (at == std::string::npos) continue;
    ++r.evictions;
    try {
      r.evicted_mb += std::stod(line.substr(at + 11));
    } catch (const std::exception&) {
    }
  }
}

std::string svg_trace(const std::vector<SystemResult>& rs, double limit_mb) {
  const double w = 960, ph = 190, left = 60, right = 20, top = 30;
  double tmax = 1;
  for (const auto& r : rs)
    for (const auto& s : r.trace) tmax = std::max(tmax, s.t);
  const double ymax = limit_mb * 1.1;
  std::ostringstream o;
  const double h = top + ph * static_cast<double>(rs.size()) + 30;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << left << "\" y=\"18\" font-size=\"13\">ebb bench pressure: memory of the cgroup (grey), of ebb "
       "serve (blue) and of the pressure generator (orange); limit dashed; x = OOM kill, | = request</text>\n";
  for (size_t i = 0; i < rs.size(); ++i) {
    const SystemResult& r = rs[i];
    const double y0 = top + ph * static_cast<double>(i), y1 = y0 + ph - 40;
    auto X = [&](double t) { return left + (w - left - right) * t / tmax; };
    auto Y = [&](double mb) { return y1 - (y1 - y0 - 15) * std::min(mb, ymax) / ymax; };
    o << "<text x=\"" << left << "\" y=\"" << y0 + 10 << "\" font-weight=\"bold\">" << r.name << ": survived "
      << r.survived << "/" << r.ttft_s.size() << " rounds</text>\n";
    o << "<line x1=\"" << left << "\" y1=\"" << y1 << "\" x2=\"" << w - right << "\" y2=\"" << y1
      << "\" stroke=\"black\"/>\n<line x1=\"" << left << "\" y1=\"" << y1 << "\" x2=\"" << left << "\" y2=\"" << y0 + 15
      << "\" stroke=\"black\"/>\n";
    for (double mb = 0; mb <= ymax; mb += 250)
      o << "<text x=\"" << left - 5 << "\" y=\"" << Y(mb) + 4 << "\" text-anchor=\"end\">" << mb << "</text>\n";
    o << "<text x=\"12\" y=\"" << (y0 + y1) / 2 << "\" transform=\"rotate(-90 12 " << (y0 + y1) / 2
      << ")\" text-anchor=\"middle\">MB</text>\n";
    for (double t = 0; t <= tmax; t += tmax > 200 ? 50 : 20)
      o << "<text x=\"" << X(t) << "\" y=\"" << y1 + 13 << "\" text-anchor=\"middle\">" << t << " s</text>\n";
    o << "<line x1=\"" << left << "\" y1=\"" << Y(limit_mb) << "\" x2=\"" << w - right << "\" y2=\"" << Y(limit_mb)
      << "\" stroke=\"red\" stroke-dasharray=\"5,4\"/>\n";
    auto poly = [&](auto get, const char* color) {
      o << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.3\" points=\"";
      for (const Sample& s : r.trace) o << X(s.t) << "," << Y(get(s)) << " ";
      o << "\"/>\n";
    };
    poly([](const Sample& s) { return s.usage_mb; }, "#999");
    poly([](const Sample& s) { return s.gen_mb; }, "#e8871e");
    poly([](const Sample& s) { return s.server_mb; }, "#1f5fbf");
    for (const Mark& m : r.marks) {
      if (m.kind == "kill") {
        o << "<text x=\"" << X(m.t) << "\" y=\"" << Y(limit_mb) - 2 << "\" fill=\"red\" font-size=\"14\" "
          << "text-anchor=\"middle\">x</text>\n";
      } else if (m.kind == "request") {
        o << "<line x1=\"" << X(m.t) << "\" y1=\"" << y1 << "\" x2=\"" << X(m.t) << "\" y2=\"" << y1 - 8
          << "\" stroke=\"green\" stroke-width=\"2\"/>\n";
      }
    }
  }
  o << "</svg>\n";
  return o.str();
}

std::vector<int> parse_steps(const std::string& s) {
  std::vector<int> out;
  std::istringstream in(s);
  for (std::string x; std::getline(in, x, ',');) {
    if (x.empty()) continue;
    int v = 0;
    try {
      v = std::stoi(x);
    } catch (const std::exception&) {
      v = 0;
    }
    if (v <= 0 || v > 100) throw Error("bench pressure: --steps '" + s + "': each step must be in (0, 100] pp");
    out.push_back(v);
  }
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

int run_pressure_bench(PressureArgs& a) {
  if (a.model.empty()) throw Error("bench pressure: -m MODEL is required");
  if (a.rounds < 1) throw Error("bench pressure: --rounds must be >= 1");
  if (!(a.fill > 0 && a.fill < 0.95)) throw Error("bench pressure: --fill must be in (0, 0.95) of the limit");
  if (!(a.rate_mb_s > 0)) throw Error("bench pressure: --rate must be > 0 MB/s");
  if (a.conversation < 1 || a.turn < 1) throw Error("bench pressure: --conversation and --turn must be >= 1");
  const uint64_t limit = parse_size(a.limit, 0);
  if (limit < (uint64_t{64} << 20)) throw Error("bench pressure: --limit must be at least 64 MiB");
  std::vector<SystemResult> rs;
  for (int s : parse_steps(a.steps)) {
    SystemResult r;
    r.name = "ebb " + std::to_string(s) + " pp";
    r.pressure = "cgroup";
    r.step_pp = s;
    rs.push_back(r);
  }
  if (!a.no_baseline) {
    SystemResult r;
    r.name = "baseline (no eviction)";
    r.pressure = "off";
    rs.push_back(r);
  }
  for (size_t i = 0; i < rs.size(); ++i) {
    SystemResult& r = rs[i];
    r.log = a.log_dir + "/ebb-bench-pressure-" + std::to_string(::getpid()) + "-" + std::to_string(i) + ".log";
    ::unlink(r.log.c_str());
    std::fprintf(stderr, "bench pressure: %s (server log %s)\n", r.name.c_str(), r.log.c_str());
    Rig(a, r, limit).run();
    count_log(r);
  }
  const double limit_mb = static_cast<double>(limit) / 1e6;
  const double target_mb = a.fill * limit_mb;
  double footprint = 0;
  for (const auto& r : rs) footprint = std::max(footprint, r.footprint_mb);
  if (!a.svg.empty()) {
    std::ofstream(a.svg) << svg_trace(rs, limit_mb);
  }
  json j;
  j["model"] = a.model;
  j["limit_bytes"] = limit;
  j["generator_target_mb"] = target_mb;
  j["generator_rate_mb_s"] = a.rate_mb_s;
  j["hold_s"] = a.hold_s;
  j["rounds"] = a.rounds;
  j["conversation_tokens"] = a.conversation;
  j["turn_tokens"] = a.turn;
  j["server_footprint_mb"] = footprint;
  j["svg"] = a.svg;
  for (const auto& r : rs) {
    j["systems"].push_back({{"name", r.name},
                            {"pressure", r.pressure},
                            {"step_pp", r.step_pp},
                            {"survived", r.survived},
                            {"killed_rounds", r.killed_rounds},
                            {"ttft_s", r.ttft_s},
                            {"ttft_median_s", median(r.ttft_s)},
                            {"footprint_mb", r.footprint_mb},
                            {"signals", r.signals},
                            {"evictions", r.evictions},
                            {"evicted_mb", r.evicted_mb},
                            {"log", r.log}});
  }
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("ebb bench pressure: %s, %d rounds\n", a.model.c_str(), a.rounds);
  std::printf("  bound: cgroup limit %.0f MB; ebb serve's footprint after the conversation %.0f MB (RSS); the\n"
              "         generator takes %.0f MB (%.0f%% of the limit) at %.0f MB/s: together %.0f MB, %.0f MB over\n",
              limit_mb, footprint, target_mb, 100 * a.fill, a.rate_mb_s, footprint + target_mb,
              footprint + target_mb - limit_mb);
  std::printf("\n  %-24s %9s %8s %10s %10s %11s   %s\n", "system", "survived", "signals", "evictions", "evicted MB",
              "TTFT med s", "TTFT on return per round (s)");
  for (const auto& r : rs) {
    std::string per;
    for (size_t k = 0; k < r.ttft_s.size(); ++k) {
      char b[32];
      const bool dead = std::find(r.killed_rounds.begin(), r.killed_rounds.end(), static_cast<int>(k + 1)) !=
                        r.killed_rounds.end();
      std::snprintf(b, sizeof b, "%s%.2f%s", per.empty() ? "" : " ", r.ttft_s[k], dead ? "*" : "");
      per += b;
    }
    std::printf("  %-24s %5d/%-3d %8lld %10lld %10.0f %11.2f   %s\n", r.name.c_str(), r.survived,
                static_cast<int>(r.ttft_s.size()), static_cast<long long>(r.signals),
                static_cast<long long>(r.evictions), r.evicted_mb, median(r.ttft_s), per.c_str());
  }
  std::printf("  (* OOM-killed that round: a cold start, load + the whole conversation recomputed)\n");
  if (!a.svg.empty()) std::printf("  memory trace: %s\n", a.svg.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

void add_bench_pressure_command(CLI::App* bench, int* rc) {
  auto a = std::make_shared<PressureArgs>();
  CLI::App* sub = bench->add_subcommand(
      "pressure", "Multitasking under memory pressure (mzCache Fig. 15): ebb serve in a cgroup against a memory hog");
  sub->add_option("-m,--model", a->model, "GGUF model file")->required();
  sub->add_option("--rounds", a->rounds, "Rounds of pressure then a request")->capture_default_str();
  sub->add_option("--limit", a->limit, "The cgroup's memory limit (bytes, or 1200MiB, 1GiB, ...)")->capture_default_str();
  sub->add_option("--steps", a->steps, "ebb systems: percentage points evicted per signal, comma-separated")
      ->capture_default_str();
  sub->add_flag("--no-baseline", a->no_baseline, "Skip the system that does not evict (--pressure off)");
  sub->add_option("--fill", a->fill, "The generator's memory, as a fraction of the limit")->capture_default_str();
  sub->add_option("--rate", a->rate_mb_s, "The generator's growth in MB/s")->capture_default_str();
  sub->add_option("--hold", a->hold_s, "Seconds the generator holds its memory before the request")
      ->capture_default_str();
  sub->add_option("--conversation", a->conversation, "Tokens of the conversation the server holds")
      ->capture_default_str();
  sub->add_option("--turn", a->turn, "Tokens each round adds to the conversation")->capture_default_str();
  sub->add_option("-t,--threads", a->threads, "The server's compute threads (0: all)")->capture_default_str();
  sub->add_option("--svg", a->svg, "Where the memory trace is written (\"\": not written)")->capture_default_str();
  sub->add_option("--log-dir", a->log_dir, "Directory of the servers' logs")->capture_default_str();
  sub->add_flag("--json", a->json, "Print one JSON object instead of the table");
  sub->callback([a, rc] { *rc = run_pressure_bench(*a); });
}

}  // namespace ebb::cli
