// `ddprun doctor` and the preflight before every launch: checks that the machine can run the
// job the launch flags describe, each with what was found and the exact fix.
//
// Two layers, as elsewhere in the launcher:
//   - the verdicts (this header's evaluate_* functions) are pure: probed facts in, check
//     results out; unit-tested without touching the system;
//   - the probes (probe_doctor_facts, probe_preflight_facts) read the machine: statvfs,
//     getrlimit, getaddrinfo, connect/bind, getifaddrs and sysfs, stat, the workers' Python
//     under a timeout, NVML (loaded at run time; no driver: the GPU checks say so).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/launcher/env_map.h"
#include "ddprun/launcher/options.h"

namespace ddprun::launcher::doctor {

enum class Status { Ok, Warn, Fail };
const char* status_mark(Status s);  // ✓, !, ✗
const char* status_name(Status s);  // ok, warning, fail

struct CheckResult {
  std::string item;   // "gpus", "cuda_visible_devices", "shm", ... (stable: the JSON key)
  Status status = Status::Ok;
  std::string found;  // what was found, one line
  std::string fix;    // the exact fix; empty when none is needed
  bool blocking = false;  // a Fail that would stop the job (exit code 1)
};

// ---- Facts, as the probes found them ----

struct GpuDeviceFacts {
  std::string name;
  std::string uuid;
  int compute_mode = 0;  // nvmlComputeMode_t: 3 = EXCLUSIVE_PROCESS
  uint64_t memory_used = 0;
  struct Process {
    unsigned pid = 0;
    uint64_t used_bytes = 0;
  };
  std::vector<Process> processes;
};

struct GpuFacts {
  bool driver = false;         // NVML loaded and initialised
  std::string driver_error;    // why not
  int driver_cuda_version = 0; // 1000*major + 10*minor; 0 unknown
  std::vector<GpuDeviceFacts> devices;
};

struct PythonFacts {
  bool needed = false;  // the workers run under Python
  std::string python;   // the interpreter, as the workers' argv names it
  bool ran = false;     // it started and printed its answer
  std::string error;    // why not / the import error's last line
  bool torch = false;
  std::string torch_version;
  std::string torch_cuda;  // torch.version.cuda; empty: a CPU-only build
  std::string nccl;        // "2.18.3"; empty: none
};

// A program entry point (not Python): the CUDA runtime and NCCL it loads, from the library
// file names the dynamic loader resolves (ldd): "libcudart.so.12.1.105" -> "12.1.105".
struct ProgramFacts {
  std::string program;  // the executable; empty: the workers run Python
  bool ran = false;     // ldd answered
  std::string error;
  std::string cudart;   // empty: not linked; "not found": linked, the loader cannot find it
  std::string nccl;
};

struct ShmFacts {
  bool present = false;
  std::string error;
  uint64_t total_bytes = 0;
  uint64_t avail_bytes = 0;
};

struct LimitsFacts {
  bool rdma = false;          // /sys/class/infiniband has a device
  bool memlock_unlimited = false;
  uint64_t memlock_bytes = 0;
};

struct InterfaceFacts {
  std::string source;  // "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME" or "route"
  std::string name;    // as given or found
  bool exists = false;
  std::string address; // its first IPv4/IPv6 address
  int mtu = 0;         // 0 unknown
};

struct NetworkFacts {
  bool multi_node = false;
  std::string host;      // the rendezvous host (the endpoint's, else --master_addr)
  uint16_t port = 0;
  std::string resolve_error;
  std::vector<std::string> addresses;  // what it resolves to, in order
  bool loopback = false;               // the first address is 127.0.0.0/8 or ::1
  bool local = false;                  // one of this node's addresses (it hosts)
  enum class Reach { NotTried, Listening, Refused, Unreachable } reach = Reach::NotTried;
  std::string reach_error;
  bool port_taken = false;  // local: binding the port failed with EADDRINUSE
  std::vector<InterfaceFacts> interfaces;
};

struct TokenFacts {
  std::string file;  // --rdzv_token_file; empty: none
  bool exists = false;
  std::string error;
  unsigned mode = 0;
  bool regular = false;
  bool own = false;  // owned by this user
};

struct Facts {
  // From the options.
  int nproc_per_node = 1;
  bool multi_node = false;
  int max_restarts = 0;
  bool overlap_restart = true;
  bool warm_spares = false;
  bool spare_cuda = false;  // warm spares that also warm their GPU (--spare_cuda=1)
  bool gpus_requested = false;  // CUDA_VISIBLE_DEVICES or --numa_binding ask for GPUs
  std::optional<std::string> cuda_visible_devices;
  int dev_nvidia_nodes = 0;  // /dev/nvidia[0-9]* (what the preflight can see without NVML)
  bool gpus_probed = false;  // NVML was tried (doctor only)
  GpuFacts gpus;
  PythonFacts python;
  ProgramFacts program;
  ShmFacts shm;
  LimitsFacts limits;
  NetworkFacts network;
  TokenFacts token;
};

// ---- The verdicts (pure) ----

// /dev/shm the job needs on this node: ddprun's shared-memory all-reduce control segment for
// `nproc` ranks (16 KiB + (nproc+1) * 8 MiB, worker_runtime's ShmGroup::control_bytes) plus,
// when the workers use GPUs, NCCL's shm transport: kNcclShmPerPairBytes per ordered pair of
// local ranks.
inline constexpr uint64_t kNcclShmPerPairBytes = 4ull << 20;  // NCCL_BUFFSIZE's default
uint64_t ddprun_shm_bytes(int nproc);
uint64_t nccl_shm_bytes(int nproc);

// Every check of `ddprun doctor`, in the order printed.
std::vector<CheckResult> evaluate(const Facts& facts);
// The cheap subset run before each launch: GPUs against nproc (from CUDA_VISIBLE_DEVICES and
// /dev/nvidia*, no NVML), /dev/shm, a loopback rendezvous host on multi-node, the token file.
std::vector<CheckResult> evaluate_preflight(const Facts& facts);

// 0 when nothing blocks, else 1.
int exit_code(const std::vector<CheckResult>& results);
// "✓ shm: ...\n    fix: ...\n" per result, then a summary line.
std::string format_text(const std::vector<CheckResult>& results);
// One JSON object (schema: launcher/README.md, "ddprun doctor").
std::string format_json(const std::vector<CheckResult>& results);

// The facts that do not need the machine, from the options and the environment.
Facts facts_from_options(const LaunchOptions& opts, const EnvMap& env);

// ---- The probes (I/O) ----

// Fills the facts every doctor check needs. Runs the workers' Python (at most
// python_timeout_ms) unless the workers do not run under Python.
void probe_doctor_facts(Facts& facts, const LaunchOptions& opts, const EnvMap& env, int python_timeout_ms = 30000);
// Only what the preflight needs, each bounded in time: /dev/nvidia*, statvfs(/dev/shm), the
// rendezvous host on multi-node as an address literal or from /etc/hosts (no DNS query; a host
// not found there is not judged), stat of the token file.
void probe_preflight_facts(Facts& facts);

// `ddprun doctor` from main(): argv without the "doctor" word. Returns the exit code.
int run_doctor(const std::vector<std::string>& argv, const EnvMap& env);
// The preflight from main(): one "ddprun: warning: ..." line per finding on stderr.
void run_preflight(const LaunchOptions& opts, const EnvMap& env);

}  // namespace ddprun::launcher::doctor
