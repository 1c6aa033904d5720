#include "ddprun/worker/progress.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "progress_page.h"

namespace ddprun::worker {
namespace {

// The layout ddprun writes (launcher/include/ddprun/launcher/hang.h): a page of little-endian
// 64-bit words; word 0 the magic "DDPRPRG1", word 1 the tick counter, words 2-6 the step
// statistics (word 2 their version, set once the others hold something).
constexpr uint64_t kMagic = 0x3147525052504444ULL;
constexpr size_t kBytes = 4096;
constexpr size_t kWords = 7;
constexpr uint64_t kStepStatsVersion = 1;
enum Word : size_t { kTicks = 1, kStatsVersion = 2, kSteps = 3, kStepNs = 4, kCommNs = 5, kExposedNs = 6 };

std::atomic<uint64_t>* map_page() noexcept {
  const char* path = std::getenv("DDPRUN_PROGRESS_FILE");
  if (path == nullptr || *path == '\0') return nullptr;
  const int fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return nullptr;
  uint64_t magic = 0;
  std::memcpy(&magic, p, sizeof magic);
  if (magic != kMagic) {
    ::munmap(p, kBytes);
    return nullptr;
  }
  static_assert(sizeof(std::atomic<uint64_t>) == 8 && kWords * 8 <= kBytes);
  return reinterpret_cast<std::atomic<uint64_t>*>(p);
}

std::atomic<uint64_t>* page() noexcept {
  static std::atomic<uint64_t>* const w = map_page();  // mapped for the process's life
  return w;
}

}  // namespace

void progress() noexcept {
  if (auto* w = page()) w[kTicks].fetch_add(1, std::memory_order_relaxed);
}

uint64_t progress_ticks() noexcept {
  auto* w = page();
  return w ? w[kTicks].load(std::memory_order_relaxed) : 0;
}

void detail::record_step_stats(uint64_t step_ns, uint64_t comm_ns, uint64_t exposed_ns) noexcept {
  auto* w = page();
  if (!w) return;
  w[kSteps].fetch_add(1, std::memory_order_relaxed);
  w[kStepNs].fetch_add(step_ns, std::memory_order_relaxed);
  w[kCommNs].fetch_add(comm_ns, std::memory_order_relaxed);
  w[kExposedNs].fetch_add(exposed_ns, std::memory_order_relaxed);
  if (w[kStatsVersion].load(std::memory_order_relaxed) != kStepStatsVersion)
    w[kStatsVersion].store(kStepStatsVersion, std::memory_order_release);
}

}  // namespace ddprun::worker
