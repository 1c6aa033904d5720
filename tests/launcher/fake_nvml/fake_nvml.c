/* A stand-in for the NVIDIA driver's libnvidia-ml.so.1, for tests on machines without a GPU:
 * the few NVML calls ddprun makes, answered from a text file named by DDPRUN_FAKE_NVML_STATE
 * and read at every call:
 *   gpu <index> <utilization %>          one line per GPU (indices 0..n-1)
 *   proc <index> <pid> <bytes>           a compute process on that GPU
 * No file, or no gpu line: a driver with no GPU. Loaded only where a test puts its directory
 * in LD_LIBRARY_PATH. Each nvmlInit_v2 appends a line "init" to the file named by
 * DDPRUN_FAKE_NVML_INITS, when set (who loaded NVML, and when), and takes
 * DDPRUN_FAKE_NVML_INIT_MS milliseconds, when set (a real driver's init, for benchmarks). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct {
  unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

enum { kSuccess = 0, kInvalidArgument = 2, kInsufficientSize = 7, kMaxGpus = 16, kMaxProcs = 64 };

struct State {
  int gpus;
  unsigned util[kMaxGpus];
  int nprocs;
  struct {
    int index;
    unsigned pid;
    unsigned long long bytes;
  } procs[kMaxProcs];
};

static void load(struct State* s) {
  memset(s, 0, sizeof *s);
  const char* path = getenv("DDPRUN_FAKE_NVML_STATE");
  FILE* f = path ? fopen(path, "r") : NULL;
  if (!f) return;
  char line[256];
  while (fgets(line, sizeof line, f)) {
    int index;
    unsigned a;
    unsigned long long b;
    if (sscanf(line, "gpu %d %u", &index, &a) == 2 && index >= 0 && index < kMaxGpus) {
      s->util[index] = a;
      if (index + 1 > s->gpus) s->gpus = index + 1;
    } else if (sscanf(line, "proc %d %u %llu", &index, &a, &b) == 3 && s->nprocs < kMaxProcs) {
      s->procs[s->nprocs].index = index;
      s->procs[s->nprocs].pid = a;
      s->procs[s->nprocs].bytes = b;
      s->nprocs++;
    }
  }
  fclose(f);
}

/* A handle is its index + 1 (never null). */
static int index_of(nvmlDevice_t d) { return (int)(size_t)d - 1; }

nvmlReturn_t nvmlInit_v2(void) {
  const char* ms = getenv("DDPRUN_FAKE_NVML_INIT_MS");
  if (ms) {
    const long n = atol(ms);
    struct timespec ts = {n / 1000, (n % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  const char* path = getenv("DDPRUN_FAKE_NVML_INITS");
  FILE* f = path ? fopen(path, "a") : NULL;
  if (f) {
    fputs("init\n", f);
    fclose(f);
  }
  return kSuccess;
}
nvmlReturn_t nvmlShutdown(void) { return kSuccess; }
const char* nvmlErrorString(nvmlReturn_t rc) { return rc == kSuccess ? "Success" : "Fake error"; }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  struct State s;
  load(&s);
  *count = (unsigned)s.gpus;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  struct State s;
  load(&s);
  if ((int)index >= s.gpus) return kInvalidArgument;
  *device = (nvmlDevice_t)(size_t)(index + 1);
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* u) {
  struct State s;
  load(&s);
  const int i = index_of(device);
  if (i < 0 || i >= s.gpus) return kInvalidArgument;
  u->gpu = s.util[i];
  u->memory = 0;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int* count,
                                                  nvmlProcessInfo_v1_t* infos) {
  struct State s;
  load(&s);
  const int i = index_of(device);
  if (i < 0 || i >= s.gpus) return kInvalidArgument;
  unsigned n = 0;
  for (int k = 0; k < s.nprocs; ++k)
    if (s.procs[k].index == i) ++n;
  if (n > *count) {
    *count = n;
    return kInsufficientSize;
  }
  n = 0;
  for (int k = 0; k < s.nprocs; ++k) {
    if (s.procs[k].index != i) continue;
    infos[n].pid = s.procs[k].pid;
    infos[n].usedGpuMemory = s.procs[k].bytes;
    ++n;
  }
  *count = n;
  return kSuccess;
}
