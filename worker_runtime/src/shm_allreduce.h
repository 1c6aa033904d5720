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
// every other rank's part (streaming stores: this core does not read them again); the
// averaged gradient is never written. One pass instead of an
// all-reduce plus a full optimizer pass on every rank (~2.5N instead of ~5N for plain SGD).
// The step writes other ranks' parameters, so it must run only once every rank is past
// backward (the Reducer issues it from finalize_and_step(), after backward, so the first
// barrier means every rank is past it); the last barrier keeps every rank from reading its
// parameters before all slices are written.
//
// Not thread-safe: one collective at a time (like the communicator that owns it).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <sys/mman.h>

#include "ddprun/worker/communicator.h"

namespace ddprun::worker {

class ShmGroup {
 public:
  // Rank 0 creates the segment and publishes its name through `publish`; the others obtain it
  // through `fetch`; `barrier` is a group barrier over another transport, used once so rank 0
  // can unlink the name after everyone mapped it (nothing leaks if a process dies later).
  template <class Publish, class Fetch, class Barrier>
  static std::unique_ptr<ShmGroup> create(int rank, int size, std::chrono::milliseconds timeout, Publish publish,
                                          Fetch fetch, Barrier barrier);
  ~ShmGroup();

  static constexpr int kMaxRanks = 64;
  static constexpr size_t kChunkBytes = 8u << 20;

  // In place; F32 (Sum/Avg/Max) and I32 (Sum/Max). Throws CommError on peer death/timeout.
  // A buffer inside a part returned by alloc_shared() is reduced without copies: rank r sums
  // slice r straight from every rank's part and writes the result into every part.
  void allreduce(void* buf, size_t count, DType dtype, ReduceOp op);

  // True when grad[0, count) and every arrays[j][0, count) lie in this rank's parts of
  // alloc_shared() regions, so allreduce_step() can fuse.
  bool fuses_step(const float* grad, size_t count, float* const* arrays, size_t n_arrays) const;
  // The fused average + step of the header comment; requires fuses_step(). Afterwards every
  // rank's part of every array holds the same updated values; grad keeps its local values.
  void allreduce_step(float* grad, size_t count, const ElementwiseStep& step, float* const* arrays);

  // Collective (same bytes, same order on every rank): a new segment with one part per rank;
  // returns this rank's part (zeroed). Valid for the group's lifetime.
  template <class Publish, class Fetch, class Barrier>
  void* alloc_shared(size_t bytes, Publish publish, Fetch fetch, Barrier barrier);

 private:
  struct Control;
  ShmGroup(int rank, int size, std::chrono::milliseconds timeout) : rank_(rank), size_(size), timeout_(timeout) {}
  std::string create_segment();  // rank 0
  void map_segment(const std::string& name, bool create);
  void unlink_name();
  void register_self_and_watch_peers(const std::function<void()>& barrier);
  void barrier();
  void check_peers();
  template <class T>
  void allreduce_typed(T* buf, size_t count, ReduceOp op);
  struct Region {
    unsigned char* base = nullptr;
    size_t stride = 0;
  };
  template <class T>
  void allreduce_zero_copy(const Region& r, T* buf, size_t count, ReduceOp op);
  // The region whose part of this rank holds [p, p + bytes), or nullptr.
  const Region* region_of(const void* p, size_t bytes) const;
  static void* map_named(const std::string& name, size_t bytes, bool create);
  std::string fresh_name() const;

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::string name_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  Control* ctl_ = nullptr;
  unsigned char* slots_ = nullptr;   // size_ slots of kChunkBytes
  unsigned char* result_ = nullptr;  // kChunkBytes
  std::vector<int> pidfds_;
  std::vector<Region> regions_;
  bool broken_ = false;
};

template <class Publish, class Fetch, class Barrier>
void* ShmGroup::alloc_shared(size_t bytes, Publish publish, Fetch fetch, Barrier barrier) {
  const size_t stride = (bytes + 4095) / 4096 * 4096;
  std::string name;
  void* base = nullptr;
  if (rank_ == 0) {
    name = fresh_name();
    base = map_named(name, stride * static_cast<size_t>(size_), true);
    publish(name);
  } else {
    name = fetch();
    base = map_named(name, stride * static_cast<size_t>(size_), false);
  }
  regions_.push_back({static_cast<unsigned char*>(base), stride});
  barrier();  // everyone mapped it: the name can go
  if (rank_ == 0) ::shm_unlink(name.c_str());
  return static_cast<unsigned char*>(base) + static_cast<size_t>(rank_) * stride;
}

template <class Publish, class Fetch, class Barrier>
std::unique_ptr<ShmGroup> ShmGroup::create(int rank, int size, std::chrono::milliseconds timeout, Publish publish,
                                           Fetch fetch, Barrier barrier) {
  std::unique_ptr<ShmGroup> g(new ShmGroup(rank, size, timeout));
  if (rank == 0) {
    publish(g->create_segment());
  } else {
    g->map_segment(fetch(), false);
  }
  g->register_self_and_watch_peers(barrier);
  return g;
}

}  // namespace ddprun::worker
