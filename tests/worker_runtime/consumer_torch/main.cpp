// What a LibTorch user of the installed ddprun_worker_torch does: wraps a module in
// DistributedDataParallel and trains. Run as 2 ranks under a launcher (ddprun), each on its own
// data, so without the gradient averaging their parameters would part; at the end every rank
// all-gathers the parameters' checksum and fails unless all agree and the model moved. Also
// catches the library's DdpError by type, and round-trips the state through a Checkpoint.
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cstddef>
#include <cstdio>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddprun/worker/runtime.h"
#include "ddprun/worker/torch/ddp.h"
#include "ddprun/worker/torch/state.h"

namespace dw = ddprun::worker;
namespace dl = ddprun::worker::libtorch;

// The autograd hooks are the engine's own business: a user cannot call them.
template <class E, class = void>
struct CallsGradReady : std::false_type {};
template <class E>
struct CallsGradReady<E, std::void_t<decltype(std::declval<E&>().on_grad_ready(size_t{0}))>> : std::true_type {};
template <class E, class = void>
struct CallsBackwardEnd : std::false_type {};
template <class E>
struct CallsBackwardEnd<E, std::void_t<decltype(std::declval<E&>().on_backward_end())>> : std::true_type {};
static_assert(!CallsGradReady<dl::DdpEngine>::value && !CallsBackwardEnd<dl::DdpEngine>::value,
              "DdpEngine's autograd hook entry points are not part of its API");

int main() {
  return dw::run_worker_main([]() -> int {
    dw::RuntimeOptions ro;
    ro.device = dw::DeviceKind::Cpu;
    ro.real_communicator_at_world_size_1 = true;  // run alone too, through a real communicator
    auto rt = dw::init(ro);
    const int rank = rt->rank(), world = rt->world_size();

    torch::manual_seed(100 + rank);  // different initial weights: the wrap must make them rank 0's
    torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::Functional(torch::relu), torch::nn::Linear(16, 1));
    const uint64_t initial = dl::state_checksum(*net.ptr());

    // A module with parameters in two dtypes is refused with the library's error type.
    bool caught = false;
    try {
      torch::nn::Sequential mixed(torch::nn::Linear(2, 2), torch::nn::Linear(2, 2));
      mixed[1]->to(torch::kFloat64);
      dl::DistributedDataParallel<torch::nn::Sequential> bad(mixed, rt->comm());
    } catch (const dl::DdpError& e) {
      caught = std::string(e.what()).find("one dtype") != std::string::npos;
    }
    if (!caught) {
      std::fprintf(stderr, "consumer: FAILED: DdpError for mixed dtypes not caught by type\n");
      return 1;
    }

    dl::DdpOptions opt;
    opt.force_collective = true;
    opt.first_bucket_cap_bytes = 64;  // several buckets even for this small model
    dl::DistributedDataParallel<torch::nn::Sequential> ddp(net, rt->comm(), opt);
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    torch::manual_seed(7 + rank);  // each rank its own data
    for (int step = 0; step < 10; ++step) {
      auto x = torch::randn({16, 8});
      auto y = x.sum(1, /*keepdim=*/true);
      sgd.zero_grad();
      auto loss = torch::nn::functional::mse_loss(ddp(x), y);
      loss.backward();
      sgd.step();
    }

    // Every rank's parameters equal after training on different data.
    const uint64_t mine = dl::state_checksum(*net.ptr());
    std::vector<int64_t> all(static_cast<size_t>(world));
    const int64_t mine_i = static_cast<int64_t>(mine);
    rt->comm().allgather(&mine_i, all.data(), 1, dw::DType::I64);
    for (int r = 0; r < world; ++r)
      if (all[static_cast<size_t>(r)] != mine_i) {
        std::fprintf(stderr, "consumer: FAILED: rank %d's parameters differ from rank %d's\n", r, rank);
        return 1;
      }
    if (mine == initial) {
      std::fprintf(stderr, "consumer: FAILED: training did not change the parameters\n");
      return 1;
    }

    // Save into a checkpoint, disturb, load back: the checksum returns.
    dw::Checkpoint ck;
    dl::save_module(*net.ptr(), ck);
    {
      torch::NoGradGuard ng;
      for (auto& p : net->parameters()) p.add_(1.0);
    }
    dl::load_module(*net.ptr(), ck);
    if (dl::state_checksum(*net.ptr()) != mine) {
      std::fprintf(stderr, "consumer: FAILED: checkpoint round trip\n");
      return 1;
    }
    std::printf("consumer_torch: OK rank %d of %d, backend %s, buckets %zu, checksum %016llx\n", rank, world,
                rt->comm().backend(), ddp.bucket_names().size(), static_cast<unsigned long long>(mine));
    return 0;
  });
}
