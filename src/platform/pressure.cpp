#include "platform/pressure.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <thread>

#include "platform/error.h"
#include "platform/thread_name.h"

namespace ebb {

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) ::close(fd_);
}

ScopedFd& ScopedFd::operator=(ScopedFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

PressureSource parse_pressure_source(std::string_view s) {
  if (s == "auto") return PressureSource::kAuto;
  if (s == "psi") return PressureSource::kPsi;
  if (s == "cgroup") return PressureSource::kCgroup;
  if (s == "cgroup-v2") return PressureSource::kCgroupV2;
  if (s == "cgroup-v1") return PressureSource::kCgroupV1;
  throw Error("memory pressure source '" + std::string(s) + "' is not one of auto, psi, cgroup, cgroup-v2, cgroup-v1");
}

std::string_view pressure_source_name(PressureSource s) {
  switch (s) {
    case PressureSource::kAuto: return "auto";
    case PressureSource::kPsi: return "psi";
    case PressureSource::kCgroup: return "cgroup";
    case PressureSource::kCgroupV2: return "cgroup-v2";
    case PressureSource::kCgroupV1: return "cgroup-v1";
  }
  return "?";
}

std::string PsiTrigger::text() const {
  return std::string(full ? "full" : "some") + " " + std::to_string(stall_us) + " " + std::to_string(window_us);
}

PsiTrigger parse_psi_trigger(std::string_view s) {
  std::istringstream in{std::string(s)};
  std::string kind, extra;
  long long stall = -1, window = -1;
  const std::string what = "PSI trigger '" + std::string(s) + "'";
  if (!(in >> kind >> stall >> window) || (in >> extra))
    throw Error(what + " is not 'some|full STALL_US WINDOW_US' (e.g. 'some 150000 1000000')");
  if (kind != "some" && kind != "full") throw Error(what + ": the kind must be 'some' or 'full'");
  // The kernel's limits (kernel/sched/psi.c): 500 ms <= window <= 10 s, 0 < stall <= window.
  if (window < 500000 || window > 10000000) throw Error(what + ": the window must be in [500000, 10000000] us");
  if (stall <= 0 || stall > window) throw Error(what + ": the stall must be in (0, window] us");
  return PsiTrigger{kind == "full", static_cast<uint64_t>(stall), static_cast<uint64_t>(window)};
}

std::optional<PsiStats> parse_psi(std::string_view text) {
  std::istringstream in{std::string(text)};
  PsiStats st;
  bool some = false;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::string kind;
    if (!(ls >> kind) || (kind != "some" && kind != "full")) continue;
    PsiLine p;
    for (std::string kv; ls >> kv;) {
      const size_t eq = kv.find('=');
      if (eq == std::string::npos) continue;
      const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
      try {
        if (k == "avg10") p.avg10 = std::stod(v);
        if (k == "avg60") p.avg60 = std::stod(v);
        if (k == "avg300") p.avg300 = std::stod(v);
        if (k == "total") p.total_us = std::stoull(v);
      } catch (const std::exception&) {
        return std::nullopt;
      }
    }
    if (kind == "some") {
      st.some = p;
      some = true;
    } else {
      st.full = p;
    }
  }
  if (!some) return std::nullopt;
  return st;
}

MemoryEvents parse_memory_events(std::string_view text) {
  std::istringstream in{std::string(text)};
  MemoryEvents ev;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::string k, v, extra;
    if (!(ls >> k >> v) || (ls >> extra)) continue;
    if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos) continue;
    try {
      ev[k] = std::stoull(v);
    } catch (const std::exception&) {
      // out of range: skip the line
    }
  }
  return ev;
}

std::string memory_events_rise(const MemoryEvents& before, const MemoryEvents& after) {
  std::string rose;
  for (const char* key : {"high", "max"}) {
    const auto a = after.find(key);
    if (a == after.end()) continue;
    const auto b = before.find(key);
    if (a->second > (b == before.end() ? 0 : b->second)) rose += rose.empty() ? key : std::string(",") + key;
  }
  return rose;
}

namespace {

bool exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

// Reads an open file from its start (kernfs files must be re-read to re-arm poll()).
std::string pread_all(int fd) {
  std::string out;
  char buf[4096];
  for (off_t off = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    off += n;
  }
  return out;
}

// The mount point and root of the v1 memory hierarchy (v1) or cgroup2 (v2).
bool find_mount(const std::string& root, int version, std::string* mroot, std::string* point) {
  std::ifstream f(root + "/proc/self/mountinfo");
  for (std::string line; std::getline(f, line);) {
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream head(line.substr(0, dash)), tail(line.substr(dash + 3));
    std::string id, parent, dev, r, p, fstype, source, super;
    if (!(head >> id >> parent >> dev >> r >> p) || !(tail >> fstype >> source >> super)) continue;
    bool match = version == 2 && fstype == "cgroup2";
    if (version == 1 && fstype == "cgroup") {
      std::istringstream opts(super);
      for (std::string o; std::getline(opts, o, ',');) match = match || o == "memory";
    }
    if (match) {
      *mroot = r;
      *point = p;
      return true;
    }
  }
  return false;
}

std::string under_mount(const std::string& root, const std::string& mroot, const std::string& point, std::string rel) {
  if (mroot != "/" && rel.compare(0, mroot.size(), mroot) == 0) rel = rel.substr(mroot.size());
  while (!rel.empty() && rel.back() == '/') rel.pop_back();
  return root + point + rel;
}

ScopedFd open_trigger(const std::string& path, const PsiTrigger& t, const std::string& who) {
  ScopedFd fd(::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC));
  if (!fd) {
    const int e = errno;
    if (e == ENOENT)
      throw Error(who + ": " + path + " is not available (kernel without CONFIG_PSI, or booted with psi=0)");
    throw Error(who + ": cannot open " + path + ": " + std::strerror(e));
  }
  const std::string text = t.text();
  // The trigger's string goes in with its terminating NUL, as the kernel's documentation does it.
  if (::write(fd.get(), text.c_str(), text.size() + 1) < 0) {
    const int e = errno;
    if (e == EOPNOTSUPP)
      throw Error(who + ": " + path + " is not available (PSI is disabled: booted with psi=0)");
    if (e == EPERM || e == EACCES)
      throw Error(who + ": writing the trigger '" + text + "' to " + path +
                  " was refused (unprivileged triggers need a window that is a multiple of 2 s)");
    throw Error(who + ": writing the trigger '" + text + "' to " + path + " failed: " + std::strerror(e));
  }
  return fd;
}

// Without CAP_SYS_RESOURCE the kernel takes only windows that are whole
// multiples of 2 s (EINVAL otherwise): such a trigger is retried with the
// window rounded up to 2 s multiples and the stall scaled with it.
PressureChannel psi_channel(const std::string& path, PsiTrigger t, PressureSource src, const std::string& who) {
  PressureChannel c;
  c.kind = PressureChannel::Kind::kTrigger;
  c.source = src;
  try {
    c.fd = open_trigger(path, t, who);
  } catch (const Error&) {
    constexpr uint64_t k2s = 2000000;
    if (t.window_us % k2s == 0) throw;
    const uint64_t w = (t.window_us + k2s - 1) / k2s * k2s;
    PsiTrigger u = t;
    u.stall_us = t.stall_us * w / t.window_us;
    u.window_us = w;
    try {
      c.fd = open_trigger(path, u, who);
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + " (and '" + t.text() +
                  "' before it: unprivileged triggers need a window that is a multiple of 2 s)");
    }
    t = u;
  }
  c.what = "psi " + t.text();
  return c;
}

std::vector<PressureChannel> open_psi(const PressureWatcherOptions& o, const CgroupDirs& d, std::string* desc) {
  const PsiTrigger t = parse_psi_trigger(o.psi_trigger);
  std::string path = o.root + "/proc/pressure/memory";
  if (!o.cgroup_dir.empty()) {
    path = o.cgroup_dir + "/memory.pressure";
  } else if (!d.v2.empty() && !d.v2_is_root && exists(d.v2 + "/memory.pressure")) {
    path = d.v2 + "/memory.pressure";
  }
  std::vector<PressureChannel> out;
  out.push_back(psi_channel(path, t, PressureSource::kPsi, "memory pressure source psi"));
  *desc = "psi " + path + " (trigger '" + out.back().what.substr(4) + "')";
  return out;
}

std::vector<PressureChannel> open_v2(const PressureWatcherOptions& o, const CgroupDirs& d, std::string* desc) {
  const std::string who = "memory pressure source cgroup-v2";
  const std::string dir = o.cgroup_dir.empty() ? d.v2 : o.cgroup_dir;
  if (dir.empty()) throw Error(who + ": this process is in no cgroup v2 group (no cgroup2 mount, or /proc/self/cgroup has no '0::' line)");
  const std::string events = dir + "/memory.events";
  if (!exists(events))
    throw Error(who + ": the group " + dir + " has no memory controller (no memory.events" +
                (d.v2_is_root && o.cgroup_dir.empty() ? "; it is the root group" : "") + ")");
  PressureChannel c;
  c.kind = PressureChannel::Kind::kEventsFile;
  c.source = PressureSource::kCgroupV2;
  c.fd = ScopedFd(::open(events.c_str(), O_RDONLY | O_CLOEXEC));
  if (!c.fd) throw Error(who + ": cannot open " + events + ": " + std::strerror(errno));
  c.what = "memory.events";
  std::vector<PressureChannel> out;
  out.push_back(std::move(c));
  *desc = "cgroup-v2 " + dir + " (memory.events high/max";
  // The group's PSI trigger too, where the kernel has PSI.
  if (exists(dir + "/memory.pressure")) {
    try {
      const PsiTrigger t = parse_psi_trigger(o.psi_trigger);
      out.push_back(psi_channel(dir + "/memory.pressure", t, PressureSource::kCgroupV2, who));
      *desc += ", memory.pressure '" + out.back().what.substr(4) + "'";
    } catch (const Error&) {
      // memory.events alone still works
    }
  }
  *desc += ")";
  return out;
}

std::vector<PressureChannel> open_v1(const PressureWatcherOptions& o, const CgroupDirs& d, std::string* desc) {
  const std::string who = "memory pressure source cgroup-v1";
  const std::string dir = o.cgroup_dir.empty() ? d.v1_memory : o.cgroup_dir;
  if (dir.empty())
    throw Error(who + ": this process is in no cgroup v1 memory hierarchy (/proc/self/cgroup names no 'memory' "
                      "controller, or it is not mounted)");
  if (o.v1_level != "low" && o.v1_level != "medium" && o.v1_level != "critical")
    throw Error(who + ": level '" + o.v1_level + "' is not one of low, medium, critical");
  const std::string level = dir + "/memory.pressure_level", control = dir + "/cgroup.event_control";
  if (!exists(level)) throw Error(who + ": " + level + " is not available (kernel without CONFIG_MEMCG_V1?)");
  PressureChannel c;
  c.kind = PressureChannel::Kind::kEventfd;
  c.source = PressureSource::kCgroupV1;
  c.fd = ScopedFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!c.fd) throw Error(who + ": eventfd: " + std::strerror(errno));
  ScopedFd lfd(::open(level.c_str(), O_RDONLY | O_CLOEXEC));
  if (!lfd) throw Error(who + ": cannot open " + level + ": " + std::strerror(errno));
  ScopedFd cfd(::open(control.c_str(), O_WRONLY | O_CLOEXEC));
  if (!cfd) throw Error(who + ": cannot open " + control + " for writing: " + std::strerror(errno));
  const std::string line = std::to_string(c.fd.get()) + " " + std::to_string(lfd.get()) + " " + o.v1_level;
  if (::write(cfd.get(), line.c_str(), line.size()) < 0)
    throw Error(who + ": registering '" + line + "' in " + control + " failed: " + std::strerror(errno));
  c.what = "v1 " + o.v1_level;
  c.keep.push_back(std::move(lfd));
  c.keep.push_back(std::move(cfd));
  std::vector<PressureChannel> out;
  out.push_back(std::move(c));
  *desc = "cgroup-v1 " + dir + " (memory.pressure_level " + o.v1_level + ")";
  return out;
}

double now_wall() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double now_mono() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

CgroupDirs find_cgroup_dirs(const std::string& root) {
  CgroupDirs d;
  std::ifstream f(root + "/proc/self/cgroup");
  std::string v1_path, v2_path;
  bool have_v1 = false, have_v2 = false;
  for (std::string line; std::getline(f, line);) {
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (id == "0" && controllers.empty()) {
      have_v2 = true;
      v2_path = path;
      continue;
    }
    std::istringstream cs(controllers);
    for (std::string c; std::getline(cs, c, ',');)
      if (c == "memory") have_v1 = true, v1_path = path;
  }
  std::string mroot, point;
  if (have_v1 && find_mount(root, 1, &mroot, &point)) d.v1_memory = under_mount(root, mroot, point, v1_path);
  if (have_v2 && find_mount(root, 2, &mroot, &point)) {
    d.v2 = under_mount(root, mroot, point, v2_path);
    d.v2_is_root = d.v2 == root + point;
  }
  return d;
}

std::vector<PressureChannel> open_pressure_channels(const PressureWatcherOptions& o, std::string* description,
                                                    PressureSource* chosen) {
  const CgroupDirs d = find_cgroup_dirs(o.root);
  std::string desc;
  auto done = [&](std::vector<PressureChannel> c, PressureSource s) {
    if (description) *description = desc;
    if (chosen) *chosen = s;
    return c;
  };
  switch (o.source) {
    case PressureSource::kPsi: return done(open_psi(o, d, &desc), PressureSource::kPsi);
    case PressureSource::kCgroupV2: return done(open_v2(o, d, &desc), PressureSource::kCgroupV2);
    case PressureSource::kCgroupV1: return done(open_v1(o, d, &desc), PressureSource::kCgroupV1);
    case PressureSource::kCgroup:
    case PressureSource::kAuto: {
      std::string why;
      if (o.source == PressureSource::kAuto) {
        try {
          return done(open_psi(o, d, &desc), PressureSource::kPsi);
        } catch (const Error& e) {
          why = e.what();
        }
      }
      // v2 where the process's group has the memory controller, else v1.
      try {
        return done(open_v2(o, d, &desc), PressureSource::kCgroupV2);
      } catch (const Error& e) {
        why += (why.empty() ? "" : "; ") + std::string(e.what());
      }
      try {
        return done(open_v1(o, d, &desc), PressureSource::kCgroupV1);
      } catch (const Error& e) {
        why += "; " + std::string(e.what());
      }
      throw Error("memory pressure source " + std::string(pressure_source_name(o.source)) +
                  ": no source is available (" + why + ")");
    }
  }
  throw Error("memory pressure: unknown source");
}

struct PressureWatcher::Impl {
  PressureWatcherOptions opts;
  PressureCallback cb;
  std::vector<PressureChannel> channels;
  std::vector<MemoryEvents> last;  // per channel: memory.events at the last read
  std::string description;
  PressureSource source = PressureSource::kAuto;
  ScopedFd stop_fd;
  std::atomic<int64_t> notifications{0}, signals{0};
  double last_signal = -1e300;  // monotonic
  int64_t folded = 0;
  std::thread thread;

  void start() {
    stop_fd = ScopedFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!stop_fd) throw Error(std::string("memory pressure watcher: eventfd: ") + std::strerror(errno));
    last.resize(channels.size());
    for (size_t i = 0; i < channels.size(); ++i)
      if (channels[i].kind == PressureChannel::Kind::kEventsFile) last[i] = parse_memory_events(read_events(i));
    thread = std::thread([this] { loop(); });
  }

  std::string read_events(size_t i) {
    const PressureChannel& c = channels[i];
    return pread_all(c.file ? c.file.get() : c.fd.get());
  }

  void notify(const PressureChannel& c, std::string what) {
    ++notifications;
    const double t = now_mono();
    if (t - last_signal < opts.min_interval_s) {
      ++folded;
      return;
    }
    last_signal = t;
    PressureEvent ev{c.source, std::move(what), now_wall(), folded + 1};
    folded = 0;
    ++signals;
    if (cb) cb(ev);
  }

  void loop() {
    set_current_thread_name("ebb-pressure");
    std::vector<pollfd> pfds(channels.size() + 1);
    pfds[0] = {stop_fd.get(), POLLIN, 0};
    std::vector<bool> drain(channels.size(), false);  // an eventfd to read on wake
    for (size_t i = 0; i < channels.size(); ++i) {
      const PressureChannel& c = channels[i];
      short ev = POLLPRI;
      if (c.kind == PressureChannel::Kind::kEventfd) ev = POLLIN;
      // A separate `file`: fd is only the wake-up (tests: an eventfd), read to drain it.
      if (c.kind == PressureChannel::Kind::kEventsFile && c.file) ev = POLLIN, drain[i] = true;
      pfds[i + 1] = {c.fd.get(), ev, 0};
    }
    for (;;) {
      const int r = ::poll(pfds.data(), pfds.size(), -1);
      if (r < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (pfds[0].revents) return;
      for (size_t i = 0; i < channels.size(); ++i) {
        const short re = pfds[i + 1].revents;
        if (!re) continue;
        PressureChannel& c = channels[i];
        switch (c.kind) {
          case PressureChannel::Kind::kTrigger:
            if (re & POLLPRI) notify(c, c.what);
            if (re & (POLLERR | POLLHUP | POLLNVAL)) pfds[i + 1].fd = -1;  // the group went away
            break;
          case PressureChannel::Kind::kEventfd: {
            uint64_t n = 0;
            if (re & POLLIN && ::read(c.fd.get(), &n, sizeof n) == sizeof n && n > 0) notify(c, c.what);
            if (re & (POLLERR | POLLHUP | POLLNVAL)) pfds[i + 1].fd = -1;
            break;
          }
          case PressureChannel::Kind::kEventsFile: {
            if (drain[i]) {
              uint64_t n = 0;
              if (::read(c.fd.get(), &n, sizeof n) < 0) {
                // nothing to drain
              }
            }
            if (re & POLLNVAL) {
              pfds[i + 1].fd = -1;
              break;
            }
            MemoryEvents now = parse_memory_events(read_events(i));
            const std::string rose = memory_events_rise(last[i], now);
            last[i] = std::move(now);
            if (!rose.empty()) notify(c, c.what + " " + rose);
            break;
          }
        }
      }
    }
  }

  void stop() {
    if (!thread.joinable()) return;
    const uint64_t one = 1;
    if (::write(stop_fd.get(), &one, sizeof one) < 0) {
      // the eventfd cannot overflow with one write; nothing else to do
    }
    thread.join();
  }
};

PressureWatcher::PressureWatcher(PressureWatcherOptions opts, PressureCallback cb)
    : impl_(std::make_unique<Impl>()) {
  impl_->opts = std::move(opts);
  impl_->cb = std::move(cb);
  impl_->channels = open_pressure_channels(impl_->opts, &impl_->description, &impl_->source);
  impl_->start();
}

PressureWatcher::PressureWatcher(PressureWatcherOptions opts, std::vector<PressureChannel> channels,
                                 PressureCallback cb)
    : impl_(std::make_unique<Impl>()) {
  impl_->opts = std::move(opts);
  impl_->cb = std::move(cb);
  impl_->channels = std::move(channels);
  impl_->source = impl_->channels.empty() ? PressureSource::kAuto : impl_->channels[0].source;
  impl_->description = std::to_string(impl_->channels.size()) + " given channel(s)";
  impl_->start();
}

PressureWatcher::~PressureWatcher() { impl_->stop(); }

const std::string& PressureWatcher::description() const { return impl_->description; }
PressureSource PressureWatcher::source() const { return impl_->source; }
int64_t PressureWatcher::notifications() const { return impl_->notifications.load(); }
int64_t PressureWatcher::signals() const { return impl_->signals.load(); }

}  // namespace ebb
