#include "shm_allreduce.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <functional>
#include <random>

#include "ddprun/worker/checks.h"

namespace ddprun::worker {

struct ShmGroup::Control {
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> generation;
  std::atomic<int32_t> pids[kMaxRanks];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex needs lock-free 32-bit atomics");

namespace {

constexpr size_t kHeaderBytes = 4096;
using Clock = std::chrono::steady_clock;

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

// Reduces [b0, b1) of every rank's buffer (src_of(r)) into acc[0, b1-b0), in rank order so
// every rank computes bit-identical results; Avg divides at the end.
template <class T, class SrcOf>
void reduce_block(T* acc, size_t b0, size_t b1, int size, ReduceOp op, SrcOf src_of) {
  for (int r = 0; r < size; ++r) {
    const T* __restrict src = src_of(r);
    if (r == 0) {
      for (size_t i = b0; i < b1; ++i) acc[i - b0] = src[i];
    } else if (op == ReduceOp::Max) {
      for (size_t i = b0; i < b1; ++i) acc[i - b0] = acc[i - b0] > src[i] ? acc[i - b0] : src[i];
    } else {
      for (size_t i = b0; i < b1; ++i) acc[i - b0] += src[i];
    }
  }
  if (op == ReduceOp::Avg) {
    const T d = static_cast<T>(size);
    for (size_t i = b0; i < b1; ++i) acc[i - b0] /= d;
  }
}

// dst[0, n) = src[0, n) with non-temporal stores (SSE, part of baseline x86-64): the peer's
// copy of the updated parameters is not read again by this core, so writing around the
// cache spares the read-for-ownership of every line (measured here: the fused step over the
// 4.2 M-parameter model went from ~3.0 to ~2.5 ms per rank). Needs _mm_sfence() before
// anyone is told the data is there.
void copy_nontemporal(float* dst, const float* src, size_t n) {
  size_t i = 0;
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 15) != 0; ++i) dst[i] = src[i];
  for (; i + 4 <= n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
  for (; i < n; ++i) dst[i] = src[i];
}

}  // namespace

std::string ShmGroup::fresh_name() const {
  std::random_device rd;
  return "/ddprun-" + std::to_string(::getpid()) + "-" + std::to_string(rd()) + "-" + std::to_string(rd());
}

void* ShmGroup::map_named(const std::string& name, size_t bytes, bool create) {
  int fd = ::shm_open(name.c_str(), create ? (O_RDWR | O_CREAT | O_EXCL) : O_RDWR, 0600);
  if (fd < 0) detail::throw_errno(("shm_open " + name).c_str(), __FILE__, __LINE__, errno);
  if (create && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int e = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    detail::throw_errno("ftruncate(shm)", __FILE__, __LINE__, e);
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) detail::throw_errno("mmap(shm)", __FILE__, __LINE__, errno);
  return p;
}

std::string ShmGroup::create_segment() {
  name_ = fresh_name();
  map_segment(name_, true);
  return name_;
}

void ShmGroup::map_segment(const std::string& name, bool create) {
  DDPRUN_ENFORCE(size_ >= 1 && size_ <= kMaxRanks, "shm group size out of range");
  name_ = name;
  bytes_ = kHeaderBytes + (static_cast<size_t>(size_) + 1) * kChunkBytes;
  base_ = map_named(name, bytes_, create);
  ctl_ = static_cast<Control*>(base_);  // a fresh tmpfs page is zero: counters start at 0
  slots_ = static_cast<unsigned char*>(base_) + kHeaderBytes;
  result_ = slots_ + static_cast<size_t>(size_) * kChunkBytes;
}

void ShmGroup::unlink_name() {
  if (rank_ == 0 && !name_.empty()) ::shm_unlink(name_.c_str());
  name_.clear();
}

void ShmGroup::register_self_and_watch_peers(const std::function<void()>& outer_barrier) {
  ctl_->pids[rank_].store(static_cast<int32_t>(::getpid()));
  outer_barrier();  // everyone mapped and registered
  unlink_name();
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const int pid = ctl_->pids[r].load();
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (fd < 0) throw CommError("shm group: peer rank " + std::to_string(r) + " (pid " + std::to_string(pid) + ") is gone");
    pidfds_.push_back(fd);
  }
}

ShmGroup::~ShmGroup() {
  unlink_name();
  for (int fd : pidfds_) ::close(fd);
  for (const auto& r : regions_) ::munmap(r.base, r.stride * static_cast<size_t>(size_));
  if (base_) ::munmap(base_, bytes_);
}

void ShmGroup::check_peers() {
  std::vector<pollfd> fds;
  for (int fd : pidfds_) fds.push_back({fd, POLLIN, 0});
  if (::poll(fds.data(), fds.size(), 0) > 0) {
    broken_ = true;
    throw CommError("shm all-reduce: a peer process exited in the middle of a collective");
  }
}

void ShmGroup::barrier() {
  const uint32_t gen = ctl_->generation.load(std::memory_order_acquire);
  if (ctl_->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size_)) {
    ctl_->arrived.store(0, std::memory_order_relaxed);
    ctl_->generation.fetch_add(1, std::memory_order_release);
    futex(&ctl_->generation, FUTEX_WAKE, INT_MAX, nullptr);
    return;
  }
  for (int spin = 0; spin < 4000; ++spin) {
    if (ctl_->generation.load(std::memory_order_acquire) != gen) return;
    __builtin_ia32_pause();
  }
  const auto deadline = Clock::now() + timeout_;
  const timespec slice{0, 20 * 1000 * 1000};  // re-check peers every 20 ms
  while (ctl_->generation.load(std::memory_order_acquire) == gen) {
    futex(&ctl_->generation, FUTEX_WAIT, gen, &slice);
    if (ctl_->generation.load(std::memory_order_acquire) != gen) return;
    check_peers();
    if (Clock::now() > deadline) {
      broken_ = true;
      throw CommError("shm all-reduce: peers did not arrive within " + std::to_string(timeout_.count()) + " ms");
    }
  }
}

template <class T>
void ShmGroup::allreduce_typed(T* buf, size_t count, ReduceOp op) {
  const size_t chunk = kChunkBytes / sizeof(T);
  constexpr size_t kBlock = 2048;  // accumulate in L1-sized blocks: one pass over memory
  T* __restrict res = reinterpret_cast<T*>(result_);
  for (size_t off = 0; off < count; off += chunk) {
    const size_t n = std::min(chunk, count - off);
    T* __restrict mine = buf + off;
    const size_t lo = n * static_cast<size_t>(rank_) / static_cast<size_t>(size_);
    const size_t hi = n * static_cast<size_t>(rank_ + 1) / static_cast<size_t>(size_);
    // Publish only the slices the other ranks reduce; our own slice is read in place.
    T* slot = reinterpret_cast<T*>(slots_ + static_cast<size_t>(rank_) * kChunkBytes);
    std::memcpy(slot, mine, lo * sizeof(T));
    std::memcpy(slot + hi, mine + hi, (n - hi) * sizeof(T));
    barrier();
    // Slice [lo, hi): sum over ranks in rank order (deterministic, identical on every rank).
    for (size_t b0 = lo; b0 < hi; b0 += kBlock) {
      const size_t b1 = std::min(hi, b0 + kBlock);
      T acc[kBlock];
      reduce_block(acc, b0, b1, size_, op, [&](int r) {
        return r == rank_ ? static_cast<const T*>(mine)
                          : reinterpret_cast<const T*>(slots_ + static_cast<size_t>(r) * kChunkBytes);
      });
      std::memcpy(res + b0, acc, (b1 - b0) * sizeof(T));
      std::memcpy(mine + b0, acc, (b1 - b0) * sizeof(T));
    }
    barrier();
    std::memcpy(mine, res, lo * sizeof(T));
    std::memcpy(mine + hi, res + hi, (n - hi) * sizeof(T));
  }
  // The result region is rewritten by the next chunk/collective only after its first barrier,
  // which every rank reaches after finishing the copies above.
}

template <class T>
void ShmGroup::allreduce_zero_copy(const Region& reg, T* buf, size_t count, ReduceOp op) {
  const size_t off = static_cast<size_t>(reinterpret_cast<unsigned char*>(buf) -
                                         (reg.base + static_cast<size_t>(rank_) * reg.stride));
  auto part = [&](int r) { return reinterpret_cast<T*>(reg.base + static_cast<size_t>(r) * reg.stride + off); };
  constexpr size_t kBlock = 2048;
  barrier();  // every rank's values are final
  const size_t lo = count * static_cast<size_t>(rank_) / static_cast<size_t>(size_);
  const size_t hi = count * static_cast<size_t>(rank_ + 1) / static_cast<size_t>(size_);
  for (size_t b0 = lo; b0 < hi; b0 += kBlock) {
    const size_t b1 = std::min(hi, b0 + kBlock);
    T acc[kBlock];
    reduce_block(acc, b0, b1, size_, op, [&](int r) { return static_cast<const T*>(part(r)); });
    for (int r = 0; r < size_; ++r) std::memcpy(part(r) + b0, acc, (b1 - b0) * sizeof(T));
  }
  barrier();  // every slice written everywhere
}

const ShmGroup::Region* ShmGroup::region_of(const void* p, size_t bytes) const {
  const auto* q = static_cast<const unsigned char*>(p);
  for (const auto& reg : regions_) {
    const auto* mine = reg.base + static_cast<size_t>(rank_) * reg.stride;
    if (q >= mine && q + bytes <= mine + reg.stride) return &reg;
  }
  return nullptr;
}

bool ShmGroup::fuses_step(const float* grad, size_t count, float* const* arrays, size_t n_arrays) const {
  if (n_arrays == 0 || n_arrays > ElementwiseStep::kMaxArrays) return false;
  if (!region_of(grad, count * sizeof(float))) return false;
  for (size_t j = 0; j < n_arrays; ++j)
    if (!region_of(arrays[j], count * sizeof(float))) return false;
  return true;
}

void ShmGroup::allreduce_step(float* grad, size_t count, const ElementwiseStep& step, float* const* arrays) {
  if (broken_) throw CommError("shm all-reduce: group broken by an earlier failure");
  const size_t na = step.num_arrays();
  DDPRUN_ENFORCE(fuses_step(grad, count, arrays, na), "shm allreduce_step: buffers are not all in alloc_shared memory");
  // Every buffer as (region, offset in a part), so rank q's copy is base + q * stride + off.
  struct Where {
    const Region* reg;
    size_t off;
  };
  auto where = [&](const void* p) {
    const Region* reg = region_of(p, count * sizeof(float));
    const auto* mine = reg->base + static_cast<size_t>(rank_) * reg->stride;
    return Where{reg, static_cast<size_t>(static_cast<const unsigned char*>(p) - mine)};
  };
  auto at = [&](const Where& w, int q) {
    return reinterpret_cast<float*>(w.reg->base + static_cast<size_t>(q) * w.reg->stride + w.off);
  };
  const Where g = where(grad);
  Where arr[ElementwiseStep::kMaxArrays];
  for (size_t j = 0; j < na; ++j) arr[j] = where(arrays[j]);

  constexpr size_t kBlock = 2048;  // the averaged block stays in L1 between reduce, step and copies
  barrier();  // every rank's gradient is final and every rank is past backward
  const size_t lo = count * static_cast<size_t>(rank_) / static_cast<size_t>(size_);
  const size_t hi = count * static_cast<size_t>(rank_ + 1) / static_cast<size_t>(size_);
  float* mine[ElementwiseStep::kMaxArrays];
  for (size_t b0 = lo; b0 < hi; b0 += kBlock) {
    const size_t b1 = std::min(hi, b0 + kBlock);
    float acc[kBlock];
    // The same reduction (order, Avg division) as allreduce_zero_copy, so the averaged gradient
    // and hence the step's result are bit-identical to the unfused path.
    reduce_block(acc, b0, b1, size_, ReduceOp::Avg, [&](int q) { return static_cast<const float*>(at(g, q)); });
    for (size_t j = 0; j < na; ++j) mine[j] = arrays[j] + b0;
    step.apply(mine, acc, b1 - b0);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      for (size_t j = 0; j < na; ++j) copy_nontemporal(at(arr[j], q) + b0, mine[j], b1 - b0);
    }
  }
  _mm_sfence();  // the streaming stores are weakly ordered: visible before the barrier says so
  barrier();     // every slice of every array written everywhere
}

void ShmGroup::allreduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  if (broken_) throw CommError("shm all-reduce: group broken by an earlier failure");
  if (const Region* reg = region_of(buf, count * dtype_size(dtype))) {
    if (dtype == DType::F32) return allreduce_zero_copy(*reg, static_cast<float*>(buf), count, op);
    if (dtype == DType::I32) return allreduce_zero_copy(*reg, static_cast<int32_t*>(buf), count, op);
  }
  if (dtype == DType::F32) return allreduce_typed(static_cast<float*>(buf), count, op);
  if (dtype == DType::I32) return allreduce_typed(static_cast<int32_t*>(buf), count, op);
  throw WorkerError(std::string("shm all-reduce of ") + dtype_name(dtype) + " is not supported");
}

}  // namespace ddprun::worker
