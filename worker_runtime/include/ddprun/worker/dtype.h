// The element types every collective takes (communicator.h) and the reducer, checkers and
// tools name: one enum, its size and its printed name.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ddprun/worker/export.h"

namespace ddprun::worker {

enum class DType : uint8_t { F32, BF16, F16, I32, F64, I64 };

inline size_t dtype_size(DType d) {
  switch (d) {
    case DType::F64:
    case DType::I64: return 8;
    case DType::F32:
    case DType::I32: return 4;
    case DType::BF16:
    case DType::F16: return 2;
  }
  return 0;
}
// "fp32", "bf16", "fp16", "int32", "fp64", "int64"; "?" for a value out of the enum.
DDPRUN_WORKER_API const char* dtype_name(DType d);

}  // namespace ddprun::worker
