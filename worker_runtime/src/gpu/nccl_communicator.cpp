// NCCL backend. Bootstrap through the store (rank 0 publishes the unique id), a non-blocking
// communicator so that init and every call can be bounded, a dedicated communication stream,
// and a watchdog thread that turns an async NCCL error or a collective older than the
// timeout into abort + error file + exit(kExitCommFailure), so no rank hangs on a dead peer.
// With DDPRUN_DEBUG_COLLECTIVES=1 every collective is preceded by a signature check. The
// collectives of a Reducer's pass are bracketed with timing events (detail::StreamTiming).
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "ddprun/worker/checks.h"
#include "ddprun/worker/error_file.h"
#include "ddprun/worker/gpu_checks.h"
#include "collective_check.h"
#include "gpu_backend.h"
#include "gpu_libs.h"
#include "log.h"
#include "position_board.h"
#include "stream_timing.h"

namespace ddprun::worker {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t to_nccl(DType d) {
  switch (d) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::F64: return ncclFloat64;
    case DType::I64: return ncclInt64;
  }
  return ncclFloat32;
}
ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

class NcclCommunicator final : public Communicator, public detail::StreamTiming {
 public:
  NcclCommunicator(Store* store, int rank, int size, int device, std::chrono::milliseconds timeout,
                   std::string error_file, const std::string& key_prefix)
      : rank_(rank), size_(size), device_(device), timeout_(timeout), error_file_(std::move(error_file)) {
    const std::string id_key = key_prefix + "unique_id";
    DDPRUN_CUDA_CHECK(cudaSetDevice(device_));
    ncclUniqueId id;
    if (rank_ == 0) {
      DDPRUN_NCCL_CHECK(ncclGetUniqueId(&id));
      if (size_ > 1) store->set(id_key, std::string(reinterpret_cast<const char*>(&id), sizeof id));
    } else {
      DDPRUN_ENFORCE(store != nullptr, "NCCL with more than one rank needs the store");
      const std::string v = store->get(id_key, timeout_);
      if (v.size() != sizeof id)
        throw CommError("NCCL unique id in the store has " + std::to_string(v.size()) + " bytes");
      std::memcpy(&id, v.data(), sizeof id);
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    DDPRUN_NCCL_CHECK(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config));
    wait_not_in_progress("ncclCommInitRankConfig");
    DDPRUN_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    DDPRUN_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
    DDPRUN_CUDA_CHECK(cudaEventCreateWithFlags(&comm_done_, cudaEventDisableTiming));
    DDPRUN_CUDA_CHECK(cudaMalloc(&scratch_, 64));
    // DDPRUN_DEBUG_COLLECTIVES=1: compare op signatures before each collective. Also at world
    // size 1, where it compares only with itself but runs the same device path.
    if (debug_collectives_enabled()) {
      checker_ = std::make_unique<CollectiveChecker>(rank_, size_);
      DDPRUN_CUDA_CHECK(cudaMalloc(&sig_dev_, sizeof(CollectiveSignature) * static_cast<size_t>(size_)));
      DDPRUN_CUDA_CHECK(cudaMallocHost(&sig_host_, sizeof(CollectiveSignature) * static_cast<size_t>(size_ + 1)));
    }
    // Where each rank is, named when a collective times out (a peer never joined it).
    if (size_ > 1 && store) board_ = std::make_unique<PositionBoard>(*store, key_prefix, rank_, size_, timeout_);
    watchdog_ = std::thread([this] { watchdog_main(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (comm_) {
      if (aborted_.load()) {
        // already aborted
      } else if (cudaStreamSynchronize(comm_stream_) == cudaSuccess) {
        ncclCommFinalize(comm_);
        wait_not_in_progress_noexcept();
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    for (auto& p : pending_) cudaEventDestroy(p.event);
    for (auto e : free_events_) cudaEventDestroy(e);
    timed_.push_back(std::move(open_pass_));
    for (auto& p : timed_) recycle(p);
    for (auto e : timing_free_) cudaEventDestroy(e);
    if (scratch_) cudaFree(scratch_);
    if (sig_dev_) cudaFree(sig_dev_);
    if (sig_host_) cudaFreeHost(sig_host_);
    if (compute_done_) cudaEventDestroy(compute_done_);
    if (comm_done_) cudaEventDestroy(comm_done_);
    if (comm_stream_) cudaStreamDestroy(comm_stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }
  bool stream_ordered() const override { return true; }
  void set_compute_stream(void* stream) override { compute_stream_ = static_cast<cudaStream_t>(stream); }

  void comm_waits_for_compute() override {
    DDPRUN_CUDA_CHECK(cudaEventRecord(compute_done_, compute_stream_));
    DDPRUN_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, compute_done_, 0));
  }
  void compute_waits_for_comm() override {
    DDPRUN_CUDA_CHECK(cudaEventRecord(comm_done_, comm_stream_));
    DDPRUN_CUDA_CHECK(cudaStreamWaitEvent(compute_stream_, comm_done_, 0));
  }

  // allreduce, allgather and reduce_scatter read what the compute stream produced, so they
  // wait for it; the compute stream does not wait for them (the caller orders its use of the
  // results with compute_waits_for_comm(), letting the Reducer's buckets overlap backward).
  void allreduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    check_alive("allreduce");
    if (count == 0) return;
    enter(CollectiveOp::AllReduce, dtype, count, static_cast<int>(op));
    comm_waits_for_compute();
    const cudaEvent_t t0 = timed_start();
    DDPRUN_NCCL_CHECK(ncclAllReduce(buf, buf, count, to_nccl(dtype), to_nccl(op), comm_, comm_stream_));
    wait_not_in_progress("ncclAllReduce");
    timed_end(t0);
    track("allreduce");
  }

  // The value goes through the 64-byte scratch buffer on the communication stream (after the
  // collectives issued before it, so the answer also says they finished): one NCCL all-reduce
  // of 4 bytes and a wait, fine once per step.
  int32_t allreduce_max_host(int32_t value) override {
    check_alive("allreduce_max_host");
    enter(CollectiveOp::AllReduce, DType::I32, 1, static_cast<int>(ReduceOp::Max));
    // From pageable memory: returns once `value` is staged, so the local may change after.
    DDPRUN_CUDA_CHECK(cudaMemcpyAsync(scratch_, &value, sizeof value, cudaMemcpyHostToDevice, comm_stream_));
    DDPRUN_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclMax, comm_, comm_stream_));
    wait_not_in_progress("ncclAllReduce");
    track("allreduce_max_host");
    int32_t out = 0;
    DDPRUN_CUDA_CHECK(cudaMemcpyAsync(&out, scratch_, sizeof out, cudaMemcpyDeviceToHost, comm_stream_));
    synchronize();
    return out;
  }

  void allgather(const void* in, void* out, size_t count, DType dtype) override {
    check_alive("allgather");
    if (count == 0) return;
    enter(CollectiveOp::AllGather, dtype, count, 0);
    comm_waits_for_compute();
    const cudaEvent_t t0 = timed_start();
    DDPRUN_NCCL_CHECK(ncclAllGather(in, out, count, to_nccl(dtype), comm_, comm_stream_));
    wait_not_in_progress("ncclAllGather");
    timed_end(t0);
    track("allgather");
  }

  void reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    check_alive("reduce_scatter");
    if (count == 0) return;
    enter(CollectiveOp::ReduceScatter, dtype, count, static_cast<int>(op));
    comm_waits_for_compute();
    const cudaEvent_t t0 = timed_start();
    DDPRUN_NCCL_CHECK(ncclReduceScatter(in, out, count, to_nccl(dtype), to_nccl(op), comm_, comm_stream_));
    wait_not_in_progress("ncclReduceScatter");
    timed_end(t0);
    track("reduce_scatter");
  }

  void broadcast(void* buf, size_t bytes, int root) override {
    check_alive("broadcast");
    enter(CollectiveOp::Broadcast, DType::F32, bytes, root);
    comm_waits_for_compute();
    DDPRUN_NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, comm_stream_));
    wait_not_in_progress("ncclBroadcast");
    track("broadcast");
    compute_waits_for_comm();
  }

  void barrier() override {
    check_alive("barrier");
    enter(CollectiveOp::Barrier, DType::F32, 0, 0);
    comm_waits_for_compute();
    DDPRUN_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, comm_stream_));
    wait_not_in_progress("barrier");
    track("barrier");
    synchronize();
  }

  // ---- detail::StreamTiming (called on the thread that issues the collectives) ----
  void timing_begin_pass() override {
    if (open_pass_.open) end_open_pass();
    open_pass_.open = true;
  }
  void timing_mark_backward_end() override {
    if (!open_pass_.open || open_pass_.mark) return;
    open_pass_.mark = timing_event();
    if (open_pass_.mark && cudaEventRecord(open_pass_.mark, compute_stream_) != cudaSuccess) {
      timing_free_.push_back(open_pass_.mark);
      open_pass_.mark = nullptr;
    }
  }
  void timing_end_pass() override {
    if (open_pass_.open) end_open_pass();
  }
  void timing_take(double& comm_ms, double& exposed_ms) override {
    while (!timed_.empty()) {
      TimedPass& p = timed_.front();
      if (!p.ops.empty()) {
        const cudaEvent_t last = p.ops.back().second;
        if (cudaEventQuery(last) == cudaErrorNotReady || (p.mark && cudaEventQuery(p.mark) == cudaErrorNotReady)) break;
        double comm = 0;
        bool ok = true;
        for (auto [a, b] : p.ops) {
          float ms = 0;
          ok = ok && cudaEventElapsedTime(&ms, a, b) == cudaSuccess;
          comm += ms;
        }
        // Exposed: from backward's end on the compute stream to the last collective's end.
        float after = 0;
        if (!p.mark || (ok && cudaEventElapsedTime(&after, p.mark, last) != cudaSuccess)) ok = false;
        if (ok) {
          comm_ms += comm;
          exposed_ms += std::clamp(static_cast<double>(after), 0.0, comm);
        }
      }
      recycle(p);
      timed_.pop_front();
    }
  }

  void synchronize() override {
    // Poll so that an abort by the watchdog (which exits the process) is never blocked on.
    for (;;) {
      check_alive("synchronize");
      cudaError_t e = cudaStreamQuery(comm_stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) DDPRUN_CUDA_CHECK(e);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void abort() noexcept override {
    bool expected = false;
    if (aborted_.compare_exchange_strong(expected, true) && comm_) ncclCommAbort(comm_);
  }

 private:
  struct Pending {
    cudaEvent_t event;
    Clock::time_point enqueued;
    const char* what;
  };

  void check_alive(const char* what) {
    if (aborted_.load()) throw CommError(std::string("nccl ") + what + ": communicator aborted");
  }

  // A collective is issued: noted as this rank's position (PositionBoard), then the debug-mode
  // signature check (collective_check.h): this rank's 32-byte signature goes
  // into its slot of a device table, an in-place ncclAllGather on the communication stream
  // fills the others, and the host waits for the copy back before comparing. Queued behind
  // earlier collectives, so it waits for them too; ranks that diverged get a CommError here
  // instead of a hang or mixed data in the collective that follows.
  void enter(CollectiveOp op, DType dtype, size_t count, int arg) {
    if (board_) board_->note(op, dtype, count, arg);
    if (!checker_) return;
    constexpr size_t kSig = sizeof(CollectiveSignature);
    const CollectiveSignature mine = checker_->next(op, dtype, count, arg);
    CollectiveSignature* staged = sig_host_ + size_;  // pinned: the copy is truly asynchronous
    *staged = mine;
    auto* slot = static_cast<unsigned char*>(sig_dev_) + static_cast<size_t>(rank_) * kSig;
    DDPRUN_CUDA_CHECK(cudaMemcpyAsync(slot, staged, kSig, cudaMemcpyHostToDevice, comm_stream_));
    DDPRUN_NCCL_CHECK(ncclAllGather(slot, sig_dev_, kSig, ncclUint8, comm_, comm_stream_));
    wait_not_in_progress("collective check");
    track("collective check");
    DDPRUN_CUDA_CHECK(
        cudaMemcpyAsync(sig_host_, sig_dev_, kSig * static_cast<size_t>(size_), cudaMemcpyDeviceToHost, comm_stream_));
    synchronize();  // bounded: the watchdog aborts a check a dead peer never joins
    checker_->verify(mine, sig_host_);
  }

  // In non-blocking mode any call may return ncclInProgress; the next call must wait for it.
  void wait_not_in_progress(const char* what) {
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      ncclResult_t st = ncclInProgress;
      DDPRUN_NCCL_CHECK(ncclCommGetAsyncError(comm_, &st));
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) {
        abort();
        throw CommError(std::string("nccl ") + what + ": " + ncclGetErrorString(st) + " (" + ncclGetLastError(comm_) +
                        ")");
      }
      if (Clock::now() > deadline) {
        abort();
        throw CommError(std::string("nccl ") + what + ": timed out after " + std::to_string(timeout_.count()) + " ms");
      }
      std::this_thread::yield();
    }
  }
  void wait_not_in_progress_noexcept() noexcept {
    ncclResult_t st = ncclInProgress;
    const auto deadline = Clock::now() + timeout_;
    while (ncclCommGetAsyncError(comm_, &st) == ncclSuccess && st == ncclInProgress && Clock::now() < deadline)
      std::this_thread::yield();
  }

  void track(const char* what) {
    cudaEvent_t ev;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!free_events_.empty()) {
        ev = free_events_.back();
        free_events_.pop_back();
      } else {
        DDPRUN_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      }
    }
    DDPRUN_CUDA_CHECK(cudaEventRecord(ev, comm_stream_));
    std::lock_guard<std::mutex> lk(mu_);
    pending_.push_back({ev, Clock::now(), what});
  }

  [[noreturn]] void die(const std::string& msg) {
    detail::log().error("rank {}: {}; aborting the NCCL communicator", rank_, msg);
    abort();
    write_error_file(error_file_, "CommError: " + msg, "rank " + std::to_string(rank_) + ": nccl watchdog\n" + msg);
    std::fflush(nullptr);
    ::_exit(kExitCommFailure);
  }

  void watchdog_main() {
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, std::chrono::milliseconds(100));
      if (stop_ || aborted_.load()) break;
      ncclResult_t st = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress)
        die(std::string("NCCL async error: ") + ncclGetErrorString(st) + " (" + ncclGetLastError(comm_) + ")");
      while (!pending_.empty()) {
        Pending& p = pending_.front();
        cudaError_t q = cudaEventQuery(p.event);
        if (q == cudaSuccess) {
          free_events_.push_back(p.event);
          pending_.pop_front();
          continue;
        }
        if (q != cudaErrorNotReady)
          die(std::string("CUDA error while waiting for ") + p.what + ": " + cudaGetErrorString(q));
        if (Clock::now() - p.enqueued > timeout_)
          die(std::string("NCCL ") + p.what + " did not finish within " + std::to_string(timeout_.count()) +
              " ms (a peer died or hangs)" + (board_ ? board_->where_ranks_are() : std::string()));
        break;
      }
    }
  }

  // A Reducer pass's timed collectives (start and end events on comm_stream_) and the mark of
  // backward's end on the compute stream.
  struct TimedPass {
    bool open = false;
    std::vector<std::pair<cudaEvent_t, cudaEvent_t>> ops;
    cudaEvent_t mark = nullptr;
  };
  static constexpr size_t kMaxTimedPasses = 16;  // unread ones past this are dropped
  cudaEvent_t timing_event() {
    if (!timing_free_.empty()) {
      cudaEvent_t e = timing_free_.back();
      timing_free_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    return cudaEventCreate(&e) == cudaSuccess ? e : nullptr;  // timing enabled
  }
  // Timing is best effort: an event that cannot be had or recorded leaves the pass untimed.
  cudaEvent_t timed_start() {
    if (!open_pass_.open) return nullptr;
    cudaEvent_t e = timing_event();
    if (e && cudaEventRecord(e, comm_stream_) != cudaSuccess) {
      timing_free_.push_back(e);
      return nullptr;
    }
    if (!e) abandon_pass();
    return e;
  }
  void timed_end(cudaEvent_t start) {
    if (!start) return;
    cudaEvent_t e = timing_event();
    if (!e || cudaEventRecord(e, comm_stream_) != cudaSuccess) {
      if (e) timing_free_.push_back(e);
      timing_free_.push_back(start);
      abandon_pass();
      return;
    }
    open_pass_.ops.emplace_back(start, e);
  }
  void end_open_pass() {
    open_pass_.open = false;
    timed_.push_back(std::move(open_pass_));
    open_pass_ = TimedPass{};
    while (timed_.size() > kMaxTimedPasses) {
      recycle(timed_.front());
      timed_.pop_front();
    }
  }
  void abandon_pass() {
    recycle(open_pass_);
    open_pass_ = TimedPass{};
  }
  void recycle(TimedPass& p) {
    for (auto [a, b] : p.ops) timing_free_.push_back(a), timing_free_.push_back(b);
    if (p.mark) timing_free_.push_back(p.mark);
    p.ops.clear();
    p.mark = nullptr;
  }

  int rank_, size_, device_;
  std::chrono::milliseconds timeout_;
  std::string error_file_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t comm_stream_ = nullptr;
  cudaStream_t compute_stream_ = nullptr;  // legacy default stream
  cudaEvent_t compute_done_ = nullptr, comm_done_ = nullptr;
  void* scratch_ = nullptr;
  std::unique_ptr<CollectiveChecker> checker_;  // DDPRUN_DEBUG_COLLECTIVES=1 only
  std::unique_ptr<PositionBoard> board_;        // more than one rank: where each is, for a timeout
  void* sig_dev_ = nullptr;                     // size_ signatures
  CollectiveSignature* sig_host_ = nullptr;     // pinned: size_ gathered + 1 staged
  std::atomic<bool> aborted_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  TimedPass open_pass_;
  std::deque<TimedPass> timed_;
  std::vector<cudaEvent_t> timing_free_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace

bool gpu_backend_available() { return detail::gpu_lib_loadable(detail::GpuLib::Nccl); }

std::string gpu_backend_problem() {
  try {
    detail::require_gpu_lib(detail::GpuLib::Nccl);
    return {};
  } catch (const WorkerError& e) {
    return e.what();
  }
}

int gpu_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string gpu_no_device_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess) return n > 0 ? std::string() : "no GPU";
  cudaGetLastError();
  std::string why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  if (e == cudaErrorInsufficientDriver)
    why += "; no NVIDIA driver (libcuda.so.1) new enough for CUDA " + std::to_string(CUDART_VERSION / 1000);
  return why;
}

void gpu_set_device(int device) { DDPRUN_CUDA_CHECK(cudaSetDevice(device)); }

std::unique_ptr<Communicator> make_nccl_communicator(Store* store, int rank, int size, int device,
                                                     std::chrono::milliseconds timeout, const std::string& error_file,
                                                     const std::string& key_prefix) {
  detail::require_gpu_lib(detail::GpuLib::Nccl);  // or the line that says what to install
  try {
    return std::make_unique<NcclCommunicator>(store, rank, size, device, timeout, error_file, key_prefix);
  } catch (const CommError& e) {
    throw CommError(std::string("NCCL bootstrap failed: ") + e.what());
  }
}

}  // namespace ddprun::worker
