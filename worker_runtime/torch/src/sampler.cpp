#include "ddprun/worker/torch/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ATen.h>

namespace ddprun::worker::libtorch {

std::vector<size_t> pytorch_permutation(size_t n, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor perm = at::randperm(static_cast<int64_t>(n), gen, at::TensorOptions().dtype(at::kLong));
  const int64_t* p = perm.data_ptr<int64_t>();
  return std::vector<size_t>(p, p + n);
}

}  // namespace ddprun::worker::libtorch
