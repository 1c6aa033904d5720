// One rank of a job started by the installed ddprun: joins the job through the launcher's store,
// all-reduces its rank + 1 over Gloo, and checks the sum of every rank's.
#include <ddprun/worker/runtime.h>

#include <cstdio>

int main() {
  return ddprun::worker::run_worker_main([] {
    ddprun::worker::RuntimeOptions opts;
    opts.device = ddprun::worker::DeviceKind::Cpu;
    auto rt = ddprun::worker::init(opts);
    const int n = rt->world_size();
    double v = rt->rank() + 1;
    rt->comm().allreduce(&v, 1, ddprun::worker::DType::F64, ddprun::worker::ReduceOp::Sum);
    const double want = n * (n + 1) / 2.0;
    std::printf("deb_consumer: rank %d of %d, backend %s, sum %g (want %g)\n", rt->rank(), n,
                rt->comm().backend(), v, want);
    return v == want ? 0 : 1;
  });
}
