// --numa-binding's readers and plan against fake sysfs/procfs trees in a temporary directory.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "ddprun/launcher/numa.h"

using namespace ddprun::launcher;
namespace fs = std::filesystem;

namespace {

// A fake root: write(rel, text) creates <root>/<rel>.
class FakeRoot {
 public:
  FakeRoot() {
    std::string templ = (fs::temp_directory_path() / "ddprun-numa-XXXXXX").string();
    REQUIRE(::mkdtemp(templ.data()) != nullptr);
    root_ = templ;
  }
  ~FakeRoot() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  void write(const std::string& rel, const std::string& text) const {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text;
  }
  void gpu(const std::string& pci, int node, const std::string& uuid) const {
    write("proc/driver/nvidia/gpus/" + pci + "/information",
          "Model: \t\t NVIDIA H200\nGPU UUID: \t " + uuid + "\nBus Location: \t " + pci + "\nDevice Minor: \t 0\n");
    write("sys/bus/pci/devices/" + pci + "/numa_node", std::to_string(node) + "\n");
  }
  // `node` holds CPUs [first, first + n); CPU c and c + smt_offset are siblings when smt_offset.
  void cpu(int c, int package, const std::string& siblings, const std::string& l3) const {
    const std::string base = "sys/devices/system/cpu/cpu" + std::to_string(c) + "/";
    write(base + "topology/physical_package_id", std::to_string(package) + "\n");
    write(base + "topology/thread_siblings_list", siblings + "\n");
    write(base + "cache/index0/type", "Instruction\n");
    write(base + "cache/index0/level", "1\n");
    write(base + "cache/index0/shared_cpu_list", std::to_string(c) + "\n");
    write(base + "cache/index1/type", "Data\n");
    write(base + "cache/index1/level", "1\n");
    write(base + "cache/index1/shared_cpu_list", siblings + "\n");
    write(base + "cache/index3/type", "Unified\n");
    write(base + "cache/index3/level", "3\n");
    write(base + "cache/index3/shared_cpu_list", l3 + "\n");
  }
  std::string path() const { return root_.string(); }

 private:
  fs::path root_;
};

// Two sockets, one NUMA node each, 4 cores x 2 threads per node (siblings c and c+8), two L3
// groups per node; GPUs 0,1 on node 0 and GPUs 2,3 on node 1 (PCI order), listed out of order.
void two_node_machine(const FakeRoot& r) {
  r.gpu("0000:c1:00.0", 1, "GPU-cccc");
  r.gpu("0000:18:00.0", 0, "GPU-aaaa");
  r.gpu("0000:2a:00.0", 0, "GPU-bbbb");
  r.gpu("0000:d5:00.0", 1, "GPU-dddd");
  r.write("sys/devices/system/node/possible", "0-1\n");
  r.write("sys/devices/system/node/node0/cpulist", "0-3,8-11\n");
  r.write("sys/devices/system/node/node1/cpulist", "4-7,12-15\n");
  for (int c = 0; c < 16; ++c) {
    const int core = c % 8;
    const std::string siblings = std::to_string(core) + "," + std::to_string(core + 8);
    const int l3_first = (core / 2) * 2;  // cores {0,1} {2,3} {4,5} {6,7}
    const std::string l3 = std::to_string(l3_first) + "-" + std::to_string(l3_first + 1) + "," +
                           std::to_string(l3_first + 8) + "-" + std::to_string(l3_first + 9);
    r.cpu(c, core < 4 ? 0 : 1, siblings, l3);
  }
}

std::set<int> range(int lo, int hi) {
  std::set<int> s;
  for (int i = lo; i <= hi; ++i) s.insert(i);
  return s;
}

const std::set<int> kAll = range(0, 15);

}  // namespace

TEST_CASE("numa modes are torchrun's", "[numa]") {
  CHECK(parse_numa_mode("node") == NumaMode::Node);
  CHECK(parse_numa_mode("socket") == NumaMode::Socket);
  CHECK(parse_numa_mode("exclusive") == NumaMode::Exclusive);
  CHECK(parse_numa_mode("core-complex") == NumaMode::CoreComplex);
  CHECK_FALSE(parse_numa_mode("core_complex"));
  CHECK_FALSE(parse_numa_mode("NODE"));
  CHECK_FALSE(parse_numa_mode(""));
  CHECK(std::string(numa_mode_name(NumaMode::CoreComplex)) == "core-complex");
}

TEST_CASE("cpu lists parse and format like sysfs", "[numa]") {
  CHECK(parse_cpu_list("0-3,8,10-11\n") == std::set<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(parse_cpu_list("5") == std::set<int>{5});
  CHECK(parse_cpu_list("\n").empty());
  CHECK_THROWS_AS(parse_cpu_list("3-1"), NumaError);
  CHECK_THROWS_AS(parse_cpu_list("a-b"), NumaError);
  CHECK(format_cpu_list({0, 1, 2, 4, 6, 7}) == "0-2,4,6-7");
  CHECK(format_cpu_list({}) == "");
}

TEST_CASE("GPUs come from the driver's directory, in PCI order, as CUDA_VISIBLE_DEVICES picks", "[numa]") {
  FakeRoot r;
  two_node_machine(r);
  auto gpus = list_nvidia_gpus(r.path());
  REQUIRE(gpus.size() == 4);
  CHECK(gpus[0].pci_address == "0000:18:00.0");
  CHECK(gpus[0].uuid == "GPU-aaaa");
  CHECK(gpus[3].pci_address == "0000:d5:00.0");
  CHECK(visible_gpu_addresses(gpus, std::nullopt).size() == 4);
  CHECK(visible_gpu_addresses(gpus, "3,0") == std::vector<std::string>{"0000:d5:00.0", "0000:18:00.0"});
  CHECK(visible_gpu_addresses(gpus, "GPU-ccc") == std::vector<std::string>{"0000:c1:00.0"});
  // CUDA stops at the first entry that names no GPU.
  CHECK(visible_gpu_addresses(gpus, "1,7,2") == std::vector<std::string>{"0000:2a:00.0"});
  CHECK(visible_gpu_addresses(gpus, "").empty());
  CHECK(list_nvidia_gpus(r.path() + "/nowhere").empty());
}

TEST_CASE("node: the CPUs of each GPU's NUMA node", "[numa]") {
  FakeRoot r;
  two_node_machine(r);
  SysfsTopology topo(r.path());
  auto gpus = visible_gpu_addresses(list_nvidia_gpus(r.path()), std::nullopt);
  auto plan = plan_numa_binding(NumaMode::Node, topo, gpus, 4, kAll);
  REQUIRE(plan.size() == 4);
  const std::set<int> node0{0, 1, 2, 3, 8, 9, 10, 11}, node1{4, 5, 6, 7, 12, 13, 14, 15};
  CHECK(plan[0] == node0);
  CHECK(plan[1] == node0);
  CHECK(plan[2] == node1);
  CHECK(plan[3] == node1);
  // Only CPUs the agent may use.
  auto narrow = plan_numa_binding(NumaMode::Node, topo, gpus, 1, {0, 1, 4});
  CHECK(narrow[0] == std::set<int>{0, 1});
  // CUDA_VISIBLE_DEVICES reorders: local rank 0 is GPU 3 (node 1).
  auto swapped =
      plan_numa_binding(NumaMode::Node, topo, visible_gpu_addresses(list_nvidia_gpus(r.path()), "3"), 1, kAll);
  CHECK(swapped[0] == node1);
}

TEST_CASE("numa_node -1 (a one-node machine) reads as node 0", "[numa]") {
  FakeRoot r;
  r.gpu("0000:01:00.0", -1, "GPU-x");
  r.write("sys/devices/system/node/node0/cpulist", "0-1\n");
  auto plan = plan_numa_binding(NumaMode::Node, SysfsTopology(r.path()), {"0000:01:00.0"}, 1, {0, 1, 2});
  CHECK(plan[0] == std::set<int>{0, 1});
}

TEST_CASE("socket: every node of the GPU's socket", "[numa]") {
  FakeRoot r;
  two_node_machine(r);
  auto gpus = visible_gpu_addresses(list_nvidia_gpus(r.path()), std::nullopt);
  auto plan = plan_numa_binding(NumaMode::Socket, SysfsTopology(r.path()), gpus, 3, kAll);
  CHECK(plan[0] == std::set<int>{0, 1, 2, 3, 8, 9, 10, 11});
  CHECK(plan[2] == std::set<int>{4, 5, 6, 7, 12, 13, 14, 15});
}

TEST_CASE("exclusive: the node's physical cores split among its GPUs", "[numa]") {
  FakeRoot r;
  two_node_machine(r);
  auto gpus = visible_gpu_addresses(list_nvidia_gpus(r.path()), std::nullopt);
  auto plan = plan_numa_binding(NumaMode::Exclusive, SysfsTopology(r.path()), gpus, 4, kAll);
  // Node 0 has cores {0,8} {1,9} {2,10} {3,11} for GPUs 0 and 1: two cores each, with their threads.
  CHECK(plan[0] == std::set<int>{0, 1, 8, 9});
  CHECK(plan[1] == std::set<int>{2, 3, 10, 11});
  CHECK(plan[2] == std::set<int>{4, 5, 12, 13});
  CHECK(plan[3] == std::set<int>{6, 7, 14, 15});
  // Three allowed cores for two GPUs: the lower GPU gets the extra one.
  auto uneven = plan_numa_binding(NumaMode::Exclusive, SysfsTopology(r.path()), gpus, 2, {0, 1, 2});
  CHECK(uneven[0] == std::set<int>{0, 1});
  CHECK(uneven[1] == std::set<int>{2});
  // Fewer cores than GPUs on the node is refused.
  CHECK_THROWS_WITH(plan_numa_binding(NumaMode::Exclusive, SysfsTopology(r.path()), gpus, 1, {0}),
                    Catch::Contains("physical cores"));
}

TEST_CASE("core-complex: one last-level-cache group per GPU", "[numa]") {
  FakeRoot r;
  two_node_machine(r);
  auto gpus = visible_gpu_addresses(list_nvidia_gpus(r.path()), std::nullopt);
  auto plan = plan_numa_binding(NumaMode::CoreComplex, SysfsTopology(r.path()), gpus, 4, kAll);
  CHECK(plan[0] == std::set<int>{0, 1, 8, 9});
  CHECK(plan[1] == std::set<int>{2, 3, 10, 11});
  CHECK(plan[2] == std::set<int>{4, 5, 12, 13});
  CHECK(plan[3] == std::set<int>{6, 7, 14, 15});
}

TEST_CASE("binding errors say what to do", "[numa]") {
  FakeRoot r;
  two_node_machine(r);
  SysfsTopology topo(r.path());
  CHECK_THROWS_WITH(plan_numa_binding(NumaMode::Node, topo, {}, 1, kAll),
                    Catch::Contains("no NVIDIA GPU visible") && Catch::Contains("drop --numa-binding"));
  auto gpus = visible_gpu_addresses(list_nvidia_gpus(r.path()), "0,1");
  CHECK_THROWS_WITH(plan_numa_binding(NumaMode::Node, topo, gpus, 3, kAll),
                    Catch::Contains("local rank 2 has no GPU") && Catch::Contains("--nproc_per_node <= 2"));
  CHECK_THROWS_WITH(plan_numa_binding(NumaMode::Node, topo, gpus, 1, {5}), Catch::Contains("no CPU left"));
  CHECK_THROWS_WITH(plan_numa_binding(NumaMode::Node, topo, {"0000:ff:00.0"}, 1, kAll),
                    Catch::Contains("cannot read") && Catch::Contains("0000:ff:00.0/numa_node"));
}
