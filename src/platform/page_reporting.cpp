#include "platform/page_reporting.h"

#include <filesystem>
#include <fstream>

namespace ebb {

namespace {

int64_t read_param(const std::filesystem::path& file) {
  std::ifstream f(file);
  int64_t v = -1;
  if (!(f >> v)) return -1;
  return v;
}

}  // namespace

std::optional<PageReporting> read_page_reporting(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return std::nullopt;
  const std::filesystem::path d(dir);
  PageReporting pr;
  pr.min_free_ms = read_param(d / "min_free_ms");
  pr.max_waiting_mib = read_param(d / "max_waiting_mib");
  pr.order = read_param(d / "page_reporting_order");
  return pr;
}

std::string describe_page_reporting(const std::optional<PageReporting>& pr) {
  if (!pr) return {};
  auto value = [](int64_t v) { return v < 0 ? std::string("?") : std::to_string(v); };
  std::string s = "page reporting to the host: min_free_ms " + value(pr->min_free_ms) + ", max_waiting_mib " +
                  value(pr->max_waiting_mib);
  if (pr->min_free_ms == 0) {
    s += " (freed memory is reported at once, so restored memory faults in from the host; see docs/benchmarks.md)";
  }
  return s;
}

}  // namespace ebb
