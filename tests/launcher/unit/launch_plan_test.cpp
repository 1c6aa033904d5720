// The launch plan: every fact the agent needs (the credential, the spawn template, the NUMA CPU
// sets) resolved before the agent exists, with the same errors the user gets from ddprun.
#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "ddprun/launcher/launch_plan.h"
#include "ddprun/launcher/numa.h"

using namespace ddprun::launcher;
namespace fs = std::filesystem;

namespace {

const std::string kToken = "a token of at least sixteen bytes";

LaunchOptions options(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  auto r = parse_command_line(args, {}, SystemInfo{.cpu_count = 8, .gpu_count = 0});
  INFO(r.message);
  REQUIRE(r.options);
  return *r.options;
}

// A plan on a machine that is not the rendezvous endpoint and whose kernel reports exits early.
LaunchPlan plan(std::vector<std::string> args, EnvMap env = {{"PYTHON_EXEC", "/bin/sh"}}) {
  PlanProbes probes{.is_local_host = [](const std::string&) { return false; },
                    .kernel_reports_exit_early = [] { return true; }};
  return make_launch_plan(options(std::move(args)), env, probes);
}

class TempDir {
 public:
  TempDir() {
    std::string templ = (fs::temp_directory_path() / "ddprun-plan-XXXXXX").string();
    REQUIRE(::mkdtemp(templ.data()) != nullptr);
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name, const std::string& text, mode_t mode) const {
    const fs::path p = path_ / name;
    std::ofstream(p) << text;
    ::chmod(p.c_str(), mode);
    return p.string();
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

const std::vector<std::string> kTwoNodes = {"--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

}  // namespace

// The token the plan resolved, or "" when it resolved none.
std::string token_of(const LaunchPlan& p) {
  const auto* t = std::get_if<TokenCredential>(&p.rendezvous.credential);
  return t ? t->token : "";
}

TEST_CASE("the token of a multi-node job is loaded into the plan", "[launchplan]") {
  auto env_token = plan(with(kTwoNodes, {"train.py"}), {{"PYTHON_EXEC", "/bin/sh"}, {"DDPRUN_RDZV_TOKEN", kToken}});
  CHECK_FALSE(env_token.rendezvous.local);
  CHECK(token_of(env_token) == kToken);
  CHECK(agent_credentials(env_token.rendezvous.credential).token == kToken);
  CHECK(server_token(env_token.rendezvous.credential) == kToken);
  TempDir d;
  const std::string file = d.file("token", "from the file, sixteen bytes or more\n", 0600);
  auto from_file = plan(with(kTwoNodes, {"--rdzv_token_file=" + file, "train.py"}),
                        {{"PYTHON_EXEC", "/bin/sh"}, {"DDPRUN_RDZV_TOKEN", kToken}});
  CHECK(token_of(from_file) == "from the file, sixteen bytes or more");  // the file wins
  // None: open.
  CHECK(std::holds_alternative<NoCredential>(plan(with(kTwoNodes, {"train.py"})).rendezvous.credential));
  // One node runs its round in-process: no token is needed or read.
  auto one = plan({"train.py"}, {{"PYTHON_EXEC", "/bin/sh"}, {"DDPRUN_RDZV_TOKEN", kToken}});
  CHECK(std::holds_alternative<NoCredential>(one.rendezvous.credential));
}

TEST_CASE("inside a Slurm step without a token the plan resolves munge once", "[launchplan]") {
  LaunchOptions o = options(with(kTwoNodes, {"train.py"}));
  o.platform.slurm_summary = "Slurm job 77 step 3";
  const EnvMap step = {{"PYTHON_EXEC", "/bin/sh"}, {"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "3"}};
  int opened = 0;
  auto no_munge = [&](const std::string&, std::string& why) -> std::shared_ptr<const ddprun::rdzv::MungeClient> {
    ++opened;
    why = "libmunge.so.2 cannot be loaded (install munge)";
    return nullptr;
  };
  PlanProbes probes{.is_local_host = [](const std::string&) { return false; },
                    .kernel_reports_exit_early = [] { return true; },
                    .open_munge = no_munge};
  // munge does not load: open, and the plan says why (the agent's warning names it).
  const auto none = make_launch_plan(o, step, probes);
  REQUIRE(std::holds_alternative<NoCredential>(none.rendezvous.credential));
  CHECK(std::get<NoCredential>(none.rendezvous.credential).why_no_munge ==
        "libmunge.so.2 cannot be loaded (install munge)");
  CHECK(opened == 1);
  // A token wins: munge is not even loaded.
  EnvMap with_token = step;
  with_token["DDPRUN_RDZV_TOKEN"] = kToken;
  CHECK(token_of(make_launch_plan(o, with_token, probes)) == kToken);
  CHECK(opened == 1);
  // Outside a Slurm step: not loaded either.
  LaunchOptions plain = o;
  plain.platform.slurm_summary.clear();
  CHECK(std::holds_alternative<NoCredential>(make_launch_plan(plain, step, probes).rendezvous.credential));
  CHECK(opened == 1);
  // This host's libmunge (no munged is asked until a connection needs a credential).
  std::string why;
  if (!ddprun::rdzv::MungeClient::open("", why)) {
    WARN("libmunge is not installed here: " << why);
    return;
  }
  probes.open_munge = {};
  const auto munge = make_launch_plan(o, step, probes);
  REQUIRE(std::holds_alternative<MungeCredential>(munge.rendezvous.credential));
  const auto& m = std::get<MungeCredential>(munge.rendezvous.credential);
  CHECK(m.scope.job_id == "77");
  CHECK(m.scope.step_id == "3");
  CHECK(agent_credentials(munge.rendezvous.credential).munge);
  CHECK(server_munge_check(munge.rendezvous.credential));
  CHECK(server_token(munge.rendezvous.credential).empty());
}

TEST_CASE("a bad token file is a usage error that says what to fix", "[launchplan]") {
  TempDir d;
  const std::string missing = (d.path() / "missing").string();
  CHECK_THROWS_AS(plan(with(kTwoNodes, {"--rdzv_token_file=" + missing, "train.py"})), UsageError);
  CHECK_THROWS_WITH(plan(with(kTwoNodes, {"--rdzv_token_file=" + missing, "train.py"})), Catch::Contains(missing));
  const std::string open = d.file("open", kToken + "\n", 0644);
  CHECK_THROWS_WITH(plan(with(kTwoNodes, {"--rdzv_token_file=" + open, "train.py"})), Catch::Contains("chmod 600"));
  CHECK_THROWS_AS(plan(with(kTwoNodes, {"train.py"}), {{"PYTHON_EXEC", "/bin/sh"}, {"DDPRUN_RDZV_TOKEN", "short"}}),
                  UsageError);
}

TEST_CASE("the spawn template: command, interpreter, exit watch, spares", "[launchplan]") {
  auto p = plan({"--max_restarts=1", "train.py", "--lr", "1"});
  CHECK(p.spawn.executable == "/bin/sh");
  CHECK(p.spawn.argv == std::vector<std::string>{"/bin/sh", "-u", "train.py", "--lr", "1"});
  CHECK_FALSE(p.interpreter.empty());
  CHECK(p.spawn.exit_watch);
  CHECK(p.spares);                      // restarts and a Python entry point
  CHECK(p.spawn.cpu_affinity.empty());  // no --numa_binding
  CHECK_FALSE(plan({"--max_restarts=1", "--early_exit_watch=0", "--warm_spares=0", "train.py"}).spawn.exit_watch);
  CHECK_FALSE(plan({"--max_restarts=1", "--warm_spares=0", "train.py"}).spares);
  auto program = plan({"--max_restarts=1", "--no_python", "/bin/true"});
  CHECK(program.spawn.executable == "/bin/true");
  CHECK(program.interpreter.empty());
  CHECK_FALSE(program.spares);
  CHECK_THROWS_WITH(plan({"train.py"}, {{"PYTHON_EXEC", "no-such-python"}, {"PATH", "/nonexistent"}}),
                    Catch::Contains("PYTHON_EXEC"));
}

TEST_CASE("--numa_binding's CPU sets are resolved into the plan, or the launch fails", "[launchplan]") {
  TempDir root;
  // One GPU on NUMA node 0, which holds every CPU this process may use.
  const fs::path gpu = root.path() / "proc/driver/nvidia/gpus/0000:18:00.0";
  fs::create_directories(gpu);
  std::ofstream(gpu / "information") << "Model: \t\t NVIDIA H200\nGPU UUID: \t GPU-aaaa\nBus Location: \t "
                                        "0000:18:00.0\nDevice Minor: \t 0\n";
  fs::create_directories(root.path() / "sys/bus/pci/devices/0000:18:00.0");
  std::ofstream(root.path() / "sys/bus/pci/devices/0000:18:00.0/numa_node") << "0\n";
  fs::create_directories(root.path() / "sys/devices/system/node/node0");
  std::ofstream(root.path() / "sys/devices/system/node/possible") << "0\n";
  std::ofstream(root.path() / "sys/devices/system/node/node0/cpulist") << "0-4095\n";
  const EnvMap env{{"PYTHON_EXEC", "/bin/sh"}, {"DDPRUN_SYSFS_ROOT", root.path().string()}};
  auto p = plan({"--numa-binding=node", "train.py"}, env);
  REQUIRE(p.spawn.cpu_affinity.size() == 1);
  CHECK_FALSE(p.spawn.cpu_affinity[0].empty());
  // Two ranks, one GPU: torchrun fails the launch too.
  CHECK_THROWS_AS(plan({"--numa-binding=node", "--nproc_per_node=2", "train.py"}, env), NumaError);
}
