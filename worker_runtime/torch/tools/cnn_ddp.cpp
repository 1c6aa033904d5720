// ddprun-torch-example: the harness the libtorch tests and benchmarks drive. A small CNN with
// batch norm trained data-parallel through ddprun::worker::libtorch::DistributedDataParallel,
// under `ddprun` or `torchrun` (the short example to read is examples/libtorch_cnn_ddp.cpp).
//
//   ddprun --nproc_per_node=2 ddprun-torch-example --steps 20 --checkpoint-dir /tmp/ck
//
// Synthetic deterministic data (torch::manual_seed), the core DistributedSampler, SGD with
// momentum, a checkpoint every K steps (model + optimizer, by module path), resume from the
// newest one, and `final_param_checksum=<hex>` at the end. The `aux` head is skipped on some
// steps (--unused-mode), so the unused-parameter handling is exercised. The flags after
// "testing" exist for the tests and the benchmark (tests/worker_runtime/torch,
// scripts/bench/bench_torch_ddp.py).
#include <ATen/Context.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/cuda.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <optional>

#include "ddprun/worker/checkpoint.h"
#include "ddprun/worker/runtime.h"
#include "ddprun/worker/sampler.h"
#include "ddprun/worker/torch/ddp.h"
#include "ddprun/worker/torch/powersgd.h"
#include "ddprun/worker/torch/sampler.h"
#include "ddprun/worker/torch/state.h"
#include "ddprun/worker/torch/sync_batchnorm.h"

namespace nn = torch::nn;
namespace dw = ddprun::worker;
namespace lt = ddprun::worker::libtorch;

struct NetImpl : nn::Module {
  NetImpl(int channels, int hidden, int depth, bool bn, bool sync_bn) {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(3, channels, 3).padding(1)));
    if (bn && sync_bn) sync_bn1 = register_module("bn1", lt::SyncBatchNorm(channels));
    else if (bn) bn1 = register_module("bn1", nn::BatchNorm2d(channels));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(channels, 2 * channels, 3).padding(1)));
    int width = 2 * channels;
    hidden_layers = register_module("hidden", nn::ModuleList());
    for (int i = 0; i < depth; ++i, width = hidden) hidden_layers->push_back(nn::Linear(width, hidden));
    fc = register_module("fc", nn::Linear(width, 10));
    aux = register_module("aux", nn::Linear(width, 10));
  }
  torch::Tensor forward(torch::Tensor x, bool use_aux) {
    x = conv1->forward(x);
    if (bn1) x = bn1->forward(x);
    if (sync_bn1) x = sync_bn1->forward(x);
    x = torch::relu(x);
    x = torch::relu(conv2->forward(x)).mean({2, 3});
    for (const auto& m : *hidden_layers) x = torch::relu(m->as<nn::Linear>()->forward(x));
    auto y = fc->forward(x);
    if (use_aux) y = y + aux->forward(x);
    return y;
  }
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::BatchNorm2d bn1{nullptr};
  lt::SyncBatchNorm sync_bn1{nullptr};  // --sync-bn: batch statistics over all ranks
  nn::ModuleList hidden_layers{nullptr};
  nn::Linear fc{nullptr}, aux{nullptr};
};
TORCH_MODULE(Net);

// Tensor dump for the tests: "DDPT", u32 count, then per tensor u32 name length, name,
// u8 dtype (0 f32, 1 i64, 2 f64), u64 bytes, bytes (little-endian, contiguous).
static void dump_state(const std::string& path, nn::Module& m) {
  std::vector<std::pair<std::string, torch::Tensor>> all;
  for (const auto& p : m.named_parameters(true)) all.emplace_back("param/" + p.key(), p.value());
  for (const auto& b : m.named_buffers(true)) all.emplace_back("buffer/" + b.key(), b.value());
  std::ofstream f(path, std::ios::binary);
  auto w = [&](const void* d, size_t n) { f.write(static_cast<const char*>(d), static_cast<std::streamsize>(n)); };
  w("DDPT", 4);
  const uint32_t count = static_cast<uint32_t>(all.size());
  w(&count, 4);
  for (auto& [name, t] : all) {
    torch::Tensor c = t.detach().cpu().contiguous();
    const uint32_t len = static_cast<uint32_t>(name.size());
    const uint8_t code = c.scalar_type() == torch::kFloat ? 0 : c.scalar_type() == torch::kLong ? 1 : 2;
    const uint64_t bytes = c.nbytes();
    w(&len, 4), w(name.data(), len), w(&code, 1), w(&bytes, 8), w(c.data_ptr(), bytes);
  }
  if (!f) throw dw::WorkerError("cannot write " + path);
}

static void load_state(const std::string& path, nn::Module& m) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw dw::WorkerError("cannot read --load-init file " + path);
  auto r = [&](void* d, size_t n) {
    f.read(static_cast<char*>(d), static_cast<std::streamsize>(n));
    if (!f) throw dw::WorkerError("truncated --load-init file " + path);
  };
  char magic[4];
  uint32_t count = 0;
  r(magic, 4), r(&count, 4);
  if (std::string(magic, 4) != "DDPT") throw dw::WorkerError(path + " is not a tensor dump");
  std::map<std::string, torch::Tensor> target;
  for (const auto& p : m.named_parameters(true)) target["param/" + p.key()] = p.value();
  for (const auto& b : m.named_buffers(true)) target["buffer/" + b.key()] = b.value();
  torch::NoGradGuard ng;
  for (uint32_t k = 0; k < count; ++k) {
    uint32_t len = 0;
    uint8_t code = 0;
    uint64_t bytes = 0;
    r(&len, 4);
    std::string name(len, '\0');
    r(name.data(), len), r(&code, 1), r(&bytes, 8);
    auto it = target.find(name);
    if (it == target.end()) throw dw::WorkerError(path + ": no tensor '" + name + "' in this model");
    torch::Tensor c = torch::empty_like(it->second).contiguous();
    if (c.nbytes() != bytes) throw dw::WorkerError(path + ": size mismatch for '" + name + "'");
    r(c.data_ptr(), bytes);
    it->second.copy_(c);
  }
}

static std::string per_rank(std::string path, int rank) {
  if (auto pos = path.find("%r"); pos != std::string::npos) path.replace(pos, 2, std::to_string(rank));
  return path;
}

int main(int argc, char** argv) {
  CLI::App app{"ddprun-torch-example: a CNN with batch norm under DDP for LibTorch"};
  int steps = 20, batch = 8, accum = 1, samples = 512, channels = 8, hidden = 16, depth = 0, image = 8, threads = 1;
  double lr = 0.05, momentum = 0.9;
  uint64_t seed = 1234;
  bool pytorch_shuffle = false;
  bool bn = true, shuffle = true, find_unused = true, broadcast_buffers = true, optimizer_zero_grad = true;
  std::string unused_mode = "step", checkpoint_dir, optimizer = "sgd", device_flag = "cpu", comm_hook = "none";
  int checkpoint_every = 0, fail_at_step = -1, fail_rank = -1, warmup = 3, model_differs_on = -1;
  size_t bucket_cap_kb = 25 * 1024, first_bucket_kb = 1024;
  std::string dump_init, load_init, dump_final, dump_batches;
  bool sync_bn = false, convert_plain_bn = false, grad_as_bucket_view = true, static_graph = false, join = false,
       join_divide_initial = true;
  int uneven = 0;
  bool perturb = false, no_ddp = false, time_steps = false, force_collective = false, deterministic = false,
       register_hook_twice = false;
  app.add_option("--steps", steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "micro-batch per rank")->check(CLI::PositiveNumber);
  app.add_option("--accum", accum, "micro-batches per step (all but the last under no_sync)")
      ->check(CLI::PositiveNumber);
  app.add_option("--samples", samples, "dataset size")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr);
  app.add_option("--momentum", momentum);
  app.add_option("--seed", seed);
  app.add_option("--optimizer", optimizer, "sgd (with --momentum) | adam | rmsprop (with --momentum) | adagrad")
      ->check(CLI::IsMember({"sgd", "adam", "rmsprop", "adagrad"}));
  app.add_option("--checkpoint-dir", checkpoint_dir, "save here and resume from the newest checkpoint");
  app.add_option("--checkpoint-every", checkpoint_every, "steps between checkpoints (0: never)");
  app.add_option("--threads", threads, "intra-op threads per rank")->check(CLI::PositiveNumber);
  app.add_option("--bn", bn, "batch norm after conv1 (1/0)");
  app.add_flag("--sync-bn", sync_bn, "that batch norm is a SyncBatchNorm over all ranks (CPU)");
  app.add_flag("--convert-plain-bn", convert_plain_bn,
               "call convert_sync_batchnorm on the model with its plain BatchNorm2d (refused)");
  app.add_option("--unused-mode", unused_mode,
                 "when `aux` is skipped: none | step (every 3rd step, all ranks) | "
                 "rank (some steps on one rank, some on all) | always")
      ->check(CLI::IsMember({"none", "step", "rank", "always"}));
  app.add_option("--find-unused", find_unused, "DdpOptions::find_unused_parameters (1/0)");
  app.add_option("--gradient-as-bucket-view", grad_as_bucket_view, "DdpOptions::gradient_as_bucket_view (1/0)");
  app.add_flag("--static-graph", static_graph, "DdpOptions::static_graph");
  app.add_flag("--join", join, "train inside ddp.join() (uneven inputs, see --uneven)");
  app.add_option("--join-divide-initial", join_divide_initial, "join(divide_by_initial_world_size) (1/0)");
  app.add_option("--uneven", uneven, "rank r runs --steps minus r times this many steps")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--device", device_flag,
                 "cpu (Gloo / shared memory) | cuda (NCCL, one GPU per local rank) | auto (cuda when every local "
                 "rank can have a GPU); DDPRUN_DEVICE overrides it")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  // testing and benchmarking
  app.add_option("--broadcast-buffers", broadcast_buffers, "(1/0)");
  app.add_option("--shuffle", shuffle, "sampler shuffle (1/0)");
  app.add_option("--channels", channels)->check(CLI::PositiveNumber);
  app.add_option("--hidden", hidden)->check(CLI::PositiveNumber);
  app.add_option("--depth", depth, "hidden Linear layers")->check(CLI::NonNegativeNumber);
  app.add_option("--image", image, "input height = width")->check(CLI::PositiveNumber);
  app.add_option("--comm-hook", comm_hook, "register_comm_hook: none | allreduce | fp16 | bf16 | powersgd")
      ->check(CLI::IsMember({"none", "allreduce", "fp16", "bf16", "powersgd"}));
  lt::PowerSGDState powersgd;
  app.add_option("--powersgd-rank", powersgd.matrix_approximation_rank, "PowerSGD matrix_approximation_rank");
  app.add_option("--powersgd-start", powersgd.start_powerSGD_iter, "PowerSGD start_powerSGD_iter");
  app.add_option("--powersgd-warm-start", powersgd.warm_start, "PowerSGD warm_start (1/0)");
  app.add_option("--powersgd-error-feedback", powersgd.use_error_feedback, "PowerSGD use_error_feedback (1/0)");
  app.add_flag("--register-hook-twice", register_hook_twice, "register a second comm hook (refused)");
  app.add_option("--bucket-cap-kb", bucket_cap_kb);
  app.add_option("--first-bucket-kb", first_bucket_kb);
  app.add_option("--optimizer-zero-grad", optimizer_zero_grad,
                 "1: opt.zero_grad() (set_to_none, as Python's default); 0: zero in place (ddp.zero_grad(), or "
                 "opt.zero_grad(false) without DDP)");
  app.add_option("--fail-at-step", fail_at_step, "SIGKILL --fail-rank at the start of this step (first attempt)");
  app.add_option("--fail-rank", fail_rank);
  app.add_option("--dump-init", dump_init, "write the initial state (after the wrap) here; %r = rank");
  app.add_option("--load-init", load_init, "load the initial state from a dump");
  app.add_option("--dump-final", dump_final, "write the final state here; %r = rank");
  app.add_option("--dump-batches", dump_batches, "write each step's sample indices here; %r = rank");
  app.add_flag("--pytorch-shuffle", pytorch_shuffle,
               "the sampler shuffles in torch.utils.data.DistributedSampler's order (torch.randperm)");
  app.add_option("--model-differs-on-rank", model_differs_on,
                 "this rank builds one more channel than the others (the wrap must refuse it)");
  app.add_flag("--perturb-init", perturb, "ranks other than 0 start from different parameters (wrap must fix)");
  app.add_flag("--no-ddp", no_ddp, "no wrapper, no communication (the benchmark's baseline)");
  app.add_flag("--time", time_steps, "print the mean step time after --warmup steps");
  app.add_option("--warmup", warmup);
  app.add_flag("--force-collective", force_collective,
               "all-reduce even with one rank (DdpOptions::force_collective; on the CPU a real 1-rank Gloo "
               "communicator)");
  app.add_flag("--deterministic", deterministic,
               "deterministic cuDNN algorithms (GPU runs that must repeat bit for bit, e.g. kill-and-resume)");
  CLI11_PARSE(app, argc, argv);

  return dw::run_worker_main([&]() -> int {
    torch::set_num_threads(threads);
    if (deterministic) {
      at::globalContext().setDeterministicCuDNN(true);
      at::globalContext().setBenchmarkCuDNN(false);
    }
    dw::RuntimeOptions ro;
    ro.device = device_flag == "cuda"   ? dw::DeviceKind::Cuda
                : device_flag == "auto" ? dw::DeviceKind::Auto
                                        : dw::DeviceKind::Cpu;
    ro.real_communicator_at_world_size_1 = force_collective;
    auto rt = dw::init(ro);
    const int rank = rt->rank(), world = rt->world_size();
    // Tensors live where the communicator works: the runtime picked (and bound) this rank's GPU.
    const torch::Device device = rt->on_cuda()
                                     ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(rt->cuda_device()))
                                     : torch::Device(torch::kCPU);
    if (device.is_cuda() && !torch::cuda::is_available())
      throw dw::WorkerError("the runtime chose CUDA but this LibTorch sees no CUDA device (a CPU-only LibTorch "
                            "build?); run with --device cpu");

    torch::manual_seed(seed);
    Net net(channels + (rank == model_differs_on ? 1 : 0), hidden, depth, bn, sync_bn);
    if (!load_init.empty()) load_state(load_init, *net);
    if (perturb && rank != 0) {
      torch::NoGradGuard ng;
      for (auto& p : net->parameters()) p.add_(0.125);
    }
    net->to(device);  // after the CPU-side initialisation: the same initial state on every device
    // SyncBatchNorm's collectives get a communicator of their own (see sync_batchnorm.h).
    std::unique_ptr<dw::Communicator> bn_comm;
    if (convert_plain_bn) lt::convert_sync_batchnorm(*net, rt->comm());  // a DdpError naming 'bn1'
    if (sync_bn && world > 1) {
      if (device.is_cuda()) throw dw::ConfigError("--sync-bn: the harness runs SyncBatchNorm on the CPU only");
      if (!rt->store()) throw dw::WorkerError("--sync-bn needs the launcher's store");
      dw::GlooOptions go;
      go.key_prefix = "ddprun-torch-example/syncbn/";
      bn_comm = dw::make_gloo_communicator(*rt->store(), rank, world, go);
      lt::convert_sync_batchnorm(*net, *bn_comm);
    }
    // Data: the same on every rank, from a generator of its own seed.
    torch::manual_seed(seed + 1);
    const auto X = torch::randn({samples, 3, image, image}).to(device);
    const auto Y = torch::randint(0, 10, {samples}).to(device);
    // Timing on a GPU waits for the step's kernels (the PyTorch side does the same).
    auto sync_device = [&] {
      if (device.is_cuda()) torch::cuda::synchronize(device.index());
    };

    lt::DdpOptions opts;
    opts.find_unused_parameters = find_unused;
    opts.broadcast_buffers = broadcast_buffers;
    opts.bucket_cap_bytes = bucket_cap_kb * 1024;
    opts.first_bucket_cap_bytes = first_bucket_kb * 1024;
    opts.force_collective = force_collective;
    opts.gradient_as_bucket_view = grad_as_bucket_view;
    opts.static_graph = static_graph;
    std::optional<lt::DistributedDataParallel<Net>> ddp;
    if (!no_ddp) ddp.emplace(net, rt->comm(), opts);
    if (ddp && comm_hook == "fp16") ddp->register_comm_hook(lt::fp16_compress_hook);
    if (ddp && comm_hook == "bf16") ddp->register_comm_hook(lt::bf16_compress_hook);
    if (ddp && comm_hook == "allreduce") ddp->register_comm_hook(lt::allreduce_hook);
    if (ddp && comm_hook == "powersgd") {
      powersgd.check();
      ddp->register_comm_hook(
          [&powersgd](dw::Communicator& c, lt::GradBucket& b) { lt::powerSGD_hook(powersgd, c, b); });
    }
    if (ddp && register_hook_twice) ddp->register_comm_hook(lt::allreduce_hook);  // refused: a DdpError
    if (!dump_init.empty()) dump_state(per_rank(dump_init, rank), *net);

    std::unique_ptr<torch::optim::Optimizer> opt_holder;
    if (optimizer == "adam")
      opt_holder = std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(lr));
    else if (optimizer == "rmsprop")
      opt_holder = std::make_unique<torch::optim::RMSprop>(net->parameters(),
                                                           torch::optim::RMSpropOptions(lr).momentum(momentum));
    else if (optimizer == "adagrad")
      opt_holder = std::make_unique<torch::optim::Adagrad>(net->parameters(), torch::optim::AdagradOptions(lr));
    else
      opt_holder =
          std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(lr).momentum(momentum));
    torch::optim::Optimizer& opt = *opt_holder;

    dw::SamplerOptions sampler_options{.dataset_size = static_cast<size_t>(samples),
                                       .num_replicas = world,
                                       .rank = rank,
                                       .shuffle = shuffle,
                                       .seed = seed};
    if (pytorch_shuffle) sampler_options.permutation = lt::pytorch_permutation;
    dw::DistributedSampler sampler(sampler_options);
    const size_t per_step = static_cast<size_t>(batch) * static_cast<size_t>(accum);
    const size_t batches = sampler.num_batches(per_step, /*drop_last_batch=*/true);
    if (batches == 0) throw dw::WorkerError("--batch x --accum exceeds the per-rank dataset; lower them");

    int start = 0;
    if (!checkpoint_dir.empty()) {
      if (auto ck = dw::load_agreed_checkpoint(checkpoint_dir, rt->comm())) {
        lt::load_module(*net, *ck);
        lt::load_optimizer(opt, *net, *ck);
        start = static_cast<int>(ck->step);
        if (rank == 0) std::printf("resumed from step %d\n", start);
      }
    }
    std::ofstream batch_log;
    if (!dump_batches.empty()) batch_log.open(per_rank(dump_batches, rank));

    auto use_aux = [&](int step) {
      if (unused_mode == "step") return step % 3 != 2;
      if (unused_mode == "rank") return !((step + rank) % 4 == 0 || step % 5 == 4);
      return unused_mode != "always";
    };
    net->train();
    double timed_s = 0, cpu_s = 0;  // wall and process CPU time of the timed steps
    int timed = 0;
    const int my_steps = steps - uneven * rank;
    if (my_steps <= start) throw dw::WorkerError("--uneven leaves rank " + std::to_string(rank) + " no step");
    std::optional<lt::DdpEngine::JoinGuard> join_guard;
    if (ddp && join) join_guard.emplace(*ddp, join_divide_initial, true);
    for (int step = start; step < my_steps; ++step) {
      if (step == fail_at_step && rank == fail_rank && rt->env().restart_count == 0) {
        std::fprintf(stderr, "injected fault: rank %d SIGKILL at step %d\n", rank, step);
        std::fflush(stderr);
        std::raise(SIGKILL);
      }
      if (time_steps) sync_device();
      const auto t0 = std::chrono::steady_clock::now();
      const std::clock_t c0 = std::clock();
      sampler.set_epoch(static_cast<uint64_t>(step) / batches);
      const auto idx = sampler.batch(static_cast<size_t>(step) % batches, per_step);
      std::vector<int64_t> ids(idx.begin(), idx.end());
      if (batch_log.is_open()) {
        for (auto i : ids) batch_log << i << ' ';
        batch_log << '\n';
      }
      if (!ddp || optimizer_zero_grad) opt.zero_grad(/*set_to_none=*/optimizer_zero_grad);
      else ddp->zero_grad();
      const auto all = torch::tensor(ids, torch::kLong).to(device);
      for (int a = 0; a < accum; ++a) {
        const auto part = all.narrow(0, static_cast<int64_t>(a) * batch, batch);
        const auto x = X.index_select(0, part), y = Y.index_select(0, part);
        auto forward_backward = [&] {
          auto out = ddp ? (*ddp)(x, use_aux(step)) : net->forward(x, use_aux(step));
          auto loss = nn::functional::cross_entropy(out, y) / static_cast<double>(accum);
          loss.backward();
        };
        if (ddp && a + 1 < accum) {
          auto guard = ddp->no_sync();
          forward_backward();
        } else {
          forward_backward();
        }
      }
      opt.step();
      if (time_steps) sync_device();
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (step - start >= warmup) timed_s += dt, cpu_s += double(std::clock() - c0) / CLOCKS_PER_SEC, ++timed;
      if (!checkpoint_dir.empty() && checkpoint_every > 0 && (step + 1) % checkpoint_every == 0 && rank == 0) {
        dw::Checkpoint ck;
        ck.step = static_cast<uint64_t>(step + 1);
        lt::save_module(*net, ck);
        lt::save_optimizer(opt, *net, ck);
        dw::save_checkpoint(checkpoint_dir, ck);
      }
    }
    join_guard.reset();  // a rank out of data shadows the others' steps until every rank is done
    if (ddp && rank == 0) {
      size_t views = 0;
      for (size_t i = 0; i < ddp->parameter_names().size(); ++i) views += ddp->gradient_is_bucket_view(i);
      std::printf("grad_bucket_views=%zu/%zu\n", views, ddp->parameter_names().size());
      const auto buckets = ddp->bucket_names();
      std::printf("buckets=%zu rebuilt=%zu launched_early_last_step=%zu first_bucket=", buckets.size(), ddp->rebuilds(),
                  ddp->buckets_launched_early());
      for (size_t k = 0; k < buckets.front().size(); ++k) std::printf("%s%s", k ? "," : "", buckets.front()[k].c_str());
      std::printf("\n");
    }
    if (!dump_final.empty()) dump_state(per_rank(dump_final, rank), *net);
    if (time_steps && timed > 0)
      std::printf("rank %d step_ms=%.4f cpu_ms=%.4f steps=%d\n", rank, 1e3 * timed_s / timed, 1e3 * cpu_s / timed,
                  timed);
    // Per rank: the parameters (equal on every rank) and the whole state (batch norm's running
    // statistics are each rank's own after the last forward).
    std::printf("rank %d parameters_checksum=%016llx state_checksum=%016llx\n", rank,
                static_cast<unsigned long long>(lt::state_checksum(*net, lt::StateParts::Parameters)),
                static_cast<unsigned long long>(lt::state_checksum(*net)));
    if (rank == 0)
      std::printf("final_param_checksum=%016llx\n", static_cast<unsigned long long>(lt::state_checksum(*net)));
    return 0;
  });
}
