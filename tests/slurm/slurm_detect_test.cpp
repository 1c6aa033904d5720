#include <catch2/catch.hpp>

#include "ddprun/launcher/options.h"
#include "ddprun/launcher/slurm.h"

using namespace ddprun::launcher;

namespace {

// What srun puts in the environment of one task of a 2-node step with one task per node
// (copied from a real step on the test cluster, tests/slurm/cluster.py).
EnvMap two_node_step(int node_id) {
  return {{"SLURM_JOB_ID", "41"},
          {"SLURM_JOBID", "41"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_STEPID", "0"},
          {"SLURM_JOB_NODELIST", "gpu[07-08]"},
          {"SLURM_NODELIST", "gpu[07-08]"},
          {"SLURM_STEP_NODELIST", "gpu[07-08]"},
          {"SLURM_JOB_NUM_NODES", "2"},
          {"SLURM_NNODES", "2"},
          {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_NTASKS", "2"},
          {"SLURM_STEP_NUM_TASKS", "2"},
          {"SLURM_NODEID", std::to_string(node_id)},
          {"SLURM_PROCID", std::to_string(node_id)},
          {"SLURM_LOCALID", "0"},
          {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
          {"SLURMD_NODENAME", node_id == 0 ? "gpu07" : "gpu08"}};
}

const SystemInfo kSys{.cpu_count = 8, .gpu_count = 0};

LaunchOptions ok(std::vector<std::string> args, const EnvMap& env, SystemInfo sys = kSys) {
  args.insert(args.begin(), "ddprun");
  auto r = parse_command_line(args, env, sys);
  INFO(r.message);
  REQUIRE(r.options);
  return *r.options;
}

std::string error_of(std::vector<std::string> args, const EnvMap& env) {
  args.insert(args.begin(), "ddprun");
  auto r = parse_command_line(args, env, kSys);
  REQUIRE_FALSE(r.options);
  CHECK(r.exit_code == kUsageExitCode);
  CHECK(r.message.find('\n') == std::string::npos);
  return r.message;
}

}  // namespace

TEST_CASE("slurm: outside Slurm nothing changes", "[slurm]") {
  auto d = derive_from_slurm({{"PATH", "/bin"}}, {});
  CHECK_FALSE(d.in_step);
  CHECK(d.flags.empty());
  CHECK(d.summary.empty());
  auto o = ok({"train.py"}, {});
  CHECK(o.platform.slurm_summary.empty());
  CHECK(o.nodes.max_nodes == 1);
  CHECK(o.rendezvous.id == "none");
}

TEST_CASE("slurm: a 2-node step gives the static rendezvous on the first host", "[slurm]") {
  const uint16_t port = slurm_step_port("41", "0");
  CHECK(port >= 20000);
  CHECK(port < 30000);
  for (int node : {0, 1}) {
    auto o = ok({"--nproc_per_node=3", "train.py"}, two_node_step(node));
    CHECK(o.nodes.min_nodes == 2);
    CHECK(o.nodes.max_nodes == 2);
    CHECK(o.nodes.node_rank == node);
    CHECK(o.rendezvous.backend == RdzvBackend::Static);
    CHECK(o.rendezvous.master_addr == "gpu07");
    CHECK(o.rendezvous.master_port == port);
    CHECK(o.rendezvous.id == "slurm-41.0");
    CHECK(o.nodes.nproc_per_node == 3);
    // One line, naming each derived flag and its source, and the way out.
    CHECK(o.platform.slurm_summary.find('\n') == std::string::npos);
    CHECK_THAT(o.platform.slurm_summary,
               Catch::Contains("Slurm step 41.0") && Catch::Contains("--nnodes=2 (SLURM_STEP_NUM_NODES)") &&
                   Catch::Contains("--node_rank=" + std::to_string(node) + " (SLURM_NODEID)") &&
                   Catch::Contains("--master_addr=gpu07 (first of SLURM_STEP_NODELIST)") &&
                   Catch::Contains("--master_port=" + std::to_string(port)) && Catch::Contains("--no_slurm"));
    CHECK_THAT(o.platform.slurm_summary, !Catch::Contains("nproc_per_node"));  // given, not derived
  }
}

TEST_CASE("slurm: the step's node list and count come before the job's", "[slurm]") {
  auto env = two_node_step(1);
  env["SLURM_JOB_NODELIST"] = "a[1-4]";
  env["SLURM_JOB_NUM_NODES"] = "4";
  env["SLURM_STEP_NODELIST"] = "a[3-4]";
  auto o = ok({"x.py"}, env);
  CHECK(o.nodes.max_nodes == 2);
  CHECK(o.rendezvous.master_addr == "a3");
  // Without the step's variables, the job's.
  env.erase("SLURM_STEP_NODELIST");
  env.erase("SLURM_STEP_NUM_NODES");
  env.erase("SLURM_NNODES");
  env["SLURM_NTASKS"] = env["SLURM_STEP_NUM_TASKS"] = "4";
  o = ok({"x.py"}, env);
  CHECK(o.nodes.max_nodes == 4);
  CHECK(o.rendezvous.master_addr == "a1");
}

TEST_CASE("slurm: hostlist syntax in the node list is parsed natively", "[slurm]") {
  auto env = two_node_step(0);
  env["SLURM_STEP_NODELIST"] = "rack-[2-3]-n[009-010],cpu3";
  CHECK(ok({"x.py"}, env).rendezvous.master_addr == "rack-2-n009");
  env["SLURM_STEP_NODELIST"] = "rack[2-";
  CHECK_THAT(error_of({"x.py"}, env), Catch::Contains("SLURM_STEP_NODELIST") && Catch::Contains("--no_slurm"));
}

TEST_CASE("slurm: explicit flags and PET_ variables win", "[slurm]") {
  auto env = two_node_step(1);
  auto o = ok({"--master_addr=10.0.0.5", "--master_port=1234", "--rdzv_id=mine", "x.py"}, env);
  CHECK(o.rendezvous.master_addr == "10.0.0.5");
  CHECK(o.rendezvous.master_port == 1234);
  CHECK(o.rendezvous.id == "mine");
  CHECK(o.nodes.node_rank == 1);  // still derived
  CHECK_THAT(o.platform.slurm_summary, !Catch::Contains("master_addr") && Catch::Contains("--node_rank=1"));
  env["PET_NODE_RANK"] = "0";
  CHECK(ok({"x.py"}, env).nodes.node_rank == 0);
  // A given node count replaces the step's, and then node rank must fit it.
  env.erase("PET_NODE_RANK");
  o = ok({"--nnodes=1", "x.py"}, env);
  CHECK(o.nodes.max_nodes == 1);
  CHECK(o.rendezvous.master_addr == "127.0.0.1");
}

TEST_CASE("slurm: --no_slurm and PET_NO_SLURM turn detection off", "[slurm]") {
  auto env = two_node_step(1);
  for (auto o : {ok({"--no_slurm", "x.py"}, env), ok({"--no-slurm", "x.py"}, env)}) {
    CHECK(o.nodes.max_nodes == 1);
    CHECK(o.nodes.node_rank == 0);
    CHECK(o.rendezvous.id == "none");
    CHECK(o.platform.slurm_summary.empty());
  }
  env["PET_NO_SLURM"] = "1";
  CHECK(ok({"x.py"}, env).nodes.max_nodes == 1);
  env["PET_NO_SLURM"] = "0";
  CHECK(ok({"x.py"}, env).nodes.max_nodes == 2);
}

TEST_CASE("slurm: --nnodes=MIN:MAX makes it elastic on the first host", "[slurm]") {
  auto env = two_node_step(1);
  auto o = ok({"--nnodes=1:2", "x.py"}, env);
  CHECK(o.nodes.min_nodes == 1);
  CHECK(o.nodes.max_nodes == 2);
  CHECK(o.rendezvous.backend == RdzvBackend::C10d);
  CHECK(o.rendezvous.host == "gpu07");
  CHECK(o.rendezvous.port == slurm_step_port("41", "0"));
  CHECK(o.rendezvous.port_given);
  CHECK(o.rendezvous.id == "slurm-41.0");
  CHECK(o.nodes.node_rank == 0);  // c10d assigns ranks; SLURM_NODEID is not used
  CHECK_THAT(o.platform.slurm_summary, Catch::Contains("--rdzv_backend=c10d") &&
                                           Catch::Contains("--rdzv_endpoint=gpu07:") && !Catch::Contains("node_rank"));
  // The node named first hosts the rendezvous, the others never try to (is_host).
  CHECK(o.rendezvous.conf.at("is_host") == "0");
  CHECK_THAT(o.platform.slurm_summary,
             Catch::Contains("--rdzv_conf=is_host=0 (SLURMD_NODENAME is not the first host)"));
  o = ok({"--nnodes=1:2", "x.py"}, two_node_step(0));
  CHECK(o.rendezvous.conf.at("is_host") == "1");
  // Without the node's name, or with a conf or endpoint of the user's, the address decides.
  auto anonymous = env;
  anonymous.erase("SLURMD_NODENAME");
  CHECK(ok({"--nnodes=1:2", "x.py"}, anonymous).rendezvous.conf.count("is_host") == 0);
  o = ok({"--nnodes=1:2", "--rdzv_conf=join_timeout=30", "x.py"}, env);
  CHECK(o.rendezvous.conf.count("is_host") == 0);
  CHECK(o.rendezvous.conf.at("join_timeout") == "30");
  // c10d asked for with a fixed count: endpoint derived, no node rank.
  o = ok({"--rdzv_backend=c10d", "x.py"}, env);
  CHECK(o.nodes.max_nodes == 2);
  CHECK(o.rendezvous.host == "gpu07");
  // A given endpoint is kept.
  o = ok({"--nnodes=1:2", "--rdzv_endpoint=h:5", "x.py"}, env);
  CHECK(o.rendezvous.host == "h");
  CHECK(o.rendezvous.port == 5);
  CHECK(o.rendezvous.conf.count("is_host") == 0);
}

TEST_CASE("slurm: one task on one node stays a single node", "[slurm]") {
  // srun -n1 inside a 2-node allocation: the step has one node.
  EnvMap env{{"SLURM_JOB_ID", "7"},         {"SLURM_STEP_ID", "3"},
             {"SLURM_JOB_NUM_NODES", "2"},  {"SLURM_JOB_NODELIST", "n[1-2]"},
             {"SLURM_STEP_NODELIST", "n1"}, {"SLURM_NNODES", "1"},
             {"SLURM_STEP_NUM_NODES", "1"}, {"SLURM_NTASKS", "1"},
             {"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_NODEID", "0"},
             {"SLURM_PROCID", "0"}};
  auto o = ok({"x.py"}, env);
  CHECK(o.nodes.max_nodes == 1);
  CHECK(o.rendezvous.master_addr == "127.0.0.1");
  CHECK_FALSE(o.rendezvous.master_port);
  CHECK(o.rendezvous.id == "slurm-7.3");
  CHECK_THAT(o.platform.slurm_summary, Catch::Contains("--rdzv_id=slurm-7.3") && !Catch::Contains("nnodes"));
  // --standalone keeps its own random id and one node.
  o = ok({"--standalone", "x.py"}, env);
  CHECK(o.rendezvous.id != "slurm-7.3");
  CHECK(o.nodes.max_nodes == 1);
  CHECK_THAT(o.platform.slurm_summary, Catch::Contains("nothing derived"));
}

TEST_CASE("slurm: more tasks than nodes is refused with the srun line to use", "[slurm]") {
  auto env = two_node_step(0);
  env["SLURM_STEP_NUM_TASKS"] = env["SLURM_NTASKS"] = "4";
  CHECK_THAT(error_of({"x.py"}, env),
             Catch::Contains("4 tasks on 2 node(s)") && Catch::Contains("--ntasks-per-node=1"));
  // The user who gives --nnodes knows what they do.
  CHECK(ok({"--nnodes=2", "x.py"}, env).nodes.max_nodes == 2);
}

TEST_CASE("slurm: a batch script (no step) derives nothing, and warns on many nodes", "[slurm]") {
  EnvMap env{{"SLURM_JOB_ID", "9"}, {"SLURM_JOB_NUM_NODES", "2"},
             {"SLURM_NNODES", "2"}, {"SLURM_JOB_NODELIST", "n[1-2]"},
             {"SLURM_NODEID", "0"}, {"SLURM_PROCID", "0"}};
  auto o = ok({"x.py"}, env);
  CHECK(o.nodes.max_nodes == 1);
  CHECK(o.platform.slurm_summary.empty());
  REQUIRE(o.warnings.size() == 1);
  CHECK_THAT(o.warnings[0], Catch::Contains("outside srun") && Catch::Contains("srun --ntasks-per-node=1"));
  env["SLURM_JOB_NUM_NODES"] = env["SLURM_NNODES"] = "1";
  CHECK(ok({"x.py"}, env).warnings.empty());
}

TEST_CASE("slurm: GPUs Slurm gave the task", "[slurm]") {
  auto env = two_node_step(0);
  SECTION("no GPU variables: nproc_per_node stays 1") { CHECK(ok({"x.py"}, env).nodes.nproc_per_node == 1); }
  SECTION("SLURM_GPUS_ON_NODE sets the default and answers gpu") {
    env["SLURM_GPUS_ON_NODE"] = "4";
    auto o = ok({"x.py"}, env);
    CHECK(o.nodes.nproc_per_node == 4);
    CHECK_THAT(o.platform.slurm_summary, Catch::Contains("--nproc_per_node=4 (SLURM_GPUS_ON_NODE)"));
    CHECK(ok({"--nproc_per_node=gpu", "x.py"}, env).nodes.nproc_per_node == 4);
    CHECK(ok({"--nproc_per_node=auto", "x.py"}, env).nodes.nproc_per_node == 4);
    CHECK(ok({"--nproc_per_node=2", "x.py"}, env).nodes.nproc_per_node == 2);
  }
  SECTION("SLURM_STEP_GPUS is a list of indexes") {
    env["SLURM_STEP_GPUS"] = "0,2-3";
    env["SLURM_GPUS_ON_NODE"] = "8";
    CHECK(ok({"x.py"}, env).nodes.nproc_per_node == 3);
  }
  SECTION("CUDA_VISIBLE_DEVICES, what the workers see, gives the count") {
    env["SLURM_GPUS_ON_NODE"] = "2";
    env["CUDA_VISIBLE_DEVICES"] = "GPU-aaaa,GPU-bbbb";
    auto o = ok({"x.py"}, env);
    CHECK(o.nodes.nproc_per_node == 2);
    CHECK_THAT(o.platform.slurm_summary, Catch::Contains("(CUDA_VISIBLE_DEVICES)"));
  }
  SECTION("Slurm's count replaces the host's for gpu") {
    env["SLURM_GPUS_ON_NODE"] = "1";
    CHECK(ok({"--nproc_per_node=gpu", "x.py"}, env, SystemInfo{.cpu_count = 8, .gpu_count = 8}).nodes.nproc_per_node ==
          1);
  }
  SECTION("bad values name the variable") {
    env["SLURM_GPUS_ON_NODE"] = "two";
    CHECK_THAT(error_of({"x.py"}, env), Catch::Contains("SLURM_GPUS_ON_NODE='two'") && Catch::Contains("--no_slurm"));
    env.erase("SLURM_GPUS_ON_NODE");
    env["SLURM_STEP_GPUS"] = "0,x";
    CHECK_THAT(error_of({"x.py"}, env), Catch::Contains("SLURM_STEP_GPUS='0,x'"));
  }
}

TEST_CASE("slurm: malformed counts name the variable", "[slurm]") {
  auto env = two_node_step(0);
  env["SLURM_STEP_NUM_NODES"] = "2x";
  CHECK_THAT(error_of({"x.py"}, env), Catch::Contains("SLURM_STEP_NUM_NODES='2x'") && Catch::Contains("--no_slurm"));
  env = two_node_step(0);
  env["SLURM_NODEID"] = "-1";
  CHECK_THAT(error_of({"x.py"}, env), Catch::Contains("SLURM_NODEID='-1'"));
  // A node id past the count is caught by the usual --node_rank check.
  env["SLURM_NODEID"] = "5";
  CHECK_THAT(error_of({"x.py"}, env), Catch::Contains("--node_rank=5"));
}

TEST_CASE("slurm: the port is the same for the step everywhere and differs between steps", "[slurm]") {
  CHECK(slurm_step_port("41", "0") == slurm_step_port("41", "0"));
  int same = 0;
  for (int job = 1; job <= 200; ++job)
    same += slurm_step_port(std::to_string(job), "0") == slurm_step_port(std::to_string(job), "1");
  CHECK(same < 5);
}
