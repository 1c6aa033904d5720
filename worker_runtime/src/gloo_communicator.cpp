// Gloo backend: a gloo::rendezvous::Store adapter over our Store, the TCP transport, and a
// full-mesh context whose timeout bounds every collective. f16/bf16 are reduced in float
// (see reduce_via_float); reduce-scatter is an all-to-all of the blocks plus a local
// reduction in rank order.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <vector>

#include "ddprun/worker/checks.h"
#include "ddprun/worker/communicator.h"
#include "ddprun/worker/error_file.h"
#include "ddprun/worker/store.h"
#include "half.h"
#include "log.h"
#include "collective_check.h"
#include "position_board.h"
#include "shm_allreduce.h"

namespace ddprun::worker {
namespace {

// Gloo's network thread throws gloo::EnforceNotMet when a peer's message does not fit the
// buffer this rank posted for it: the ranks issued collectives of different sizes. Nothing
// catches it in that thread, so it would end in std::terminate (SIGABRT, exit 134) with one
// line of Gloo's. It cannot become an exception in the thread that waits for the collective
// (Gloo's thread is gone and the waiter would only time out), so this handler ends the
// process the way a failed collective ends a worker: the cause named on stderr and in
// TORCHELASTIC_ERROR_FILE, exit 75 (kExitCommFailure). Any other exception goes on to the
// handler that was installed before. Peers see this rank's connections close: a CommError.
std::terminate_handler g_previous_terminate = nullptr;
std::atomic<int> g_gloo_rank{-1};

[[noreturn]] void on_terminate() {
  if (std::exception_ptr ep = std::current_exception()) {
    try {
      std::rethrow_exception(ep);
    } catch (const gloo::EnforceNotMet& e) {
      const std::string msg =
          "CommError: gloo collective failed on rank " + std::to_string(g_gloo_rank.load()) +
          " in Gloo's network thread: a peer sent a message that does not fit the collective this rank issued (" +
          e.what() +
          "). The ranks issued different collectives (a rank-dependent branch, a skipped step, or "
          "different models); DDPRUN_DEBUG_COLLECTIVES=1 names the ranks and their ops";
      detail::log().error("{}", msg);
      detail::log().flush();
      if (const char* path = std::getenv("TORCHELASTIC_ERROR_FILE")) write_error_file(path, msg, "");
      std::_Exit(kExitCommFailure);
    } catch (...) {
    }
  }
  if (g_previous_terminate) g_previous_terminate();
  std::abort();
}

void name_gloo_enforce_failures(int rank) {
  static std::once_flag once;
  g_gloo_rank.store(rank);
  std::call_once(once, [] { g_previous_terminate = std::set_terminate(on_terminate); });
}

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(worker::Store& store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = store_.get(prefix_ + key, timeout_);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> k;
    k.reserve(keys.size());
    for (const auto& key : keys) k.push_back(prefix_ + key);
    store_.wait(k, timeout == gloo::kNoTimeout ? timeout_ : timeout);
  }

 private:
  worker::Store& store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

template <class T>
void reduce_sum(void* c, const void* a, const void* b, size_t n) {
  auto* o = static_cast<T*>(c);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}
template <class T>
void reduce_max(void* c, const void* a, const void* b, size_t n) {
  auto* o = static_cast<T*>(c);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = x[i] > y[i] ? x[i] : y[i];
}

// Avg of a Sum, in place: floats divide, integers truncate toward zero.
template <class T>
void divide(T* p, size_t n, int size) {
  if constexpr (std::is_floating_point_v<T>) {
    const T d = static_cast<T>(size);
    for (size_t i = 0; i < n; ++i) p[i] /= d;
  } else {
    for (size_t i = 0; i < n; ++i) p[i] /= static_cast<T>(size);
  }
}

// The dtypes ShmGroup::allreduce handles (see shm_allreduce.h); the others go over Gloo.
// Keep in step with ShmGroup when it learns more.
// The shared-memory path reduces every DType (f16/bf16 accumulated in float, rounded once,
// like the Gloo path below).
bool shm_handles(DType) { return true; }

bool is_half(DType d) { return d == DType::F16 || d == DType::BF16; }

void widen(const void* in, float* out, size_t n, DType d) {
  const auto* h = static_cast<const uint16_t*>(in);
  if (d == DType::F16)
    for (size_t i = 0; i < n; ++i) out[i] = half_to_float(h[i]);
  else
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(h[i]);
}
void narrow(const float* in, void* out, size_t n, DType d) {
  auto* h = static_cast<uint16_t*>(out);
  if (d == DType::F16)
    for (size_t i = 0; i < n; ++i) h[i] = float_to_half(in[i]);
  else
    for (size_t i = 0; i < n; ++i) h[i] = float_to_bf16(in[i]);
}

class GlooCommunicator final : public Communicator, public FusedStep {
 public:
  GlooCommunicator(Store& store, int rank, int size, const GlooOptions& opt)
      : rank_(rank), size_(size), timeout_(opt.timeout), store_(store), key_prefix_(opt.key_prefix) {
    gloo::transport::tcp::attr attr;
    if (!opt.iface.empty()) {
      attr.iface = opt.iface;
    } else {
      attr.hostname = opt.hostname;
      if (attr.hostname.empty()) {
        char host[256] = {};
        DDPRUN_SYSCHECK(::gethostname(host, sizeof host - 1));
        attr.hostname = host;
      }
    }
    try {
      device_ = gloo::transport::tcp::CreateDevice(attr);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
      ctx->setTimeout(timeout_);
      GlooStoreAdapter adapter(store, opt.key_prefix, timeout_);
      ctx->connectFullMesh(adapter, device_);
      ctx_ = std::move(ctx);
      // DDPRUN_DEBUG_COLLECTIVES=1: ranks compare op signatures before each collective that
      // goes over TCP (the shared-memory path checks every collective anyway).
      if (size_ > 1 && debug_collectives_enabled()) checker_ = std::make_unique<CollectiveChecker>(rank_, size_);
      if (opt.shared_memory && size_ > 1 && size_ <= ShmGroup::kMaxRanks && all_on_this_host(store, opt.key_prefix)) {
        shm_ = ShmGroup::create(
            rank_, size_, timeout_, [&](const std::string& name) { store.set(opt.key_prefix + "shm", name); },
            [&] { return store.get(opt.key_prefix + "shm", timeout_); }, [&] { barrier(); });
      }
      if (size_ > 1 && !shm_) board_ = std::make_unique<PositionBoard>(store, opt.key_prefix, rank_, size_, timeout_);
    } catch (const std::exception& e) {
      throw CommError(std::string("gloo: cannot form the full mesh (rank ") + std::to_string(rank) + " of " +
                      std::to_string(size) + ", local address '" + (attr.iface.empty() ? attr.hostname : attr.iface) +
                      "'): " + e.what());
    }
  }
  ~GlooCommunicator() override = default;

  bool uses_shared_memory() const { return shm_ != nullptr; }

  // Fused steps live on the shared-memory path.
  FusedStep* fused_step() override { return shm_ ? this : nullptr; }

  void* alloc_shared(size_t bytes) override { return alloc_shm(bytes, false); }
  void* alloc_shared_single(size_t bytes) override { return alloc_shm(bytes, true); }

  bool is_single_copy(const void* p, size_t bytes) const override { return shm_ && shm_->is_single(p, bytes); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // "gloo+shm" when the ranks' all-reduces and fused steps go through shared memory (the other
  // collectives still go over Gloo).
  const char* backend() const override { return shm_ ? "gloo+shm" : "gloo"; }

  void allreduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    check_alive("allreduce");
    if (count == 0) return;
    if (shm_ && !shm_->is_single(buf, count * dtype_size(dtype)))
      refuse_single_output("allreduce (a buffer partly in it)", buf, count * dtype_size(dtype));
    if (shm_ && shm_handles(dtype)) {
      guarded("allreduce", [&] { shm_->allreduce(buf, count, dtype, op); });
      return;
    }
    enter(CollectiveOp::AllReduce, dtype, count, static_cast<int>(op));
    if (is_half(dtype)) {
      // Accumulate in float, round once: exact whenever the float sum is, and the same bits
      // on every rank (every rank rounds the same float result).
      std::vector<float> wide(count);
      widen(buf, wide.data(), count, dtype);
      allreduce_typed(wide.data(), count, op);
      narrow(wide.data(), buf, count, dtype);
      return;
    }
    switch (dtype) {
      case DType::F32: return allreduce_typed(static_cast<float*>(buf), count, op);
      case DType::F64: return allreduce_typed(static_cast<double*>(buf), count, op);
      case DType::I32: return allreduce_typed(static_cast<int32_t*>(buf), count, op);
      case DType::I64: return allreduce_typed(static_cast<int64_t*>(buf), count, op);
      case DType::F16:
      case DType::BF16: break;
    }
  }

  void allgather(const void* in, void* out, size_t count, DType dtype) override {
    check_alive("allgather");
    if (count == 0) return;
    refuse_single_output("allgather", out, count * dtype_size(dtype) * static_cast<size_t>(size_));
    const size_t bytes = count * dtype_size(dtype);
    auto* mine = static_cast<unsigned char*>(out) + static_cast<size_t>(rank_) * bytes;
    if (in != mine) std::memcpy(mine, in, bytes);
    if (size_ == 1) return;
    shm_turn(ShmGroup::TransportOp::AllGather, dtype, count, ReduceOp::Sum, 0, "allgather");
    enter(CollectiveOp::AllGather, dtype, count, 0);
    // In place: Gloo gathers every rank's block of `out` (ours is already there).
    guarded("allgather", [&] {
      gloo::AllgatherOptions o(ctx_);
      o.setTag(next_tag());
      o.setTimeout(timeout_);
      o.setOutput(static_cast<uint8_t*>(out), bytes * static_cast<size_t>(size_));
      gloo::allgather(o);
    });
  }

  void reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    check_alive("reduce_scatter");
    if (count == 0) return;
    refuse_single_output("reduce_scatter", out, count * dtype_size(dtype));
    shm_turn(ShmGroup::TransportOp::ReduceScatter, dtype, count, op, 0, "reduce_scatter");
    enter(CollectiveOp::ReduceScatter, dtype, count, static_cast<int>(op));
    switch (dtype) {
      case DType::F32: return reduce_scatter_typed<float, float>(in, out, count, op, dtype);
      case DType::F64: return reduce_scatter_typed<double, double>(in, out, count, op, dtype);
      case DType::I32: return reduce_scatter_typed<int32_t, int32_t>(in, out, count, op, dtype);
      case DType::I64: return reduce_scatter_typed<int64_t, int64_t>(in, out, count, op, dtype);
      case DType::F16:
      case DType::BF16: return reduce_scatter_typed<uint16_t, float>(in, out, count, op, dtype);
    }
  }

  bool fuses_step(const float* grad, size_t count, float* const* arrays, size_t n_arrays) const override {
    return shm_ && count > 0 && shm_->fuses_step(grad, count, arrays, n_arrays);
  }

  void allreduce_step(float* grad, size_t count, const ElementwiseStep& step, float* const* arrays) override {
    if (!fuses_step(grad, count, arrays, step.num_arrays())) {
      for (size_t j = 0; j < step.num_arrays(); ++j)
        refuse_single_output("allreduce_step (not fused: the gradient is not in alloc_shared memory)", arrays[j],
                             count * sizeof(float));
      return allreduce_then_step(*this, grad, count, step, arrays);
    }
    check_alive("allreduce_step");
    guarded("allreduce_step", [&] { shm_->allreduce_step(grad, count, step, arrays); });
  }

  bool splits_step() const override { return shm_ != nullptr; }
  void reduce_for_step(float* grad, size_t count) override {
    check_alive("reduce_for_step");
    guarded("reduce_for_step", [&] { shm_->reduce_for_step(grad, count); });
  }
  void start_reduce_for_step(float* grad, size_t count) override {
    check_alive("reduce_for_step");
    guarded("reduce_for_step", [&] { shm_->start_reduce_for_step(grad, count); });
  }
  bool test_reduce_for_step(bool block) override {
    check_alive("reduce_for_step");
    bool done = false;
    guarded("reduce_for_step", [&] { done = shm_->test_reduce_for_step(block); });
    return done;
  }
  void finish_step(size_t n_segments, float* const* grads, const size_t* counts, const ElementwiseStep& step,
                   float* const* arrays) override {
    check_alive("finish_step");
    guarded("finish_step", [&] { shm_->finish_step(n_segments, grads, counts, step, arrays); });
  }

  void broadcast(void* buf, size_t bytes, int root) override {
    check_alive("broadcast");
    if (bytes == 0) return;
    if (shm_ && shm_->is_single(buf, bytes)) {  // one copy: already root's everywhere
      guarded("broadcast", [&] { shm_->broadcast_single(buf, bytes, root); });
      return;
    }
    refuse_single_output("broadcast (a buffer partly in it)", buf, bytes);
    shm_turn(ShmGroup::TransportOp::Broadcast, DType::F32, bytes, ReduceOp::Sum, static_cast<uint32_t>(root),
             "broadcast");
    enter(CollectiveOp::Broadcast, DType::F32, bytes, root);
    guarded("broadcast", [&] {
      gloo::BroadcastOptions o(ctx_);
      o.setTag(next_tag());
      o.setTimeout(timeout_);
      o.setOutput(static_cast<uint8_t*>(buf), bytes);
      o.setRoot(root);
      gloo::broadcast(o);
    });
  }

  void barrier() override {
    check_alive("barrier");
    shm_turn(ShmGroup::TransportOp::Barrier, DType::F32, 0, ReduceOp::Sum, 0, "barrier");
    enter(CollectiveOp::Barrier, DType::F32, 0, 0);
    guarded("barrier", [&] {
      gloo::BarrierOptions o(ctx_);
      o.setTag(next_tag());
      o.setTimeout(timeout_);
      gloo::barrier(o);
    });
  }

  void abort() noexcept override { aborted_.store(true); }

 private:
  // alloc_shared / alloc_shared_single: the segment's name travels through the store under a
  // key numbered in call order (the same on every rank: both are collective).
  void* alloc_shm(size_t bytes, bool single) {
    const char* what = single ? "alloc_shared_single" : "alloc_shared";
    if (!shm_ || bytes == 0) return nullptr;
    check_alive(what);
    const std::string key = key_prefix_ + "shm/region/" + std::to_string(regions_++);
    auto publish = [&](const std::string& name) { store_.set(key, name); };
    auto fetch = [&] { return store_.get(key, timeout_); };
    auto bar = [&] { barrier(); };
    void* p = nullptr;
    guarded(what, [&] {
      p = single ? shm_->alloc_shared_single(bytes, publish, fetch, bar)
                 : shm_->alloc_shared(bytes, publish, fetch, bar);
    });
    return p;
  }

  uint32_t next_tag() { return tag_++; }

  template <class T>
  void allreduce_typed(T* buf, size_t count, ReduceOp op) {
    guarded("allreduce", [&] {
      gloo::AllreduceOptions o(ctx_);
      o.setTag(next_tag());
      o.setTimeout(timeout_);
      o.setOutput(buf, count);
      o.setReduceFunction(op == ReduceOp::Max ? &reduce_max<T> : &reduce_sum<T>);
      gloo::allreduce(o);
    });
    if (op == ReduceOp::Avg) divide(buf, count, size_);
  }

  // Every rank sends block r of its input to rank r (one all-to-all), then reduces the
  // blocks it received in rank order, in Acc (float for f16/bf16: one rounding at the end).
  template <class T, class Acc>
  void reduce_scatter_typed(const void* in, void* out, size_t count, ReduceOp op, DType dtype) {
    const size_t n = static_cast<size_t>(size_);
    std::vector<T> recv(count * n);
    if (size_ == 1) {
      std::memcpy(recv.data(), in, count * sizeof(T));
    } else {
      guarded("reduce_scatter", [&] {
        gloo::AlltoallOptions o(ctx_);
        o.setTag(next_tag());
        o.setTimeout(timeout_);
        o.setInput(const_cast<T*>(static_cast<const T*>(in)), count * n);
        o.setOutput(recv.data(), count * n);
        gloo::alltoall(o);
      });
    }
    std::vector<Acc> acc(count);
    auto load = [&](const T* p, Acc* dst) {
      if constexpr (std::is_same_v<T, Acc>) std::memcpy(dst, p, count * sizeof(T));
      else widen(p, dst, count, dtype);
    };
    load(recv.data(), acc.data());
    std::vector<Acc> next(std::is_same_v<T, Acc> ? 0 : count);
    for (size_t r = 1; r < n; ++r) {
      const T* blk = recv.data() + r * count;
      const Acc* v = nullptr;
      if constexpr (std::is_same_v<T, Acc>) {
        v = blk;
      } else {
        widen(blk, next.data(), count, dtype);
        v = next.data();
      }
      if (op == ReduceOp::Max)
        for (size_t i = 0; i < count; ++i) acc[i] = v[i] > acc[i] ? v[i] : acc[i];
      else
        for (size_t i = 0; i < count; ++i) acc[i] += v[i];
    }
    if (op == ReduceOp::Avg) divide(acc.data(), count, size_);
    if constexpr (std::is_same_v<T, Acc>) std::memcpy(out, acc.data(), count * sizeof(T));
    else narrow(acc.data(), out, count, dtype);
  }

  // Every rank publishes "hostname boot_id"; true when all are equal to ours.
  bool all_on_this_host(Store& store, const std::string& prefix) {
    char host[256] = {};
    DDPRUN_SYSCHECK(::gethostname(host, sizeof host - 1));
    std::string boot_id;
    std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
    const std::string me = std::string(host) + " " + boot_id;
    store.set(prefix + "host/" + std::to_string(rank_), me);
    bool same = true;
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && store.get(prefix + "host/" + std::to_string(r), timeout_) != me) same = false;
    return same;
  }
  // On the shared-memory path, a collective over Gloo first takes its turn in the shm op
  // sequence (ShmGroup::check_transport_op): ranks that diverged between a shm op and a Gloo
  // op fail at once, naming both, instead of each waiting for the other until the timeout.
  void shm_turn(ShmGroup::TransportOp op, DType dtype, size_t count, ReduceOp rop, uint32_t extra, const char* what) {
    if (!shm_ || size_ == 1) return;
    guarded(what, [&] { shm_->check_transport_op(op, dtype, count, rop, extra); });
  }
  // A collective over Gloo's TCP pairs starts: noted as this rank's position (published for
  // the peers' errors), then the debug-mode signature check (collective_check.h): one small
  // all-gather, same transport.
  void enter(CollectiveOp op, DType dtype, size_t count, int arg) {
    if (board_) board_->note(op, dtype, count, arg);
    if (!checker_) return;
    guarded("collective check", [&] {
      checker_->check(op, dtype, count, arg, [&](const void* mine, void* all, size_t bytes) {
        std::memcpy(static_cast<unsigned char*>(all) + static_cast<size_t>(rank_) * bytes, mine, bytes);
        gloo::AllgatherOptions o(ctx_);
        o.setTag(next_tag());
        o.setTimeout(timeout_);
        o.setOutput(static_cast<uint8_t*>(all), bytes * static_cast<size_t>(size_));
        gloo::allgather(o);
      });
    });
  }
  // Every rank would write all of `out`, the same bytes of the one copy: a data race. Thrown on
  // every rank alike (the memory was allocated collectively).
  void refuse_single_output(const char* what, const void* out, size_t bytes) const {
    if (shm_ && shm_->overlaps_single(out, bytes))
      throw WorkerError(std::string("gloo ") + what +
                        ": the output lies in alloc_shared_single() memory, which every "
                        "rank maps as one copy, so every rank would write the same bytes. Expected an output in "
                        "alloc_shared() or private memory");
  }
  void check_alive(const char* what) {
    if (aborted_.load()) throw CommError(std::string("gloo ") + what + ": communicator aborted");
  }
  template <class F>
  void guarded(const char* what, F&& f) {
    try {
      f();
    } catch (const CommError&) {
      aborted_.store(true);
      throw;
    } catch (const WorkerError&) {
      throw;
    } catch (const std::exception& e) {
      aborted_.store(true);  // a failed collective leaves the mesh unusable
      throw CommError(describe_failure(what, e.what()));
    }
  }

  // The timeout is named only when it is what ended the collective; a peer that closed its
  // connection (it exited or failed) is said as such. Either way, where every rank is.
  std::string describe_failure(const char* what, const std::string& cause) const {
    std::string msg = std::string("gloo ") + what + " failed on rank " + std::to_string(rank_);
    auto has = [&](const char* s) { return cause.find(s) != std::string::npos; };
    bool stuck = true;
    if (has("imed out") || has("imeout"))
      msg += " (no progress within the timeout of " + std::to_string(timeout_.count()) + " ms)";
    else if (has("losed") || has("reset") || has("Broken pipe") || has("EOF"))
      msg += " (a peer rank closed its connection: it exited or failed; its own error says why)";
    else stuck = false;
    return msg + ": " + cause + (stuck && board_ ? board_->where_ranks_are() : "");
  }

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> ctx_;
  uint32_t tag_ = 1;
  std::atomic<bool> aborted_{false};
  std::unique_ptr<ShmGroup> shm_;
  std::unique_ptr<CollectiveChecker> checker_;
  worker::Store& store_;
  std::string key_prefix_;
  std::unique_ptr<PositionBoard> board_;  // the pure Gloo path: where each rank is, for errors
  int regions_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(Store& store, int rank, int size, const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size)
    throw WorkerError("make_gloo_communicator: rank " + std::to_string(rank) + " of size " + std::to_string(size) +
                      " (need 0 <= rank < size)");
  // Gloo's TCP pairs send with writev, which raises SIGPIPE when the peer has gone: its default
  // action would end this process silently instead of failing the collective with a
  // CommError. Ignored process-wide, as Python (and so PyTorch) does, unless the program
  // installed a handler of its own.
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL && !(current.sa_flags & SA_SIGINFO))
    ::signal(SIGPIPE, SIG_IGN);
  name_gloo_enforce_failures(rank);
  return std::make_unique<GlooCommunicator>(store, rank, size, options);
}

}  // namespace ddprun::worker
