// Memory pressure watching: a thread that waits on the kernel's memory
// pressure notifications and calls back once per (debounced) signal, so the
// engine can give memory back before the OOM killer takes the process
// (mzCache §6.6 uses Android's onTrimMemory; §7 names PSI and vmpressure).
//
// Sources, each for the process's own cgroup (found from /proc/self/cgroup
// and /proc/self/mountinfo, as in platform/cgroup.h):
//   psi        a PSI trigger ("some 150000 1000000": 150 ms of stall in any
//              1 s window) written to the cgroup v2 group's memory.pressure,
//              or to /proc/pressure/memory when the group is the root; the
//              kernel wakes poll() with POLLPRI when it fires.
//   cgroup-v2  memory.events (kernfs wakes poll() with POLLPRI|POLLERR when
//              it changes; a rise of its "high" or "max" counter is a
//              signal) and a PSI trigger on the group's memory.pressure.
//   cgroup-v1  memory.pressure_level through an eventfd registered in
//              cgroup.event_control ("<event_fd> <level_fd> <level>").
//   auto       psi where the kernel has it, else cgroup v2, else v1.
// "cgroup" asks for v2 where the process's v2 group has a memory controller,
// else v1. An unavailable source is an ebb::Error that says why.
//
// Thread model: the callback runs on the watcher's thread; it should be
// short (post work elsewhere). The destructor wakes the thread through an
// eventfd and joins it, so it returns within one wake-up, not one window.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ebb {

// A file descriptor that closes itself.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd();
  ScopedFd(ScopedFd&& o) noexcept : fd_(o.release()) {}
  ScopedFd& operator=(ScopedFd&& o) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }
  int release() {
    const int f = fd_;
    fd_ = -1;
    return f;
  }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

enum class PressureSource : uint8_t { kAuto, kPsi, kCgroup, kCgroupV2, kCgroupV1 };
// "auto" | "psi" | "cgroup" | "cgroup-v2" | "cgroup-v1"; throws ebb::Error otherwise.
PressureSource parse_pressure_source(std::string_view s);
std::string_view pressure_source_name(PressureSource s);

// A PSI trigger: "some|full STALL_US WINDOW_US".
struct PsiTrigger {
  bool full = false;        // "full": all tasks stalled; "some": at least one
  uint64_t stall_us = 0;    // stall time that fires it ...
  uint64_t window_us = 0;   // ... within any window of this length
  std::string text() const;  // as the kernel wants it
};
// Checks the kernel's own rules (stall <= window, window in [500 ms, 10 s]):
// a bad trigger is an Error naming the rule, not a silent EINVAL later.
PsiTrigger parse_psi_trigger(std::string_view s);

// One line of a PSI file: "some avg10=0.00 avg60=0.00 avg300=0.00 total=0".
struct PsiLine {
  double avg10 = 0, avg60 = 0, avg300 = 0;  // percent of time stalled
  uint64_t total_us = 0;
};
struct PsiStats {
  PsiLine some, full;
};
// nullopt when the text has no "some" line.
std::optional<PsiStats> parse_psi(std::string_view text);

// memory.events (cgroup v2): "low N\nhigh N\nmax N\noom N\noom_kill N\n...",
// every "key value" line kept (the kernel adds keys over time).
using MemoryEvents = std::map<std::string, uint64_t>;
MemoryEvents parse_memory_events(std::string_view text);
// The keys whose rise is pressure ("high", "max"), "" when none rose.
std::string memory_events_rise(const MemoryEvents& before, const MemoryEvents& after);

// The process's cgroup directories, under `root` ("" is the real file
// system; tests give a directory of fake files). "" where there is none.
struct CgroupDirs {
  std::string v1_memory;  // the v1 memory controller's directory of this process
  std::string v2;         // the v2 (unified) group's directory of this process
  bool v2_is_root = false;
};
CgroupDirs find_cgroup_dirs(const std::string& root = "");

struct PressureEvent {
  PressureSource source = PressureSource::kAuto;  // kPsi, kCgroupV2 or kCgroupV1
  std::string what;      // what fired: "psi some 150000 1000000", "memory.events high", "v1 low"
  double time = 0;       // wall clock (seconds since the epoch)
  int64_t folded = 0;    // notifications folded into this signal by the debounce (>= 1)
};
using PressureCallback = std::function<void(const PressureEvent&)>;

struct PressureWatcherOptions {
  PressureSource source = PressureSource::kAuto;
  std::string psi_trigger = "some 150000 1000000";
  // cgroup v1's level: "low" fires as soon as the group reclaims (page
  // cache first); "medium" and "critical" come, on a machine without swap,
  // only milliseconds before the OOM kill (docs/pressure.md), too late to act.
  std::string v1_level = "low";
  double min_interval_s = 1.0;  // debounce: at most one signal per interval
  // Where to look: the file system root of /proc and /sys ("" real; tests a
  // fake tree), and the cgroup directory to watch instead of the process's own.
  std::string root;
  std::string cgroup_dir;
};

// One thing the thread polls. Built by the watcher for the real sources;
// tests build them from fds they control.
struct PressureChannel {
  enum class Kind : uint8_t {
    kTrigger,     // POLLPRI on fd: fired (PSI)
    kEventfd,     // POLLIN on fd: read the 8-byte count (cgroup v1)
    kEventsFile,  // fd (memory.events) wakes with POLLPRI|POLLERR; re-read
                  // it and fire on a rise of "high" or "max". With a separate
                  // `file`, fd is only a wake-up (tests: an eventfd, drained)
                  // and `file` is what is re-read
  };
  Kind kind = Kind::kTrigger;
  PressureSource source = PressureSource::kPsi;
  ScopedFd fd;
  ScopedFd file;     // kEventsFile: memory.events (read from offset 0 on each wake)
  std::string what;  // the event's `what` (kEventsFile adds the key that rose)
  // Held open for the channel's life (v1: the pressure_level and event_control fds).
  std::vector<ScopedFd> keep;
};

class PressureWatcher {
 public:
  // Opens the source `opts` asks for and starts the thread; throws
  // ebb::Error when it is unavailable (the message says why).
  PressureWatcher(PressureWatcherOptions opts, PressureCallback cb);
  // Tests: watches the given channels (with opts' debounce).
  PressureWatcher(PressureWatcherOptions opts, std::vector<PressureChannel> channels, PressureCallback cb);
  ~PressureWatcher();  // wakes the thread and joins it
  PressureWatcher(const PressureWatcher&) = delete;
  PressureWatcher& operator=(const PressureWatcher&) = delete;

  // What is watched, e.g. "cgroup-v1 /sys/fs/cgroup/memory/a (memory.pressure_level low)".
  const std::string& description() const;
  PressureSource source() const;  // the concrete source (kPsi, kCgroupV2, kCgroupV1)
  int64_t notifications() const;  // raw notifications seen (signalled or folded)
  int64_t signals() const;        // callbacks made

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The channels of a source, without a thread (the watcher's first half; the
// bench uses it too). Throws ebb::Error when unavailable. `description` gets
// what is watched; `chosen` the concrete source.
std::vector<PressureChannel> open_pressure_channels(const PressureWatcherOptions& opts, std::string* description,
                                                    PressureSource* chosen);

}  // namespace ebb
