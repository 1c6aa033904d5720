// The data-parallel gradient reducer (PyTorch DDP's Reducer, model-agnostic).
//
// The program registers its parameter gradients in registration (forward) order. They are
// grouped into buckets in reverse registration order — the order backward produces them —
// with a small first bucket (so communication starts early) and ~25 MiB after that. During
// backward the program calls mark_ready(i) when gradient i is final; when the last gradient
// of a bucket arrives, the bucket's all-reduce (average over ranks) is launched at once and
// overlaps the rest of backward:
//   * host communicators (Gloo): on the reducer's communication thread, or inline on the
//     training thread at each mark_ready (ReducerOptions::progress);
//   * stream-ordered communicators (NCCL): on the communication stream, after an event on
//     the compute stream (comm_waits_for_compute), with the compute stream made to wait in
//     finalize().
// finalize() waits for every bucket; afterwards every rank holds the same averaged gradient.
// Buckets are reduced in the same order on every rank with fixed chunking, so results are
// deterministic run to run (bit-identical resume).
//
// Memory: a bucket whose gradients tile one contiguous range (in any order) is reduced in
// place; otherwise (host memory only) it is staged through a copy. Lay gradients out in one
// flat buffer in registration order to get the in-place path.
//
// Fused optimizer step (host communicators, fp32): register the optimizer's arrays once with
// set_step_arrays() and end each pass with finalize_and_step(step) instead of finalize() plus
// an optimizer pass. Buckets whose gradients and arrays the communicator can average and step
// in one pass (Communicator::fused_step(), FusedStep::fuses_step: the CPU shared-memory path,
// everything in alloc_shared() memory) are fused: each rank steps only its slice of a bucket and writes the
// result into every rank's copy (ZeRO-1 style, but the state stays replicated). Writing
// parameters must wait until every rank is past backward (a slower peer may still read them:
// dX = dz.W runs after mark_ready of W), but the reduction need not: where the communicator
// splits the step (FusedStep::splits_step, the shm path), a fused bucket's reduction
// (reduce_for_step: each rank averages its slice) starts as soon as the bucket is ready, during
// backward like any bucket, and finalize_and_step() only steps the slices and writes them
// everywhere (one finish_step for all fused buckets). A communicator that fuses without
// splitting gets the fused buckets launched in finalize_and_step(), adjacent ones as one
// collective. Every other bucket is all-reduced as usual (overlapped) and stepped locally
// after it. All give the same bits: same reduction order, same per-element float operations
// (see FusedStep::allreduce_step). After set_step_arrays() end synchronised passes with
// finalize_and_step(), not finalize().
//
// Thread-safety: the Reducer is driven from one thread (the training loop).
// Errors: a failed all-reduce is rethrown from finalize() / finalize_and_step() as CommError.
//
// Misuse is an error, never silent divergence (a rank that skipped synchronisation would end
// with different parameters and still exit 0). Each pass must be, on every rank:
//   prepare_for_backward(); backward with mark_ready(i) (or mark_unused(i)) once per gradient;
//   finalize() or finalize_and_step().
// mark_ready/mark_unused outside a pass, finalize without prepare, prepare twice, a gradient
// marked twice, or finalize with gradients never marked throw WorkerError naming the rank, the
// call and what was expected (parameters by index, and by name with ReducerOptions::param_name).
// These checks also run at world size 1 and while sync is off, so a bug shows on one rank.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/worker/communicator.h"

namespace ddprun::worker {

namespace detail {
class ReducerImpl;  // the Reducer's state and machinery (reducer.cpp)
}

// A bucket as a communication hook sees it: its gradients as one contiguous buffer (in place;
// a staging copy when they do not tile one range), in the Reducer's dtype, in host or device
// memory as the communicator works.
struct CommBucket {
  void* data = nullptr;
  size_t count = 0;  // elements
  DType dtype = DType::F32;
  size_t index = 0;     // bucket number in launch order
  bool average = true;  // ReducerOptions::average: whether the result should be the average
};
// PyTorch's register_comm_hook: replaces a bucket's all-reduce. Called on every rank for every
// bucket, in the same order; afterwards bucket.data must hold the bucket's reduced gradients
// (the average over ranks when bucket.average). Runs where the all-reduce would: on the
// communication thread or the training thread (host communicators), or on the training
// thread with the collectives queued on the communication stream (stream-ordered ones: order
// your own device work yourself, e.g. through the tensor collectives of the LibTorch
// component). Throwing fails the pass like a failed all-reduce (CommError from finalize()).
using CommHook = std::function<void(Communicator&, const CommBucket&)>;

struct ReducerOptions {
  size_t bucket_cap_bytes = 25u << 20;
  size_t first_bucket_cap_bytes = 1u << 20;
  bool overlap = true;  // false: launch every bucket in finalize() (for measuring overlap)
  // World size 1: still bucket and launch every collective, as PyTorch's DDP wrapper does, so
  // a one-rank benchmark measures the DDP machinery instead of skipping it. Default: skip.
  bool force_collective = false;
  // Gradients not marked ready (nor unused) by finalize() are treated as unused (mark_unused)
  // instead of being an error, like PyTorch DDP's find_unused_parameters (which finds them by
  // walking the autograd graph; here whatever was not marked is unused). Buckets holding such a
  // gradient can only start in finalize(), so marking unused parameters early overlaps better.
  bool find_unused_parameters = false;
  // true: buckets are averaged over ranks. false: they are summed, and the caller divides by
  // the world size itself, typically inside its optimizer step: that saves a pass over the
  // gradients where the transport's average is one (NCCL's in-place average at world size 1 is a
  // scaling kernel over every byte, its in-place sum nothing; PyTorch's DDP divides in a separate
  // kernel before its sum). Not with set_step_arrays() (the fused CPU step always averages).
  bool average = true;
  // Who runs a host communicator's collectives while backward runs (stream-ordered ones queue
  // on their stream either way):
  //  * Thread: a communication thread of the Reducer. Truly concurrent with backward, so it
  //    hides communication when the rank has a core to spare for it; when ranks occupy every
  //    core it only time-slices with backward (and wakes, preempts and migrates threads).
  //  * Inline: no thread. The training thread itself, at each mark_ready(), starts the next
  //    ready bucket's collective without waiting and finishes it once every rank started it
  //    (a non-blocking check; if a peer is behind, the next mark_ready() checks again), so
  //    it never waits for a peer before finalize(). Only collectives that can be started
  //    without blocking (FusedStep::start_reduce_for_step: the fused step's reduction on
  //    the shared-memory path) progress during backward; any other bucket is reduced in
  //    finalize(). Same collectives in the same order, hence the same bits, as Thread.
  //  * Auto: Inline when the communicator splits the fused step (all ranks on this host,
  //    shared memory) and this process may run on fewer than 2 CPUs per rank
  //    (sched_getaffinity), i.e. no core to spare for a communication thread; else Thread.
  enum class Progress { Auto, Thread, Inline };
  Progress progress = Progress::Auto;
  // Optional: replaces each bucket's all-reduce (see CommHook). Buckets with a hook are never
  // fused with the optimizer step (set_step_arrays steps them after the hook).
  CommHook comm_hook;
  // Optional: the name of parameter i (registration order), used in error messages.
  std::function<std::string(size_t)> param_name;
};

struct GradView {
  void* ptr = nullptr;
  size_t count = 0;  // elements
};

// Bucket assignment: parameter indices per bucket, buckets in launch order, each bucket's
// members in the order backward makes them ready (reverse registration). A bucket is closed
// once its size reaches the cap (the first bucket's cap for bucket 0); a parameter larger
// than the cap gets a bucket of its own.
DDPRUN_WORKER_API std::vector<std::vector<size_t>> plan_buckets(const std::vector<size_t>& param_bytes,
                                                                size_t first_bucket_cap_bytes, size_t bucket_cap_bytes);

class DDPRUN_WORKER_API Reducer {
 public:
  Reducer(Communicator& comm, std::vector<GradView> grads, DType dtype, ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Call before each backward pass.
  void prepare_for_backward();
  // Gradient `index` (registration order) is final for this backward pass.
  void mark_ready(size_t index);
  // Parameter `index` took no part in this pass: its gradient counts as ready, zero-filled
  // unless it received a contribution since the last synchronised pass (no_sync accumulation
  // keeps it, as PyTorch keeps a defined .grad). Host gradients only: for device gradients
  // zero it on the device and call mark_ready().
  void mark_unused(size_t index);
  // Waits for all buckets (launching any not yet launched). Throws CommError; WorkerError when
  // a gradient was never marked (without find_unused_parameters) or on misuse (see above).
  void finalize();

  // Collective, once, outside backward: where the arrays of the ElementwiseStep given to
  // finalize_and_step() live (parameters first, then optimizer state), each laid out like the
  // gradients: element k of arrays[j] belongs to the gradient element grad_base + k
  // (grad_base: the start of the flat buffer the GradViews point into). fp32, host
  // communicators only. Ranks agree (an all-reduce of the choice) on which buckets to fuse.
  void set_step_arrays(const float* grad_base, std::vector<float*> arrays);
  // finalize() and the optimizer step in one: afterwards every rank holds the same arrays,
  // equal bit for bit to finalize() followed by step.apply over every gradient; the
  // gradients themselves are left unspecified (averaged or still local). While sync is off
  // it is finalize(): no communication and no step. Returns whether it stepped.
  // Throws CommError.
  bool finalize_and_step(const ElementwiseStep& step);

  // Gradient accumulation: while sync is off, mark_ready/finalize do no communication and
  // gradients accumulate locally (PyTorch's no_sync()).
  void set_sync(bool sync);
  // Sets (or clears) ReducerOptions::comm_hook; not inside a pass (WorkerError).
  void set_comm_hook(CommHook hook);
  bool sync() const;
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(Reducer& r) : r_(r), prev_(r.sync()) { r_.set_sync(false); }
    ~NoSyncGuard() { r_.set_sync(prev_); }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    Reducer& r_;
    bool prev_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  const std::vector<std::vector<size_t>>& buckets() const;
  // Number of buckets launched before finalize() in the last pass (overlap evidence).
  size_t buckets_launched_early() const;
  // Overlap of the last synchronised pass (host communicators time their collectives).
  struct OverlapStats {
    size_t buckets = 0, buckets_early = 0;  // early: launched during backward (before finalize)
    size_t bytes = 0, bytes_early = 0;
    double comm_ms = 0;     // communication thread's time in this pass's collectives
    double exposed_ms = 0;  // of which finalize waited after backward (the rest was hidden)
    double finish_ms = 0;   // fused step after backward (finish_step / allreduce_step)
    // Collectives that had finished when backward ended (finalize() was called): reduced
    // during backward; the rest was reduced after it.
    size_t buckets_done_early = 0, bytes_done_early = 0;
    double comm_cpu_ms = 0;        // CPU time of the thread(s) running this pass's collectives in them
    bool inline_progress = false;  // Progress::Inline: comm_ms ran on the training thread
  };
  const OverlapStats& overlap() const;
  // Progress::Auto resolved (Thread or Inline).
  ReducerOptions::Progress progress() const;
  // Number of buckets averaged and stepped in one fused pass by the last finalize_and_step(),
  // and the number of fused collectives they took (adjacent fused buckets go as one).
  size_t buckets_fused() const;
  size_t fused_collectives() const;

 private:
  std::unique_ptr<detail::ReducerImpl> impl_;
};

}  // namespace ddprun::worker
