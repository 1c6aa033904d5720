// What the kernel lets this process hold before it is killed: the least memory limit of its
// cgroup and of the cgroups above it (cgroup v2 memory.max, v1 memory.limit_in_bytes, as
// systemd's MemoryMax= or a container runtime set them), and the memory budget
// (StoreServerOptions::max_memory, ddprund --max-memory) that leaves room under it.
//
// The budget counts what the server holds for clients (stored data, replies and requests in
// flight, socket buffers it asked the kernel for: memory_budget.h). The kernel counts more: the
// allocator's free lists and partly used pages, thread stacks, the program itself, kernel
// objects of every socket. kLimitHeadroom is what the budget leaves for them.
//
// Pure functions over the text of /proc/self/cgroup and /proc/self/mountinfo, and one reader of
// the real files. Thread-safety: all are reentrant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::server {

// The budget is at most this share of the cgroup's limit, less kLimitReserveBytes.
inline constexpr uint64_t kLimitShareNum = 5, kLimitShareDen = 8;
inline constexpr uint64_t kLimitReserveBytes = 64ull << 20;

// A limit file's contents: a number of bytes, or none ("max"; v1's "unlimited", a number near
// 2^63). nullopt also for text that is neither.
std::optional<uint64_t> parse_memory_limit(std::string_view text);

// The memory-limit files that bound this process, its own cgroup first, then each one above it
// up to the root visible through the mount: for the cgroup v2 entry of `proc_self_cgroup`
// (memory.max under a cgroup2 mount of `mountinfo`) and the v1 memory controller's
// (memory.limit_in_bytes under a cgroup mount with the memory option).
std::vector<std::string> memory_limit_files(std::string_view proc_self_cgroup, std::string_view mountinfo);

// The budget that leaves room under a cgroup limit of `limit` bytes (0 when the limit is too
// small to leave any).
uint64_t budget_under_limit(uint64_t limit);

struct CgroupMemoryLimit {
  uint64_t bytes = 0;
  std::string file;  // where it was read
};

// The least limit of the files above, read now; nullopt when none is set or none can be read.
std::optional<CgroupMemoryLimit> read_cgroup_memory_limit();

}  // namespace ddprun::server
