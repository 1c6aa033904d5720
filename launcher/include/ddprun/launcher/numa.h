// `--numa-binding`: each worker runs on the CPUs near the GPU whose CUDA index equals its local
// rank, as torchrun 2.11 does (torch/numa/binding.py), without linking CUDA.
//
// The GPU's PCI address comes from the NVIDIA driver's /proc/driver/nvidia/gpus/<pci>/
// (one directory per GPU, its `information` file names the GPU UUID); CUDA_VISIBLE_DEVICES
// (indices or GPU-<uuid> prefixes) picks and orders them. CUDA index i is the i-th visible GPU
// in PCI bus order: CUDA's default order (fastest first) is the PCI order on the machines this
// flag is for (identical GPUs); set CUDA_DEVICE_ORDER=PCI_BUS_ID to make it so in the workers.
// The NUMA node is /sys/bus/pci/devices/<pci>/numa_node (-1, a one-node machine, reads as 0)
// and its CPUs /sys/devices/system/node/node<N>/cpulist, intersected with the CPUs the agent
// may run on. The agent applies the set with sched_setaffinity in the child before exec
// (SpawnRequest::cpu_affinity), the same binding `numactl --physcpubind` gives torchrun's
// workers, without needing numactl installed.
//
// Every reader takes a root directory ("/" on a real machine) so tests build fake trees.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher {

// torchrun 2.11's AffinityMode values.
enum class NumaMode {
  Node,         // every CPU of the GPU's NUMA node
  Socket,       // every CPU of every NUMA node on the GPU's socket
  Exclusive,    // the GPU's NUMA node's physical cores split evenly among its GPUs
  CoreComplex,  // one last-level-cache group of the GPU's NUMA node per GPU
};

// "node", "socket", "exclusive", "core-complex"; nullopt for anything else.
std::optional<NumaMode> parse_numa_mode(std::string_view text);
const char* numa_mode_name(NumaMode mode);
inline constexpr const char* kNumaModeChoices = "node, socket, exclusive or core-complex";

// A binding that cannot be computed; the message says which file or GPU and what to do.
class NumaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// sysfs's range lists: "0-3,8,10-11\n" -> {0,1,2,3,8,10,11}. Throws NumaError on bad text.
std::set<int> parse_cpu_list(std::string_view text);
// The inverse, compact: {0,1,2,4} -> "0-2,4".
std::string format_cpu_list(const std::set<int>& cpus);

struct NvidiaGpu {
  std::string pci_address;  // "0000:18:00.0", lower case
  std::string uuid;         // "GPU-...", empty when the driver does not say
};

// GPUs the NVIDIA driver lists under <root>/proc/driver/nvidia/gpus, sorted by PCI address;
// empty when the directory is missing (no driver, no GPU).
std::vector<NvidiaGpu> list_nvidia_gpus(const std::string& root);

// PCI addresses in CUDA index order: `gpus` as CUDA_VISIBLE_DEVICES selects them (unset: all).
// Like CUDA, the list ends at the first entry that names no GPU.
std::vector<std::string> visible_gpu_addresses(const std::vector<NvidiaGpu>& gpus,
                                               const std::optional<std::string>& cuda_visible_devices);

// The sysfs facts a binding needs, read under a root.
class SysfsTopology {
 public:
  explicit SysfsTopology(std::string root) : root_(std::move(root)) {}
  int numa_node_of_pci(const std::string& pci_address) const;  // -1 reads as 0
  std::set<int> node_cpus(int node) const;
  std::set<int> possible_nodes() const;
  std::set<int> thread_siblings(int cpu) const;
  int package_of(int cpu) const;
  // CPUs sharing the highest-level data/unified cache with `cpu`.
  std::set<int> last_level_cache_siblings(int cpu) const;

 private:
  std::string read(const std::string& rel) const;
  std::string root_;
};

// The CPU set of each local rank 0..nproc-1 (never empty). `gpu_addresses` is in CUDA index
// order; `allowed` the CPUs the agent may use (sched_getaffinity). Throws NumaError.
std::vector<std::set<int>> plan_numa_binding(NumaMode mode, const SysfsTopology& topo,
                                             const std::vector<std::string>& gpu_addresses,
                                             int nproc, const std::set<int>& allowed);

// The CPUs this process may run on (sched_getaffinity).
std::set<int> allowed_cpus_of_this_process();

// The CPUs of each of `nproc` local ranks under `mode`, from the machine under `root` ("/", or
// DDPRUN_SYSFS_ROOT in tests) and env's CUDA_VISIBLE_DEVICES, within the CPUs this process may
// use. Throws NumaError saying what to do.
std::vector<std::vector<int>> numa_cpus_for(NumaMode mode, int nproc, const std::map<std::string, std::string>& env,
                                            const std::string& root);

}  // namespace ddprun::launcher
