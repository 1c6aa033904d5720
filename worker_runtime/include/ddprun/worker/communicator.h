// The communicator: the collectives data-parallel training needs, behind one interface with
// three backends (Gloo on CPU, with a shared-memory all-reduce when every rank is on one host;
// NCCL on GPU; a no-op one for a world of one) and a test fake.
//
// Contract for every backend:
//  * Collectives must be issued in the same order, with the same counts, dtypes and ops, on
//    every rank.
//  * Every collective takes every DType: f32, f16, bf16, f64, i32, i64. Sums of f16/bf16 on
//    the CPU backends accumulate in float and round to the type once at the end (round to
//    nearest even), so they are exact whenever the float sum is; NCCL reduces them natively.
//    Avg of an integer type is the sum divided by the world size, truncated toward zero.
//  * Failures (peer died, I/O error, timeout, abort()) throw CommError, never hang past the
//    communicator's timeout. An unsupported argument throws WorkerError on every rank alike.
//    Ranks that issue different collectives: on one host (Gloo's shared-memory path) every
//    collective, shm or TCP, is checked against every rank's before it waits: a CommError
//    naming both ops on every rank. Over Gloo's TCP path, DDPRUN_DEBUG_COLLECTIVES=1 gives the
//    same check; without it, a size mismatch that Gloo detects in its own network thread ends
//    the process as a failed collective (the cause on stderr and in TORCHELASTIC_ERROR_FILE,
//    exit 75) since it cannot be thrown in the waiting thread; other mismatches wait for the
//    timeout.
//  * Not thread-safe: one thread issues collectives at a time (the Reducer's communication
//    thread during backward, the caller otherwise). abort() alone may be called from any
//    thread, at any time.
//  * Memory: host memory for the host backends, device memory for NCCL.
//
// One backend's fused optimizer step (shared memory on one host) is an optional capability,
// FusedStep, reached through Communicator::fused_step(); the rest of the interface is what
// every backend does.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ddprun/worker/dtype.h"
#include "ddprun/worker/export.h"

namespace ddprun::worker {

enum class ReduceOp : uint8_t { Sum, Avg, Max };

// An optimizer step that is elementwise over a flat fp32 parameter space (SGD, SGD with
// momentum, Adam, ...): element i of every array depends only on element i of the gradient
// and of the arrays. That lets a communicator apply it slice by slice, each slice on the rank
// that reduced it (FusedStep::allreduce_step), with the same bits as one pass over all.
class DDPRUN_WORKER_API ElementwiseStep {
 public:
  static constexpr size_t kMaxArrays = 8;
  virtual ~ElementwiseStep() = default;
  // Arrays the step updates in place, each laid out like the gradient: the parameters first,
  // then optimizer state (e.g. the momentum buffer). 1..kMaxArrays.
  virtual size_t num_arrays() const = 0;
  // Updates a[j][0, n) for every j < num_arrays() from the averaged gradient g[0, n). Must be
  // a pure function of those elements and of the step's own fields (no hidden counters), so
  // calling it on any split of a range gives the same result as one call.
  virtual void apply(float* const* a, const float* g, size_t n) const = 0;
};

class FusedStep;

class DDPRUN_WORKER_API Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "gloo", "gloo+shm" (Gloo with the shared-memory all-reduce of ranks on one host), "nccl",
  // "self" (one rank, no communication).
  virtual const char* backend() const = 0;

  // Blocking on host backends. On stream-ordered ones (NCCL), allreduce, allgather and
  // reduce_scatter are enqueued on the communication stream after the work already issued on
  // the compute stream (so inputs the compute stream produced are read complete), and the
  // compute stream does NOT wait for them (that is what lets gradient buckets overlap
  // backward): call compute_waits_for_comm() or synchronize() before using the results.
  // broadcast is ordered on both sides (the compute stream waits for it); barrier blocks the
  // host.

  // In place over `count` elements at `buf`: every rank ends with op over all ranks' buffers.
  virtual void allreduce(void* buf, size_t count, DType dtype, ReduceOp op) = 0;
  // `bytes` at `buf` on every rank become root's.
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  // Every rank ends with out[r * count, (r + 1) * count) = rank r's in[0, count), for every
  // rank r (out holds count * size() elements). In place when in == out + rank() * count;
  // otherwise in and out must not overlap.
  virtual void allgather(const void* in, void* out, size_t count, DType dtype) = 0;
  // in holds count * size() elements on every rank; rank r ends with out[0, count) = op over
  // all ranks of their in[r * count, (r + 1) * count). In place when out == in + rank() *
  // count; otherwise in and out must not overlap. in is left unchanged (except, in place,
  // the block that becomes out).
  virtual void reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) = 0;
  // Returns once every rank entered it. Host-blocking on every backend.
  virtual void barrier() = 0;
  // Makes current and future operations fail with CommError. Any thread; never throws.
  virtual void abort() noexcept = 0;

  // The fused-step capability (FusedStep below) when this communicator has it, else nullptr
  // (NCCL, the one-rank communicator, Gloo without its shared-memory path). The same answer on
  // every rank; valid for the communicator's lifetime.
  virtual FusedStep* fused_step() { return nullptr; }

  // Stream-ordered backends (NCCL) only; the defaults suit blocking host backends.
  virtual bool stream_ordered() const { return false; }
  // The caller's compute stream (a cudaStream_t; default: the legacy default stream).
  virtual void set_compute_stream(void* /*stream*/) {}
  // The communication stream waits for work already issued on the compute stream.
  virtual void comm_waits_for_compute() {}
  // The compute stream waits for all communication issued so far.
  virtual void compute_waits_for_comm() {}
  // Blocks the host until all issued communication finished (throws CommError on failure).
  virtual void synchronize() {}

  // Collective: `value` from the host of every rank, reduced with MAX, returned on the host (a
  // tiny control-plane agreement, e.g. stop.h's). The default all-reduces host memory, right for
  // host backends; a stream-ordered backend (NCCL) stages it through device memory and waits for
  // it, and so for the communication issued before it.
  virtual int32_t allreduce_max_host(int32_t value);
};

// Optional capability of a host communicator (Communicator::fused_step()): shared memory that
// the backend reduces without copies, and an all-reduce fused with an elementwise optimizer
// step over it (the CPU shared-memory path). The Reducer uses it through set_step_arrays() /
// finalize_and_step(); a program places its gradients and optimizer state with alloc_shared()
// and alloc_shared_single(). Every call follows the Communicator's contract (same order on
// every rank, CommError on failure, one thread at a time). Not owned through this interface:
// it lives as long as its communicator.
class DDPRUN_WORKER_API FusedStep {
 public:
  // Collective (same bytes, same order on every rank). Zeroed host memory that this backend
  // all-reduces without copies (peers read and write it directly) — put gradients there.
  // nullptr when there is none to give (no room in /dev/shm: one warning): use your own.
  // Valid for the communicator's lifetime.
  virtual void* alloc_shared(size_t bytes) = 0;

  // Collective (same bytes, same order on every rank, like alloc_shared). Zeroed host memory
  // that every rank maps as ONE copy: a store by any rank is the store every rank reads (the
  // address may differ per rank). For state that is the same on every rank and written only by
  // the fused step (parameters, optimizer state): each rank steps its slice in place, nothing
  // is copied to peers, and the host holds one copy instead of one per rank. nullptr when the
  // backend has none (a world of one, or /dev/shm without room: one warning): use
  // alloc_shared() or your own. Valid for the communicator's lifetime.
  // Writes are the caller's to order: two ranks must never access the same bytes at once when
  // one of them writes (a data race, even when they write equal values). So:
  //  * initialise or load such memory on ONE rank, then call barrier() or broadcast() from that
  //    rank over it before anyone reads it; every collective orders what each rank did before
  //    it before what any rank does after it;
  //  * broadcast() of a buffer wholly inside such memory moves no bytes (there is one copy):
  //    it is that ordering point, checked like a collective on every rank;
  //  * allreduce() of such a buffer reduces the size() equal contributions like any others
  //    (Sum adds x size() times in rank order, Avg divides that by size(), Max is x), each
  //    rank writing only its slice;
  //  * the fused step (allreduce_step / finish_step) writes its arrays that lie here only
  //    between its first barrier (every rank past backward) and its last (before anyone's
  //    next forward), each rank its own slice;
  //  * allgather / reduce_scatter outputs must not lie here, and neither must an array of a
  //    step that is not fused (WorkerError: every rank would write all of it).
  virtual void* alloc_shared_single(size_t /*bytes*/) { return nullptr; }
  // True when [p, p + bytes) lies in alloc_shared_single() memory of this communicator.
  virtual bool is_single_copy(const void* /*p*/, size_t /*bytes*/) const { return false; }

  // All-reduce (average) of an fp32 gradient fused with an elementwise optimizer step: after
  // it, arrays[j][0, count) on every rank hold the step applied to the average of grad[0,
  // count) over ranks (identical bits on every rank); grad[0, count) is left unspecified
  // (averaged or still local). Every rank passes the same count and step, and arrays of the
  // same kind. Where fuses_step() is false for these buffers it is allreduce_then_step(); the
  // fused path gives the same bits (it reduces in the same order and applies the same float
  // operations).
  virtual void allreduce_step(float* grad, size_t count, const ElementwiseStep& step, float* const* arrays) = 0;
  // True when allreduce_step() over these buffers is a fused single pass (gradient in
  // alloc_shared() memory; params and state there or in alloc_shared_single() memory, which
  // the step writes in place, each rank its slice, with no copies to peers), not an all-reduce
  // plus a separate step.
  virtual bool fuses_step(const float* grad, size_t count, float* const* arrays, size_t n_arrays) const = 0;

  // The fused step split in two, so the reduction overlaps backward (the Reducer's default CPU
  // path). Only where splits_step() and fuses_step() hold. Phase 1, reduce_for_step(), may run
  // while backward still reads the parameters: it reads gradients only and leaves on each rank
  // the average of the slice of grad[0, count) that this rank steps. Phase 2, finish_step(),
  // after backward on every rank: for each segment s (one earlier reduce_for_step(grads[s],
  // counts[s]) each), the step over that segment with arrays[s * n_arrays + j], written into
  // every rank's arrays (the one copy, for arrays in alloc_shared_single() memory). Same bits
  // as allreduce_step() over each segment.
  virtual bool splits_step() const { return false; }
  virtual void reduce_for_step(float* /*grad*/, size_t /*count*/) {}
  virtual void finish_step(size_t /*n_segments*/, float* const* /*grads*/, const size_t* /*counts*/,
                           const ElementwiseStep& /*step*/, float* const* /*arrays*/) {}
  // Phase 1 without blocking, for a caller that makes progress itself between pieces of
  // backward (the Reducer's inline progress): start_reduce_for_step() issues it and returns at
  // once; test_reduce_for_step() finishes the started one and returns true once every rank has
  // started it, or returns false at once while one has not (block = false) or waits (block =
  // true). One started at a time, finished before this rank issues anything else. Default:
  // start runs reduce_for_step() to the end (blocking); test returns true.
  virtual void start_reduce_for_step(float* grad, size_t count) { reduce_for_step(grad, count); }
  virtual bool test_reduce_for_step(bool /*block*/) { return true; }

 protected:
  ~FusedStep() = default;
};

// The unfused reference for FusedStep::allreduce_step: allreduce(Avg) of grad in place, then
// step.apply over the whole range.
DDPRUN_WORKER_API void allreduce_then_step(Communicator& comm, float* grad, size_t count, const ElementwiseStep& step,
                                           float* const* arrays);

struct GlooOptions {
  // Collective and connect timeout: a stuck peer surfaces as CommError after this (a dead one
  // at once: its sockets close). PyTorch's default for Gloo, 10 minutes.
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  // Local address for Gloo's TCP pairs: a hostname/IP, or "" = derive (GLOO_SOCKET_IFNAME,
  // loopback when MASTER_ADDR is loopback, else this host's name).
  std::string hostname;
  std::string iface;  // network interface name (GLOO_SOCKET_IFNAME); wins over hostname
  std::string key_prefix = "ddprun/gloo/";
  // When every rank runs on this host, all-reduce through shared memory (see
  // src/shm_allreduce.h) for the dtypes that path handles; Gloo carries the rest and every
  // other collective. init() turns it off for DDPRUN_SHM=0.
  bool shared_memory = true;
};

class Store;

// Builds a full-mesh Gloo context over `store` (keys under options.key_prefix); rank in
// [0, size), size >= 1, the same size and key prefix on every rank. `store` must outlive the
// communicator (alloc_shared() publishes through it). Throws CommError when the mesh cannot be formed within the
// timeout. Sets SIGPIPE to ignored when it is at its default (Gloo's sends would otherwise end the process silently
// when a peer dies; Python does the same).
DDPRUN_WORKER_API std::unique_ptr<Communicator> make_gloo_communicator(Store& store, int rank, int size,
                                                                       const GlooOptions& options);

}  // namespace ddprun::worker
