// DDP for LibTorch modules: a small CNN (conv, batch norm, conv, linear) trained data-parallel
// with ddprun::worker::libtorch::DistributedDataParallel on synthetic 3x16x16 images. Each rank
// takes its own shard of every epoch (the core DistributedSampler: PyTorch's DistributedSampler
// semantics); SGD with momentum; rank 0 saves a checkpoint (model, batch-norm buffers, momentum)
// every 10 steps, and a run resumes from the newest checkpoint in its directory, bit for bit.
//
// Run it with ddprun, two processes on this host:
//   ddprun --standalone --nproc_per_node=2 build/examples/libtorch_cnn_ddp /tmp/cnn_ckpt 40
// Run the same command again with a larger step count and it continues where the last
// checkpoint left off; so does a worker group that ddprun restarts after a failure
// (--max_restarts=N). Rank 0 prints its loss at each checkpoint and, at the end, a checksum of
// the model's state: a run in one go and a resumed run print the same.
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cstdio>
#include <string>
#include <vector>

#include <ddprun/worker/checkpoint.h>
#include <ddprun/worker/runtime.h>
#include <ddprun/worker/sampler.h>
#include <ddprun/worker/torch/ddp.h>
#include <ddprun/worker/torch/state.h>

namespace nn = torch::nn;
namespace dw = ddprun::worker;
namespace lt = ddprun::worker::libtorch;

struct NetImpl : nn::Module {
  NetImpl() {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(3, 8, 3).padding(1)));
    bn1 = register_module("bn1", nn::BatchNorm2d(8));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(8, 16, 3).stride(2).padding(1)));
    fc = register_module("fc", nn::Linear(16, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn1->forward(conv1->forward(x)));
    x = torch::relu(conv2->forward(x)).mean({2, 3});  // global average pooling
    return fc->forward(x);
  }
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::BatchNorm2d bn1{nullptr};
  nn::Linear fc{nullptr};
};
TORCH_MODULE(Net);

int main(int argc, char** argv) {
  return dw::run_worker_main([&] {  // an exception becomes the error file and a failing exit
    if (argc < 2) throw dw::WorkerError("usage: libtorch_cnn_ddp CHECKPOINT_DIR [STEPS (default 40)]");
    const std::string ckpt_dir = argv[1];
    const int steps = argc > 2 ? std::stoi(argv[2]) : 40;
    constexpr int kSamples = 512, kBatch = 16, kEvery = 10;
    torch::set_num_threads(1);  // the ranks share this host's cores
    auto rt = dw::init();       // RANK, WORLD_SIZE, MASTER_ADDR... from ddprun; Gloo on the CPU
    const int rank = rt->rank(), world = rt->world_size();

    torch::manual_seed(0);  // the same data everywhere; DDP starts every rank from rank 0's model
    Net net;
    const auto images = torch::randn({kSamples, 3, 16, 16});
    const auto labels = images.mean({2, 3}).matmul(torch::randn({3, 10})).argmax(1);  // learnable classes
    lt::DistributedDataParallel<Net> ddp(net, rt->comm());  // collective: broadcasts the model
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    dw::DistributedSampler sampler({kSamples, world, rank, /*shuffle=*/true, /*seed=*/1, /*drop_last=*/false});
    const auto per_epoch = static_cast<int>(sampler.num_batches(kBatch));

    int start = 0;
    if (auto ck = dw::load_agreed_checkpoint(ckpt_dir, rt->comm())) {  // the newest every rank can read
      lt::load_module(*net, *ck);
      lt::load_optimizer(opt, *net, *ck);
      start = static_cast<int>(ck->step);
      if (rank == 0) std::printf("resumed from step %d\n", start);
    }
    net->train();
    double loss_sum = 0;  // since the last checkpoint
    for (int step = start; step < steps; ++step) {
      sampler.set_epoch(static_cast<uint64_t>(step / per_epoch));  // a new shuffle each epoch
      const auto idx = sampler.batch(static_cast<size_t>(step % per_epoch), kBatch);  // mid-epoch resume
      const auto ids = torch::tensor(std::vector<int64_t>(idx.begin(), idx.end()));
      opt.zero_grad();
      auto loss = nn::functional::cross_entropy(ddp(images.index_select(0, ids)), labels.index_select(0, ids));
      loss.backward();  // the gradients are averaged over ranks when it returns
      opt.step();
      loss_sum += loss.item<double>();
      if (rank == 0 && (step + 1) % kEvery == 0) {
        dw::Checkpoint ck;
        ck.step = static_cast<uint64_t>(step + 1);
        lt::save_module(*net, ck);
        lt::save_optimizer(opt, *net, ck);
        dw::save_checkpoint(ckpt_dir, ck);  // atomic: a kill never leaves a torn checkpoint
        std::printf("step %d: mean loss %.4f on rank 0's batches (checkpoint saved)\n", step + 1, loss_sum / kEvery);
      }
      if ((step + 1) % kEvery == 0) loss_sum = 0;
    }
    if (rank == 0)
      std::printf("finished step %d: state checksum %016llx\n", steps,
                  static_cast<unsigned long long>(lt::state_checksum(*net)));
    return 0;
  });
}
