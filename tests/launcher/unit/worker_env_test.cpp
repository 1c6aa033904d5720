#include <catch2/catch.hpp>
#include <map>

#include "ddprun/launcher/worker_env.h"

using namespace ddprun::launcher;

namespace {

GroupLayout layout(int nproc) {
  GroupLayout g;
  g.local_world_size = nproc;
  g.world_size = nproc;
  g.store_host = "10.0.0.1";
  g.store_port = 4242;
  g.run_id = "job7";
  g.restart_count = 2;
  return g;
}

// The worker and fault sections build_worker_env reads.
struct Sections {
  WorkerOptions workers;
  FaultOptions faults;
};
Sections opts(int) {
  Sections o;
  o.faults.max_restarts = 3;
  o.workers.role = "trainer";
  o.workers.entrypoint = "train.py";
  return o;
}
EnvMap build_worker_env(const EnvMap& parent, const Sections& o, const GroupLayout& g, int local_rank,
                        const std::string& error_file) {
  return ddprun::launcher::build_worker_env(parent, o.workers, o.faults, g, local_rank, error_file);
}

}  // namespace

TEST_CASE("worker environment has torchrun's variables", "[env]") {
  EnvMap parent{{"PATH", "/usr/bin"}, {"HOME", "/root"}};
  auto env = build_worker_env(parent, opts(4), layout(4), 3, "/logs/3/error.json");
  const EnvMap expected{
      {"RANK", "3"},          {"LOCAL_RANK", "3"},
      {"GROUP_RANK", "0"},    {"ROLE_RANK", "3"},
      {"ROLE_NAME", "trainer"}, {"LOCAL_WORLD_SIZE", "4"},
      {"WORLD_SIZE", "4"},    {"GROUP_WORLD_SIZE", "1"},
      {"ROLE_WORLD_SIZE", "4"}, {"MASTER_ADDR", "10.0.0.1"},
      {"MASTER_PORT", "4242"}, {"TORCHELASTIC_RESTART_COUNT", "2"},
      {"TORCHELASTIC_MAX_RESTARTS", "3"}, {"TORCHELASTIC_RUN_ID", "job7"},
      {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_ERROR_FILE", "/logs/3/error.json"},
      {"DDPRUN_PREEMPT_FILE", "/logs/3/preempted"},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
      {"OMP_NUM_THREADS", "1"},
      {"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"},
      {"PATH", "/usr/bin"}, {"HOME", "/root"},
  };
  for (const auto& [k, v] : expected) {
    INFO(k);
    REQUIRE(env.count(k));
    CHECK(env.at(k) == v);
  }
  CHECK(env.size() == expected.size());
  CHECK_FALSE(env.count("CUDA_VISIBLE_DEVICES"));
  // Nothing torchrun 2.11 does not set: NCCL's defaults (NVLink SHARP included) stay, and no
  // deprecated NCCL_ASYNC_ERROR_HANDLING (PyTorch 2.x warns about it in every NCCL worker).
  CHECK_FALSE(env.count("NCCL_NVLS_ENABLE"));
  CHECK_FALSE(env.count("NCCL_ASYNC_ERROR_HANDLING"));
}

TEST_CASE("global rank adds the node's base", "[env]") {
  auto g = layout(2);
  g.node_rank = 1;
  g.num_nodes = 2;
  g.world_size = 4;
  g.global_rank_base = 2;
  auto env = build_worker_env({}, opts(2), g, 1, "e");
  CHECK(env.at("RANK") == "3");
  CHECK(env.at("LOCAL_RANK") == "1");
  CHECK(env.at("GROUP_RANK") == "1");
  CHECK(env.at("GROUP_WORLD_SIZE") == "2");
  CHECK(env.at("WORLD_SIZE") == "4");
}

TEST_CASE("'unless set' variables keep the parent's value", "[env]") {
  EnvMap parent{{"OMP_NUM_THREADS", "8"}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"},
                {"NCCL_ASYNC_ERROR_HANDLING", "3"}, {"NCCL_NVLS_ENABLE", "1"}, {"RANK", "99"}};
  auto env = build_worker_env(parent, opts(2), layout(2), 0, "e");
  CHECK(env.at("OMP_NUM_THREADS") == "8");
  CHECK(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "0");
  CHECK(env.at("NCCL_ASYNC_ERROR_HANDLING") == "3");
  CHECK(env.at("NCCL_NVLS_ENABLE") == "1");
  CHECK(env.at("RANK") == "0");  // ours always win
}

TEST_CASE("OMP_NUM_THREADS only with more than one local worker", "[env]") {
  CHECK_FALSE(build_worker_env({}, opts(1), layout(1), 0, "e").count("OMP_NUM_THREADS"));
}

TEST_CASE("virtual local rank: LOCAL_RANK 0 and one device", "[env]") {
  auto o = opts(4);
  o.workers.virtual_local_rank = true;
  auto env = build_worker_env({}, o, layout(4), 2, "e");
  CHECK(env.at("LOCAL_RANK") == "0");
  CHECK(env.at("RANK") == "2");
  CHECK(env.at("CUDA_VISIBLE_DEVICES") == "2");
  auto env2 = build_worker_env({{"CUDA_VISIBLE_DEVICES", "4,5,6,7"}}, o, layout(4), 2, "e");
  CHECK(env2.at("CUDA_VISIBLE_DEVICES") == "6");
}

TEST_CASE("argv: a script without .py that runs with Python", "[env]") {
  auto o = opts(1).workers;
  o.entrypoint = "train";
  CHECK(build_worker_argv(o, {}, true) == std::vector<std::string>{"python3", "-u", "train"});
  CHECK(build_worker_argv(o, {}, false) == std::vector<std::string>{"train"});
  CHECK(build_worker_argv(o, {}) == std::vector<std::string>{"train"});
}

TEST_CASE("argv: PYTHON_EXEC, else DDPRUN_DEFAULT_PYTHON, else python3", "[env]") {
  auto o = opts(1).workers;
  const EnvMap pip_installed{{"DDPRUN_DEFAULT_PYTHON", "/venv/bin/python"}};
  CHECK(build_worker_argv(o, pip_installed) == std::vector<std::string>{"/venv/bin/python", "-u", "train.py"});
  EnvMap both = pip_installed;
  both["PYTHON_EXEC"] = "/opt/py/bin/python3";
  CHECK(build_worker_argv(o, both) == std::vector<std::string>{"/opt/py/bin/python3", "-u", "train.py"});
  o.module = true;
  o.entrypoint = "pkg.train";
  CHECK(build_worker_argv(o, pip_installed) ==
        std::vector<std::string>{"/venv/bin/python", "-u", "-m", "pkg.train"});
  CHECK(build_worker_argv(o, {{"DDPRUN_DEFAULT_PYTHON", ""}}) ==
        std::vector<std::string>{"python3", "-u", "-m", "pkg.train"});  // empty counts as unset
}

TEST_CASE("argv for scripts, modules, programs", "[env]") {
  auto o = opts(1).workers;
  o.args = {"--lr", "0.1"};
  CHECK(build_worker_argv(o, {}) == std::vector<std::string>{"python3", "-u", "train.py", "--lr", "0.1"});
  CHECK(build_worker_argv(o, {{"PYTHON_EXEC", "/usr/bin/python3"}}) ==
        std::vector<std::string>{"/usr/bin/python3", "-u", "train.py", "--lr", "0.1"});
  o.module = true;
  o.entrypoint = "pkg.train";
  CHECK(build_worker_argv(o, {}) ==
        std::vector<std::string>{"python3", "-u", "-m", "pkg.train", "--lr", "0.1"});
  o.module = false;
  o.no_python = true;
  o.entrypoint = "train.py";
  CHECK(build_worker_argv(o, {}) == std::vector<std::string>{"train.py", "--lr", "0.1"});
  o.no_python = false;
  o.entrypoint = "./train";
  CHECK(build_worker_argv(o, {}) == std::vector<std::string>{"./train", "--lr", "0.1"});
  o.run_path = true;
  o.entrypoint = "script";
  auto rp = build_worker_argv(o, {});
  REQUIRE(rp.size() == 7);
  CHECK(rp[1] == "-u");
  CHECK(rp[2] == "-c");
  CHECK(rp[4] == "script");
}

TEST_CASE("envp is K=V", "[env]") {
  CHECK(to_envp({{"A", "1"}, {"B", "x=y"}}) == std::vector<std::string>{"A=1", "B=x=y"});
}

TEST_CASE("the rendezvous token is not passed to workers", "[env]") {
  EnvMap parent{{"PATH", "/usr/bin"}, {"DDPRUN_RDZV_TOKEN", "s3cret-shared-by-agents"}};
  auto env = build_worker_env(parent, opts(2), layout(2), 0, "/logs/0/error.json");
  CHECK(env.count("DDPRUN_RDZV_TOKEN") == 0);
  CHECK(env.at("PATH") == "/usr/bin");
}

TEST_CASE("GLOO_SOCKET_IFNAME: the hostname's interface when it is a real one, else the rendezvous route", "[env]") {
  const std::map<std::string, std::string> ifaces = {
      {"10.1.0.5", "ib0"}, {"198.18.0.10", "eth0"}, {"127.0.0.1", "lo"}, {"127.0.1.1", "lo"}};
  auto iface_of = [&](const std::string& a) {
    auto it = ifaces.find(a);
    return it == ifaces.end() ? std::string() : it->second;
  };
  // Gloo's own pick (the hostname's address) when it is an interface of this host.
  auto g = choose_gloo_interface("n1", {"10.1.0.5"}, "198.18.0.10", iface_of);
  CHECK(g.name == "ib0");
  CHECK(g.why == "the interface of 10.1.0.5, which the hostname n1 resolves to, as Gloo would");
  // Loopback first, a real address after it: the real one.
  CHECK(choose_gloo_interface("n1", {"127.0.1.1", "10.1.0.5"}, "198.18.0.10", iface_of).name == "ib0");
  // Loopback only: the interface toward the rendezvous, and why.
  g = choose_gloo_interface("n1", {"127.0.1.1"}, "198.18.0.10", iface_of);
  CHECK(g.name == "eth0");
  CHECK(g.why == "the interface that reaches the rendezvous (198.18.0.10): the hostname n1 resolves to loopback "
                 "(127.0.1.1), which other nodes cannot reach");
  // An address of another host (a stale /etc/hosts), or no answer at all.
  g = choose_gloo_interface("n1", {"192.0.2.7"}, "198.18.0.10", iface_of);
  CHECK(g.name == "eth0");
  CHECK(g.why.find("resolves to 192.0.2.7, an address of no interface here") != std::string::npos);
  g = choose_gloo_interface("n1", {}, "198.18.0.10", iface_of);
  CHECK(g.why.find("the hostname n1 does not resolve") != std::string::npos);
  // Everything on loopback (one host): nothing to set.
  CHECK(choose_gloo_interface("n1", {"127.0.1.1"}, "127.0.0.1", iface_of).name.empty());
}
