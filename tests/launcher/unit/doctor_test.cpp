// The doctor's verdicts over hand-written facts: no system calls.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "ddprun/launcher/doctor.h"

using namespace ddprun::launcher;
using namespace ddprun::launcher::doctor;

namespace {

const CheckResult* find(const std::vector<CheckResult>& rs, const std::string& item) {
  for (const auto& r : rs) {
    if (r.item == item) return &r;
  }
  return nullptr;
}

Facts healthy() {
  Facts f;
  f.nproc_per_node = 2;
  f.shm = {true, "", 1ull << 30, 1ull << 30};
  f.python.needed = true;
  f.python.python = "python3";
  f.python.ran = true;
  f.python.torch = true;
  f.python.torch_version = "2.1.0";
  return f;
}

Facts with_gpus(int n) {
  Facts f = healthy();
  f.gpus_probed = true;
  f.gpus.driver = true;
  f.gpus.driver_cuda_version = 12020;
  for (int i = 0; i < n; ++i) f.gpus.devices.push_back({"H200", "GPU-aaaa" + std::to_string(i), 0, 0, {}});
  return f;
}

}  // namespace

TEST_CASE("a healthy CPU node passes with exit code 0", "[doctor]") {
  auto rs = evaluate(healthy());
  CHECK(exit_code(rs) == 0);
  REQUIRE(find(rs, "gpus"));
  CHECK(find(rs, "gpus")->found == "no NVIDIA driver found: GPU checks skipped");
  CHECK(find(rs, "gpus")->status == Status::Ok);
  CHECK(find(rs, "rdzv_host") == nullptr);  // single node: no network checks
}

TEST_CASE("no driver while CUDA_VISIBLE_DEVICES asks for GPUs blocks", "[doctor]") {
  Facts f = healthy();
  f.cuda_visible_devices = "7";
  f.gpus_requested = true;
  f.gpus.driver_error = "libnvidia-ml.so.1 cannot be loaded";
  auto rs = evaluate(f);
  CHECK(exit_code(rs) == 1);
  CHECK(find(rs, "gpus")->found ==
        "no NVIDIA driver found (libnvidia-ml.so.1 cannot be loaded), but CUDA_VISIBLE_DEVICES=7 asks for GPUs");
}

TEST_CASE("CUDA_VISIBLE_DEVICES naming a missing GPU blocks, by index and by UUID", "[doctor]") {
  Facts f = with_gpus(4);
  f.cuda_visible_devices = "0,7";
  const CheckResult* r = nullptr;
  auto rs = evaluate(f);
  REQUIRE((r = find(rs, "gpus")));
  CHECK(r->status == Status::Fail);
  CHECK(r->found == "CUDA_VISIBLE_DEVICES=0,7 names GPU '7', which this node does not have (it has GPUs 0-3)");
  f.cuda_visible_devices = "GPU-aaaa2,GPU-bbbb";
  rs = evaluate(f);
  CHECK(find(rs, "gpus")->found.find("names GPU 'GPU-bbbb'") != std::string::npos);
  f.cuda_visible_devices = "GPU-aaaa2,3";
  CHECK(exit_code(evaluate(f)) == 0);
}

TEST_CASE("fewer visible GPUs than --nproc_per_node blocks and names the flag", "[doctor]") {
  Facts f = with_gpus(4);
  f.nproc_per_node = 8;
  auto rs = evaluate(f);
  CHECK(exit_code(rs) == 1);
  CHECK(find(rs, "gpus")->found == "4 GPUs visible for --nproc_per_node=8");
  CHECK(find(rs, "gpus")->fix.rfind("run with --nproc_per_node=4", 0) == 0);
}

TEST_CASE("EXCLUSIVE_PROCESS blocks only overlapped restarts; GPU-warm spares are told they stay CPU-warm",
          "[doctor]") {
  Facts f = with_gpus(2);
  for (auto& d : f.gpus.devices) d.compute_mode = 3;
  CHECK(exit_code(evaluate(f)) == 0);  // no restarts: nothing overlaps
  f.max_restarts = 3;
  f.warm_spares = true;
  auto rs = evaluate(f);
  CHECK(exit_code(rs) == 1);
  CHECK(find(rs, "compute_mode")->fix == "run with --overlap_restart=0, or nvidia-smi -c DEFAULT (as root)");
  f.overlap_restart = false;  // CPU-warm spares hold no context: they fit
  rs = evaluate(f);
  CHECK(exit_code(rs) == 0);
  CHECK(find(rs, "compute_mode")->status == Status::Ok);
  f.spare_cuda = true;
  rs = evaluate(f);
  CHECK(exit_code(rs) == 0);
  CHECK(find(rs, "compute_mode")->status == Status::Warn);
  CHECK(find(rs, "compute_mode")->found.find("the spares stay CPU-warm") != std::string::npos);
  CHECK(find(rs, "compute_mode")->fix == "run with --spare_cuda=0 to say so, or nvidia-smi -c DEFAULT (as root)");
  f.warm_spares = false;
  CHECK(find(evaluate(f), "compute_mode")->status == Status::Ok);
}

TEST_CASE("other processes on the job's GPUs are a warning", "[doctor]") {
  Facts f = with_gpus(2);
  f.gpus.devices[1].processes.push_back({4242, 3ull << 30});
  auto rs = evaluate(f);
  CHECK(exit_code(rs) == 0);
  CHECK(find(rs, "gpu_processes")->status == Status::Warn);
  CHECK(find(rs, "gpu_processes")->found ==
        "other processes hold memory on the job's GPUs: GPU 1: pid 4242 holds 3072 MiB");
}

TEST_CASE("a driver older than the CUDA runtime's major version blocks; a minor one warns", "[doctor]") {
  Facts f = with_gpus(2);
  f.python.torch_cuda = "12.1";
  f.python.nccl = "2.18.1";
  f.gpus.driver_cuda_version = 11040;
  auto rs = evaluate(f);
  CHECK(exit_code(rs) == 1);
  CHECK(find(rs, "versions")
            ->found.rfind("torch 2.1.0 (CUDA 12.1, NCCL 2.18.1), driver supports CUDA 11.4: the driver is too old",
                          0) == 0);
  f.gpus.driver_cuda_version = 12000;
  CHECK(find(evaluate(f), "versions")->status == Status::Warn);
  f.gpus.driver_cuda_version = 12040;
  CHECK(find(evaluate(f), "versions")->status == Status::Ok);
}

TEST_CASE("a worker Python without torch blocks and says how to fix it", "[doctor]") {
  Facts f = healthy();
  f.python.torch = false;
  f.python.error = "ModuleNotFoundError: No module named 'torch'";
  auto rs = evaluate(f);
  CHECK(exit_code(rs) == 1);
  CHECK(find(rs, "python")->found ==
        "the workers' Python python3 cannot import torch (ModuleNotFoundError: No module named 'torch')");
  f.python.needed = false;  // --no_python
  CHECK(find(evaluate(f), "python") == nullptr);
}

TEST_CASE("/dev/shm: the requirement and the verdicts", "[doctor]") {
  CHECK(ddprun_shm_bytes(1) == 0);
  CHECK(ddprun_shm_bytes(4) == 16384 + 5 * (8ull << 20));
  CHECK(nccl_shm_bytes(8) == 56 * (4ull << 20));
  Facts f = healthy();
  f.shm = {true, "", 8ull << 20, 8ull << 20};
  auto rs = evaluate(f);
  CHECK(exit_code(rs) == 0);  // CPU job: ddprun falls back to Gloo
  CHECK(
      find(rs, "shm")->found ==
      "/dev/shm has 8 MiB free of 8 MiB; 25 MiB wanted for 2 local ranks: ddprun's shared-memory all-reduce falls back "
      "to Gloo over TCP");
  CHECK(find(rs, "shm")->fix.find("--shm-size=1g (or --ipc=host)") != std::string::npos);
  f.gpus_requested = true;  // NCCL needs it
  f.nproc_per_node = 8;
  CHECK(find(evaluate(f), "shm")->blocking);
  CHECK(evaluate_preflight(f).size() >= 1);
}

TEST_CASE("memlock is checked only where RDMA is present", "[doctor]") {
  Facts f = healthy();
  CHECK(find(evaluate(f), "memlock") == nullptr);
  f.limits.rdma = true;
  f.limits.memlock_bytes = 64 << 10;
  CHECK(find(evaluate(f), "memlock")->status == Status::Warn);
}

TEST_CASE("multi-node: a loopback rendezvous host blocks; interfaces and reachability", "[doctor]") {
  Facts f = healthy();
  f.multi_node = true;
  f.network.host = "node0";
  f.network.port = 29400;
  f.network.addresses = {"127.0.1.1"};
  f.network.loopback = true;
  f.network.local = true;
  auto rs = evaluate(f);
  CHECK(exit_code(rs) == 1);
  CHECK(find(rs, "rdzv_host")->found ==
        "the rendezvous host node0 resolves to 127.0.1.1, a loopback address: the other nodes cannot reach it there");
  CHECK(find(rs, "rdzv_endpoint")->found == "node0:29400 is this node; port 29400 is free");
  auto pre = evaluate_preflight(f);
  REQUIRE(pre.size() == 1);
  CHECK(pre[0].item == "rdzv_host");
  f.network.loopback = false;
  f.network.addresses = {"10.0.0.1"};
  f.network.local = false;
  f.network.reach = NetworkFacts::Reach::Unreachable;
  f.network.reach_error = "no answer within 1000 ms";
  f.network.interfaces = {{"GLOO_SOCKET_IFNAME", "eth9", false, "", 0},
                          {"NCCL_SOCKET_IFNAME", "eth0", true, "10.0.0.2", 9000},
                          {"route", "eth1", true, "10.0.1.2", 1500}};
  rs = evaluate(f);
  CHECK(find(rs, "rdzv_endpoint")->blocking);
  CHECK(find(rs, "interface")->found == "GLOO_SOCKET_IFNAME=eth9: no such interface on this node");
  CHECK(find(rs, "mtu")->status == Status::Warn);
  // A loopback address typed as the host: every node on this host; a warning, and none before a launch.
  f.network.host = "127.0.0.1";
  f.network.addresses = {"127.0.0.1"};
  f.network.loopback = true;
  CHECK(find(evaluate(f), "rdzv_host")->status == Status::Warn);
  CHECK(evaluate_preflight(f).empty());
}

TEST_CASE("token file: 0644 blocks with the chmod, 0600 passes", "[doctor]") {
  Facts f = healthy();
  f.token = {"/tmp/tok", true, "", 0100644, true, true};
  auto rs = evaluate(f);
  CHECK(exit_code(rs) == 1);
  CHECK(find(rs, "token")->found ==
        "--rdzv_token_file /tmp/tok has mode 0644: other users can read it, and the launch refuses it");
  CHECK(find(rs, "token")->fix == "chmod 600 /tmp/tok");
  f.token.mode = 0100600;
  CHECK(exit_code(evaluate(f)) == 0);
}

TEST_CASE("preflight: CUDA_VISIBLE_DEVICES against /dev/nvidia* without NVML", "[doctor]") {
  Facts f = healthy();
  CHECK(evaluate_preflight(f).empty());
  f.cuda_visible_devices = "0,1";
  auto pre = evaluate_preflight(f);
  REQUIRE(pre.size() == 1);
  CHECK(pre[0].found ==
        "CUDA_VISIBLE_DEVICES=0,1 asks for GPUs, but this node has no NVIDIA GPU device (/dev/nvidia*)");
  f.dev_nvidia_nodes = 1;
  CHECK(evaluate_preflight(f)[0].found ==
        "CUDA_VISIBLE_DEVICES=0,1 names GPU '1', which this node does not have (it has GPU 0)");
  f.dev_nvidia_nodes = 2;
  f.nproc_per_node = 3;
  CHECK(evaluate_preflight(f)[0].found == "CUDA_VISIBLE_DEVICES=0,1 shows 2 GPUs for --nproc_per_node=3");
}

TEST_CASE("text and JSON output", "[doctor]") {
  std::vector<CheckResult> rs = {{"shm", Status::Ok, "fine", "", false},
                                 {"token", Status::Fail, "mode \"0644\"", "chmod 600 f", true}};
  CHECK(format_text(rs) == "\u2713 shm: fine\n\u2717 token: mode \"0644\"\n    fix: chmod 600 f\n"
                           "doctor: 2 checks, 1 blocking, 0 warnings\n");
  CHECK(
      format_json(rs) ==
      "{\"ok\":false,\"exit_code\":1,\"checks\":[{\"item\":\"shm\",\"status\":\"ok\",\"blocking\":false,\"found\":"
      "\"fine\","
      "\"fix\":\"\"},{\"item\":\"token\",\"status\":\"fail\",\"blocking\":true,\"found\":\"mode \\\"0644\\\"\",\"fix\":"
      "\"chmod 600 f\"}]}\n");
}

TEST_CASE("JSON output: what a probe found is escaped, and text that is not UTF-8 gets U+FFFD", "[doctor]") {
  std::vector<CheckResult> rs = {
      {"python", Status::Warn, "/opt/py\xff/bin/python3: \"3.8\"\n\x1b[0m", "fix\tit", false}};
  const std::string text = format_json(rs);
  CHECK(text.find('\n') == text.size() - 1);
  nlohmann::json doc;
  REQUIRE_NOTHROW(doc = nlohmann::json::parse(text));
  CHECK(doc["checks"][0]["found"] == "/opt/py\xef\xbf\xbd/bin/python3: \"3.8\"\n\x1b[0m");
  CHECK(doc["checks"][0]["fix"] == "fix\tit");
  CHECK(doc["ok"] == true);
}

TEST_CASE("a program's CUDA runtime and NCCL, from the libraries it loads, against the driver", "[doctor]") {
  Facts f = with_gpus(1);
  f.python.needed = false;
  f.program.program = "/opt/train";
  f.program.ran = true;
  CHECK(find(evaluate(f), "versions")->found ==
        "/opt/train loads no shared CUDA runtime (CPU-only, or linked in statically)");
  f.program.cudart = "13.0.48";
  f.program.nccl = "2.28.9";
  auto rs = evaluate(f);
  CHECK(exit_code(rs) == 1);
  CHECK(find(rs, "versions")
            ->found.rfind("/opt/train loads CUDA runtime 13.0.48, NCCL 2.28.9, driver supports CUDA 12.2: the "
                          "driver is too old",
                          0) == 0);
  CHECK(find(rs, "versions")->fix ==
        "upgrade the NVIDIA driver to one for CUDA 13.0.48, or rebuild it against CUDA 12.2 or older");
  f.program.cudart = "not found";
  CHECK(find(evaluate(f), "versions")->found == "/opt/train links libcudart, which the dynamic loader cannot find");
}
