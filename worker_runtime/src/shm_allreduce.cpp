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
enum OpKind : uint32_t {
  kStaged = 1,
  kZeroCopy = 2,
  kFusedStep = 3,
  kReduceForStep = 4,
  kFinishStep = 5,
  kBroadcastSingle = 6,
  // 7..10: ShmGroup::TransportOp (collectives over Gloo, checked here).
  kGlooBroadcast = 7,
  kGlooAllGather = 8,
  kGlooReduceScatter = 9,
  kGlooBarrier = 10,
};
// The fused ops' `extra`: n_arrays / n_segments in the low 24 bits, the one-copy arrays' mask
// above (ranks that disagree on where an array lives would each write a different copy).
constexpr uint32_t kMaskShift = 24;

// Reduction arithmetic per element type: f16 and bf16 accumulate in float and round once.
struct bf16_t {
  uint16_t bits;
};
template <class T>
struct Arith {
  using Acc = T;
  static Acc in(T v) { return v; }
  static T out(Acc a) { return a; }
};
template <>
struct Arith<_Float16> {
  using Acc = float;
  static float in(_Float16 v) { return static_cast<float>(v); }
  static _Float16 out(float a) { return static_cast<_Float16>(a); }  // round to nearest even
};
template <>
struct Arith<bf16_t> {
  using Acc = float;
  static float in(bf16_t v) {
    const uint32_t u = static_cast<uint32_t>(v.bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static bf16_t out(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40u)};  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                                         // round to nearest even
    return {static_cast<uint16_t>(u >> 16)};
  }
};
static_assert(sizeof(_Float16) == 2 && sizeof(bf16_t) == 2);
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::F32;
  if constexpr (std::is_same_v<T, double>) return DType::F64;
  if constexpr (std::is_same_v<T, int32_t>) return DType::I32;
  if constexpr (std::is_same_v<T, int64_t>) return DType::I64;
  if constexpr (std::is_same_v<T, _Float16>) return DType::F16;
  if constexpr (std::is_same_v<T, bf16_t>) return DType::BF16;
}
using Clock = std::chrono::steady_clock;

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

// Reduces [b0, b1) of every rank's buffer (src_of(r)) into acc[0, b1-b0), in rank order so
// every rank computes bit-identical results; Avg divides at the end.
// fp32 Sum/Avg (gradients: the hot path) four lanes at a time with SSE, part of baseline
// x86-64, so the library's own build type decides nothing here: built -O2 (RelWithDebInfo)
// the scalar loop below was not vectorised (one addss and one divss per element: ~5 ms of
// CPU per rank and step for the 4.2 M-parameter `train` model on the H200 host's cores).
// Lane by lane the same IEEE operations in the same order (rank order, then one division) as
// the scalar loop, so the same bits.
template <class SrcOf>
void reduce_block_f32(float* acc, size_t b0, size_t b1, int size, bool avg, SrcOf src_of) {
  const float* src[ShmGroup::kMaxRanks];
  for (int r = 0; r < size; ++r) src[r] = src_of(r) + b0;
  const size_t n = b1 - b0;
  const float d = static_cast<float>(size);
  const __m128 dv = _mm_set1_ps(d);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    __m128 v = _mm_loadu_ps(src[0] + i);
    for (int r = 1; r < size; ++r) v = _mm_add_ps(v, _mm_loadu_ps(src[r] + i));
    if (avg) v = _mm_div_ps(v, dv);
    _mm_storeu_ps(acc + i, v);
  }
  for (; i < n; ++i) {
    float v = src[0][i];
    for (int r = 1; r < size; ++r) v += src[r][i];
    acc[i] = avg ? v / d : v;
  }
}

template <class T, class SrcOf>
void reduce_block(typename Arith<T>::Acc* acc, size_t b0, size_t b1, int size, ReduceOp op, SrcOf src_of) {
  using A = Arith<T>;
  if constexpr (std::is_same_v<T, float>) {
    if (op != ReduceOp::Max)
      return reduce_block_f32(acc, b0, b1, size, op == ReduceOp::Avg,
                              [&](int r) { return static_cast<const float*>(src_of(r)); });
  }
  for (int r = 0; r < size; ++r) {
    const T* __restrict src = src_of(r);
    if (r == 0) {
      for (size_t i = b0; i < b1; ++i) acc[i - b0] = A::in(src[i]);
    } else if (op == ReduceOp::Max) {
      for (size_t i = b0; i < b1; ++i) {
        const auto v = A::in(src[i]);
        acc[i - b0] = acc[i - b0] > v ? acc[i - b0] : v;
      }
    } else {
      for (size_t i = b0; i < b1; ++i) acc[i - b0] += A::in(src[i]);
    }
  }
  if (op == ReduceOp::Avg) {
    const auto d = static_cast<typename Arith<T>::Acc>(size);
    for (size_t i = b0; i < b1; ++i) acc[i - b0] /= d;
  }
}

// The block's result in T (a no-op view for types reduced in their own type).
template <class T>
const T* to_elements(const typename Arith<T>::Acc* acc, size_t n, T* tmp) {
  if constexpr (std::is_same_v<typename Arith<T>::Acc, T>) {
    (void)n;
    (void)tmp;
    return acc;
  } else {
    for (size_t i = 0; i < n; ++i) tmp[i] = Arith<T>::out(acc[i]);
    return tmp;
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

uint32_t ShmGroup::arrive() {
  const uint32_t gen = ctl_->generation.load(std::memory_order_acquire);
  if (ctl_->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size_)) {
    ctl_->arrived.store(0, std::memory_order_relaxed);
    ctl_->generation.fetch_add(1, std::memory_order_release);
    futex(&ctl_->generation, FUTEX_WAKE, INT_MAX, nullptr);
  }
  return gen;
}

bool ShmGroup::all_arrived(uint32_t gen) const { return ctl_->generation.load(std::memory_order_acquire) != gen; }

void ShmGroup::wait_all(uint32_t gen) {
  // A short spin (a peer is usually close behind), then sleep in the kernel: a waiter must not
  // keep its core from the threads that still have work (ranks often share cores).
  // Bounded in time, not in PAUSEs (one costs ~10 to ~140 cycles depending on the CPU: the
  // former 4000 meant ~0.2 ms of a core burnt per wait on the H200 host's Xeon).
  const auto spin_end = Clock::now() + std::chrono::microseconds(20);
  for (int spin = 1;; ++spin) {
    if (all_arrived(gen)) return;
    __builtin_ia32_pause();
    if (spin % 32 == 0 && Clock::now() > spin_end) break;
  }
  const auto deadline = Clock::now() + timeout_;
  const timespec slice{0, 20 * 1000 * 1000};  // re-check peers every 20 ms
  while (!all_arrived(gen)) {
    futex(&ctl_->generation, FUTEX_WAIT, gen, &slice);
    if (all_arrived(gen)) return;
    check_peers();
    if (Clock::now() > deadline) {
      broken_ = true;
      throw CommError("shm collective on rank " + std::to_string(rank_) +
                      ": peers did not arrive within the timeout of " + std::to_string(timeout_.count()) +
                      " ms (DDPRUN_COLLECTIVE_TIMEOUT_S)" + where_ranks_are() +
                      ". A rank that stopped issuing collectives (stuck, or in code the others do not run) "
                      "keeps the others waiting");
    }
  }
}

void ShmGroup::barrier() { wait_all(arrive()); }

ShmGroup::OpSig ShmGroup::publish(uint32_t kind, DType dtype, size_t count, ReduceOp op, uint64_t where,
                                  uint32_t extra) {
  if (broken_) throw CommError("shm all-reduce: group broken by an earlier failure");
  DDPRUN_ENFORCE(!pending_.active, "shm collective issued while a started reduce_for_step is not finished "
                                   "(test_reduce_for_step(true) first)");
  const OpSig mine{++seq_, count, where, kind, static_cast<uint32_t>(dtype), static_cast<uint32_t>(op), extra};
  ctl_->sigs[mine.seq & 1][rank_] = mine;
  return mine;
}

void ShmGroup::check_sigs(const OpSig& mine) {
  const OpSig* const sigs = ctl_->sigs[mine.seq & 1];
  std::string diff;
  for (int r = 0; r < size_; ++r) {
    const OpSig o = sigs[r];
    if (o.seq == mine.seq && o.count == mine.count && o.where == mine.where && o.kind == mine.kind &&
        o.dtype == mine.dtype && o.op == mine.op && o.extra == mine.extra)
      continue;
    if (diff.size() < 600)
      diff += "; rank " + std::to_string(r) + " issued #" + std::to_string(o.seq) + " " + describe(o);
  }
  if (diff.empty()) return;
  broken_ = true;  // the peers' buffers are not what this rank expects: never read them
  throw CommError("shm collective mismatch seen by rank " + std::to_string(rank_) + ": rank " + std::to_string(rank_) +
                  " (this one) issued #" + std::to_string(mine.seq) + " " + describe(mine) + diff +
                  ". Expected every rank to issue the same collectives in the same order (op, dtype, count, and "
                  "for shared buffers the same place in them); ranks diverged (e.g. a skipped step or a "
                  "rank-dependent branch)");
}

void ShmGroup::enter(uint32_t kind, DType dtype, size_t count, ReduceOp op, uint64_t where, uint32_t extra) {
  const OpSig mine = publish(kind, dtype, count, op, where, extra);
  barrier();
  check_sigs(mine);
}

void ShmGroup::check_transport_op(TransportOp op, DType dtype, size_t count, ReduceOp rop, uint32_t extra) {
  enter(static_cast<uint32_t>(op), dtype, count, rop, 0, extra);
}

std::string ShmGroup::where_ranks_are() const {
  std::string out;
  for (int r = 0; r < size_; ++r) {
    // The newer of the rank's two entries (by sequence number) is the collective it is in or
    // last finished.
    const OpSig a = ctl_->sigs[0][r], b = ctl_->sigs[1][r];
    const OpSig& last = a.seq > b.seq ? a : b;
    out += "; rank " + std::to_string(r) + (r == rank_ ? " (this one)" : "") +
           (last.seq == 0 ? std::string(" has issued no collective yet")
                          : " last issued #" + std::to_string(last.seq) + " " + describe(last));
  }
  return out;
}

std::string ShmGroup::describe(const OpSig& s) const {
  const char* op = s.op == static_cast<uint32_t>(ReduceOp::Sum)   ? "sum"
                   : s.op == static_cast<uint32_t>(ReduceOp::Avg) ? "avg"
                   : s.op == static_cast<uint32_t>(ReduceOp::Max) ? "max"
                                                                  : "?";
  const std::string dt = s.dtype <= static_cast<uint32_t>(DType::I64) ? dtype_name(static_cast<DType>(s.dtype)) : "?";
  const std::string place =
      "region " + std::to_string(s.where >> 48) + " offset " + std::to_string(s.where & ((uint64_t{1} << 48) - 1));
  if (s.seq == 0) return "nothing yet";
  switch (s.kind) {
    case kStaged: return "allreduce(" + dt + ", " + std::to_string(s.count) + " elements, " + op + ")";
    case kZeroCopy:
      return "allreduce(" + dt + ", " + std::to_string(s.count) + " elements, " + op + ", shared buffer at " + place +
             ")";
    case kFusedStep:
      return "allreduce_step(fp32, " + std::to_string(s.count) + " elements, " +
             std::to_string(s.extra & ((1u << kMaskShift) - 1)) + " arrays (one-copy mask " +
             std::to_string(s.extra >> kMaskShift) + "), gradient at " + place + ")";
    case kReduceForStep:
      return "reduce_for_step(fp32, " + std::to_string(s.count) + " elements, gradient at " + place + ")";
    case kFinishStep:
      return "finish_step(fp32, " + std::to_string(s.count) + " elements in " +
             std::to_string(s.extra & ((1u << kMaskShift) - 1)) + " segments (one-copy mask " +
             std::to_string(s.extra >> kMaskShift) + "), first at " + place + ")";
    case kBroadcastSingle:
      return "broadcast(" + std::to_string(s.count) + " bytes from rank " + std::to_string(s.extra) +
             ", one-copy buffer at " + place + ")";
    case kGlooBroadcast:
      return "broadcast(" + std::to_string(s.count) + " bytes from rank " + std::to_string(s.extra) + ", over Gloo)";
    case kGlooAllGather: return "all_gather(" + dt + ", " + std::to_string(s.count) + " elements, over Gloo)";
    case kGlooReduceScatter:
      return "reduce_scatter(" + dt + ", " + std::to_string(s.count) + " elements, " + op + ", over Gloo)";
    case kGlooBarrier: return "barrier()";
  }
  return "an unknown collective";
}

uint64_t ShmGroup::where_of(const Region* reg, const void* p) const {
  const auto idx = static_cast<uint64_t>(reg - regions_.data());
  const auto off = static_cast<uint64_t>(static_cast<const unsigned char*>(p) - reg->at(rank_));
  return (idx << 48) | off;
}

template <class T>
void ShmGroup::allreduce_typed(T* buf, size_t count, ReduceOp op) {
  using Acc = typename Arith<T>::Acc;
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
    if (off == 0) {
      enter(kStaged, dtype_of<T>(), count, op, 0, 0);  // the first barrier, with the op check
    } else {
      barrier();
    }
    // Slice [lo, hi): sum over ranks in rank order (deterministic, identical on every rank).
    for (size_t b0 = lo; b0 < hi; b0 += kBlock) {
      const size_t b1 = std::min(hi, b0 + kBlock);
      Acc acc[kBlock];
      T tmp[kBlock];
      reduce_block<T>(acc, b0, b1, size_, op, [&](int r) {
        return r == rank_ ? static_cast<const T*>(mine)
                          : reinterpret_cast<const T*>(slots_ + static_cast<size_t>(r) * kChunkBytes);
      });
      const T* out = to_elements<T>(acc, b1 - b0, tmp);
      std::memcpy(res + b0, out, (b1 - b0) * sizeof(T));
      std::memcpy(mine + b0, out, (b1 - b0) * sizeof(T));
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
  using Acc = typename Arith<T>::Acc;
  const size_t off = static_cast<size_t>(reinterpret_cast<unsigned char*>(buf) - reg.at(rank_));
  // In a one-copy region every rank's part is the same memory: the size() contributions are
  // equal, and each rank writes only its slice of it.
  auto part = [&](int r) { return reinterpret_cast<T*>(reg.at(r) + off); };
  constexpr size_t kBlock = 2048;
  enter(kZeroCopy, dtype_of<T>(), count, op, where_of(&reg, buf), 0);  // every rank's values are final
  const size_t lo = count * static_cast<size_t>(rank_) / static_cast<size_t>(size_);
  const size_t hi = count * static_cast<size_t>(rank_ + 1) / static_cast<size_t>(size_);
  for (size_t b0 = lo; b0 < hi; b0 += kBlock) {
    const size_t b1 = std::min(hi, b0 + kBlock);
    Acc acc[kBlock];
    T tmp[kBlock];
    reduce_block<T>(acc, b0, b1, size_, op, [&](int r) { return static_cast<const T*>(part(r)); });
    const T* out = to_elements<T>(acc, b1 - b0, tmp);
    for (int r = 0; r < (reg.single() ? 1 : size_); ++r) std::memcpy(part(r) + b0, out, (b1 - b0) * sizeof(T));
  }
  barrier();  // every slice written everywhere
}

const ShmGroup::Region* ShmGroup::region_of(const void* p, size_t bytes) const {
  const auto* q = static_cast<const unsigned char*>(p);
  for (const auto& reg : regions_) {
    const auto* mine = reg.at(rank_);
    if (q >= mine && bytes <= reg.part && q - mine <= static_cast<ptrdiff_t>(reg.part - bytes)) return &reg;
  }
  return nullptr;
}

bool ShmGroup::is_single(const void* p, size_t bytes) const {
  const Region* reg = region_of(p, bytes);
  return reg && reg->single();
}

bool ShmGroup::overlaps_single(const void* p, size_t bytes) const {
  const auto q = reinterpret_cast<uintptr_t>(p);
  for (const auto& reg : regions_) {
    if (!reg.single()) continue;
    const auto b = reinterpret_cast<uintptr_t>(reg.base);
    if (q < b + reg.part && b < q + bytes) return true;
  }
  return false;
}

uint32_t ShmGroup::single_mask(float* const* arrays, size_t n_arrays, size_t count) const {
  uint32_t mask = 0;
  for (size_t j = 0; j < n_arrays; ++j)
    if (is_single(arrays[j], count * sizeof(float))) mask |= 1u << j;
  return mask << kMaskShift;
}

void ShmGroup::broadcast_single(void* buf, size_t bytes, int root) {
  if (broken_) throw CommError("shm all-reduce: group broken by an earlier failure");
  const Region* reg = region_of(buf, bytes);
  DDPRUN_ENFORCE(reg && reg->single(), "shm broadcast_single: the buffer is not in one-copy memory");
  // One barrier: root's writes before it happen before every rank's reads after it; nobody
  // writes a byte (each would be a store racing the others' reads).
  enter(kBroadcastSingle, DType::F32, bytes, ReduceOp::Sum, where_of(reg, buf), static_cast<uint32_t>(root));
}

bool ShmGroup::fuses_step(const float* grad, size_t count, float* const* arrays, size_t n_arrays) const {
  if (n_arrays == 0 || n_arrays > ElementwiseStep::kMaxArrays) return false;
  // The gradient is each rank's own: it must have a part per rank.
  const Region* g = region_of(grad, count * sizeof(float));
  if (!g || g->single()) return false;
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
    return Where{reg, static_cast<size_t>(static_cast<const unsigned char*>(p) - reg->at(rank_))};
  };
  auto at = [&](const Where& w, int q) { return reinterpret_cast<float*>(w.reg->at(q) + w.off); };
  const Where g = where(grad);
  Where arr[ElementwiseStep::kMaxArrays];
  for (size_t j = 0; j < na; ++j) arr[j] = where(arrays[j]);

  constexpr size_t kBlock = 2048;  // the averaged block stays in L1 between reduce, step and copies
  // Every rank's gradient is final and every rank is past backward; all issued this step.
  enter(kFusedStep, DType::F32, count, ReduceOp::Avg, where_of(g.reg, grad),
        static_cast<uint32_t>(na) | single_mask(arrays, na, count));
  const size_t lo = count * static_cast<size_t>(rank_) / static_cast<size_t>(size_);
  const size_t hi = count * static_cast<size_t>(rank_ + 1) / static_cast<size_t>(size_);
  float* mine[ElementwiseStep::kMaxArrays];
  for (size_t b0 = lo; b0 < hi; b0 += kBlock) {
    const size_t b1 = std::min(hi, b0 + kBlock);
    float acc[kBlock];
    // The same reduction (order, Avg division) as allreduce_zero_copy, so the averaged gradient
    // and hence the step's result are bit-identical to the unfused path.
    reduce_block<float>(acc, b0, b1, size_, ReduceOp::Avg, [&](int q) { return static_cast<const float*>(at(g, q)); });
    for (size_t j = 0; j < na; ++j) mine[j] = arrays[j] + b0;
    step.apply(mine, acc, b1 - b0);  // a one-copy array: written in place, for everyone
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      for (size_t j = 0; j < na; ++j)
        if (!arr[j].reg->single()) copy_nontemporal(at(arr[j], q) + b0, mine[j], b1 - b0);
    }
  }
  _mm_sfence();  // the streaming stores are weakly ordered: visible before the barrier says so
  barrier();     // every slice of every array written everywhere
}

void ShmGroup::start_reduce_for_step(float* grad, size_t count) {
  const Region* reg = region_of(grad, count * sizeof(float));
  DDPRUN_ENFORCE(reg != nullptr && !reg->single(),
                 "shm reduce_for_step: the gradient is not in alloc_shared memory (one part per rank)");
  // Every rank's gradient of this range is final once every rank arrived.
  const OpSig mine = publish(kReduceForStep, DType::F32, count, ReduceOp::Avg, where_of(reg, grad), 0);
  pending_ = Pending{mine, arrive(), reg, grad, count, true};
}

bool ShmGroup::test_reduce_for_step(bool block) {
  if (!pending_.active) return true;
  if (!all_arrived(pending_.gen)) {
    if (!block) return false;
    wait_all(pending_.gen);
  }
  pending_.active = false;
  check_sigs(pending_.mine);
  const Region* reg = pending_.reg;
  float* const grad = pending_.grad;
  const size_t count = pending_.count;
  const size_t off = static_cast<size_t>(reinterpret_cast<unsigned char*>(grad) - reg->at(rank_));
  auto part = [&](int q) { return reinterpret_cast<const float*>(reg->at(q) + off); };
  // Slice r of every part is read by rank r only, so rank r may overwrite its own part's slice
  // with the average: no second barrier (finish_step's first one orders it before any reader).
  const size_t lo = count * static_cast<size_t>(rank_) / static_cast<size_t>(size_);
  const size_t hi = count * static_cast<size_t>(rank_ + 1) / static_cast<size_t>(size_);
  constexpr size_t kBlock = 2048;
  for (size_t b0 = lo; b0 < hi; b0 += kBlock) {
    const size_t b1 = std::min(hi, b0 + kBlock);
    float acc[kBlock];
    // The reduction of allreduce_step (order, Avg division): the same averaged bits.
    reduce_block<float>(acc, b0, b1, size_, ReduceOp::Avg, part);
    std::memcpy(grad + b0, acc, (b1 - b0) * sizeof(float));
  }
  return true;
}

void ShmGroup::reduce_for_step(float* grad, size_t count) {
  start_reduce_for_step(grad, count);
  test_reduce_for_step(true);
}

void ShmGroup::finish_step(size_t n_segments, float* const* grads, const size_t* counts, const ElementwiseStep& step,
                           float* const* arrays) {
  const size_t na = step.num_arrays();
  size_t total = 0;
  uint32_t mask = 0;
  for (size_t s = 0; s < n_segments; ++s) {
    DDPRUN_ENFORCE(fuses_step(grads[s], counts[s], arrays + s * na, na),
                   "shm finish_step: buffers are not all in alloc_shared / alloc_shared_single memory");
    total += counts[s];
    mask |= single_mask(arrays + s * na, na, counts[s]);
  }
  if (n_segments == 0) return;
  DDPRUN_ENFORCE(n_segments < (1u << kMaskShift), "shm finish_step: too many segments for the op signature");
  // Every rank is past backward (nobody reads parameters any more) and every reduce_for_step
  // of this pass finished on every rank.
  enter(kFinishStep, DType::F32, total, ReduceOp::Avg,
        where_of(region_of(grads[0], counts[0] * sizeof(float)), grads[0]), static_cast<uint32_t>(n_segments) | mask);
  constexpr size_t kBlock = 2048;
  for (size_t s = 0; s < n_segments; ++s) {
    const size_t count = counts[s];
    const size_t lo = count * static_cast<size_t>(rank_) / static_cast<size_t>(size_);
    const size_t hi = count * static_cast<size_t>(rank_ + 1) / static_cast<size_t>(size_);
    float* const* arr = arrays + s * na;
    struct Peer {
      const Region* reg;
      size_t off;
    } where[ElementwiseStep::kMaxArrays];
    for (size_t j = 0; j < na; ++j) {
      const Region* reg = region_of(arr[j], count * sizeof(float));
      where[j] = {reg, static_cast<size_t>(reinterpret_cast<unsigned char*>(arr[j]) - reg->at(rank_))};
    }
    float* mine[ElementwiseStep::kMaxArrays];
    for (size_t b0 = lo; b0 < hi; b0 += kBlock) {
      const size_t b1 = std::min(hi, b0 + kBlock);
      for (size_t j = 0; j < na; ++j) mine[j] = arr[j] + b0;
      // A one-copy array is written in place (this rank's slice of the one copy) and copied
      // nowhere: no peer part to keep in step.
      step.apply(mine, grads[s] + b0, b1 - b0);
      for (int q = 0; q < size_; ++q) {
        if (q == rank_) continue;
        for (size_t j = 0; j < na; ++j)
          if (!where[j].reg->single())
            copy_nontemporal(reinterpret_cast<float*>(where[j].reg->at(q) + where[j].off) + b0, mine[j], b1 - b0);
      }
    }
  }
  _mm_sfence();  // the streaming stores are weakly ordered: visible before the barrier says so
  barrier();     // every slice of every array written everywhere
}

template <class T>
void ShmGroup::allreduce_as(void* buf, size_t count, ReduceOp op) {
  if (const Region* reg = region_of(buf, count * sizeof(T)))
    return allreduce_zero_copy(*reg, static_cast<T*>(buf), count, op);
  allreduce_typed(static_cast<T*>(buf), count, op);
}

void ShmGroup::allreduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  if (broken_) throw CommError("shm all-reduce: group broken by an earlier failure");
  switch (dtype) {
    case DType::F32: return allreduce_as<float>(buf, count, op);
    case DType::F64: return allreduce_as<double>(buf, count, op);
    case DType::I32: return allreduce_as<int32_t>(buf, count, op);
    case DType::I64: return allreduce_as<int64_t>(buf, count, op);
    case DType::F16: return allreduce_as<_Float16>(buf, count, op);
    case DType::BF16: return allreduce_as<bf16_t>(buf, count, op);
  }
  throw WorkerError(std::string("shm all-reduce of ") + dtype_name(dtype) + " is not supported");
}

}  // namespace ddprun::worker
