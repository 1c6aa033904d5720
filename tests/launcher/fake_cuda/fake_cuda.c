/* A stand-in for the NVIDIA driver's libcuda.so.1, for tests on machines without a GPU: the
 * driver calls a GPU-warm spare makes before it creates a context (launcher/src/spares/
 * spare_bootstrap.py), answered from the environment:
 *   DDPRUN_FAKE_CUDA_GPUS           how many devices (default 1)
 *   DDPRUN_FAKE_CUDA_COMPUTE_MODE   every device's compute mode (0 DEFAULT, 2 PROHIBITED,
 *                                   3 EXCLUSIVE_PROCESS; default 0)
 * Creating a context fails (CUDA_ERROR_UNKNOWN): there is no GPU behind it. Loaded only where a
 * test puts its directory in LD_LIBRARY_PATH. */
#include <stdlib.h>

typedef int CUresult;
typedef int CUdevice;
typedef void* CUcontext;

enum { kSuccess = 0, kInvalidValue = 1, kInvalidDevice = 101, kUnknown = 999, kComputeModeAttr = 20 };

static int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}

CUresult cuInit(unsigned int flags) { return flags == 0 ? kSuccess : kInvalidValue; }

CUresult cuDeviceGetCount(int* count) {
  if (!count) return kInvalidValue;
  *count = env_int("DDPRUN_FAKE_CUDA_GPUS", 1);
  return kSuccess;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (!device) return kInvalidValue;
  if (ordinal < 0 || ordinal >= env_int("DDPRUN_FAKE_CUDA_GPUS", 1)) return kInvalidDevice;
  *device = ordinal;
  return kSuccess;
}

CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device) {
  if (!value || device < 0 || device >= env_int("DDPRUN_FAKE_CUDA_GPUS", 1)) return kInvalidValue;
  *value = attribute == kComputeModeAttr ? env_int("DDPRUN_FAKE_CUDA_COMPUTE_MODE", 0) : 0;
  return kSuccess;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
  (void)ctx;
  (void)device;
  return kUnknown;
}
