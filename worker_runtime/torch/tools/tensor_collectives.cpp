// ddprun-torch-collectives: the tensor collectives of collectives.h on fixed inputs, printed
// as raw bytes, for the test that runs PyTorch's torch.distributed on the same inputs
// (tests/worker_runtime/torch/tensor_collectives_test.py). Inputs: torch::manual_seed(100 +
// rank), the same generator as the Python side's. One line per case:
//   case <name> <dtype> <hex of the result's bytes, contiguous>
// Then a line per misuse case with the error message ("misuse <name> <message>").
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>

#include "ddprun/worker/runtime.h"
#include "ddprun/worker/torch/collectives.h"

namespace dw = ddprun::worker;
namespace dist = ddprun::worker::libtorch;

namespace {

void print_case(const std::string& name, const at::Tensor& t) {
  const at::Tensor c = t.contiguous().cpu();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  std::string hex;
  hex.reserve(c.nbytes() * 2);
  static const char* digits = "0123456789abcdef";
  for (size_t i = 0; i < c.nbytes(); ++i) {
    hex += digits[p[i] >> 4];
    hex += digits[p[i] & 15];
  }
  std::printf("case %s %s %s\n", name.c_str(), c10::toString(c.scalar_type()), hex.c_str());
}

template <class F>
void misuse(const std::string& name, F&& f) {
  try {
    f();
    std::printf("misuse %s accepted\n", name.c_str());
  } catch (const dw::WorkerError& e) {
    std::printf("misuse %s %s\n", name.c_str(), e.what());
  }
}

}  // namespace

int main() {
  return dw::run_worker_main([] {
    dw::RuntimeOptions ro;
    ro.device = dw::DeviceKind::Cpu;
    auto rt = dw::init(ro);
    auto& comm = rt->comm();
    const int rank = rt->rank(), world = rt->world_size();
    torch::manual_seed(100 + rank);

    auto t = torch::randn({5, 7});
    dist::all_reduce(comm, t);
    print_case("all_reduce_sum_f32", t);

    t = torch::randn({11}, torch::kDouble);
    dist::all_reduce(comm, t, dw::ReduceOp::Max);
    print_case("all_reduce_max_f64", t);

    t = torch::randn({33}).to(torch::kHalf);
    dist::all_reduce(comm, t);
    print_case("all_reduce_sum_f16", t);

    t = torch::randn({33}).to(torch::kBFloat16);
    dist::all_reduce(comm, t);
    print_case("all_reduce_sum_bf16", t);

    t = torch::randint(-50, 50, {9}, torch::kLong);
    dist::all_reduce(comm, t);
    print_case("all_reduce_sum_i64", t);

    t = torch::randn({13});
    dist::all_reduce(comm, t, dw::ReduceOp::Avg);
    print_case("all_reduce_avg_f32", t);

    t = torch::randn({6, 4}).t();  // not contiguous
    dist::all_reduce(comm, t);
    print_case("all_reduce_sum_noncontiguous", t);

    t = torch::randn({3, 3});
    dist::broadcast(comm, t, world - 1);
    print_case("broadcast_last", t);

    t = torch::randint(-1000, 1000, {4}, torch::kInt);
    std::vector<at::Tensor> parts;
    for (int r = 0; r < world; ++r) parts.push_back(torch::empty_like(t));
    dist::all_gather(comm, parts, t);
    print_case("all_gather_i32", torch::cat(parts));

    t = torch::randn({2, 3});
    auto out = torch::empty({2 * world, 3});
    dist::all_gather_into_tensor(comm, out, t);
    print_case("all_gather_into_tensor_f32", out);

    t = torch::randn({4 * world});
    out = torch::empty({4});
    dist::reduce_scatter_tensor(comm, out, t);
    print_case("reduce_scatter_tensor_f32", out);

    dist::barrier(comm);

    misuse("dtype", [&] { dist::all_reduce(comm, torch::ones({2}, torch::kBool)); });
    misuse("list_length", [&] {
      std::vector<at::Tensor> one{torch::empty({2})};
      dist::all_gather(comm, one, torch::ones({2}));
    });
    misuse("output_size", [&] {
      auto o = torch::empty({3});
      dist::all_gather_into_tensor(comm, o, torch::ones({2}));
    });
    misuse("src", [&] { dist::broadcast(comm, torch::ones({2}), world); });
    std::fflush(stdout);
    return 0;
  });
}
