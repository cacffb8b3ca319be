// Reading a guest kernel's free-page-reporting settings, which decide whether
// memory given back and then restored faults in from the host.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "platform/page_reporting.h"
#include "support.h"

namespace ebb {
namespace {

// A directory standing in for /sys/module/page_reporting/parameters.
struct Dir : test::TempDir {
  Dir() : test::TempDir("ebb-page-reporting") {}
};

void write(const std::filesystem::path& p, const std::string& text) {
  std::ofstream f(p);
  f << text;
}

TEST(PageReporting, AbsentWhereTheKernelDoesNotReport) {
  Dir dir;
  EXPECT_FALSE(read_page_reporting(dir.path() + "/no-such-module").has_value());
  EXPECT_EQ(describe_page_reporting(std::nullopt), "");
}

TEST(PageReporting, ReadsTheModulesParameters) {
  Dir dir;
  write(dir.path() + "/min_free_ms", "5000\n");
  write(dir.path() + "/max_waiting_mib", "4096\n");
  write(dir.path() + "/page_reporting_order", "9\n");
  const auto pr = read_page_reporting(dir.path());
  ASSERT_TRUE(pr.has_value());
  EXPECT_EQ(pr->min_free_ms, 5000);
  EXPECT_EQ(pr->max_waiting_mib, 4096);
  EXPECT_EQ(pr->order, 9);
  EXPECT_EQ(describe_page_reporting(pr), "page reporting to the host: min_free_ms 5000, max_waiting_mib 4096");
}

TEST(PageReporting, MissingOrUnreadableParametersAreUnknownAndReportingAtOnceIsFlagged) {
  Dir dir;
  write(dir.path() + "/min_free_ms", "0\n");
  write(dir.path() + "/max_waiting_mib", "lots\n");
  const auto pr = read_page_reporting(dir.path());
  ASSERT_TRUE(pr.has_value());
  EXPECT_EQ(pr->min_free_ms, 0);
  EXPECT_EQ(pr->max_waiting_mib, -1);
  EXPECT_EQ(pr->order, -1);
  const std::string line = describe_page_reporting(pr);
  EXPECT_NE(line.find("min_free_ms 0, max_waiting_mib ?"), std::string::npos) << line;
  EXPECT_NE(line.find("reported at once"), std::string::npos) << line;
}

}  // namespace
}  // namespace ebb
