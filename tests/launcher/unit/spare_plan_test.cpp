// Warm spares, the pure decisions (spare_plan.h) and their flags.
#include <catch2/catch.hpp>

#include <algorithm>

#include "ddprun/launcher/options.h"
#include "ddprun/launcher/spare_plan.h"
#include "ddprun/launcher/worker_env.h"

using namespace ddprun::launcher;

namespace {

ParseOutcome parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  return parse_command_line(args, {}, SystemInfo{.cpu_count = 8, .gpu_count = 0});
}

bool enabled(const LaunchOptions& o, bool python_entry) {
  return spares_enabled(o.spares, o.faults.max_restarts, python_entry);
}

LaunchOptions ok(std::vector<std::string> args) {
  auto r = parse(std::move(args));
  INFO(r.message);
  REQUIRE(r.options);
  return *r.options;
}

}  // namespace

TEST_CASE("spares are on by default with restarts and a Python entry point", "[spares]") {
  CHECK_FALSE(enabled(ok({"train.py"}), true));
  CHECK(enabled(ok({"--max_restarts=2", "train.py"}), true));
  CHECK_FALSE(enabled(ok({"--max_restarts=2", "./a.out"}), false));
  CHECK_FALSE(enabled(ok({"--max_restarts=2", "--warm_spares=0", "train.py"}), true));
  CHECK(enabled(ok({"--warm_spares=1", "train.py"}), true));
  CHECK_FALSE(enabled(ok({"--warm_spares=1", "--no_python", "./a.out"}), false));
}

TEST_CASE("--preload and --spare_priority", "[spares]") {
  CHECK(ok({"train.py"}).spares.preload == std::vector<std::string>{"torch", "torch.distributed"});
  CHECK(ok({"--preload", "numpy, torch._C,my_pkg.sub_2", "train.py"}).spares.preload ==
        std::vector<std::string>{"numpy", "torch._C", "my_pkg.sub_2"});
  CHECK(ok({"--preload=,", "train.py"}).spares.preload.empty());
  for (const char* bad : {"torch;rm", "a..b", "1abc", "torch.", "a b"}) {
    auto r = parse({std::string("--preload=") + bad, "train.py"});
    REQUIRE_FALSE(r.options);
    CHECK(r.message.find("--preload") != std::string::npos);
    CHECK(r.message.find("module names") != std::string::npos);
  }
  CHECK(ok({"train.py"}).spares.priority == SparePriority::Idle);
  CHECK(ok({"--spare_priority=normal", "train.py"}).spares.priority == SparePriority::Normal);
  auto r = parse({"--spare_priority=low", "train.py"});
  REQUIRE_FALSE(r.options);
  CHECK(r.message.find("idle or normal") != std::string::npos);
  r = parse({"--warm_spares=maybe", "train.py"});
  REQUIRE_FALSE(r.options);
  CHECK(r.message.find("--warm_spares") != std::string::npos);
}

TEST_CASE("a spare replays python -u script, -m module and -c code only", "[spares]") {
  CHECK(spare_can_run({"python3", "-u", "train.py", "--lr", "1"}));
  CHECK(spare_can_run({"python3", "-u", "-m", "pkg.train"}));
  CHECK(spare_can_run({"python3", "-u", "-c", "print(1)", "x"}));
  CHECK_FALSE(spare_can_run({"python3", "-u", "-m"}));
  CHECK_FALSE(spare_can_run({"python3", "train.py"}));
  CHECK_FALSE(spare_can_run({"python3", "-u", "-X", "dev", "train.py"}));
  // What build_worker_argv makes for every Python entry point is replayable.
  for (auto args : {std::vector<std::string>{"train.py"}, {"-m", "pkg.train"}, {"--run_path", "train.py"}}) {
    args.insert(args.begin(), "--max_restarts=1");
    auto o = ok(args);
    CHECK(spare_can_run(build_worker_argv(o.workers, {}, true)));
  }
}

TEST_CASE("a spare serves an attempt whose environment differs only in per-attempt variables", "[spares]") {
  LaunchOptions o = ok({"--max_restarts=1", "--nproc_per_node=2", "train.py"});
  EnvMap parent = {{"PATH", "/usr/bin"}, {"PYTHONPATH", "/src"}};
  GroupLayout g0;
  g0.local_world_size = 2;
  g0.world_size = 4;
  GroupLayout g1 = g0;
  g1.restart_count = 1;
  g1.store_port = 31000;
  g1.global_rank_base = 2;
  g1.run_id = "other";
  const EnvMap started = build_worker_env(parent, o.workers, o.faults, g0, 1, "");
  const EnvMap wanted = build_worker_env(parent, o.workers, o.faults, g1, 1, "/logs/attempt_1/1/error.json");
  CHECK(spare_env_mismatch(started, wanted).empty());
  // Anything else must match: what the interpreter and its libraries read at start-up.
  EnvMap changed = wanted;
  changed["PYTHONPATH"] = "/elsewhere";
  CHECK(spare_env_mismatch(started, changed) == "PYTHONPATH differs from the spare's");
  changed = wanted;
  changed["OMP_NUM_THREADS"] = "4";
  CHECK(spare_env_mismatch(started, changed) == "OMP_NUM_THREADS differs from the spare's");
  changed = wanted;
  changed["LD_PRELOAD"] = "x.so";
  CHECK(spare_env_mismatch(started, changed) == "LD_PRELOAD is set now, not when the spare started");
  changed = wanted;
  changed.erase("PATH");
  CHECK(spare_env_mismatch(started, changed) == "PATH is unset now, set when the spare started");
  // Every variable build_worker_env sets per attempt is one that may differ.
  for (const auto& [k, v] : wanted) {
    if (started.at(k) != v) {
      INFO(k);
      const auto& free = spare_per_attempt_variables();
      CHECK(std::find(free.begin(), free.end(), k) != free.end());
    }
  }
}

TEST_CASE("the spare's command line and launch message", "[spares]") {
  const std::vector<std::string> cold = {"/usr/bin/python3", "-u", "train.py", "a b"};
  auto argv = spare_argv(cold, 4, "idle", {"torch", "numpy"});
  REQUIRE(argv.size() == 9 + cold.size());
  CHECK(argv[0] == "/usr/bin/python3");
  CHECK(argv[1] == "-u");
  CHECK(argv[2] == "-c");
  CHECK(std::string(argv[3]).find("ddprun warm spare") != std::string::npos);
  CHECK(std::vector<std::string>(argv.begin() + 4, argv.begin() + 9) ==
        std::vector<std::string>{"4", "idle", "torch,numpy", "-", "--"});
  CHECK(std::vector<std::string>(argv.begin() + 9, argv.end()) == cold);
  const auto gpu = spare_argv(cold, 5, "normal", {}, /*cuda=*/true);
  CHECK(std::vector<std::string>(gpu.begin() + 4, gpu.begin() + 9) ==
        std::vector<std::string>{"5", "normal", "", "cuda", "--"});
  // The bootstrap itself: embedded whole (its last statement re-raises the script's exception).
  const std::string src = spare_bootstrap_source();
  CHECK(src.find("raise\n") != std::string::npos);
  CHECK(src.find('@') == std::string::npos);

  const std::string msg = encode_spare_launch("/work", {"py", "-u", "t.py"}, {{"A", "1"}, {"B", "x=y"}});
  CHECK(msg == std::string("/work\0" "3\0" "py\0" "-u\0" "t.py\0" "A=1\0" "B=x=y\0", 29));
}

TEST_CASE("the spare's ready message", "[spares]") {
  auto plain = parse_spare_ready("R 1.25 3 -");
  REQUIRE(plain);
  CHECK(plain->import_s == Approx(1.25));
  CHECK(plain->threads == 3);
  CHECK(plain->gpu == SpareReady::Gpu::NotAsked);
  // An older bootstrap's line (no GPU word) is a plain ready message too.
  auto old = parse_spare_ready("R 0.5 1");
  REQUIRE(old);
  CHECK(old->gpu == SpareReady::Gpu::NotAsked);

  auto warm = parse_spare_ready("R 2.0 4 gpu 1 180.5 95.25");
  REQUIRE(warm);
  CHECK(warm->gpu == SpareReady::Gpu::Warm);
  CHECK(warm->device == 1);
  CHECK(warm->context_ms == Approx(180.5));
  CHECK(warm->nccl_ms == Approx(95.25));

  auto no_nccl = parse_spare_ready("R 2.0 4 gpu 0 150 - no libnccl in this process");
  REQUIRE(no_nccl);
  CHECK(no_nccl->gpu == SpareReady::Gpu::Warm);
  CHECK(no_nccl->nccl_ms < 0);
  CHECK(no_nccl->why == "no libnccl in this process");

  auto skipped = parse_spare_ready("R 2.0 4 nogpu the GPU is in exclusive-process compute mode");
  REQUIRE(skipped);
  CHECK(skipped->gpu == SpareReady::Gpu::Skipped);
  CHECK(skipped->why == "the GPU is in exclusive-process compute mode");
  auto unexplained = parse_spare_ready("R 2.0 4 nogpu");
  REQUIRE(unexplained);
  CHECK(unexplained->why == "no reason given");

  for (const char* bad : {"", "X 1 2 -", "R x 2 -", "R 1", "R 1 2 gpu", "R 1 2 gpu -1 5 6", "R 1 2 gpu 0 5 6ms",
                          "R 1 2 gpu 0 5 -3", "R 1 2 what 0"}) {
    INFO(bad);
    CHECK_FALSE(parse_spare_ready(bad));
  }
}

TEST_CASE("--spare_cuda", "[spares]") {
  auto def = parse({"--nproc_per_node=2", "--max_restarts=1", "train.py"});
  REQUIRE(def.options);
  CHECK_FALSE(def.options->spares.cuda);
  auto on = parse({"--nproc_per_node=2", "--max_restarts=1", "--spare_cuda=1", "train.py"});
  REQUIRE(on.options);
  CHECK(on.options->spares.cuda);
  auto bad = parse({"--nproc_per_node=2", "--spare_cuda=maybe", "train.py"});
  CHECK_FALSE(bad.options);
  CHECK(bad.message.find("--spare_cuda") != std::string::npos);
}
