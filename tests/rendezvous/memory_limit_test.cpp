// The cgroup memory limit ddprund sizes its budget from: which files bound it, read from the
// text of /proc/self/cgroup and /proc/self/mountinfo as the kernel writes them.
#include <catch2/catch.hpp>

#include "ddprun/server/memory_limit.h"

using namespace ddprun::server;

namespace {
// A systemd host: cgroup v2 only, the service in system.slice.
constexpr const char* kV2Mounts =
    "22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw\n"
    "26 22 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n";
// A hybrid host (cgroup v1 controllers, a v2 mount without them), as CI machines are.
constexpr const char* kHybridMounts =
    "30 25 0:26 / /sys/fs/cgroup ro,nosuid shared:4 - tmpfs tmpfs ro,mode=755\n"
    "31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:5 - cgroup2 cgroup2 rw\n"
    "35 30 0:31 / /sys/fs/cgroup/cpu,cpuacct rw shared:13 - cgroup cgroup rw,cpu,cpuacct\n"
    "36 30 0:32 / /sys/fs/cgroup/memory rw shared:14 - cgroup cgroup rw,memory\n";
}  // namespace

TEST_CASE("AServiceIsBoundByItsOwnCgroupAndEveryOneAboveIt", "[server][memory]") {
  const auto files = memory_limit_files("0::/system.slice/ddprund.service\n", kV2Mounts);
  REQUIRE(files == std::vector<std::string>{"/sys/fs/cgroup/system.slice/ddprund.service/memory.max",
                                            "/sys/fs/cgroup/system.slice/memory.max", "/sys/fs/cgroup/memory.max"});
}

TEST_CASE("TheV1MemoryControllerIsReadOnAHybridHost", "[server][memory]") {
  const auto files = memory_limit_files("4:memory:/jobs/a\n3:cpu,cpuacct:/jobs/a\n0::/\n", kHybridMounts);
  REQUIRE(files == std::vector<std::string>{"/sys/fs/cgroup/memory/jobs/a/memory.limit_in_bytes",
                                            "/sys/fs/cgroup/memory/jobs/memory.limit_in_bytes",
                                            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                            "/sys/fs/cgroup/unified/memory.max"});
}

// A container that mounts only its own cgroup (the mount's root is the cgroup's path), and one
// with a cgroup namespace (the path is "/"): its own directory is the mount point.
TEST_CASE("AContainerSeesItsOwnCgroupAtTheMountPoint", "[server][memory]") {
  const char* v1 = "40 30 0:40 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n";
  REQUIRE(memory_limit_files("9:memory:/docker/abc\n", v1) ==
          std::vector<std::string>{"/sys/fs/cgroup/memory/memory.limit_in_bytes"});
  REQUIRE(memory_limit_files("0::/\n", kV2Mounts) == std::vector<std::string>{"/sys/fs/cgroup/memory.max"});
  // A cgroup outside what the mount shows bounds nothing that can be read.
  REQUIRE(memory_limit_files("9:memory:/elsewhere\n", v1).empty());
}

TEST_CASE("MountPathsWithBlanksAreUnescaped", "[server][memory]") {
  const char* m = "40 30 0:40 / /mnt/cg\\040v2 rw - cgroup2 cgroup2 rw\n";
  REQUIRE(memory_limit_files("0::/a\n", m) ==
          std::vector<std::string>{"/mnt/cg v2/a/memory.max", "/mnt/cg v2/memory.max"});
}

TEST_CASE("NoCgroupNoFiles", "[server][memory]") {
  REQUIRE(memory_limit_files("", kV2Mounts).empty());
  REQUIRE(memory_limit_files("0::/x\n", "").empty());
  REQUIRE(memory_limit_files("garbage\n", "garbage\n").empty());
}

TEST_CASE("LimitTextIsBytesOrNone", "[server][memory]") {
  REQUIRE(parse_memory_limit("4294967296\n") == 4294967296ull);
  REQUIRE_FALSE(parse_memory_limit("max\n"));
  REQUIRE_FALSE(parse_memory_limit("9223372036854771712\n"));  // v1: unlimited
  REQUIRE_FALSE(parse_memory_limit(""));
  REQUIRE_FALSE(parse_memory_limit("12abc"));
}

TEST_CASE("TheBudgetLeavesRoomUnderTheLimit", "[server][memory]") {
  REQUIRE(budget_under_limit(0) == 0);
  REQUIRE(budget_under_limit(kLimitReserveBytes) == 0);
  const uint64_t limit = 512ull << 20;
  REQUIRE(budget_under_limit(limit) == (limit - kLimitReserveBytes) / kLimitShareDen * kLimitShareNum);
  REQUIRE(budget_under_limit(limit) < limit * 3 / 4);
  REQUIRE(budget_under_limit(6ull << 30) > (3ull << 30));
}
