// The cgroup memory limit, read from a fake /proc and /sys tree: v1, v2, a
// hybrid of both, a container's view, parents that bind their children, and
// the spellings of "no limit".
#include "platform/cgroup.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "support.h"

namespace ebb {
namespace {

void write(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

constexpr const char* kV2Mount = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
constexpr const char* kV1Mounts =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:7 - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

TEST(Cgroup, V2LeafLimit) {
  test::TempDir d("ebb-cgroup");
  write(d.file("proc/self/cgroup"), "0::/user.slice/chat.scope\n");
  write(d.file("proc/self/mountinfo"), kV2Mount);
  write(d.file("sys/fs/cgroup/memory.max"), "max\n");
  write(d.file("sys/fs/cgroup/user.slice/memory.max"), "max\n");
  write(d.file("sys/fs/cgroup/user.slice/chat.scope/memory.max"), "25165824\n");
  const auto l = cgroup_memory_limit(d.path());
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->bytes, 24u << 20);
  EXPECT_EQ(l->version, 2);
  EXPECT_EQ(l->file, d.file("sys/fs/cgroup/user.slice/chat.scope/memory.max"));
}

TEST(Cgroup, V2ParentBindsTheChild) {
  test::TempDir d("ebb-cgroup");
  write(d.file("proc/self/cgroup"), "0::/a/b\n");
  write(d.file("proc/self/mountinfo"), kV2Mount);
  write(d.file("sys/fs/cgroup/a/memory.max"), "1048576\n");
  write(d.file("sys/fs/cgroup/a/b/memory.max"), "8388608\n");
  const auto l = cgroup_memory_limit(d.path());
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->bytes, 1u << 20);
  EXPECT_EQ(l->file, d.file("sys/fs/cgroup/a/memory.max"));
}

TEST(Cgroup, V2WithoutLimitIsNone) {
  test::TempDir d("ebb-cgroup");
  write(d.file("proc/self/cgroup"), "0::/a\n");
  write(d.file("proc/self/mountinfo"), kV2Mount);
  write(d.file("sys/fs/cgroup/a/memory.max"), "max\n");
  EXPECT_FALSE(cgroup_memory_limit(d.path()).has_value());
  // A malformed value is not a limit either.
  write(d.file("sys/fs/cgroup/a/memory.max"), "12abc\n");
  EXPECT_FALSE(cgroup_memory_limit(d.path()).has_value());
}

TEST(Cgroup, V1HybridTakesTheMemoryController) {
  test::TempDir d("ebb-cgroup");
  // As on this project's machines: v1 controllers plus an empty unified tree.
  write(d.file("proc/self/cgroup"), "9:name=systemd:/\n4:memory:/jobs/chat\n1:cpu:/\n0::/\n");
  write(d.file("proc/self/mountinfo"), kV1Mounts);
  write(d.file("sys/fs/cgroup/memory/memory.limit_in_bytes"), "9223372036854771712\n");
  write(d.file("sys/fs/cgroup/memory/jobs/memory.limit_in_bytes"), "9223372036854771712\n");
  write(d.file("sys/fs/cgroup/memory/jobs/chat/memory.limit_in_bytes"), "104857600\n");
  const auto l = cgroup_memory_limit(d.path());
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->bytes, 100u << 20);
  EXPECT_EQ(l->version, 1);
  // v1's "unlimited" everywhere: no limit (the unified tree has no memory.max).
  write(d.file("sys/fs/cgroup/memory/jobs/chat/memory.limit_in_bytes"), "9223372036854771712\n");
  EXPECT_FALSE(cgroup_memory_limit(d.path()).has_value());
}

TEST(Cgroup, ContainerSeesItsCgroupAsTheMountRoot) {
  test::TempDir d("ebb-cgroup");
  // The hierarchy's /docker/abc is mounted at /sys/fs/cgroup/memory.
  write(d.file("proc/self/cgroup"), "5:memory:/docker/abc\n");
  write(d.file("proc/self/mountinfo"),
        "35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n");
  write(d.file("sys/fs/cgroup/memory/memory.limit_in_bytes"), "536870912\n");
  const auto l = cgroup_memory_limit(d.path());
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->bytes, 512u << 20);
}

TEST(Cgroup, NoCgroupFilesIsNone) {
  test::TempDir d("ebb-cgroup");
  EXPECT_FALSE(cgroup_memory_limit(d.path()).has_value());
  write(d.file("proc/self/cgroup"), "0::/a\n");  // no cgroup2 mount
  write(d.file("proc/self/mountinfo"), "31 23 0:28 / /tmp rw - tmpfs tmpfs rw\n");
  EXPECT_FALSE(cgroup_memory_limit(d.path()).has_value());
}

TEST(Cgroup, ThisMachineReadsWithoutThrowing) {
  // Whatever the machine's setup, reading the real files never throws.
  EXPECT_NO_THROW(cgroup_memory_limit());
}

}  // namespace
}  // namespace ebb
