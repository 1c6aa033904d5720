// ShmGroup's segment: creating or opening it (tmpfs, unnamed or by handle), mapping the control
// block, and watching the peers' processes while a collective waits for them.
#include "shm_control.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <functional>
#include <type_traits>

#include "ddprun/worker/checks.h"
#include "log.h"
namespace ddprun::worker {
namespace {
constexpr size_t kHeaderBytes = kShmHeaderBytes;
}  // namespace

void shm_close_fd(int fd) { ::close(fd); }

size_t ShmGroup::control_bytes(int size) {
  DDPRUN_ENFORCE(size >= 1 && size <= kMaxRanks, "shm group size out of range");
  return kHeaderBytes + (static_cast<size_t>(size) + 1) * kChunkBytes;
}

void* ShmGroup::create_unnamed(size_t bytes, int* fd_out, std::string* handle, std::string* why) {
  static_assert(sizeof(Control) <= kHeaderBytes);
  const char* dir = "/dev/shm";
  struct statvfs vs {};
  if (::statvfs(dir, &vs) == 0) {
    const auto avail = static_cast<unsigned long long>(vs.f_bavail) * vs.f_frsize;
    if (avail < bytes) {
      *why = std::string(dir) + " has " + std::to_string(avail) + " bytes free, " + std::to_string(bytes) + " needed";
      return nullptr;
    }
  }
  // Unnamed from birth: nothing to unlink, nothing left behind by a kill (header comment).
  int fd = ::open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == ENOENT || errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL))
    fd = ::memfd_create("ddprun-shm", MFD_CLOEXEC);
  if (fd < 0) detail::throw_errno("open(/dev/shm, O_TMPFILE) and memfd_create", __FILE__, __LINE__, errno);
  // Allocate now: a sparse file on a full tmpfs would fault SIGBUS at first touch instead.
  const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc == ENOSPC || rc == EFBIG) {
    ::close(fd);
    *why = "allocating " + std::to_string(bytes) + " bytes in " + dir + ": " + std::strerror(rc);
    return nullptr;
  }
  if (rc != 0) {
    ::close(fd);
    detail::throw_errno("posix_fallocate(shm)", __FILE__, __LINE__, rc);
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    detail::throw_errno("mmap(shm)", __FILE__, __LINE__, e);
  }
  *fd_out = fd;
  *handle = std::to_string(::getpid()) + ":" + std::to_string(fd);
  return p;
}

void* ShmGroup::open_handle(const std::string& handle, size_t bytes) {
  const auto colon = handle.find(':');
  if (colon == std::string::npos || colon == 0)
    throw CommError("shm group: malformed segment handle '" + handle +
                    "' from rank 0 (a rank of another ddprun version?)");
  const std::string path = "/proc/" + handle.substr(0, colon) + "/fd/" + handle.substr(colon + 1);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    throw CommError("shm group: cannot open rank 0's segment " + path + ": " + std::strerror(e) +
                    (e == ENOENT
                         ? " (rank 0 exited before this rank joined)"
                         : " (all ranks of a host must run as one user; DDPRUN_SHM=0 uses Gloo over TCP instead)"));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    ::close(fd);
    throw CommError("shm group: rank 0's segment " + path + " is smaller than " + std::to_string(bytes) + " bytes");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) detail::throw_errno("mmap(shm)", __FILE__, __LINE__, e);
  return p;
}

void ShmGroup::warn_fallback(int rank, const std::string& what, const std::string& handle) {
  if (rank != 0) return;  // one line for the group; every rank takes the same fallback
  detail::log().warn(
      "shared-memory all-reduce: no room for {} ({}); the group falls back to {}. Give the host or container "
      "a larger /dev/shm (e.g. docker --shm-size=1g) for the fast path",
      what, handle.substr(5),
      what.rfind("the all-reduce", 0) == 0 ? "Gloo over TCP"
      : what.rfind("a one-copy", 0) == 0   ? "a copy per rank"
                                           : "private memory");
}

void ShmGroup::map_control(void* base) {
  base_ = base;
  ctl_ = static_cast<Control*>(base_);  // a fresh tmpfs page is zero: counters start at 0
  slots_ = static_cast<unsigned char*>(base_) + kHeaderBytes;
  result_ = slots_ + static_cast<size_t>(size_) * kChunkBytes;
}

void ShmGroup::register_self_and_watch_peers(const std::function<void()>& outer_barrier) {
  ctl_->pids[rank_].store(static_cast<int32_t>(::getpid()));
  outer_barrier();  // everyone mapped and registered
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const int pid = ctl_->pids[r].load();
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (fd < 0)
      throw CommError("shm group: peer rank " + std::to_string(r) + " (pid " + std::to_string(pid) + ") is gone");
    pidfds_.push_back(fd);
    pidfd_ranks_.push_back(r);
  }
}

ShmGroup::~ShmGroup() {
  for (int fd : pidfds_) ::close(fd);
  for (const auto& r : regions_) ::munmap(r.base, r.mapped);
  if (base_) ::munmap(base_, bytes_);
}

void ShmGroup::check_peers() {
  std::vector<pollfd> fds;
  for (int fd : pidfds_) fds.push_back({fd, POLLIN, 0});
  if (::poll(fds.data(), fds.size(), 0) > 0) {
    broken_ = true;
    std::string who;
    for (size_t i = 0; i < fds.size(); ++i)
      if (fds[i].revents) who += (who.empty() ? "" : ", ") + std::to_string(pidfd_ranks_[i]);
    throw CommError("shm collective on rank " + std::to_string(rank_) + ": peer rank " + who +
                    " exited while this rank waited for it in a collective (its own error says why)");
  }
}

}  // namespace ddprun::worker
