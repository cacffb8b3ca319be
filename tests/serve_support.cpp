#include "serve_support.h"

#include <filesystem>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "support.h"

namespace ebb::test {

using nlohmann::json;
using namespace std::chrono_literals;

ServerProcess::ServerProcess(const std::vector<std::string>& extra, const std::string& model,
                             const std::string& cgroup_procs) {
  std::vector<std::string> args = {EBB_CLI_PATH, "serve",     "-m", model.empty() ? model_path("stories260K.gguf") : model,
                                   "--port",     "0",         "--threads", "1", "--batch", "16"};
  // KV chunks of 16 unless the test names its own (--kv-chunk 0: ebb's default).
  if (std::find(extra.begin(), extra.end(), "--kv-chunk") == extra.end()) args.insert(args.end(), {"--kv-chunk", "16"});
  args.insert(args.end(), extra.begin(), extra.end());
  int out[2], err[2];
  if (::pipe(out) != 0) return;
  if (::pipe(err) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return;
  }
  pid_ = ::fork();
  if (pid_ == 0) {
    if (!cgroup_procs.empty()) {  // into the cgroup before anything is charged
      const std::string me = std::to_string(::getpid());
      const int fd = ::open(cgroup_procs.c_str(), O_WRONLY);
      if (fd < 0 || ::write(fd, me.data(), me.size()) != static_cast<ssize_t>(me.size())) ::_exit(126);
      ::close(fd);
    }
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  out_ = out[0];
  err_ = err[0];
  err_reader_ = std::thread([this] { drain(err_, &err_text_); });
  std::string line;
  const auto end = std::chrono::steady_clock::now() + 20s;
  while (line.find('\n') == std::string::npos && std::chrono::steady_clock::now() < end) {
    pollfd p{out_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[512];
    const ssize_t n = ::read(out_, buf, sizeof buf);
    if (n <= 0) break;
    line.append(buf, static_cast<size_t>(n));
  }
  {
    std::lock_guard lock(mu_);
    out_text_ = line;
  }
  out_reader_ = std::thread([this] { drain(out_, &out_text_); });
  first_line_ = line.substr(0, line.find('\n') == std::string::npos ? line.size() : line.find('\n') + 1);
  const size_t at = line.find("http://127.0.0.1:");
  if (at != std::string::npos) port_ = std::atoi(line.c_str() + at + std::strlen("http://127.0.0.1:"));
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  // The child is gone: both pipes reach EOF and the readers end.
  if (out_reader_.joinable()) out_reader_.join();
  if (err_reader_.joinable()) err_reader_.join();
  if (out_ >= 0) ::close(out_);
  if (err_ >= 0) ::close(err_);
}

void ServerProcess::drain(int fd, std::string* into) {
  constexpr size_t kKeep = 256 << 10;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    std::lock_guard lock(mu_);
    into->append(buf, static_cast<size_t>(n));
    if (into->size() > kKeep) into->erase(0, into->size() - kKeep);
  }
}

std::string ServerProcess::out() const {
  std::lock_guard lock(mu_);
  return out_text_;
}

std::string ServerProcess::err() const {
  std::lock_guard lock(mu_);
  return err_text_;
}

int ServerProcess::stop(int sig, std::chrono::milliseconds limit) {
  if (pid_ <= 0 || reaped_) return -1;
  ::kill(pid_, sig);
  const auto end = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      // Its pipes are at EOF: out() and err() hold everything it printed.
      if (out_reader_.joinable()) out_reader_.join();
      if (err_reader_.joinable()) err_reader_.join();
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(10ms);
  }
  return -1;
}

std::unique_ptr<httplib::Client> client(int port, bool with_key) {
  auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
  c->set_read_timeout(15, 0);
  c->set_write_timeout(5, 0);
  c->set_connection_timeout(5, 0);
  if (with_key) c->set_bearer_token_auth(kKey);
  return c;
}

Reply post(httplib::Client& c, const std::string& path, const std::string& body) {
  Reply r;
  auto res = c.Post(path.c_str(), body, "application/json");
  if (!res) {
    ADD_FAILURE() << "POST " << path << ": no response (" << httplib::to_string(res.error()) << ")";
    return r;
  }
  r.status = res->status;
  r.raw = res->body;
  r.body = json::parse(res->body, nullptr, /*allow_exceptions=*/false);
  return r;
}

Reply post(httplib::Client& c, const std::string& path, const json& body) { return post(c, path, body.dump()); }

Reply get(httplib::Client& c, const std::string& path) {
  Reply r;
  auto res = c.Get(path.c_str());
  if (!res) {
    ADD_FAILURE() << "GET " << path << ": no response (" << httplib::to_string(res.error()) << ")";
    return r;
  }
  r.status = res->status;
  r.raw = res->body;
  r.body = json::parse(res->body, nullptr, false);
  return r;
}

json poll_get(httplib::Client& c, const std::string& path, const std::function<bool(const json&)>& done,
              std::chrono::milliseconds limit, std::chrono::milliseconds every) {
  const auto end = std::chrono::steady_clock::now() + limit;
  json j;
  while (std::chrono::steady_clock::now() < end) {
    const Reply r = get(c, path);
    if (r.status != 200) {
      ADD_FAILURE() << "GET " << path << ": " << r.raw;
      return j;
    }
    j = r.body;
    if (done(j)) return j;
    std::this_thread::sleep_for(every);
  }
  ADD_FAILURE() << "GET " << path << " did not get there in time: " << j.dump();
  return j;
}

std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < body.size()) {
    size_t end = body.find("\n\n", at);
    if (end == std::string::npos) end = body.size();
    const std::string event = body.substr(at, end - at);
    if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
    at = end + 2;
  }
  return out;
}

Streamed stream(httplib::Client& c, const std::string& path, json body, bool chat) {
  body["stream"] = true;
  Reply r = post(c, path, body.dump());
  EXPECT_EQ(r.status, 200) << r.raw;
  Streamed s;
  const std::vector<std::string> data = sse_data(r.raw);
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i] == "[DONE]") {
      s.done = true;
      s.done_last = i + 1 == data.size();
      continue;
    }
    json j = json::parse(data[i], nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << data[i];
    if (j.is_discarded()) continue;
    s.chunks.push_back(j);
    if (!j.contains("choices") || j["choices"].empty()) continue;
    const json& ch = j["choices"][0];
    if (chat && ch.contains("delta") && ch["delta"].contains("content")) s.text += ch["delta"]["content"].get<std::string>();
    if (!chat && ch.contains("text")) s.text += ch["text"].get<std::string>();
  }
  return s;
}

void expect_openai_error(const Reply& r, int status, const std::string& code, const std::string& param) {
  EXPECT_EQ(r.status, status) << r.raw;
  ASSERT_TRUE(r.body.is_object()) << r.raw;
  ASSERT_TRUE(r.body.contains("error")) << r.raw;
  const json& e = r.body["error"];
  EXPECT_TRUE(e.contains("message") && e["message"].is_string() && !e["message"].get<std::string>().empty()) << r.raw;
  EXPECT_TRUE(e.contains("type") && e["type"].is_string()) << r.raw;
  EXPECT_TRUE(e.contains("param")) << r.raw;
  EXPECT_TRUE(e.contains("code")) << r.raw;
  if (!code.empty()) {
    EXPECT_EQ(e["code"], code) << r.raw;
  }
  if (!param.empty()) {
    EXPECT_EQ(e["param"], param) << r.raw;
  }
}

double metric_value(httplib::Client& c, const std::string& name) {
  auto res = c.Get("/metrics");
  if (!res) return -1;
  const size_t at = res->body.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::atof(res->body.c_str() + at + name.size() + 2);
}

uint64_t rss_bytes(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return 0;
}

ScriptRun run_openai_script(const std::string& script, int port) {
  ScriptRun run;
  const std::string cli = EBB_CLI_PATH;
  const std::string prefix = cli.substr(0, cli.rfind('/')) + "/npm";
  if (std::system("node --version >/dev/null 2>&1") != 0) {
    ADD_FAILURE() << "node is not installed: run scripts/setup.sh (it installs nodejs, and the openai package into "
                  << prefix << ")";
    return run;
  }
  if (!std::filesystem::exists(prefix + "/node_modules/openai/package.json")) {
    ADD_FAILURE() << "the openai npm package is not in " << prefix << ": run scripts/setup.sh (EBB_BUILD_DIR="
                  << prefix.substr(0, prefix.size() - 4) << " for this build tree), or npm install --prefix " << prefix
                  << " openai";
    return run;
  }
  const std::string cmd = "timeout 60 node " + std::string(EBB_SOURCE_DIR) + "/tests/" + script +
                          " http://127.0.0.1:" + std::to_string(port) + "/v1 " + kKey + " stories260K " + prefix +
                          " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    ADD_FAILURE() << "cannot run " << cmd;
    return run;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) run.out.append(buf, n);
  const int status = ::pclose(p);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace ebb::test
