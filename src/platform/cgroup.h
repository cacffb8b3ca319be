// The memory limit of the cgroup this process runs in (cgroup v1 or v2), so
// the engine can keep within it by itself instead of being killed by the
// kernel's OOM killer.
//
// /proc/self/cgroup names the process's cgroup in each hierarchy:
//   v1: "4:memory:/a/b"   (the memory controller's hierarchy)
//   v2: "0::/a/b"         (the unified hierarchy)
// /proc/self/mountinfo says where each hierarchy is mounted (fstype "cgroup"
// with super option "memory", or "cgroup2") and which of its directories is
// the mount's root (a container sees its own cgroup as "/"). The limit is the
// smallest one on the path from the process's cgroup up to the mount point
// (a parent's limit binds its children): memory.limit_in_bytes in v1, where
// values of 2^62 and above mean "none", and memory.max in v2, where "max"
// means "none". A v1 memory controller wins over v2 in hybrid setups, where
// the unified hierarchy holds no memory controller.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ebb {

struct CgroupMemoryLimit {
  uint64_t bytes = 0;  // the binding limit
  std::string file;    // the file it came from (memory.max or memory.limit_in_bytes)
  int version = 0;     // 1 or 2
};

// Reads /proc/self/cgroup and /proc/self/mountinfo under `root` ("" is the
// real file system; tests give a directory of fake files), and the limit
// files under root + the mount points. nullopt when there is no limit, or
// no cgroup file system; never throws.
std::optional<CgroupMemoryLimit> cgroup_memory_limit(const std::string& root = "");

// This process's resident set (/proc/self/statm), in bytes; 0 when unknown.
uint64_t resident_bytes();

}  // namespace ebb
