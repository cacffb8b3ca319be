// Memory pressure watching without privileges: the PSI, trigger and
// memory.events parsers; the cgroup directories from a fake /proc and /sys
// tree; the watcher over fds the test controls (an eventfd as the v1
// notification, a fake memory.events whose counters change plus an eventfd
// as its wake-up) firing, debouncing and stopping fast; and the error of an
// unavailable source.
#include "platform/pressure.h"

#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "platform/error.h"
#include "support.h"

namespace ebb {
namespace {

void write(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Collects the callback's events; wait_for(n) waits until n arrived.
struct Events {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<PressureEvent> got;
  PressureCallback callback() {
    return [this](const PressureEvent& e) {
      std::lock_guard lock(mu);
      got.push_back(e);
      cv.notify_all();
    };
  }
  bool wait_for(size_t n, double seconds = 5) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return got.size() >= n; });
  }
  size_t size() {
    std::lock_guard lock(mu);
    return got.size();
  }
};

void signal(int efd) {
  const uint64_t one = 1;
  ASSERT_EQ(::write(efd, &one, sizeof one), static_cast<ssize_t>(sizeof one));
}

constexpr const char* kHybridMounts =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:7 - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
constexpr const char* kV2Mount = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";

TEST(PressureParse, PsiFile) {
  const auto st = parse_psi(
      "some avg10=1.50 avg60=0.25 avg300=0.00 total=123456\n"
      "full avg10=0.75 avg60=0.00 avg300=0.00 total=6543\n");
  ASSERT_TRUE(st.has_value());
  EXPECT_DOUBLE_EQ(st->some.avg10, 1.5);
  EXPECT_DOUBLE_EQ(st->some.avg60, 0.25);
  EXPECT_EQ(st->some.total_us, 123456u);
  EXPECT_DOUBLE_EQ(st->full.avg10, 0.75);
  EXPECT_EQ(st->full.total_us, 6543u);
  EXPECT_FALSE(parse_psi("").has_value());
  EXPECT_FALSE(parse_psi("full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n").has_value());
  EXPECT_FALSE(parse_psi("some avg10=x total=1\n").has_value());
}

TEST(PressureParse, PsiTrigger) {
  const PsiTrigger t = parse_psi_trigger("some 150000 1000000");
  EXPECT_FALSE(t.full);
  EXPECT_EQ(t.stall_us, 150000u);
  EXPECT_EQ(t.window_us, 1000000u);
  EXPECT_EQ(t.text(), "some 150000 1000000");
  EXPECT_TRUE(parse_psi_trigger("full 50000 2000000").full);
  EXPECT_NE(error_of([] { parse_psi_trigger("some 150000"); }).find("is not 'some|full STALL_US WINDOW_US'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_psi_trigger("most 1 1000000"); }).find("'some' or 'full'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_psi_trigger("some 1000 100000"); }).find("window must be in"), std::string::npos);
  EXPECT_NE(error_of([] { parse_psi_trigger("some 2000000 1000000"); }).find("stall must be in"), std::string::npos);
  EXPECT_NE(error_of([] { parse_psi_trigger("some 1 1000000 x"); }), "");
}

TEST(PressureParse, MemoryEventsAndRise) {
  const MemoryEvents a = parse_memory_events("low 0\nhigh 3\nmax 1\noom 0\noom_kill 0\noom_group_kill 0\n");
  EXPECT_EQ(a.at("high"), 3u);
  EXPECT_EQ(a.at("max"), 1u);
  EXPECT_EQ(a.at("oom_group_kill"), 0u);
  EXPECT_EQ(a.size(), 6u);
  // Malformed lines are skipped, not misread.
  const MemoryEvents b = parse_memory_events("high x\nmax -1\nlow 2 3\noom 7\n");
  EXPECT_EQ(b.size(), 1u);
  EXPECT_EQ(b.at("oom"), 7u);

  MemoryEvents c = a;
  EXPECT_EQ(memory_events_rise(a, c), "");
  c["low"] = 9;  // low and oom are not what we act on
  c["oom"] = 1;
  EXPECT_EQ(memory_events_rise(a, c), "");
  c["high"] = 4;
  EXPECT_EQ(memory_events_rise(a, c), "high");
  c["max"] = 2;
  EXPECT_EQ(memory_events_rise(a, c), "high,max");
  // A key that appears counts from zero.
  EXPECT_EQ(memory_events_rise(MemoryEvents{}, parse_memory_events("high 1\n")), "high");
  EXPECT_EQ(memory_events_rise(MemoryEvents{}, parse_memory_events("high 0\n")), "");
}

TEST(PressureParse, SourceNames) {
  EXPECT_EQ(parse_pressure_source("auto"), PressureSource::kAuto);
  EXPECT_EQ(parse_pressure_source("cgroup-v1"), PressureSource::kCgroupV1);
  EXPECT_EQ(pressure_source_name(PressureSource::kCgroupV2), "cgroup-v2");
  EXPECT_NE(error_of([] { parse_pressure_source("vmpressure"); }).find("is not one of"), std::string::npos);
}

TEST(PressureCgroup, HybridDirs) {
  test::TempDir d("ebb-pressure");
  write(d.file("proc/self/cgroup"), "9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n");
  write(d.file("proc/self/mountinfo"), kHybridMounts);
  const CgroupDirs c = find_cgroup_dirs(d.path());
  EXPECT_EQ(c.v1_memory, d.path() + "/sys/fs/cgroup/memory/process_api/abc");
  EXPECT_EQ(c.v2, d.path() + "/sys/fs/cgroup/unified");
  EXPECT_TRUE(c.v2_is_root);
}

TEST(PressureCgroup, ContainerView) {
  // A container sees its own group as the mount's root.
  test::TempDir d("ebb-pressure");
  write(d.file("proc/self/cgroup"), "0::/kubepods/pod1/ctr\n");
  write(d.file("proc/self/mountinfo"),
        "30 23 0:26 /kubepods/pod1/ctr /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
  const CgroupDirs c = find_cgroup_dirs(d.path());
  EXPECT_EQ(c.v1_memory, "");
  EXPECT_EQ(c.v2, d.path() + "/sys/fs/cgroup");
}

TEST(PressureSources, UnavailableSourcesSayWhy) {
  test::TempDir d("ebb-pressure");
  write(d.file("proc/self/cgroup"), "0::/\n");
  write(d.file("proc/self/mountinfo"), kV2Mount);
  PressureWatcherOptions o;
  o.root = d.path();
  o.source = PressureSource::kPsi;
  const std::string psi = error_of([&] { open_pressure_channels(o, nullptr, nullptr); });
  EXPECT_NE(psi.find("psi: " + d.path() + "/proc/pressure/memory is not available (kernel without CONFIG_PSI"),
            std::string::npos)
      << psi;
  o.source = PressureSource::kCgroupV1;
  EXPECT_NE(error_of([&] { open_pressure_channels(o, nullptr, nullptr); }).find("no cgroup v1 memory hierarchy"),
            std::string::npos);
  o.source = PressureSource::kCgroupV2;
  const std::string v2 = error_of([&] { open_pressure_channels(o, nullptr, nullptr); });
  EXPECT_NE(v2.find("has no memory controller (no memory.events; it is the root group)"), std::string::npos) << v2;
  // auto names every reason.
  o.source = PressureSource::kAuto;
  const std::string all = error_of([&] { PressureWatcher w(o, nullptr); });
  EXPECT_NE(all.find("no source is available"), std::string::npos) << all;
  EXPECT_NE(all.find("CONFIG_PSI"), std::string::npos);
  EXPECT_NE(all.find("cgroup v1"), std::string::npos);
  // A bad v1 level and a bad trigger are errors before anything is opened.
  o.source = PressureSource::kCgroupV1;
  o.cgroup_dir = d.path();
  o.v1_level = "severe";
  EXPECT_NE(error_of([&] { open_pressure_channels(o, nullptr, nullptr); }).find("'severe' is not one of"),
            std::string::npos);
  o.source = PressureSource::kPsi;
  o.psi_trigger = "some 5 10";
  EXPECT_NE(error_of([&] { open_pressure_channels(o, nullptr, nullptr); }).find("window must be in"),
            std::string::npos);
}

TEST(PressureSources, V1RegistersItsEventfd) {
  // Fake files take the registration line as the kernel would read it.
  test::TempDir d("ebb-pressure");
  write(d.file("proc/self/cgroup"), "4:memory:/bench\n0::/\n");
  write(d.file("proc/self/mountinfo"), kHybridMounts);
  const std::string dir = d.path() + "/sys/fs/cgroup/memory/bench";
  write(dir + "/memory.pressure_level", "");
  write(dir + "/cgroup.event_control", "");
  PressureWatcherOptions o;
  o.root = d.path();
  o.source = PressureSource::kCgroup;  // v2 root has no memory controller: v1
  std::string desc;
  PressureSource chosen = PressureSource::kAuto;
  std::vector<PressureChannel> ch = open_pressure_channels(o, &desc, &chosen);
  ASSERT_EQ(ch.size(), 1u);
  EXPECT_EQ(chosen, PressureSource::kCgroupV1);
  EXPECT_EQ(desc, "cgroup-v1 " + dir + " (memory.pressure_level low)");
  EXPECT_EQ(ch[0].kind, PressureChannel::Kind::kEventfd);
  ASSERT_EQ(ch[0].keep.size(), 2u);
  EXPECT_EQ(slurp(dir + "/cgroup.event_control"),
            std::to_string(ch[0].fd.get()) + " " + std::to_string(ch[0].keep[0].get()) + " low");
}

TEST(PressureSources, V2WatchesMemoryEvents) {
  test::TempDir d("ebb-pressure");
  write(d.file("proc/self/cgroup"), "0::/app.slice/chat\n");
  write(d.file("proc/self/mountinfo"), kV2Mount);
  const std::string dir = d.path() + "/sys/fs/cgroup/app.slice/chat";
  write(dir + "/memory.events", "low 0\nhigh 0\nmax 0\n");
  write(dir + "/memory.pressure", "");  // a regular file takes the trigger
  PressureWatcherOptions o;
  o.root = d.path();
  o.source = PressureSource::kCgroup;
  std::string desc;
  PressureSource chosen = PressureSource::kAuto;
  std::vector<PressureChannel> ch = open_pressure_channels(o, &desc, &chosen);
  EXPECT_EQ(chosen, PressureSource::kCgroupV2);
  ASSERT_EQ(ch.size(), 2u);
  EXPECT_EQ(ch[0].kind, PressureChannel::Kind::kEventsFile);
  EXPECT_EQ(ch[1].kind, PressureChannel::Kind::kTrigger);
  EXPECT_EQ(slurp(dir + "/memory.pressure"), std::string("some 150000 1000000") + '\0');
  EXPECT_NE(desc.find("memory.events high/max, memory.pressure 'some 150000 1000000'"), std::string::npos) << desc;
  // psi on a group that is not the root takes the group's file, not /proc's.
  o.source = PressureSource::kPsi;
  open_pressure_channels(o, &desc, &chosen);
  EXPECT_EQ(desc, "psi " + dir + "/memory.pressure (trigger 'some 150000 1000000')");
}

PressureChannel eventfd_channel(int* efd) {
  PressureChannel c;
  c.kind = PressureChannel::Kind::kEventfd;
  c.source = PressureSource::kCgroupV1;
  c.fd = ScopedFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  c.what = "v1 low";
  *efd = c.fd.get();
  return c;
}

TEST(PressureWatcher, EventfdFiresAndDebounces) {
  Events ev;
  int efd = -1;
  std::vector<PressureChannel> ch;
  ch.push_back(eventfd_channel(&efd));
  PressureWatcherOptions o;
  o.min_interval_s = 0.3;
  PressureWatcher w(o, std::move(ch), ev.callback());
  signal(efd);
  ASSERT_TRUE(ev.wait_for(1));
  EXPECT_EQ(ev.got[0].source, PressureSource::kCgroupV1);
  EXPECT_EQ(ev.got[0].what, "v1 low");
  EXPECT_EQ(ev.got[0].folded, 1);
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_NEAR(ev.got[0].time, now, 5.0);
  // A burst within the interval is folded, not signalled.
  for (int i = 0; i < 3; ++i) {
    signal(efd);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int i = 0; i < 100 && w.notifications() < 4; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(w.notifications(), 4);
  EXPECT_EQ(ev.size(), 1u);
  EXPECT_EQ(w.signals(), 1);
  // After the interval the next notification signals, carrying the folded ones.
  std::this_thread::sleep_for(std::chrono::milliseconds(350));
  signal(efd);
  ASSERT_TRUE(ev.wait_for(2));
  EXPECT_EQ(ev.got[1].folded, 4);
  EXPECT_EQ(w.signals(), 2);
}

TEST(PressureWatcher, MemoryEventsFileRiseOfHighOrMax) {
  test::TempDir d("ebb-pressure");
  const std::string file = d.file("memory.events");
  write(file, "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n");
  Events ev;
  PressureChannel c;
  c.kind = PressureChannel::Kind::kEventsFile;
  c.source = PressureSource::kCgroupV2;
  c.fd = ScopedFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  c.file = ScopedFd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  c.what = "memory.events";
  const int wake = c.fd.get();
  std::vector<PressureChannel> ch;
  ch.push_back(std::move(c));
  PressureWatcherOptions o;
  o.min_interval_s = 0;
  PressureWatcher w(o, std::move(ch), ev.callback());
  // A change that is not high or max wakes the thread but is no signal.
  write(file, "low 5\nhigh 0\nmax 0\noom 1\noom_kill 0\n");
  signal(wake);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(ev.size(), 0u);
  EXPECT_EQ(w.notifications(), 0);
  write(file, "low 5\nhigh 2\nmax 0\noom 1\noom_kill 0\n");
  signal(wake);
  ASSERT_TRUE(ev.wait_for(1));
  EXPECT_EQ(ev.got[0].what, "memory.events high");
  EXPECT_EQ(ev.got[0].source, PressureSource::kCgroupV2);
  // The same counters again: nothing rose.
  signal(wake);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(ev.size(), 1u);
  write(file, "low 5\nhigh 3\nmax 1\noom 1\noom_kill 0\n");
  signal(wake);
  ASSERT_TRUE(ev.wait_for(2));
  EXPECT_EQ(ev.got[1].what, "memory.events high,max");
}

TEST(PressureWatcher, StopsFastWithoutSignals) {
  // A watcher whose channel never fires, with a long debounce: destruction
  // wakes the thread at once.
  int efd = -1;
  std::vector<PressureChannel> ch;
  ch.push_back(eventfd_channel(&efd));
  PressureWatcherOptions o;
  o.min_interval_s = 60;
  auto w = std::make_unique<PressureWatcher>(o, std::move(ch), [](const PressureEvent&) {});
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto t0 = std::chrono::steady_clock::now();
  w.reset();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 0.5);
}

TEST(PressureWatcher, RealSourceWhereAvailable) {
  // This machine's own source (auto) opens, watches and stops; skipped
  // where the kernel offers none to this user (a CI container).
  PressureWatcherOptions o;
  std::unique_ptr<PressureWatcher> w;
  try {
    w = std::make_unique<PressureWatcher>(o, [](const PressureEvent&) {});
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  EXPECT_NE(w->source(), PressureSource::kAuto);
  EXPECT_FALSE(w->description().empty());
  const auto t0 = std::chrono::steady_clock::now();
  w.reset();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.5);
}

}  // namespace
}  // namespace ebb
