// The model code of the `train` harness, not part of libddprun_worker (a user brings the model).
// The model on CPU: Linear(in, width), ReLU, [Linear(width, width), ReLU] x depth,
// Linear(width, out), with MSE loss. depth = 0, width = 50 is train's default model.
// Parameters (and gradients) live in caller-owned flat fp32 buffers laid out in PyTorch's
// parameters() order: W0 [width, in], b0 [width], W1, b1, ..., W_last [out, width], b_last.
// Not thread-safe (owns its activation workspace).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "ddprun/worker/communicator.h"

namespace ddprun::example {

struct MlpShape {
  int in = 10;
  int width = 50;
  int depth = 0;
  int out = 1;
};

struct ParamTensor {
  size_t offset = 0;  // elements into the flat buffer
  size_t count = 0;
  int fan_in = 0;
};

// The tensors of a shape, in registration order.
std::vector<ParamTensor> mlp_param_tensors(const MlpShape& shape);
size_t mlp_num_params(const MlpShape& shape);
// PyTorch's default Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases,
// from a counter-based generator seeded by `seed` (not PyTorch's numbers).
void mlp_init(const MlpShape& shape, uint64_t seed, float* params);

class CpuMlp {
 public:
  explicit CpuMlp(MlpShape shape);
  const MlpShape& shape() const { return shape_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }

  // Mean-squared-error loss of a batch (x [batch, in], y [batch, out]).
  float loss(const float* params, const float* x, const float* y, int batch);
  // Forward + backward: writes (or adds, when accumulate) dLoss/dparams into grads, calling
  // on_ready(tensor index) as soon as a tensor's gradient is final (last layer first), so a
  // Reducer can start communicating. grad_scale multiplies the loss gradient (1 = plain
  // mean; use 1/k when accumulating k micro-batches). Returns the loss.
  float forward_backward(const float* params, const float* x, const float* y, int batch, float* grads,
                         bool accumulate, const std::function<void(size_t)>& on_ready, float grad_scale = 1.f);
  // Called between forward and backward in every forward_backward() (timing: a training
  // loop's per-phase breakdown). Empty: nothing.
  void set_on_backward_start(std::function<void()> f) { on_backward_start_ = std::move(f); }

 private:
  float forward(const float* params, const float* x, const float* y, int batch);
  MlpShape shape_;
  std::vector<ParamTensor> tensors_;
  std::vector<int> dims_;                 // in, width, ..., out
  std::vector<std::vector<float>> acts_;  // acts_[l] = input of layer l (post-ReLU); acts_.back() = output
  std::vector<float> dz_, dz_prev_;
  std::function<void()> on_backward_start_;
};

// SGD (PyTorch semantics): with momentum, buf = momentum * buf + g (buf = g on the first
// step), p -= lr * buf; without, p -= lr * g.
void sgd_step(float* params, const float* grads, float* momentum_buf, size_t n, float lr, float momentum,
              bool first_step);

// sgd_step as an ElementwiseStep for Reducer::finalize_and_step(): arrays {params} without
// momentum, {params, momentum buffer} with. It calls sgd_step itself, so the fused and the
// unfused step run the same float operations and give the same bits.
struct SgdStep final : worker::ElementwiseStep {
  float lr = 0.01f;
  float momentum = 0.f;
  bool first_step = true;  // momentum buffer not initialised yet (buf = g)
  SgdStep(float lr_, float momentum_, bool first_step_) : lr(lr_), momentum(momentum_), first_step(first_step_) {}
  size_t num_arrays() const override { return momentum != 0.f ? 2 : 1; }
  void apply(float* const* a, const float* g, size_t n) const override {
    sgd_step(a[0], g, momentum != 0.f ? a[1] : nullptr, n, lr, momentum, first_step);
  }
};

}  // namespace ddprun::example
