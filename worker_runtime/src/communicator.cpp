#include "ddprun/worker/communicator.h"

namespace ddprun::worker {

void allreduce_then_step(Communicator& comm, float* grad, size_t count, const ElementwiseStep& step,
                         float* const* arrays) {
  comm.allreduce(grad, count, DType::F32, ReduceOp::Avg);
  step.apply(arrays, grad, count);
}

}  // namespace ddprun::worker
