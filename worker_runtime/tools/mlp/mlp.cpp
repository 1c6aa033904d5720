#include "mlp/mlp.h"

#include <cmath>

#include "ddprun/worker/checks.h"
#include "mlp/gemm.h"
#include "ddprun/worker/hash.h"

namespace ddprun::example {

std::vector<ParamTensor> mlp_param_tensors(const MlpShape& s) {
  std::vector<int> dims{s.in, s.width};
  for (int i = 0; i < s.depth; ++i) dims.push_back(s.width);
  dims.push_back(s.out);
  std::vector<ParamTensor> t;
  size_t off = 0;
  for (size_t l = 0; l + 1 < dims.size(); ++l) {
    const size_t w = static_cast<size_t>(dims[l + 1]) * static_cast<size_t>(dims[l]);
    t.push_back({off, w, dims[l]});
    off += w;
    t.push_back({off, static_cast<size_t>(dims[l + 1]), dims[l]});
    off += static_cast<size_t>(dims[l + 1]);
  }
  return t;
}

size_t mlp_num_params(const MlpShape& shape) {
  auto t = mlp_param_tensors(shape);
  return t.back().offset + t.back().count;
}

void mlp_init(const MlpShape& shape, uint64_t seed, float* params) {
  const auto tensors = mlp_param_tensors(shape);
  for (size_t k = 0; k < tensors.size(); ++k) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(tensors[k].fan_in));
    worker::Rng rng{worker::splitmix64(seed * 1000003ull + k)};
    for (size_t i = 0; i < tensors[k].count; ++i) params[tensors[k].offset + i] = (2.f * rng.next_unit() - 1.f) * bound;
  }
}

CpuMlp::CpuMlp(MlpShape shape) : shape_(shape), tensors_(mlp_param_tensors(shape)) {
  DDPRUN_ENFORCE(shape.in > 0 && shape.width > 0 && shape.depth >= 0 && shape.out > 0, "bad MLP shape");
  dims_ = {shape.in, shape.width};
  for (int i = 0; i < shape.depth; ++i) dims_.push_back(shape.width);
  dims_.push_back(shape.out);
  acts_.resize(dims_.size());
}

float CpuMlp::forward(const float* params, const float* x, const float* y, int batch) {
  const size_t L = dims_.size() - 1;
  acts_[0].assign(x, x + static_cast<size_t>(batch) * dims_[0]);
  for (size_t l = 0; l < L; ++l) {
    const int in = dims_[l], out = dims_[l + 1];
    const float* W = params + tensors_[2 * l].offset;
    const float* b = params + tensors_[2 * l + 1].offset;
    auto& z = acts_[l + 1];
    z.resize(static_cast<size_t>(batch) * out);
    sgemm(false, true, batch, out, in, acts_[l].data(), in, W, in, z.data(), out, false);
    const bool relu = l + 1 < L;
    for (int i = 0; i < batch; ++i) {
      float* row = z.data() + static_cast<size_t>(i) * out;
      if (relu) {
        for (int j = 0; j < out; ++j) row[j] = std::max(row[j] + b[j], 0.f);
      } else {
        for (int j = 0; j < out; ++j) row[j] += b[j];
      }
    }
  }
  const auto& o = acts_[L];
  double sum = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    const double d = static_cast<double>(o[i]) - y[i];
    sum += d * d;
  }
  return static_cast<float>(sum / static_cast<double>(o.size()));
}

float CpuMlp::loss(const float* params, const float* x, const float* y, int batch) {
  return forward(params, x, y, batch);
}

float CpuMlp::forward_backward(const float* params, const float* x, const float* y, int batch, float* grads,
                               bool accumulate, const std::function<void(size_t)>& on_ready, float grad_scale) {
  const float loss_value = forward(params, x, y, batch);
  if (on_backward_start_) on_backward_start_();
  const size_t L = dims_.size() - 1;
  // dLoss/dout = 2 (o - y) / (batch * out)
  const auto& o = acts_[L];
  dz_.resize(o.size());
  const float k = 2.f * grad_scale / static_cast<float>(o.size());
  for (size_t i = 0; i < o.size(); ++i) dz_[i] = k * (o[i] - y[i]);
  for (size_t l = L; l-- > 0;) {
    const int in = dims_[l], out = dims_[l + 1];
    float* dW = grads + tensors_[2 * l].offset;
    float* db = grads + tensors_[2 * l + 1].offset;
    // dW[out, in] = dz^T [out, batch] . a_l [batch, in]
    sgemm(true, false, out, in, batch, dz_.data(), out, acts_[l].data(), in, dW, in, accumulate);
    if (!accumulate)
      for (int j = 0; j < out; ++j) db[j] = 0.f;
    for (int i = 0; i < batch; ++i) {
      const float* row = dz_.data() + static_cast<size_t>(i) * out;
      for (int j = 0; j < out; ++j) db[j] += row[j];
    }
    if (on_ready) {
      on_ready(2 * l + 1);
      on_ready(2 * l);
    }
    if (l == 0) break;
    // da [batch, in] = dz [batch, out] . W [out, in]; dz_prev = da * relu'(a_l)
    const float* W = params + tensors_[2 * l].offset;
    dz_prev_.resize(static_cast<size_t>(batch) * in);
    sgemm(false, false, batch, in, out, dz_.data(), out, W, in, dz_prev_.data(), in, false);
    const auto& a = acts_[l];
    for (size_t i = 0; i < dz_prev_.size(); ++i) dz_prev_[i] = a[i] > 0.f ? dz_prev_[i] : 0.f;
    dz_.swap(dz_prev_);
  }
  return loss_value;
}

void sgd_step(float* params, const float* grads, float* momentum_buf, size_t n, float lr, float momentum,
              bool first_step) {
  if (momentum == 0.f || momentum_buf == nullptr) {
    for (size_t i = 0; i < n; ++i) params[i] -= lr * grads[i];
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const float b = first_step ? grads[i] : momentum * momentum_buf[i] + grads[i];
    momentum_buf[i] = b;
    params[i] -= lr * b;
  }
}

}  // namespace ddprun::example
