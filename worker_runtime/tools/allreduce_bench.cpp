// ddprun_allreduce_bench: all-reduce sweep on GPUs, one process per GPU (under ddprun or
// torchrun --no-python), in the style of nccl-tests' all_reduce_perf, for two implementations
// side by side in the same processes:
//   ours  the library's communicator (ddprun::worker::init() -> NcclCommunicator::allreduce:
//         non-blocking communicator, its own stream, watchdog bookkeeping per call)
//   raw   a plain ncclAllReduce loop on a blocking communicator of its own; rank 0's unique
//         id goes to the others through our store client (the runtime's connection)
// In place, sum, fp32 and bf16, sizes from --min-bytes to --max-bytes (x --factor). Per size:
// a barrier, `warmup` ops, then `iters` ops between two CUDA events on one stream; time per op
// is the maximum over ranks. algbw = bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests).
// Iteration counts are a pure function of the size (the same on every rank):
//   iters = clamp(4 GiB / bytes, 10, 200), warmup = clamp(iters / 10, 2, 20)   (--iters overrides)
// Before timing, each implementation checks one all-reduce of rank+1 (sum = n(n+1)/2).
// Output (rank 0): lines `RESULT impl=.. dtype=.. bytes=.. count=.. iters=.. us=.. algbw=.. busbw=..`
// on stdout and, with --out, the same lines in a file. `--info` prints the NCCL/CUDA versions
// and the devices, without a launcher.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ddprun/worker/checks.h"
#include "ddprun/worker/gpu_checks.h"
#include "ddprun/worker/runtime.h"

namespace dw = ddprun::worker;

namespace {

struct Options {
  std::string impls = "ours,raw";
  std::string dtypes = "fp32,bf16";
  uint64_t min_bytes = 8;
  uint64_t max_bytes = 1ull << 30;
  int factor = 2;
  int iters = 0;    // 0 = by size
  int warmup = -1;  // -1 = by iters
  std::string out;
  bool info = false;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  size_t p = 0;
  while (p <= s.size()) {
    const size_t q = std::min(s.find(',', p), s.size());
    if (q > p) v.push_back(s.substr(p, q - p));
    p = q + 1;
  }
  return v;
}

int iters_for(uint64_t bytes, const Options& o) {
  if (o.iters > 0) return o.iters;
  const uint64_t n = (4ull << 30) / std::max<uint64_t>(bytes, 1);
  return static_cast<int>(std::clamp<uint64_t>(n, 10, 200));
}
int warmup_for(int iters, const Options& o) { return o.warmup >= 0 ? o.warmup : std::clamp(iters / 10, 2, 20); }

// bf16 bit pattern of a small integer-valued float (exact: truncation of an exact value).
uint16_t to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16_bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

#define NCCL_OK(expr)                                                                                             \
  do {                                                                                                            \
    ncclResult_t r_ = (expr);                                                                                     \
    if (r_ != ncclSuccess)                                                                                        \
      throw dw::CommError(std::string(#expr) + ": " + ncclGetErrorString(r_) + " (" + ncclGetLastError(nullptr) + \
                          ")");                                                                                   \
  } while (0)

// One implementation behind three calls: enqueue `iters` all-reduces between two events on
// `stream_`, a barrier, and a max over ranks of one float.
class Impl {
 public:
  virtual ~Impl() = default;
  virtual const char* name() const = 0;
  virtual void allreduce(void* buf, size_t count, dw::DType dt) = 0;  // enqueue one
  virtual void begin() = 0;                                           // comm stream waits for the timing stream (ours)
  virtual void end() = 0;                                             // timing stream waits for the comm stream (ours)
  virtual void barrier() = 0;
  virtual float max_over_ranks(float v) = 0;
  cudaStream_t stream() const { return stream_; }

 protected:
  cudaStream_t stream_ = nullptr;
};

class Ours final : public Impl {
 public:
  explicit Ours(dw::Communicator& c) : c_(c) {
    DDPRUN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    c_.set_compute_stream(stream_);
    DDPRUN_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
  }
  ~Ours() override {
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
  }
  const char* name() const override { return "ours"; }
  void allreduce(void* buf, size_t count, dw::DType dt) override { c_.allreduce(buf, count, dt, dw::ReduceOp::Sum); }
  void begin() override { c_.comm_waits_for_compute(); }
  void end() override { c_.compute_waits_for_comm(); }
  void barrier() override {
    DDPRUN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    c_.barrier();
  }
  float max_over_ranks(float v) override {
    DDPRUN_CUDA_CHECK(cudaMemcpyAsync(scratch_, &v, sizeof v, cudaMemcpyHostToDevice, stream_));
    c_.comm_waits_for_compute();
    c_.allreduce(scratch_, 1, dw::DType::F32, dw::ReduceOp::Max);
    c_.compute_waits_for_comm();
    DDPRUN_CUDA_CHECK(cudaMemcpyAsync(&v, scratch_, sizeof v, cudaMemcpyDeviceToHost, stream_));
    DDPRUN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return v;
  }

 private:
  dw::Communicator& c_;
  float* scratch_ = nullptr;
};

class Raw final : public Impl {
 public:
  explicit Raw(dw::Runtime& rt) {
    const int rank = rt.rank(), n = rt.world_size();
    ncclUniqueId id;
    // Keyed by attempt so that a restarted job never reads an old id from a reused store.
    const std::string key = "ddprun_allreduce_bench/raw_nccl_id/" + std::to_string(rt.env().restart_count);
    if (rank == 0) {
      NCCL_OK(ncclGetUniqueId(&id));
      if (n > 1) rt.store()->set(key, std::string(reinterpret_cast<const char*>(&id), sizeof id));
    } else {
      DDPRUN_ENFORCE(rt.store() != nullptr, "raw NCCL with several ranks needs the store");
      const std::string v = rt.store()->get(key, std::chrono::minutes(5));
      DDPRUN_ENFORCE(v.size() == sizeof id, "bad NCCL id in the store");
      std::memcpy(&id, v.data(), sizeof id);
    }
    NCCL_OK(ncclCommInitRank(&comm_, n, id, rank));
    DDPRUN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DDPRUN_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
  }
  ~Raw() override {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
  }
  const char* name() const override { return "raw"; }
  void allreduce(void* buf, size_t count, dw::DType dt) override {
    NCCL_OK(
        ncclAllReduce(buf, buf, count, dt == dw::DType::BF16 ? ncclBfloat16 : ncclFloat32, ncclSum, comm_, stream_));
  }
  void begin() override {}
  void end() override {}
  void barrier() override {
    NCCL_OK(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
    DDPRUN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  float max_over_ranks(float v) override {
    DDPRUN_CUDA_CHECK(cudaMemcpyAsync(scratch_, &v, sizeof v, cudaMemcpyHostToDevice, stream_));
    NCCL_OK(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclMax, comm_, stream_));
    DDPRUN_CUDA_CHECK(cudaMemcpyAsync(&v, scratch_, sizeof v, cudaMemcpyDeviceToHost, stream_));
    DDPRUN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return v;
  }

 private:
  ncclComm_t comm_ = nullptr;
  float* scratch_ = nullptr;
};

// One all-reduce of rank+1 over `count` elements; every element must be n(n+1)/2.
bool check(Impl& impl, void* buf, size_t count, dw::DType dt, int rank, int n, std::string* why) {
  const float v = static_cast<float>(rank + 1), want = static_cast<float>(n) * (n + 1) / 2.f;
  const size_t esz = dw::dtype_size(dt);
  std::vector<uint8_t> host(count * esz);
  for (size_t i = 0; i < count; ++i) {
    if (dt == dw::DType::BF16) {
      const uint16_t b = to_bf16_bits(v);
      std::memcpy(&host[i * 2], &b, 2);
    } else {
      std::memcpy(&host[i * 4], &v, 4);
    }
  }
  DDPRUN_CUDA_CHECK(cudaMemcpyAsync(buf, host.data(), host.size(), cudaMemcpyHostToDevice, impl.stream()));
  impl.begin();
  impl.allreduce(buf, count, dt);
  impl.end();
  DDPRUN_CUDA_CHECK(cudaMemcpyAsync(host.data(), buf, host.size(), cudaMemcpyDeviceToHost, impl.stream()));
  DDPRUN_CUDA_CHECK(cudaStreamSynchronize(impl.stream()));
  for (size_t i = 0; i < count; ++i) {
    float got;
    if (dt == dw::DType::BF16) {
      uint16_t b;
      std::memcpy(&b, &host[i * 2], 2);
      got = from_bf16_bits(b);
    } else {
      std::memcpy(&got, &host[i * 4], 4);
    }
    if (got != want) {
      *why = "element " + std::to_string(i) + " is " + std::to_string(got) + ", want " + std::to_string(want);
      return false;
    }
  }
  return true;
}

void print_info() {
  int nccl = 0, rt = 0, drv = 0, ndev = 0;
  ncclGetVersion(&nccl);
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
  std::printf("INFO nccl_version=%d nccl=%d.%d.%d cuda_runtime=%d cuda_driver=%d devices=%d\n", nccl, nccl / 10000,
              (nccl / 100) % 100, nccl % 100, rt, drv, ndev);
  for (int d = 0; d < ndev; ++d) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, d) == cudaSuccess)
      std::printf("INFO device=%d name=%s sm=%d.%d mem_gib=%.1f\n", d, p.name, p.major, p.minor,
                  static_cast<double>(p.totalGlobalMem) / (1ull << 30));
  }
}

int run(const Options& o) {
  dw::RuntimeOptions ro;
  ro.device = dw::DeviceKind::Cuda;
  auto rt = dw::init(ro);
  const int rank = rt->rank(), n = rt->world_size();
  FILE* out = nullptr;
  if (rank == 0) {
    int nccl = 0;
    ncclGetVersion(&nccl);
    cudaDeviceProp p;
    DDPRUN_CUDA_CHECK(cudaGetDeviceProperties(&p, rt->cuda_device()));
    std::printf("INFO nccl_version=%d world=%d device=%s\n", nccl, n, p.name);
    if (!o.out.empty()) {
      out = std::fopen(o.out.c_str(), "w");
      DDPRUN_ENFORCE(out != nullptr, "cannot write " + o.out);
      std::fprintf(out, "INFO nccl_version=%d world=%d device=%s\n", nccl, n, p.name);
    }
  }
  std::vector<std::unique_ptr<Impl>> impls;
  for (const auto& s : split(o.impls)) {
    if (s == "ours") impls.push_back(std::make_unique<Ours>(rt->comm()));
    else if (s == "raw") impls.push_back(std::make_unique<Raw>(*rt));
    else throw dw::WorkerError("--impl: unknown '" + s + "' (ours, raw)");
  }
  std::vector<dw::DType> dts;
  for (const auto& s : split(o.dtypes)) {
    if (s == "fp32") dts.push_back(dw::DType::F32);
    else if (s == "bf16") dts.push_back(dw::DType::BF16);
    else throw dw::WorkerError("--dtype: unknown '" + s + "' (fp32, bf16)");
  }
  void* buf = nullptr;
  DDPRUN_CUDA_CHECK(cudaMalloc(&buf, o.max_bytes));
  cudaEvent_t e0, e1;
  DDPRUN_CUDA_CHECK(cudaEventCreate(&e0));
  DDPRUN_CUDA_CHECK(cudaEventCreate(&e1));

  int failed_checks = 0;
  for (auto& impl : impls)
    for (auto dt : dts) {
      const size_t count = std::min<uint64_t>(o.max_bytes, 4u << 20) / dw::dtype_size(dt);
      std::string why;
      const bool ok = check(*impl, buf, count, dt, rank, n, &why);
      const float bad = impl->max_over_ranks(ok ? 0.f : 1.f);
      if (rank == 0) {
        std::printf("CHECK impl=%s dtype=%s count=%zu %s%s\n", impl->name(), dw::dtype_name(dt), count,
                    bad == 0.f ? "ok" : "FAILED", ok ? "" : (" " + why).c_str());
        if (out)
          std::fprintf(out, "CHECK impl=%s dtype=%s count=%zu %s\n", impl->name(), dw::dtype_name(dt), count,
                       bad == 0.f ? "ok" : "FAILED");
      }
      if (bad != 0.f) ++failed_checks;
    }
  DDPRUN_CUDA_CHECK(cudaMemset(buf, 0, o.max_bytes));  // zeros: the sums stay finite

  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 0.0;
  for (uint64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= static_cast<uint64_t>(o.factor)) {
    for (auto dt : dts) {
      const size_t count = bytes / dw::dtype_size(dt);
      if (count == 0) continue;
      const int iters = iters_for(bytes, o), warm = warmup_for(iters, o);
      for (auto& impl : impls) {
        impl->barrier();
        impl->begin();
        for (int i = 0; i < warm; ++i) impl->allreduce(buf, count, dt);
        impl->end();
        impl->barrier();
        DDPRUN_CUDA_CHECK(cudaEventRecord(e0, impl->stream()));
        impl->begin();
        for (int i = 0; i < iters; ++i) impl->allreduce(buf, count, dt);
        impl->end();
        DDPRUN_CUDA_CHECK(cudaEventRecord(e1, impl->stream()));
        DDPRUN_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        DDPRUN_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        const double us = impl->max_over_ranks(ms) * 1000.0 / iters;
        const double algbw = static_cast<double>(bytes) / (us * 1e-6) / 1e9;  // GB/s (1e9 bytes)
        if (rank == 0) {
          char line[256];
          std::snprintf(line, sizeof line,
                        "RESULT impl=%s dtype=%s bytes=%" PRIu64
                        " count=%zu iters=%d warmup=%d us=%.3f algbw=%.3f busbw=%.3f\n",
                        impl->name(), dw::dtype_name(dt), bytes, count, iters, warm, us, algbw, algbw * bus_factor);
          std::fputs(line, stdout);
          std::fflush(stdout);
          if (out) std::fputs(line, out);
        }
      }
    }
    if (o.factor < 2) break;
  }
  impls.clear();
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(buf);
  if (out) std::fclose(out);
  return failed_checks ? dw::kExitError : dw::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"ddprun all-reduce sweep: the library's NCCL communicator vs a raw ncclAllReduce loop"};
  app.add_option("--impl", o.impls, "comma list: ours, raw");
  app.add_option("--dtype", o.dtypes, "comma list: fp32, bf16");
  app.add_option("--min-bytes", o.min_bytes, "smallest message")->check(CLI::PositiveNumber);
  app.add_option("--max-bytes", o.max_bytes, "largest message (and the buffer size)")->check(CLI::PositiveNumber);
  app.add_option("--factor", o.factor, "size step (2 = powers of two, 4 = x4)")->check(CLI::Range(2, 1024));
  app.add_option("--iters", o.iters, "timed iterations per size (0 = clamp(4 GiB / bytes, 10, 200))")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup", o.warmup, "warm-up iterations per size (default clamp(iters / 10, 2, 20))");
  app.add_option("--out", o.out, "also write the RESULT lines to this file (rank 0)");
  app.add_flag("--info", o.info, "print NCCL/CUDA versions and the devices, then exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : dw::kExitUsage;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (o.info) {
    print_info();
    return 0;
  }
  if (o.min_bytes > o.max_bytes) {
    std::fprintf(stderr, "--min-bytes must not exceed --max-bytes\n");
    return dw::kExitUsage;
  }
  return dw::run_worker_main([&] { return run(o); });
}
