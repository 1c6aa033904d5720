#include "ddprun/launcher/numa.h"


#include <sched.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

namespace fs = std::filesystem;

namespace ddprun::launcher {
namespace {

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

std::optional<int> to_int(std::string_view s) {
  std::string t = trim(s);
  int v = 0;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || ec != std::errc() || p != t.data() + t.size()) return std::nullopt;
  return v;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The GPUs (CUDA index order) that sit on `node`, as torchrun's exclusive/core-complex modes
// count them.
std::vector<int> gpus_on_node(const SysfsTopology& topo, const std::vector<std::string>& gpus, int node) {
  std::vector<int> out;
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (topo.numa_node_of_pci(gpus[i]) == node) out.push_back(static_cast<int>(i));
  }
  return out;
}

std::set<int> allowed_node_cpus(const SysfsTopology& topo, int node, const std::set<int>& allowed) {
  std::set<int> out;
  for (int c : topo.node_cpus(node)) {
    if (allowed.count(c)) out.insert(c);
  }
  return out;
}

// Groups `cpus` by the smallest CPU of the group `key_of` puts each one in.
std::map<int, std::set<int>> group_by_min(const std::set<int>& cpus,
                                          const std::function<std::set<int>(int)>& key_of) {
  std::map<int, std::set<int>> groups;
  for (int c : cpus) {
    std::set<int> g = key_of(c);
    groups[g.empty() ? c : *g.begin()].insert(c);
  }
  return groups;
}

std::set<int> cpus_for_rank(NumaMode mode, const SysfsTopology& topo, const std::vector<std::string>& gpus,
                            int gpu, const std::set<int>& allowed) {
  const int node = topo.numa_node_of_pci(gpus[gpu]);
  switch (mode) {
    case NumaMode::Node:
      return allowed_node_cpus(topo, node, allowed);
    case NumaMode::Socket: {
      auto mine = allowed_node_cpus(topo, node, allowed);
      if (mine.empty()) return mine;
      const int socket = topo.package_of(*mine.begin());
      std::set<int> out;
      for (int n : topo.possible_nodes()) {
        auto cpus = allowed_node_cpus(topo, n, allowed);
        if (!cpus.empty() && topo.package_of(*cpus.begin()) == socket) out.insert(cpus.begin(), cpus.end());
      }
      return out;
    }
    case NumaMode::Exclusive: {
      auto peers = gpus_on_node(topo, gpus, node);
      const int index = static_cast<int>(std::find(peers.begin(), peers.end(), gpu) - peers.begin());
      auto cores = group_by_min(allowed_node_cpus(topo, node, allowed),
                                [&](int c) { return topo.thread_siblings(c); });
      const int n = static_cast<int>(peers.size());
      const int per_gpu = static_cast<int>(cores.size()) / n;
      const int extra = static_cast<int>(cores.size()) % n;  // the lowest GPUs get one more core
      if (per_gpu < 1) {
        throw NumaError("--numa-binding=exclusive: NUMA node " + std::to_string(node) + " has " +
                        std::to_string(cores.size()) + " physical cores for " + std::to_string(n) +
                        " GPUs; use --numa-binding=node");
      }
      const int start = index * per_gpu + std::min(index, extra);
      const int end = start + per_gpu + (index < extra ? 1 : 0);
      std::set<int> out;
      int i = 0;
      for (const auto& [first, threads] : cores) {
        if (i >= start && i < end) out.insert(threads.begin(), threads.end());
        ++i;
      }
      return out;
    }
    case NumaMode::CoreComplex: {
      auto peers = gpus_on_node(topo, gpus, node);
      const size_t index = static_cast<size_t>(std::find(peers.begin(), peers.end(), gpu) - peers.begin());
      auto caches = group_by_min(allowed_node_cpus(topo, node, allowed),
                                 [&](int c) { return topo.last_level_cache_siblings(c); });
      if (caches.empty()) return {};
      // Larger groups first, then by their lowest CPU, as torchrun orders them.
      std::vector<std::set<int>> order;
      for (auto& [first, cpus] : caches) order.push_back(cpus);
      std::stable_sort(order.begin(), order.end(),
                       [](const std::set<int>& a, const std::set<int>& b) { return a.size() > b.size(); });
      return order[index % order.size()];
    }
  }
  return {};
}

}  // namespace

std::optional<NumaMode> parse_numa_mode(std::string_view text) {
  if (text == "node") return NumaMode::Node;
  if (text == "socket") return NumaMode::Socket;
  if (text == "exclusive") return NumaMode::Exclusive;
  if (text == "core-complex") return NumaMode::CoreComplex;
  return std::nullopt;
}

const char* numa_mode_name(NumaMode mode) {
  switch (mode) {
    case NumaMode::Node: return "node";
    case NumaMode::Socket: return "socket";
    case NumaMode::Exclusive: return "exclusive";
    case NumaMode::CoreComplex: return "core-complex";
  }
  return "?";
}

std::set<int> parse_cpu_list(std::string_view text) {
  std::set<int> out;
  std::string all = trim(text);
  std::istringstream in(all);
  std::string part;
  while (std::getline(in, part, ',')) {
    part = trim(part);
    if (part.empty()) continue;
    auto dash = part.find('-');
    auto lo = to_int(dash == std::string::npos ? part : part.substr(0, dash));
    auto hi = dash == std::string::npos ? lo : to_int(part.substr(dash + 1));
    if (!lo || !hi || *lo < 0 || *hi < *lo || *hi > (1 << 20)) {
      throw NumaError("bad CPU list '" + all + "' (expected ranges like 0-3,8)");
    }
    for (int c = *lo; c <= *hi; ++c) out.insert(c);
  }
  return out;
}

std::string format_cpu_list(const std::set<int>& cpus) {
  std::string out;
  for (auto it = cpus.begin(); it != cpus.end();) {
    int first = *it, last = *it;
    for (++it; it != cpus.end() && *it == last + 1; ++it) last = *it;
    if (!out.empty()) out += ',';
    out += std::to_string(first);
    if (last != first) out += "-" + std::to_string(last);
  }
  return out;
}

std::vector<NvidiaGpu> list_nvidia_gpus(const std::string& root) {
  std::vector<NvidiaGpu> gpus;
  std::error_code ec;
  fs::directory_iterator it(fs::path(root) / "proc/driver/nvidia/gpus", ec);
  if (ec) return gpus;
  for (const auto& entry : it) {
    NvidiaGpu g;
    g.pci_address = lower(entry.path().filename().string());
    std::ifstream info(entry.path() / "information");
    std::string line;
    while (std::getline(info, line)) {
      if (line.rfind("GPU UUID:", 0) == 0) g.uuid = trim(line.substr(9));
    }
    gpus.push_back(std::move(g));
  }
  std::sort(gpus.begin(), gpus.end(),
            [](const NvidiaGpu& a, const NvidiaGpu& b) { return a.pci_address < b.pci_address; });
  return gpus;
}

std::vector<std::string> visible_gpu_addresses(const std::vector<NvidiaGpu>& gpus,
                                               const std::optional<std::string>& cuda_visible_devices) {
  std::vector<std::string> out;
  if (!cuda_visible_devices) {
    for (const auto& g : gpus) out.push_back(g.pci_address);
    return out;
  }
  std::istringstream in(*cuda_visible_devices);
  std::string part;
  while (std::getline(in, part, ',')) {
    part = trim(part);
    const NvidiaGpu* found = nullptr;
    if (auto idx = to_int(part)) {
      if (*idx >= 0 && *idx < static_cast<int>(gpus.size())) found = &gpus[static_cast<size_t>(*idx)];
    } else if (part.rfind("GPU-", 0) == 0) {
      // CUDA accepts a unique prefix of the UUID.
      for (const auto& g : gpus) {
        if (!g.uuid.empty() && g.uuid.rfind(part, 0) == 0) {
          if (found) {
            found = nullptr;
            break;
          }
          found = &g;
        }
      }
    }
    if (!found) break;
    out.push_back(found->pci_address);
  }
  return out;
}

std::string SysfsTopology::read(const std::string& rel) const {
  const fs::path p = fs::path(root_) / rel;
  std::ifstream in(p);
  if (!in) throw NumaError("cannot read " + p.string() + " (needed for --numa-binding)");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

int SysfsTopology::numa_node_of_pci(const std::string& pci_address) const {
  const std::string rel = "sys/bus/pci/devices/" + pci_address + "/numa_node";
  auto n = to_int(read(rel));
  if (!n) throw NumaError("unexpected content in " + root_ + "/" + rel);
  return std::max(*n, 0);
}

std::set<int> SysfsTopology::node_cpus(int node) const {
  return parse_cpu_list(read("sys/devices/system/node/node" + std::to_string(node) + "/cpulist"));
}

std::set<int> SysfsTopology::possible_nodes() const {
  return parse_cpu_list(read("sys/devices/system/node/possible"));
}

std::set<int> SysfsTopology::thread_siblings(int cpu) const {
  return parse_cpu_list(read("sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/thread_siblings_list"));
}

int SysfsTopology::package_of(int cpu) const {
  const std::string rel = "sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/physical_package_id";
  auto n = to_int(read(rel));
  if (!n) throw NumaError("unexpected content in " + root_ + "/" + rel);
  return *n;
}

std::set<int> SysfsTopology::last_level_cache_siblings(int cpu) const {
  const std::string dir = "sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/cache";
  std::error_code ec;
  fs::directory_iterator it(fs::path(root_) / dir, ec);
  if (ec) throw NumaError("cannot read " + root_ + "/" + dir + " (needed for --numa-binding=core-complex)");
  int best = -1;
  std::set<int> out;
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("index", 0) != 0 || !to_int(name.substr(5))) continue;
    const std::string base = dir + "/" + name + "/";
    const std::string type = trim(read(base + "type"));
    if (type != "Unified" && type != "Data") continue;
    auto level = to_int(read(base + "level"));
    if (!level || *level <= best) continue;
    best = *level;
    out = parse_cpu_list(read(base + "shared_cpu_list"));
  }
  return out;
}

std::vector<std::set<int>> plan_numa_binding(NumaMode mode, const SysfsTopology& topo,
                                             const std::vector<std::string>& gpu_addresses, int nproc,
                                             const std::set<int>& allowed) {
  const std::string flag = std::string("--numa-binding=") + numa_mode_name(mode);
  if (gpu_addresses.empty()) {
    throw NumaError(flag + ": no NVIDIA GPU visible (none under /proc/driver/nvidia/gpus, or "
                    "CUDA_VISIBLE_DEVICES selects none); NUMA binding places each local rank near its GPU, "
                    "so drop --numa-binding on machines without GPUs");
  }
  if (nproc > static_cast<int>(gpu_addresses.size())) {
    throw NumaError(flag + ": local rank " + std::to_string(gpu_addresses.size()) + " has no GPU (" +
                    std::to_string(gpu_addresses.size()) + " visible); binding uses the GPU whose index is the "
                    "local rank, so use --nproc_per_node <= " + std::to_string(gpu_addresses.size()) +
                    " or drop --numa-binding");
  }
  std::vector<std::set<int>> plan;
  for (int lr = 0; lr < nproc; ++lr) {
    auto cpus = cpus_for_rank(mode, topo, gpu_addresses, lr, allowed);
    if (cpus.empty()) {
      throw NumaError(flag + ": no CPU left for local rank " + std::to_string(lr) + " (GPU " +
                      gpu_addresses[static_cast<size_t>(lr)] + ", NUMA node " +
                      std::to_string(topo.numa_node_of_pci(gpu_addresses[static_cast<size_t>(lr)])) +
                      ") among the CPUs ddprun may use (" + format_cpu_list(allowed) +
                      "); widen the CPU set ddprun runs on (taskset, cgroup) or drop --numa-binding");
    }
    plan.push_back(std::move(cpus));
  }
  return plan;
}

std::vector<std::vector<int>> numa_cpus_for(NumaMode mode, int nproc, const std::map<std::string, std::string>& env,
                                            const std::string& root) {
  std::optional<std::string> cvd;
  if (auto it = env.find("CUDA_VISIBLE_DEVICES"); it != env.end()) cvd = it->second;
  const auto gpus = visible_gpu_addresses(list_nvidia_gpus(root), cvd);
  std::vector<std::vector<int>> out;
  for (const auto& cpus : plan_numa_binding(mode, SysfsTopology(root), gpus, nproc, allowed_cpus_of_this_process()))
    out.emplace_back(cpus.begin(), cpus.end());
  return out;
}

std::set<int> allowed_cpus_of_this_process() {
  std::set<int> out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.insert(c);
  }
  return out;
}

}  // namespace ddprun::launcher
