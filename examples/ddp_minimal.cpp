// Minimal data-parallel training on the core library (libddprun_worker), no framework: a
// hand-written two-layer network (Linear -> ReLU -> Linear, mean squared error) learns
// y = sin(x0 + ... + x7) from synthetic data. Each rank trains on its own shard of every
// epoch (DistributedSampler); the Reducer averages the gradients over ranks during backward,
// so every rank takes the same SGD step and the copies of the model never part.
//
// Run it with ddprun, two processes on this host:
//   ddprun --standalone --nproc_per_node=2 build/examples/ddp_minimal
// Rank 0 prints the loss every 5 epochs; at the end the ranks compare parameter checksums and
// the program fails unless all ranks agree and the loss went down.
#include <ddprun/worker/hash.h>
#include <ddprun/worker/reducer.h>
#include <ddprun/worker/runtime.h>
#include <ddprun/worker/sampler.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace dw = ddprun::worker;

constexpr int kIn = 8, kHidden = 32, kBatch = 16, kEpochs = 30;
constexpr size_t kSamples = 512;
// One flat buffer each for parameters and gradients, in registration order: W1, b1, W2, b2.
constexpr size_t kW1 = 0, kB1 = kW1 + kHidden * kIn, kW2 = kB1 + kHidden, kB2 = kW2 + kHidden, kN = kB2 + 1;

// Sample i (x in [-1, 1)^8, and its target): a pure function of i, the same on every rank.
float uniform(uint64_t key) { return static_cast<float>(dw::splitmix64(key) >> 40) / 16777216.f * 2.f - 1.f; }
float sample(size_t i, float* x) {
  float s = 0;
  for (int j = 0; j < kIn; ++j) s += x[j] = uniform(i * kIn + static_cast<size_t>(j));
  return std::sin(s);
}

// One batch: forward, then backward layer by layer. A layer's gradients are final as soon as
// backward has passed it, so they are marked ready then and their all-reduce overlaps the rest.
float train_step(const std::vector<size_t>& batch, const float* p, float* g, dw::Reducer& reducer) {
  for (size_t k = 0; k < kN; ++k) g[k] = 0;
  std::vector<float> x(batch.size() * kIn), h(batch.size() * kHidden), dout(batch.size());
  float loss = 0;
  for (size_t b = 0; b < batch.size(); ++b) {  // forward
    const float y = sample(batch[b], &x[b * kIn]);
    float out = p[kB2];
    for (int u = 0; u < kHidden; ++u) {
      float a = p[kB1 + u];
      for (int j = 0; j < kIn; ++j) a += p[kW1 + u * kIn + j] * x[b * kIn + j];
      h[b * kHidden + u] = a > 0 ? a : 0;
      out += p[kW2 + u] * h[b * kHidden + u];
    }
    loss += (out - y) * (out - y) / static_cast<float>(batch.size());
    dout[b] = 2 * (out - y) / static_cast<float>(batch.size());
  }
  for (size_t b = 0; b < batch.size(); ++b) {  // output layer
    g[kB2] += dout[b];
    for (int u = 0; u < kHidden; ++u) g[kW2 + u] += dout[b] * h[b * kHidden + u];
  }
  reducer.mark_ready(3);  // b2 and W2 are final: their all-reduce starts now
  reducer.mark_ready(2);
  for (size_t b = 0; b < batch.size(); ++b)  // hidden layer
    for (int u = 0; u < kHidden; ++u) {
      if (h[b * kHidden + u] <= 0) continue;
      const float dh = dout[b] * p[kW2 + u];
      g[kB1 + u] += dh;
      for (int j = 0; j < kIn; ++j) g[kW1 + u * kIn + j] += dh * x[b * kIn + j];
    }
  reducer.mark_ready(1);
  reducer.mark_ready(0);
  return loss;
}

int main() {
  return dw::run_worker_main([] {  // an exception becomes the error file and a failing exit
    auto rt = dw::init();           // RANK, WORLD_SIZE, MASTER_ADDR... from ddprun; Gloo on the CPU
    dw::Communicator& comm = rt->comm();
    const int rank = rt->rank(), world = rt->world_size();

    std::vector<float> params(kN), grads(kN);
    for (size_t k = 0; k < kN; ++k) params[k] = 0.3f * uniform(1000003 + k);
    comm.broadcast(params.data(), kN * sizeof(float), 0);  // everyone starts from rank 0's model
    // The gradients of W1, b1, W2, b2 (registration order) in one flat buffer: reduced in place.
    dw::Reducer reducer(comm, {{&grads[kW1], kB1}, {&grads[kB1], kHidden}, {&grads[kW2], kHidden}, {&grads[kB2], 1}},
                        dw::DType::F32);
    dw::DistributedSampler sampler({kSamples, world, rank, /*shuffle=*/true, /*seed=*/7, /*drop_last=*/false});

    float first = 0, last = 0;
    const size_t steps = sampler.num_batches(kBatch);
    for (int epoch = 0; epoch < kEpochs; ++epoch) {
      sampler.set_epoch(static_cast<uint64_t>(epoch));  // a new shuffle, the same on every rank
      float sum = 0;
      for (size_t s = 0; s < steps; ++s) {
        reducer.prepare_for_backward();
        sum += train_step(sampler.batch(s, kBatch), params.data(), grads.data(), reducer);
        reducer.finalize();  // grads now hold the average over ranks
        for (size_t k = 0; k < kN; ++k) params[k] -= 0.05f * grads[k];
      }
      last = sum / static_cast<float>(steps);
      if (epoch == 0) first = last;
      if (rank == 0 && epoch % 5 == 0) std::printf("epoch %d loss %.5f\n", epoch, last);
    }

    // Every rank holds the same parameters: compare their checksums.
    std::vector<int64_t> sums(static_cast<size_t>(world));
    const auto mine = static_cast<int64_t>(dw::fnv1a64(params.data(), kN * sizeof(float)));
    comm.allgather(&mine, sums.data(), 1, dw::DType::I64);
    for (int64_t s : sums)
      if (s != mine) throw dw::WorkerError("rank " + std::to_string(rank) + ": parameters differ between ranks");
    if (!(last < 0.5f * first)) throw dw::WorkerError("the loss did not go down enough");
    if (rank == 0) std::printf("loss %.5f -> %.5f; parameters identical on %d ranks\n", first, last, world);
    return 0;
  });
}
