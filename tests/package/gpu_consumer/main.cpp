// gpu_consumer cpu|cuda: a world of one on the device asked for, one all-reduce. Prints the
// backend and exits 0, or prints the library's error and exits 3.
#include <cstdio>
#include <cstring>
#include <exception>

#include <ddprun/worker/runtime.h>

namespace dw = ddprun::worker;

int main(int argc, char** argv) {
  if (argc != 2 || (std::strcmp(argv[1], "cpu") != 0 && std::strcmp(argv[1], "cuda") != 0)) {
    std::fprintf(stderr, "usage: gpu_consumer cpu|cuda\n");
    return 2;
  }
  dw::RuntimeOptions o;
  o.device = std::strcmp(argv[1], "cuda") == 0 ? dw::DeviceKind::Cuda : dw::DeviceKind::Cpu;
  try {
    auto rt = dw::init(o);
    float x = 2.f;
    rt->comm().allreduce(&x, 1, dw::DType::F32, dw::ReduceOp::Sum);
    std::printf("gpu_consumer: %s path ok (backend %s, cuda available: %d)\n", argv[1], rt->comm().backend(),
                dw::cuda_available() ? 1 : 0);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_consumer: %s\n", e.what());
    return 3;
  }
}
