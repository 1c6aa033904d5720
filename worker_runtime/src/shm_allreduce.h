// Intra-host fast path of the CPU communicator: when every rank of the group runs on one host,
// all-reduce goes through one shared-memory segment instead of Gloo's TCP loopback (which
// costs ~24 ms for 16 MiB at 2 ranks on a 2-core host, more than half a training step).
//
// Staged path (any other buffer), per chunk of 8 MiB: each rank copies into its slot the
// slices the others reduce; barrier; rank r sums slice r over all ranks in rank order
// (deterministic; its own slice read in place) into its buffer and the result region;
// barrier; everyone copies the other slices of the result back. (N-1)/N of the data is copied
// in and out per rank. Barriers are futexes on the shared segment. Peers are watched with
// pidfds, so a peer that dies mid-collective fails the collective at once (CommError) instead
// of after the timeout; a peer that hangs fails it after the timeout.
//
// Zero-copy path: buffers inside alloc_shared() parts (one part per rank, same layout) are
// reduced where they lie: barrier; rank r sums slice r of every rank's part in rank order and
// writes the sum into every part; barrier. 2N of memory traffic per rank for N elements.
//
// Fused step (allreduce_step): when the gradient AND the optimizer's arrays (parameters,
// momentum, ...) all lie in alloc_shared() parts with the same flat layout, rank r, block by
// block of its slice, computes the averaged gradient exactly as the zero-copy path does,
// applies the elementwise step to its own part's arrays, and copies the updated blocks into
// every other rank's part (streaming stores: this core does not read them again; an array in
// a one-copy region, below, is written in place only); the
// averaged gradient is never written. One pass instead of an
// all-reduce plus a full optimizer pass on every rank (~2.5N instead of ~5N for plain SGD).
// The step writes parameters other ranks read, so it must run only once every rank is past
// backward (the Reducer issues it from finalize_and_step(), after backward, so the first
// barrier means every rank is past it); the last barrier keeps every rank from reading its
// parameters before all slices are written.
//
// Mismatched collectives (safety): every collective publishes this rank's sequence number and
// op signature (kind incl. staged / zero-copy / fused, dtype, count, reduce op, where in a shared
// region) in the control page before its first barrier; after that barrier every rank compares
// every peer's with its own and throws CommError naming the ranks, the op and what was expected
// (instead of reading a peer's unrelated data). All ranks see the same table, so all throw.
// The collectives that go over Gloo take part in the same sequence (check_transport_op), so a
// rank in a shm all-reduce and another in a Gloo broadcast fail the same way. A peer that
// exits fails the collective at once, naming it; one that never arrives (alive elsewhere) fails
// it after the communicator's timeout (DDPRUN_COLLECTIVE_TIMEOUT_S, 10 min by default), with
// the collective each rank was last in.
//
// No /dev/shm leftovers at any moment (safety): segments never have a name. The creator opens
// an unnamed file on /dev/shm (O_TMPFILE; memfd where /dev/shm lacks it), sizes it with
// posix_fallocate, and publishes "<pid>:<fd>"; peers open /proc/<pid>/fd/<fd> (a same-user
// read access, allowed under Yama unlike pidfd_getfd), then the creator closes its descriptor
// after a barrier. The memory lives exactly as long as some mapping or descriptor does, so a
// SIGKILL at any instant leaks nothing (named segments plus an unlink always leave a window,
// and a sweep of dead PIDs' names needs a survivor to run it). A creator killed before the
// peers opened it makes their open fail: a CommError, and the group is restarted anyway.
//
// Capacity (safety): a /dev/shm without room for a segment (statvfs before, ENOSPC/EFBIG from
// posix_fallocate, which allocates now instead of faulting SIGBUS later) makes the creator
// publish "none:<why>" instead; every rank reads the same answer, so the whole group falls back
// together (create() returns nullptr: Gloo; alloc_shared() returns nullptr: private memory),
// with one warning line from rank 0.
//
// Dtypes: f32, f64, i32, i64 reduced in their own type; f16 and bf16 accumulated in float
// (rank order, Avg divides in float) and rounded once to nearest even.
//
// One-copy regions (alloc_shared_single): a segment of one part that every rank maps, for
// state that is equal on every rank (parameters, optimizer state). The fused step writes an
// array that lies there in place, each rank its slice, and copies nothing to peers: per rank
// and step that saves (N-1)/N of the array's stores and the peers' copies of it in every
// rank's cache and in RAM. Every collective that meets such a buffer treats the size() parts
// as the same memory: the zero-copy all-reduce reduces size() identical contributions (each
// rank writes only its slice), broadcast is only its op check and barrier (the bytes are
// already root's), and allgather/reduce_scatter refuse it as output (every rank would write
// all of it). Arrays of one fused step may mix both kinds of region.
//
// Split fused step (reduce_for_step, then finish_step): the reduction of the fused step
// moved into backward, where it overlaps the rest of it: rank r averages slice r of a bucket
// as soon as the bucket is ready on every rank and keeps it in its own part of the gradient
// (only rank r reads slice r, so no second barrier); after backward one finish_step steps
// every fused bucket's slice and writes the updated parameters into every rank's copy (one
// barrier pair for all buckets). Parameters are written only there, after backward.
// reduce_for_step also comes in two non-blocking halves (start_reduce_for_step publishes the
// op and arrives at the barrier; test_reduce_for_step finishes it once everyone arrived), so
// the training thread can drive it between layers without a communication thread.
//
// Not thread-safe: one collective at a time (like the communicator that owns it).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/worker/communicator.h"

namespace ddprun::worker {

class ShmGroup {
 public:
  // Rank 0 creates the segment and publishes how to open it through `publish`; the others
  // obtain it through `fetch`; `barrier` is a group barrier over another transport, used once
  // so rank 0 can drop its descriptor after everyone opened it. Returns nullptr on every rank
  // when rank 0 found /dev/shm too small (see the header comment).
  template <class Publish, class Fetch, class Barrier>
  static std::unique_ptr<ShmGroup> create(int rank, int size, std::chrono::milliseconds timeout, Publish publish,
                                          Fetch fetch, Barrier barrier);
  ~ShmGroup();

  static constexpr int kMaxRanks = 64;
  static constexpr size_t kChunkBytes = 8u << 20;

  // In place; every DType, Sum/Avg/Max. Throws CommError on peer death/timeout or when the
  // ranks issued different collectives. A buffer inside a part returned by alloc_shared() is
  // reduced without copies: rank r sums slice r straight from every rank's part and writes
  // the result into every part.
  void allreduce(void* buf, size_t count, DType dtype, ReduceOp op);

  // True when grad[0, count) lies in this rank's part of an alloc_shared() region and every
  // arrays[j][0, count) in one of alloc_shared() or alloc_shared_single(), so allreduce_step()
  // can fuse.
  bool fuses_step(const float* grad, size_t count, float* const* arrays, size_t n_arrays) const;
  // The fused average + step of the header comment; requires fuses_step(). Afterwards every
  // rank's part of every array holds the same updated values; grad keeps its local values.
  void allreduce_step(float* grad, size_t count, const ElementwiseStep& step, float* const* arrays);

  // The fused step in two phases (FusedStep::splits_step): reduce_for_step() during
  // backward leaves in this rank's part the average of the gradient slice this rank steps;
  // finish_step() after backward steps each segment's slice and writes it everywhere, as
  // allreduce_step() does, with the same bits.
  void reduce_for_step(float* grad, size_t count);
  // reduce_for_step() without blocking (the Reducer's inline progress): start publishes the op
  // and arrives at its barrier at once; test finishes it (the op check, then this rank's
  // slice) when every rank has arrived, returning false while one has not (block = false) or
  // waiting like any barrier (block = true). One started at a time, finished before any other
  // collective; same bits as reduce_for_step().
  void start_reduce_for_step(float* grad, size_t count);
  bool test_reduce_for_step(bool block);
  void finish_step(size_t n_segments, float* const* grads, const size_t* counts, const ElementwiseStep& step,
                   float* const* arrays);

  // Collective (same bytes, same order on every rank): a new segment with one part per rank;
  // returns this rank's part (zeroed), valid for the group's lifetime, or nullptr on every
  // rank when /dev/shm has no room for it.
  template <class Publish, class Fetch, class Barrier>
  void* alloc_shared(size_t bytes, Publish publish, Fetch fetch, Barrier barrier) {
    return alloc_region(bytes, false, publish, fetch, barrier);
  }
  // The same with one part that every rank maps (the header comment's one-copy regions).
  template <class Publish, class Fetch, class Barrier>
  void* alloc_shared_single(size_t bytes, Publish publish, Fetch fetch, Barrier barrier) {
    return alloc_region(bytes, true, publish, fetch, barrier);
  }
  // [p, p + bytes) lies wholly in a one-copy region / overlaps one at all.
  bool is_single(const void* p, size_t bytes) const;
  bool overlaps_single(const void* p, size_t bytes) const;
  // Broadcast of a buffer wholly in a one-copy region: the bytes are root's already, so only
  // the op check (every rank names the same place and root) and one barrier, which orders
  // root's writes before everyone's reads.
  void broadcast_single(void* buf, size_t bytes, int root);

  // The communicator's other collectives (over Gloo) take their turn in the same sequence:
  // this rank's signature is published, one barrier, every rank's compared. A rank in a shm
  // op and another in a Gloo op (or two different Gloo ops) then fail with a CommError naming
  // both instead of waiting for each other until the timeout. Costs one barrier (microseconds)
  // before a collective that goes over TCP.
  enum class TransportOp : uint32_t { Broadcast = 7, AllGather, ReduceScatter, Barrier };
  void check_transport_op(TransportOp op, DType dtype, size_t count, ReduceOp rop, uint32_t extra);

 private:
  struct Control;
  struct OpSig {
    uint64_t seq, count, where;
    uint32_t kind, dtype, op, extra;
  };
  ShmGroup(int rank, int size, std::chrono::milliseconds timeout) : rank_(rank), size_(size), timeout_(timeout) {}
  static size_t control_bytes(int size);
  // Creator side: an unnamed segment of `bytes` and its "<pid>:<fd>" handle, or nullptr with
  // *why when /dev/shm has no room. *fd stays open until drop_creator_fd().
  static void* create_unnamed(size_t bytes, int* fd, std::string* handle, std::string* why);
  static void* open_handle(const std::string& handle, size_t bytes);
  static bool is_fallback(const std::string& handle) { return handle.rfind("none:", 0) == 0; }
  static void warn_fallback(int rank, const std::string& what, const std::string& handle);
  void map_control(void* base);
  void register_self_and_watch_peers(const std::function<void()>& barrier);
  // The group barrier in two halves: arrive() counts this rank in and returns the generation
  // to wait on; all_arrived() tells without blocking whether everyone has; wait_all() blocks
  // (short spin, then futex; peers checked and the timeout applied).
  uint32_t arrive();
  bool all_arrived(uint32_t gen) const;
  void wait_all(uint32_t gen);
  void barrier();
  void check_peers();
  // Where every rank is (its newest published collective), for the timeout's message.
  std::string where_ranks_are() const;
  // Publishes this rank's op, waits for everyone (the collective's first barrier) and checks
  // that every rank issued the same one.
  void enter(uint32_t kind, DType dtype, size_t count, ReduceOp op, uint64_t where, uint32_t extra);
  // enter()'s halves: write this rank's signature (before arriving); compare every rank's
  // with it (after everyone arrived).
  OpSig publish(uint32_t kind, DType dtype, size_t count, ReduceOp op, uint64_t where, uint32_t extra);
  void check_sigs(const OpSig& mine);
  std::string describe(const OpSig& s) const;
  template <class T>
  void allreduce_as(void* buf, size_t count, ReduceOp op);
  template <class T>
  void allreduce_typed(T* buf, size_t count, ReduceOp op);
  struct Region {
    unsigned char* base = nullptr;
    size_t part = 0;    // bytes of one rank's part, as asked for (the stride rounds it to pages)
    size_t stride = 0;  // from one rank's part to the next: 0 in a one-copy region
    size_t mapped = 0;
    unsigned char* at(int q) const { return base + static_cast<size_t>(q) * stride; }
    bool single() const { return stride == 0; }
  };
  template <class Publish, class Fetch, class Barrier>
  void* alloc_region(size_t bytes, bool single, Publish publish, Fetch fetch, Barrier barrier);
  // Bit j set when arrays[j] lies in a one-copy region (part of the fused ops' signature).
  uint32_t single_mask(float* const* arrays, size_t n_arrays, size_t count) const;
  template <class T>
  void allreduce_zero_copy(const Region& r, T* buf, size_t count, ReduceOp op);
  // The region whose part of this rank holds [p, p + bytes), or nullptr.
  const Region* region_of(const void* p, size_t bytes) const;
  uint64_t where_of(const Region* reg, const void* p) const;

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  Control* ctl_ = nullptr;
  unsigned char* slots_ = nullptr;   // size_ slots of kChunkBytes
  unsigned char* result_ = nullptr;  // kChunkBytes
  std::vector<int> pidfds_;
  std::vector<int> pidfd_ranks_;  // the rank each pidfd watches
  std::vector<Region> regions_;
  uint64_t seq_ = 0;
  bool broken_ = false;
  struct Pending {  // a started, unfinished reduce_for_step
    OpSig mine{};
    uint32_t gen = 0;
    const Region* reg = nullptr;
    float* grad = nullptr;
    size_t count = 0;
    bool active = false;
  } pending_;
};

void shm_close_fd(int fd);
// Closes a creator's descriptor on every exit path (the mapping stays).
struct ShmFdGuard {
  int fd = -1;
  ~ShmFdGuard() { if (fd >= 0) shm_close_fd(fd); }
};

template <class Publish, class Fetch, class Barrier>
void* ShmGroup::alloc_region(size_t bytes, bool single, Publish publish, Fetch fetch, Barrier barrier) {
  const size_t part = (bytes + 4095) / 4096 * 4096;
  const size_t total = single ? part : part * static_cast<size_t>(size_);
  std::string handle, why;
  void* base = nullptr;
  ShmFdGuard fd;
  if (rank_ == 0) {
    base = create_unnamed(total, &fd.fd, &handle, &why);
    if (!base) handle = "none:" + why;
    publish(handle);
  } else {
    handle = fetch();
  }
  if (is_fallback(handle)) {  // the same answer on every rank: no barrier, all return nullptr
    warn_fallback(rank_, std::string(single ? "a one-copy shared region" : "a shared region") + " of " +
                             std::to_string(total) + " bytes", handle);
    return nullptr;
  }
  if (rank_ != 0) base = open_handle(handle, total);
  const Region reg{static_cast<unsigned char*>(base), bytes, single ? 0 : part, total};
  regions_.push_back(reg);
  barrier();  // everyone opened it: the creator's descriptor can go (fd's guard)
  return reg.at(rank_);
}

template <class Publish, class Fetch, class Barrier>
std::unique_ptr<ShmGroup> ShmGroup::create(int rank, int size, std::chrono::milliseconds timeout, Publish publish,
                                           Fetch fetch, Barrier barrier) {
  std::unique_ptr<ShmGroup> g(new ShmGroup(rank, size, timeout));
  const size_t bytes = control_bytes(size);
  std::string handle, why;
  ShmFdGuard fd;  // closed once everyone opened it (after the barrier), or on an error
  void* base = nullptr;
  if (rank == 0) {
    base = create_unnamed(bytes, &fd.fd, &handle, &why);
    if (!base) handle = "none:" + why;
    publish(handle);
  } else {
    handle = fetch();
  }
  if (is_fallback(handle)) {
    warn_fallback(rank, "the all-reduce segment (" + std::to_string(bytes) + " bytes)", handle);
    return nullptr;
  }
  if (rank != 0) base = open_handle(handle, bytes);
  g->bytes_ = bytes;
  g->map_control(base);
  g->register_self_and_watch_peers(barrier);
  return g;
}

}  // namespace ddprun::worker
