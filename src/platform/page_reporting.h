// Free page reporting: a guest kernel that hands freed memory back to its
// hypervisor. Memory ebb evicts and then restores is faulted in again from the
// host once reported (0.2-0.4 GB/s against 8-10 GB/s for local pages on the VM
// measured, docs/benchmarks.md), so a benchmark of restoration on such a
// virtual machine prints these settings beside its figures. Phones and laptops
// without a hypervisor have none.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ebb {

struct PageReporting {
  // Parameters of the page_reporting module; -1 where the kernel lacks one.
  int64_t min_free_ms = -1;      // how long freed memory waits before it is reported
  int64_t max_waiting_mib = -1;  // a cap on freed memory waiting to be reported (this VM's kernel)
  int64_t order = -1;            // smallest block reported: 2^order pages
};

inline constexpr const char* kPageReportingDir = "/sys/module/page_reporting/parameters";

// The settings under `dir`, or nullopt where the kernel does not report free
// pages (no such directory).
std::optional<PageReporting> read_page_reporting(const std::string& dir = kPageReportingDir);

// One line for a benchmark's header: "page reporting to the host: min_free_ms
// 0, max_waiting_mib 1024 (...)", with a hint when freed memory is reported
// at once; "" for nullopt.
std::string describe_page_reporting(const std::optional<PageReporting>& pr);

}  // namespace ebb
