#include "ddprun/worker/runtime.h"

#include "log.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "ddprun/client/store_client.h"
#include "ddprun/common/knobs.h"
#include "ddprun/server/store_server.h"
#include "ddprun/worker/checks.h"
#include "ddprun/worker/error_file.h"
#include "collective_check.h"
#include "gpu_backend.h"
#include "knob_flag.h"
#include "store_impl.h"

namespace ddprun::worker {
namespace {

// A communicator for a world of one: every collective is the identity (a copy where input
// and output differ).
class SelfCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "self"; }
  void allreduce(void*, size_t, DType, ReduceOp) override { check_alive(); }
  void broadcast(void*, size_t, int root) override {
    check_alive();
    if (root != 0) throw WorkerError("broadcast: root " + std::to_string(root) + " is not a rank of a world of 1");
  }
  void allgather(const void* in, void* out, size_t count, DType dtype) override {
    check_alive();
    if (in != out && count > 0) std::memmove(out, in, count * dtype_size(dtype));
  }
  void reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp) override {
    check_alive();
    if (in != out && count > 0) std::memmove(out, in, count * dtype_size(dtype));
  }
  void barrier() override { check_alive(); }
  void abort() noexcept override { aborted_.store(true); }

 private:
  void check_alive() const {
    if (aborted_.load()) throw CommError("self communicator: aborted");
  }
  std::atomic<bool> aborted_{false};
};

class RuntimeImpl final : public Runtime {
 public:
  const WorkerEnv& env() const override { return env_; }
  Communicator& comm() override { return *comm_; }
  Store* store() override { return store_.get(); }
  bool on_cuda() const override { return on_cuda_; }
  int cuda_device() const override { return device_; }

  WorkerEnv env_;
  std::unique_ptr<server::StoreServer> server_;  // rank 0 without a launcher store (srun, env://)
  std::unique_ptr<Store> store_;
  std::unique_ptr<Store> local_store_;  // the rendezvous of a lone rank's real communicator
  std::unique_ptr<Communicator> comm_;
  bool on_cuda_ = false;
  int device_ = -1;
};

bool is_loopback(const std::string& addr) { return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1"; }

std::chrono::milliseconds env_seconds(const knobs::Knob& knob, std::chrono::milliseconds def) {
  const auto value = knobs::get(knob);
  if (!value) return def;
  const char* v = value->c_str();
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(s > 0))
    throw WorkerError(std::string("environment variable ") + knob.name + "='" + v +
                      "' is not a positive number of seconds");
  return std::chrono::milliseconds(static_cast<long long>(s * 1000));
}

}  // namespace

// The device first: NCCL is loaded only where there is a GPU to use it on.
bool cuda_available() { return gpu_device_count() > 0 && gpu_backend_available(); }

std::unique_ptr<Runtime> init(RuntimeOptions options) {
  auto rt = std::make_unique<RuntimeImpl>();
  rt->env_ = read_worker_env();
  const WorkerEnv& env = rt->env_;
  // The 0/1 knobs are checked up front, so a bad value fails every run, not only the runs
  // (world size > 1, CPU) that happen to read it.
  (void)knob_flag(knobs::kShm);
  (void)debug_collectives_enabled();
  if (options.apply_env_overrides) {
    options.timeout = env_seconds(knobs::kCollectiveTimeout, options.timeout);
    options.store_timeout = env_seconds(knobs::kStoreTimeout, options.store_timeout);
    if (const auto d = knobs::get(knobs::kDevice)) {
      const std::string s = *d;
      if (s == "cpu") options.device = DeviceKind::Cpu;
      else if (s == "cuda") options.device = DeviceKind::Cuda;
      else if (s == "auto") options.device = DeviceKind::Auto;
      else throw WorkerError("DDPRUN_DEVICE='" + s + "': expected cpu, cuda or auto");
    }
  }
  bool cuda = false;
  if (options.device == DeviceKind::Cuda) {
    if (!gpu_backend_available()) throw WorkerError("--device cuda: " + gpu_backend_problem());
    if (gpu_device_count() == 0)
      throw WorkerError("--device cuda: no CUDA device visible (" + gpu_no_device_reason() + ")");
    cuda = true;
  } else if (options.device == DeviceKind::Auto) {
    if (gpu_device_count() > 0 && !gpu_backend_available())
      detail::log().warn("GPUs are visible, but {}: using the CPU (Gloo)", gpu_backend_problem());
    // One GPU per local rank, or the CPU: NCCL cannot put two ranks on one GPU.
    cuda = cuda_available() && env.local_world_size <= gpu_device_count();
    if (cuda_available() && !cuda)
      detail::log().warn("{} local ranks but {} GPUs: using the CPU (Gloo)", env.local_world_size, gpu_device_count());
  }
  if (cuda) {
    const int n = gpu_device_count();
    rt->device_ = env.local_rank % n;
    gpu_set_device(rt->device_);
    rt->on_cuda_ = true;
  }

  // A launcher's store is joined even by a lone rank: the launcher reads init/ to tell a failure
  // after start-up (retried) from one before it (an import error: not retried).
  const bool need_store = !env.standalone && (env.world_size > 1 || env.use_agent_store);
  if (need_store && !env.use_agent_store && env.rank == 0) {
    server::StoreServerOptions ss;
    ss.port = env.master_port;
    try {
      rt->server_ = std::make_unique<server::StoreServer>(ss);
      rt->server_->start();
    } catch (const std::exception& e) {
      throw CommError("rank 0 cannot host the store on port " + std::to_string(env.master_port) + ": " + e.what());
    }
  }
  if (need_store) {
    client::StoreClientOptions so;
    so.host = env.master_addr;
    so.port = env.master_port;
    so.connect_timeout = options.store_timeout;
    so.timeout = options.store_timeout;
    so.pytorch_key_prefix = true;
    so.world_size = env.world_size;  // add to init/ like PyTorch: the rendezvous server counts progress by it
    try {
      rt->store_ = std::make_unique<ClientStore>(so);
    } catch (const std::exception& e) {
      throw CommError("cannot reach the store at " + env.master_addr + ":" + std::to_string(env.master_port) + ": " +
                      e.what());
    }
  }

  // Bootstrap keys are scoped by attempt: under ddprun every attempt has a fresh store anyway,
  // but torchrun (2.6+) reuses one store across restarts, where an unscoped key would hand a
  // replacement the previous attempt's NCCL id or Gloo addresses.
  const std::string scope = "ddprun/attempt_" + std::to_string(env.restart_count) + "/";
  if (cuda) {
    rt->comm_ = make_nccl_communicator(rt->store_.get(), env.rank, env.world_size, rt->device_, options.timeout,
                                       env.error_file, scope + "nccl/");
  } else if (env.world_size == 1 && !options.real_communicator_at_world_size_1) {
    rt->comm_ = std::make_unique<SelfCommunicator>();
  } else {
    Store* store = rt->store_.get();
    if (!store) {
      rt->local_store_ = std::make_unique<MemoryStore>();
      store = rt->local_store_.get();
    }
    GlooOptions go;
    go.timeout = options.timeout;
    go.key_prefix = scope + "gloo/";
    go.shared_memory = knob_flag(knobs::kShm);
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) go.iface = ifname;
    else if (is_loopback(env.master_addr)) go.hostname = "127.0.0.1";
    rt->comm_ = make_gloo_communicator(*store, env.rank, env.world_size, go);
  }
  detail::log().debug("rank {}/{} (local {}/{}) backend {} attempt {}", env.rank, env.world_size, env.local_rank,
                      env.local_world_size, rt->comm_->backend(), env.restart_count);
  return rt;
}

int report_fatal(const std::exception& e, const std::string& where) {
  const bool comm =
      dynamic_cast<const CommError*>(&e) != nullptr || dynamic_cast<const client::StoreError*>(&e) != nullptr;
  const bool config = dynamic_cast<const ConfigError*>(&e) != nullptr;
  WorkerEnv env;
  try {
    env = read_worker_env();
  } catch (...) {
  }
  const std::string msg = std::string(comm ? "CommError" : config ? "ConfigError" : "Error") + ": " + e.what();
  detail::log().error("rank {}: {}{}", env.rank, msg, where.empty() ? "" : " (in " + where + ")");
  std::string trace = "rank " + std::to_string(env.rank) + " attempt " + std::to_string(env.restart_count) +
                      (where.empty() ? "" : ": " + where) + "\n" + msg;
  write_error_file(env.error_file, msg, trace);
  return comm ? kExitCommFailure : config ? kExitConfig : kExitError;
}

int run_worker_main(const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return report_fatal(e, "main");
  } catch (...) {
    return report_fatal(std::runtime_error("unknown exception"), "main");
  }
}

}  // namespace ddprun::worker
