// PowerSGD comm hook: the semantics and arithmetic of PyTorch's powerSGD_hook (see powersgd.h).
#include "ddprun/worker/torch/powersgd.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "ddprun/worker/torch/collectives.h"

namespace ddprun::worker::libtorch {

namespace {

// numpy's legacy RandomState(seed).randint(1_000_000_000): 32-bit Mersenne Twister outputs
// masked to 30 bits, rejected above the bound.
uint64_t next_seed(PowerSGDState& s) {
  if (!s.rng_seeded) {
    s.rng.seed(s.random_seed);
    s.rng_seeded = true;
  }
  constexpr uint32_t bound = 999999999u, mask = (1u << 30) - 1;
  uint32_t v = 0;
  do v = static_cast<uint32_t>(s.rng()) & mask;
  while (v > bound);
  return v;
}

// Columns of each matrix of a batch [B, n, r] made orthonormal, one after the other.
void orthogonalize_gram_schmidt(const at::Tensor& matrices, double epsilon) {
  const int64_t cols = matrices.size(2);
  for (int64_t i = 0; i < cols; ++i) {
    at::Tensor col = matrices.narrow(2, i, 1);
    at::Tensor norm = at::linalg_vector_norm(col, 2, at::IntArrayRef{1}, /*keepdim=*/true);
    if (epsilon == 0) col.div_(norm);
    else col.div_(norm + epsilon);
    if (i + 1 < cols) {
      at::Tensor rest = matrices.narrow(2, i + 1, cols - i - 1);
      rest.sub_((col * rest).sum(at::IntArrayRef{1}, /*keepdim=*/true) * col);
    }
  }
}

void orthogonalize(const at::Tensor& matrices, double epsilon) {
  const auto type = matrices.scalar_type();
  if (matrices.size(2) <= 2 || type == at::kHalf || type == at::kBFloat16) {
    orthogonalize_gram_schmidt(matrices, epsilon);
  } else {
    auto qr = at::linalg_qr(matrices);
    matrices.copy_(std::get<0>(qr));
  }
}

}  // namespace

void PowerSGDState::check() const {
  if ((use_error_feedback || warm_start) && start_powerSGD_iter <= 1)
    throw ConfigError("PowerSGD: start_powerSGD_iter must be > 1 with use_error_feedback or warm_start (got " +
                      std::to_string(start_powerSGD_iter) +
                      "): PowerSGD can only start after the first two iterations, once DDP rebuilt its buckets");
  if (matrix_approximation_rank < 1)
    throw ConfigError("PowerSGD: matrix_approximation_rank must be at least 1 (got " +
                      std::to_string(matrix_approximation_rank) + ")");
}

void powerSGD_hook(PowerSGDState& state, Communicator& comm, GradBucket& bucket) {
  state.check();
  const int world = comm.size();
  at::Tensor& input = bucket.buffer;
  if (state.iter < state.start_powerSGD_iter) {  // plain averaging first (allreduce_hook)
    if (bucket.is_last) ++state.iter;
    input.div_(world);
    all_reduce(comm, input, ReduceOp::Sum);
    return;
  }
  const auto options = input.options();
  const size_t index = bucket.index;
  at::Tensor input_copy;
  if (state.use_error_feedback) {
    auto it = state.error_dict.find(index);
    if (it != state.error_dict.end()) input.add_(it->second);
    else state.error_dict[index] = at::zeros({input.numel()}, options);
    input_copy = input.detach().clone();
  }

  // Which gradients to compress: as matrices (first dimension x the rest).
  std::vector<at::Tensor> to_compress, uncompressed;
  int64_t ps_size = 0, qs_size = 0;
  for (const auto& g : bucket.gradients) {
    if (g.dim() == 0) {
      uncompressed.push_back(g);
      ++state.total_numel_before_compression;
      ++state.total_numel_after_compression;
      continue;
    }
    at::Tensor matrix = g.view({g.size(0), -1});
    const int64_t n = matrix.size(0), m = matrix.size(1);
    const int64_t rank = std::min({n, m, state.matrix_approximation_rank});
    const int64_t full = n * m, compressed = (n + m) * rank;
    state.total_numel_before_compression += full;
    if (static_cast<double>(compressed) * state.min_compression_rate < static_cast<double>(full)) {
      to_compress.push_back(matrix);
      ps_size += n * rank;
      qs_size += m * rank;
      state.total_numel_after_compression += compressed;
    } else {
      uncompressed.push_back(g);
      state.total_numel_after_compression += full;
    }
  }
  std::vector<at::Tensor> flat;
  for (const auto& t : uncompressed) flat.push_back(t.reshape({-1}));
  at::Tensor uncompressed_memory = flat.empty() ? at::empty({0}, options) : at::cat(flat);

  bool randomize = false;
  if (!state.warm_start || !state.p_memory_dict.count(index)) {
    randomize = true;
    state.p_memory_dict[index] = at::empty({ps_size}, options);
    state.q_memory_dict[index] = at::empty({qs_size}, options);
  }
  const at::Tensor& p_memory = state.p_memory_dict[index];
  const at::Tensor& q_memory = state.q_memory_dict[index];

  // Matrices grouped by shape, shapes in order of first appearance (PyTorch's grouping).
  std::vector<std::pair<std::vector<int64_t>, std::vector<at::Tensor>>> groups;
  for (const auto& matrix : to_compress) {
    const std::vector<int64_t> shape(matrix.sizes().begin(), matrix.sizes().end());
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == shape; });
    if (it == groups.end()) groups.push_back({shape, {matrix}});
    else it->second.push_back(matrix);
  }
  std::vector<at::Tensor> matrices, ps, qs;
  int64_t p_at = 0, q_at = 0;
  for (const auto& group : groups)
    for (const auto& matrix : group.second) {
      const int64_t n = matrix.size(0), m = matrix.size(1);
      const int64_t rank = std::min({n, m, state.matrix_approximation_rank});
      matrices.push_back(matrix.unsqueeze(0));
      ps.push_back(p_memory.narrow(0, p_at, n * rank).view({1, n, rank}));
      qs.push_back(q_memory.narrow(0, q_at, m * rank).view({1, m, rank}));
      p_at += n * rank;
      q_at += m * rank;
    }

  if (!randomize) {
    for (const auto& q : qs) orthogonalize(q, state.orthogonalization_epsilon);
  } else {
    // Every rank draws the same Q: LibTorch's CPU generator seeded from the shared stream.
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(next_seed(state));
    for (const auto& q : qs) {
      q.copy_(at::randn(q.sizes(), gen, at::TensorOptions().dtype(input.scalar_type()).device(at::kCPU)));
      orthogonalize(q, state.orthogonalization_epsilon);
    }
  }
  for (size_t k = 0; k < matrices.size(); ++k) at::bmm_out(ps[k], matrices[k], qs[k]);

  if (uncompressed_memory.numel() > 0) {
    all_reduce(comm, uncompressed_memory, ReduceOp::Sum);
    uncompressed_memory.div_(world);
    int64_t at_ = 0;
    for (auto& t : uncompressed) {
      t.copy_(uncompressed_memory.narrow(0, at_, t.numel()).view_as(t));
      at_ += t.numel();
    }
  }
  if (p_memory.numel() > 0) all_reduce(comm, p_memory, ReduceOp::Sum);
  for (const auto& p : ps) orthogonalize(p, state.orthogonalization_epsilon);
  for (size_t k = 0; k < matrices.size(); ++k) at::bmm_out(qs[k], matrices[k].transpose(1, 2), ps[k]);
  if (q_memory.numel() > 0) all_reduce(comm, q_memory, ReduceOp::Sum);
  q_memory.div_(world);
  for (size_t k = 0; k < matrices.size(); ++k) at::bmm_out(matrices[k], ps[k], qs[k].transpose(1, 2));

  if (state.use_error_feedback) state.error_dict[index] = input_copy - input;
  if (!state.warm_start) {
    state.p_memory_dict.clear();
    state.q_memory_dict.clear();
  }
  if (bucket.is_last) ++state.iter;
}

}  // namespace ddprun::worker::libtorch
