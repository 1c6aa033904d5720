#include "ddprun/worker/dtype.h"

namespace ddprun::worker {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "fp32";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    case DType::I32: return "int32";
    case DType::F64: return "fp64";
    case DType::I64: return "int64";
  }
  return "?";
}

}  // namespace ddprun::worker
