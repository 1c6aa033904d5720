#include "ddprun/worker/progress.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace ddprun::worker {
namespace {

// The layout ddprun writes (launcher/include/ddprun/launcher/hang.h): a page whose first
// 64-bit word is the magic "DDPRPRG1" and whose second is the counter.
constexpr uint64_t kMagic = 0x3147525052504444ULL;
constexpr size_t kBytes = 4096;

std::atomic<uint64_t>* map_counter() noexcept {
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
  return reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(p) + 8);
}

std::atomic<uint64_t>* counter() noexcept {
  static std::atomic<uint64_t>* const c = map_counter();  // mapped for the process's life
  return c;
}

}  // namespace

void progress() noexcept {
  if (auto* c = counter()) c->fetch_add(1, std::memory_order_relaxed);
}

uint64_t progress_ticks() noexcept {
  auto* c = counter();
  return c ? c->load(std::memory_order_relaxed) : 0;
}

}  // namespace ddprun::worker
