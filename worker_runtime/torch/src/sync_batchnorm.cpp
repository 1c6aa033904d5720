// SyncBatchNorm: batch statistics over every rank's batch (forward: an all-gather of each
// rank's mean, variance and count; backward: an all-reduce of two per-channel sums).
#include "ddprun/worker/torch/sync_batchnorm.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/nn/modules/batchnorm.h>

#include <string>
#include <vector>

#include "ddprun/worker/torch/collectives.h"
#include "ddprun/worker/torch/ddp.h"

namespace ddprun::worker::libtorch {

namespace {

using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

// Every dimension but the channels' (1).
std::vector<int64_t> reduce_dims(const at::Tensor& x) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

// A per-channel vector shaped to broadcast against x: [1, C, 1, ...].
at::Tensor per_channel(const at::Tensor& v, const at::Tensor& x) {
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[1] = x.size(1);
  return v.reshape(shape);
}

at::ScalarType compute_type(const at::Tensor& x) { return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

Communicator* comm_of(AutogradContext* ctx) {
  return reinterpret_cast<Communicator*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
}

struct SyncBatchNormFunction : public ::torch::autograd::Function<SyncBatchNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& running_mean, const at::Tensor& running_var,
                            double momentum, double eps, int64_t comm_address) {
    Communicator& comm = *reinterpret_cast<Communicator*>(static_cast<intptr_t>(comm_address));
    const auto type = compute_type(input);
    const at::Tensor x = input.to(type);
    const int64_t channels = input.size(1);
    const auto dims = reduce_dims(x);
    const double count = static_cast<double>(input.numel() / channels);
    // This rank's per-channel mean and biased variance, and its count: [mean, var, count].
    at::Tensor mine = at::cat({x.mean(dims).to(at::kDouble), x.var(dims, /*unbiased=*/false).to(at::kDouble),
                               at::full({1}, count, x.options().dtype(at::kDouble))});
    at::Tensor all = at::empty({static_cast<int64_t>(comm.size()), 2 * channels + 1}, mine.options());
    all_gather_into_tensor(comm, all, mine);
    // Merged (Chan et al.): the mean and biased variance of the global batch.
    const at::Tensor means = all.narrow(1, 0, channels), vars = all.narrow(1, channels, channels);
    const at::Tensor counts = all.narrow(1, 2 * channels, 1);
    const at::Tensor total = counts.sum();
    const at::Tensor mean = (means * counts).sum(0) / total;
    const at::Tensor var = ((vars + (means - mean).pow(2)) * counts).sum(0) / total;
    const double n = total.item<double>();
    if (n <= 1)
      throw DdpError("SyncBatchNorm: expected more than 1 value per channel over all ranks in training, got " +
                     std::to_string(static_cast<int64_t>(n)));
    if (running_mean.defined()) {
      at::NoGradGuard ng;
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      running_var.mul_(1 - momentum).add_((var * (n / (n - 1))).to(running_var.scalar_type()), momentum);
    }
    const at::Tensor mean_t = mean.to(type), invstd = (var + eps).rsqrt().to(type);
    at::Tensor out = (x - per_channel(mean_t, x)) * per_channel(invstd, x);
    if (weight.defined()) out = out * per_channel(weight.to(type), x) + per_channel(bias.to(type), x);
    ctx->save_for_backward({input, weight, mean_t, invstd});
    ctx->saved_data["count"] = n;
    ctx->saved_data["comm"] = comm_address;
    return out.to(input.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& mean = saved[2];
    const at::Tensor& invstd = saved[3];
    const double n = ctx->saved_data["count"].toDouble();
    const auto type = compute_type(input);
    const at::Tensor x = input.to(type), dy = grad_outputs[0].to(type);
    const auto dims = reduce_dims(x);
    const at::Tensor xmu = x - per_channel(mean, x);
    at::Tensor sum_dy = dy.sum(dims), sum_dy_xmu = (dy * xmu).sum(dims);
    at::Tensor grad_weight, grad_bias;  // this rank's (DDP averages them)
    if (weight.defined() && ctx->needs_input_grad(1)) grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
    if (weight.defined() && ctx->needs_input_grad(2)) grad_bias = sum_dy.to(weight.scalar_type());
    at::Tensor grad_input;
    if (ctx->needs_input_grad(0)) {
      const int64_t channels = input.size(1);
      at::Tensor both = at::cat({sum_dy, sum_dy_xmu});
      all_reduce(*comm_of(ctx), both, ReduceOp::Sum);
      const at::Tensor mean_dy = both.narrow(0, 0, channels) / n;
      const at::Tensor mean_dy_xmu = both.narrow(0, channels, channels) / n;
      at::Tensor scale = invstd;
      if (weight.defined()) scale = scale * weight.to(type);
      grad_input = ((dy - per_channel(mean_dy, x) - xmu * per_channel(invstd * invstd * mean_dy_xmu, x)) *
                    per_channel(scale, x))
                       .to(input.scalar_type());
    }
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const ::torch::nn::BatchNormOptions& options_) : options(options_) {
  if (options.affine()) {
    weight = register_parameter("weight", at::ones({options.num_features()}));
    bias = register_parameter("bias", at::zeros({options.num_features()}));
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", at::zeros({options.num_features()}));
    running_var = register_buffer("running_var", at::ones({options.num_features()}));
    num_batches_tracked = register_buffer("num_batches_tracked", at::zeros({}, at::kLong));
  }
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  at::NoGradGuard ng;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  if (input.dim() < 2 || input.size(1) != options.num_features())
    throw DdpError("SyncBatchNorm: expected an input of shape (N, " + std::to_string(options.num_features()) +
                   ", ...), got " + std::to_string(input.dim()) + " dimensions" +
                   (input.dim() >= 2 ? " with " + std::to_string(input.size(1)) + " channels" : std::string()));
  // PyTorch's _BatchNorm: the momentum, or a cumulative average without one.
  double factor = options.momentum().has_value() ? *options.momentum() : 0.0;
  if (is_training() && options.track_running_stats()) {
    {
      at::NoGradGuard ng;
      num_batches_tracked.add_(1);
    }
    if (!options.momentum().has_value()) factor = 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  }
  const bool batch_stats = is_training() || !running_mean.defined();
  const at::Tensor rm = !is_training() || options.track_running_stats() ? running_mean : at::Tensor();
  const at::Tensor rv = !is_training() || options.track_running_stats() ? running_var : at::Tensor();
  if (!(batch_stats && is_training() && comm_ && comm_->size() > 1))
    return at::batch_norm(input, weight, bias, rm, rv, batch_stats, factor, options.eps(), /*cudnn_enabled=*/true);
  return SyncBatchNormFunction::apply(input, weight, bias, rm, rv, factor, options.eps(),
                                      static_cast<int64_t>(reinterpret_cast<intptr_t>(comm_)));
}

size_t convert_sync_batchnorm(::torch::nn::Module& module, Communicator& comm) {
  size_t bound = 0;
  std::vector<std::string> plain;
  auto visit = [&](const std::string& name, ::torch::nn::Module& m) {
    if (auto* s = m.as<SyncBatchNormImpl>()) {
      s->set_communicator(&comm);
      ++bound;
    } else if (m.as<::torch::nn::BatchNorm1dImpl>() || m.as<::torch::nn::BatchNorm2dImpl>() ||
               m.as<::torch::nn::BatchNorm3dImpl>()) {
      plain.push_back(name.empty() ? "(the module itself)" : "'" + name + "'");
    }
  };
  visit("", module);
  for (const auto& item : module.named_modules("", /*include_self=*/false)) visit(item.key(), *item.value());
  if (!plain.empty()) {
    std::string list;
    for (size_t k = 0; k < plain.size(); ++k) list += (k ? ", " : "") + plain[k];
    throw DdpError("convert_sync_batchnorm: " + list + (plain.size() > 1 ? " are" : " is") +
                   " torch::nn::BatchNorm, which cannot be replaced under its owner's member in C++; declare " +
                   (plain.size() > 1 ? "them" : "it") +
                   " as ddprun::worker::libtorch::SyncBatchNorm (same options and parameter names), which is plain "
                   "batch norm until bound here");
  }
  return bound;
}

}  // namespace ddprun::worker::libtorch
