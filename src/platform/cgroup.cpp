#include "platform/cgroup.h"

#include <unistd.h>

#include <cstdio>

#include <fstream>
#include <sstream>
#include <vector>

namespace ebb {
namespace {

// v1 writes "no limit" as the largest page-aligned int64 (9223372036854771712).
constexpr uint64_t kV1Unlimited = uint64_t{1} << 62;

struct Mount {
  std::string root;   // the hierarchy's directory mounted here ("/" unless in a container)
  std::string point;  // where it is mounted
};

// The mount of the v1 memory hierarchy (version 1) or of cgroup2 (version 2).
std::optional<Mount> find_mount(const std::string& root, int version) {
  std::ifstream f(root + "/proc/self/mountinfo");
  for (std::string line; std::getline(f, line);) {
    // "ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS"
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream head(line.substr(0, dash)), tail(line.substr(dash + 3));
    std::string id, parent, dev, mroot, point, fstype, source, super;
    if (!(head >> id >> parent >> dev >> mroot >> point) || !(tail >> fstype >> source >> super)) continue;
    if (version == 2 && fstype == "cgroup2") return Mount{mroot, point};
    if (version == 1 && fstype == "cgroup") {
      std::istringstream opts(super);
      for (std::string o; std::getline(opts, o, ',');)
        if (o == "memory") return Mount{mroot, point};
    }
  }
  return std::nullopt;
}

std::optional<uint64_t> read_limit(const std::string& path, int version) {
  std::ifstream f(path);
  std::string v;
  if (!(f >> v)) return std::nullopt;
  if (version == 2 && v == "max") return std::nullopt;
  try {
    size_t used = 0;
    const unsigned long long x = std::stoull(v, &used);
    if (used != v.size()) return std::nullopt;
    if (version == 1 && x >= kV1Unlimited) return std::nullopt;
    return x;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The smallest limit from `dir` (under the mount point) up to the mount point.
std::optional<CgroupMemoryLimit> walk_up(const std::string& root, const Mount& m, std::string rel, int version) {
  // The process's path is in hierarchy terms; the mount shows the part below m.root.
  if (m.root != "/" && rel.compare(0, m.root.size(), m.root) == 0) rel = rel.substr(m.root.size());
  while (!rel.empty() && rel.back() == '/') rel.pop_back();
  const char* name = version == 2 ? "memory.max" : "memory.limit_in_bytes";
  std::optional<CgroupMemoryLimit> best;
  for (;;) {
    const std::string file = root + m.point + rel + "/" + name;
    if (auto x = read_limit(file, version); x && (!best || *x < best->bytes)) best = CgroupMemoryLimit{*x, file, version};
    if (rel.empty()) break;
    rel = rel.substr(0, rel.rfind('/'));
  }
  return best;
}

}  // namespace

std::optional<CgroupMemoryLimit> cgroup_memory_limit(const std::string& root) {
  std::ifstream f(root + "/proc/self/cgroup");
  std::string v1_path, v2_path;
  bool have_v1 = false, have_v2 = false;
  for (std::string line; std::getline(f, line);) {
    // "ID:CONTROLLERS:PATH"; PATH may itself hold ':'.
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
    for (std::string c; std::getline(cs, c, ',');) {
      if (c == "memory") {
        have_v1 = true;
        v1_path = path;
      }
    }
  }
  if (have_v1) {
    if (auto m = find_mount(root, 1)) return walk_up(root, *m, v1_path, 1);
  }
  if (have_v2) {
    if (auto m = find_mount(root, 2)) return walk_up(root, *m, v2_path, 2);
  }
  return std::nullopt;
}

uint64_t resident_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long long size = 0, rss = 0;
  const int n = std::fscanf(f, "%llu %llu", &size, &rss);
  std::fclose(f);
  return n == 2 ? rss * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace ebb
