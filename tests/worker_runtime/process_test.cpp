// End-to-end tests of the `train` example as real processes over a real in-process store:
// a peer SIGKILLed mid-collective makes the survivor exit fast with the documented code and
// an error file; and an elastic run (restarted by a minimal launcher loop written here, the
// way ddprun does it) ends bit-identical to an uninterrupted run.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ddprun/server/store_server.h"
#include "ddprun/worker/checks.h"
#include "spawn_logged.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

std::string temp_dir() {
  char tmpl[] = "/tmp/ddprun-proc-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  return tmpl;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return {std::istreambuf_iterator<char>(f), {}};
}

struct Proc {
  pid_t pid = -1;
  std::optional<int> status;
};

pid_t spawn(const std::vector<std::string>& args, const std::vector<std::string>& extra_env,
            const std::string& out_path) {
  return ddprun::worker::testing::spawn_logged(args, extra_env, out_path);
}

// Waits for all; returns false if the deadline passed (then kills the rest).
bool wait_all(std::vector<Proc>& ps, Clock::time_point deadline, std::vector<Clock::time_point>* exit_times = nullptr) {
  if (exit_times) exit_times->assign(ps.size(), Clock::time_point{});
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < ps.size(); ++i) {
      if (ps[i].status) continue;
      int st = 0;
      if (::waitpid(ps[i].pid, &st, WNOHANG) == ps[i].pid) {
        ps[i].status = st;
        if (exit_times) (*exit_times)[i] = Clock::now();
      } else {
        all = false;
      }
    }
    if (all) return true;
    if (Clock::now() > deadline) {
      for (auto& p : ps)
        if (!p.status) {
          ::kill(p.pid, SIGKILL);
          int st = 0;
          ::waitpid(p.pid, &st, 0);
          p.status = st;
        }
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling waitpid, not synchronising
  }
}

std::vector<std::string> rank_env(int rank, int world, uint16_t port, int attempt, const std::string& err_file) {
  return {"RANK=" + std::to_string(rank),
          "WORLD_SIZE=" + std::to_string(world),
          "LOCAL_RANK=" + std::to_string(rank),
          "LOCAL_WORLD_SIZE=" + std::to_string(world),
          "MASTER_ADDR=127.0.0.1",
          "MASTER_PORT=" + std::to_string(port),
          "TORCHELASTIC_RESTART_COUNT=" + std::to_string(attempt),
          "TORCHELASTIC_ERROR_FILE=" + err_file,
          "DDPRUN_DEVICE=cpu",
          "TORCHELASTIC_USE_AGENT_STORE=True"};
}

std::string checksum_of(const std::string& log) {
  std::smatch m;
  static const std::regex re("final_param_checksum=([0-9a-f]{16})");
  return std::regex_search(log, m, re) ? m[1].str() : "";
}

// A minimal launcher: run `world` ranks per attempt on a fresh keyspace (like ddprun) or on one
// store kept across attempts (like torchrun 2.6+: `reuse_store`); when one fails, stop the
// others and start the next attempt; returns rank 0's log of the successful attempt.
std::string run_elastic(const std::vector<std::string>& train_args, int world, int max_restarts, int* attempts_used,
                        bool reuse_store = false) {
  const std::string dir = temp_dir();
  ddprun::server::StoreServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  ddprun::server::StoreServer server(so);
  server.start();
  for (int attempt = 0; attempt <= max_restarts; ++attempt) {
    if (!reuse_store) server.reset_keyspace();
    std::vector<Proc> ps(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      std::vector<std::string> args{TRAIN_EXE};
      args.insert(args.end(), train_args.begin(), train_args.end());
      const std::string base = dir + "/a" + std::to_string(attempt) + "-r" + std::to_string(r);
      ps[static_cast<size_t>(r)].pid =
          spawn(args, rank_env(r, world, server.port(), attempt, base + ".err.json"), base + ".log");
    }
    // Watch: the first failure stops the group (SIGTERM is what ddprun sends; SIGKILL after grace).
    bool failed = false;
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    for (;;) {
      bool all_done = true;
      for (auto& p : ps) {
        if (p.status) continue;
        int st = 0;
        if (::waitpid(p.pid, &st, WNOHANG) == p.pid) {
          p.status = st;
          if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) failed = true;
        } else {
          all_done = false;
        }
      }
      if (all_done) break;
      if (failed || Clock::now() > deadline) {
        for (auto& p : ps)
          if (!p.status) ::kill(p.pid, SIGTERM);
        wait_all(ps, Clock::now() + std::chrono::seconds(10));
        failed = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!failed) {
      *attempts_used = attempt + 1;
      return slurp(dir + "/a" + std::to_string(attempt) + "-r0.log");
    }
  }
  *attempts_used = max_restarts + 1;
  return "";
}

}  // namespace

TEST_CASE("Failure: a SIGKILLed peer makes the survivor exit fast with the error file", "[process]") {
  const bool shm = GENERATE(true, false);
  INFO("shared memory path: " << shm);
  const std::string dir = temp_dir();
  ddprun::server::StoreServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  ddprun::server::StoreServer server(so);
  server.start();
  const std::vector<std::string> args{TRAIN_EXE, "--width",        "256", "--depth",     "2", "--samples",
                                      "1000000", "--batch",        "32",  "--epochs",    "1", "--max-steps",
                                      "100000",  "--fail-at-step", "5",   "--fail-rank", "1", "--timeout",
                                      "30"};
  std::vector<Proc> ps(2);
  for (int r = 0; r < 2; ++r)
    ps[static_cast<size_t>(r)].pid = spawn(
        args,
        [&] {
          auto e = rank_env(r, 2, server.port(), 0, dir + "/err" + std::to_string(r) + ".json");
          e.push_back(shm ? "DDPRUN_SHM=1" : "DDPRUN_SHM=0");
          return e;
        }(),
        dir + "/r" + std::to_string(r) + ".log");
  std::vector<Clock::time_point> t;
  REQUIRE(wait_all(ps, Clock::now() + std::chrono::seconds(60), &t));
  INFO("rank0 log: " << slurp(dir + "/r0.log") << "\nrank1 log: " << slurp(dir + "/r1.log"));
  REQUIRE(WIFSIGNALED(*ps[1].status));
  REQUIRE(WTERMSIG(*ps[1].status) == SIGKILL);
  REQUIRE(WIFEXITED(*ps[0].status));
  REQUIRE(WEXITSTATUS(*ps[0].status) == ddprun::worker::kExitCommFailure);
  // Far below the 30 s collective timeout: the dead peer's closed sockets fail the collective.
  REQUIRE(t[0] - t[1] < std::chrono::seconds(5));
  const std::string err = slurp(dir + "/err0.json");
  // PyTorch's error file: {"message": {"message": ..., "extraInfo": {"py_callstack", "timestamp"}}}.
  const auto doc = nlohmann::json::parse(err);
  REQUIRE(doc.at("message").at("message").get<std::string>().rfind("CommError", 0) == 0);
  REQUIRE(doc.at("message").at("extraInfo").at("timestamp").is_string());
}

TEST_CASE("Store: without a launcher store, rank 0 hosts it (srun-started ranks)", "[process]") {
  const std::string dir = temp_dir();
  // Below the ephemeral range (32768+), where a test running beside this one may hold any port
  // for its own connections; and clear of 29400/29500.
  const uint16_t port = static_cast<uint16_t>(10000 + (::getpid() % 19000));
  std::vector<Proc> ps(2);
  for (int r = 0; r < 2; ++r)
    ps[static_cast<size_t>(r)].pid =
        spawn({TRAIN_EXE, "--device", "cpu"},
              {"SLURM_PROCID=" + std::to_string(r), "SLURM_NTASKS=2", "SLURM_LOCALID=" + std::to_string(r),
               "SLURM_NTASKS_PER_NODE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port),
               "RANK=", "WORLD_SIZE=", "TORCHELASTIC_USE_AGENT_STORE="},
              dir + "/r" + std::to_string(r) + ".log");
  REQUIRE(wait_all(ps, Clock::now() + std::chrono::seconds(60)));
  INFO("rank0 log: " << slurp(dir + "/r0.log") << "\nrank1 log: " << slurp(dir + "/r1.log"));
  for (auto& p : ps) REQUIRE((WIFEXITED(*p.status) && WEXITSTATUS(*p.status) == 0));
  REQUIRE(slurp(dir + "/r0.log").find("world=2 backend=") != std::string::npos);
  REQUIRE(!checksum_of(slurp(dir + "/r0.log")).empty());
}

TEST_CASE("Elastic resume: two SIGKILLs at different steps end bit-identical to an uninterrupted run", "[process]") {
  const std::vector<std::string> base{"--width", "64", "--depth",  "2", "--samples",  "400",
                                      "--batch", "20", "--epochs", "3", "--momentum", "0.9"};
  int attempts = 0;
  const std::string clean = run_elastic(base, 2, 0, &attempts);
  INFO("clean log: " << clean);
  const std::string want = checksum_of(clean);
  REQUIRE(!want.empty());
  REQUIRE(attempts == 1);

  auto args = base;
  const std::string ck = temp_dir() + "/ck";
  // 10 steps per epoch; checkpoints every 4; killed before steps 7 (attempt 0) and 23 (attempt 1).
  args.insert(args.end(),
              {"--checkpoint-dir", ck, "--checkpoint-every", "4", "--fail-at-step", "7,23", "--fail-rank", "1"});
  const std::string resumed = run_elastic(args, 2, 3, &attempts);
  INFO("resumed log: " << resumed);
  REQUIRE(attempts == 3);
  // Rank 0 writes checkpoints in the background, one at a time, newer snapshots replacing one
  // still waiting: on a slow disk the newest on disk when attempt 1 is stopped before step 23
  // may be older than step 20's (one of 4, 8, ..., 20). Whichever it is, the end is bit-identical.
  std::smatch m;
  REQUIRE(std::regex_search(resumed, m, std::regex("resumed from step ([0-9]+)")));
  const int from = std::stoi(m[1].str());
  REQUIRE(from >= 4);
  REQUIRE(from <= 20);
  REQUIRE(from % 4 == 0);
  REQUIRE(checksum_of(resumed) == want);

  SECTION("on one store kept across attempts, as torchrun 2.6+ does, attempts do not read each other's keys") {
    const std::string ck2 = temp_dir() + "/ck";
    auto args2 = base;
    args2.insert(args2.end(),
                 {"--checkpoint-dir", ck2, "--checkpoint-every", "4", "--fail-at-step", "7,23", "--fail-rank", "1"});
    const std::string reused = run_elastic(args2, 2, 3, &attempts, /*reuse_store=*/true);
    INFO("reused-store log: " << reused);
    REQUIRE(attempts == 3);
    REQUIRE(checksum_of(reused) == want);
  }
}

TEST_CASE("Fused step: train --fused-step=1 ends bit-identical to =0, also when a run switches at a resume",
          "[process]") {
  const std::vector<std::string> base{"--profile", "--width", "64",       "--depth", "2",          "--samples", "400",
                                      "--batch",   "20",      "--epochs", "3",       "--momentum", "0.9"};
  auto with = [&](std::vector<std::string> extra) {
    auto a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  int attempts = 0;
  const std::string separate = run_elastic(with({"--fused-step", "0"}), 2, 0, &attempts);
  INFO("separate log: " << separate);
  REQUIRE(separate.find("step=separate") != std::string::npos);
  const std::string fused = run_elastic(with({"--fused-step", "1"}), 2, 0, &attempts);
  INFO("fused log: " << fused);
  REQUIRE(fused.find("step=fused(shm)") != std::string::npos);  // the shm path, not the default
  // Parameters and momentum as one copy that every rank maps (rank 0 initialises it alone).
  REQUIRE(fused.find("state=one-copy") != std::string::npos);
  REQUIRE(!checksum_of(separate).empty());
  REQUIRE(checksum_of(fused) == checksum_of(separate));
  // Both ways of running the collectives during backward, whatever --progress auto picks on
  // this host: the same bits.
  for (const char* progress : {"thread", "inline"}) {
    const std::string log = run_elastic(with({"--fused-step", "1", "--progress", progress}), 2, 0, &attempts);
    INFO("--progress " << progress << " log: " << log);
    REQUIRE(log.find(std::string("progress=") + progress) != std::string::npos);
    REQUIRE(checksum_of(log) == checksum_of(separate));
  }

  // Checkpoint (params + momentum) written by the fused path, resumed by the separate one.
  const std::string ck = temp_dir() + "/ck";
  const std::string first =
      run_elastic(with({"--fused-step", "1", "--checkpoint-dir", ck, "--checkpoint-every", "4", "--max-steps", "14"}),
                  2, 0, &attempts);
  REQUIRE(first.find("final_step=14") != std::string::npos);
  const std::string resumed = run_elastic(with({"--fused-step", "0", "--checkpoint-dir", ck}), 2, 0, &attempts);
  INFO("resumed log: " << resumed);
  REQUIRE(resumed.find("resumed from step 12") != std::string::npos);
  REQUIRE(checksum_of(resumed) == checksum_of(separate));
  // And the other way: the separate path's checkpoint loaded into the one copy (by rank 0
  // alone; the others wait at the broadcast), resumed by the fused path.
  const std::string ck2 = temp_dir() + "/ck2";
  run_elastic(with({"--fused-step", "0", "--checkpoint-dir", ck2, "--checkpoint-every", "4", "--max-steps", "14"}), 2,
              0, &attempts);
  const std::string resumed_fused = run_elastic(with({"--fused-step", "1", "--checkpoint-dir", ck2}), 2, 0, &attempts);
  INFO("resumed fused log: " << resumed_fused);
  REQUIRE(resumed_fused.find("resumed from step 12") != std::string::npos);
  REQUIRE(resumed_fused.find("state=one-copy") != std::string::npos);
  REQUIRE(checksum_of(resumed_fused) == checksum_of(separate));
}

TEST_CASE("Force collective: one rank with --force-collective all-reduces through Gloo and ends bit-identical",
          "[process]") {
  const std::string dir = temp_dir();
  // No launcher variables: a standalone rank.
  const std::vector<std::string> solo_env{"RANK=",
                                          "WORLD_SIZE=",
                                          "LOCAL_RANK=",
                                          "LOCAL_WORLD_SIZE=",
                                          "SLURM_PROCID=",
                                          "SLURM_NTASKS=",
                                          "TORCHELASTIC_USE_AGENT_STORE=",
                                          "DDPRUN_DEVICE="};
  auto run = [&](std::vector<std::string> extra, const std::string& name) {
    std::vector<std::string> args{TRAIN_EXE, "--device", "cpu", "--width",  "64", "--depth",    "2",  "--samples",
                                  "400",     "--batch",  "20",  "--epochs", "2",  "--momentum", "0.9"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<Proc> ps(1);
    ps[0].pid = spawn(args, solo_env, dir + "/" + name + ".log");
    REQUIRE(wait_all(ps, Clock::now() + std::chrono::seconds(120)));
    const std::string log = slurp(dir + "/" + name + ".log");
    INFO(name << " log: " << log);
    REQUIRE((WIFEXITED(*ps[0].status) && WEXITSTATUS(*ps[0].status) == 0));
    return log;
  };
  const std::string plain = run({}, "plain");
  REQUIRE(plain.find("world=1 backend=self") != std::string::npos);
  const std::string want = checksum_of(plain);
  REQUIRE(!want.empty());
  for (const char* fused : {"0", "1"}) {
    INFO("--fused-step " << fused);
    const std::string forced = run({"--force-collective", "--fused-step", fused}, std::string("forced") + fused);
    INFO("forced log: " << forced);
    REQUIRE(forced.find("world=1 backend=gloo") != std::string::npos);
    REQUIRE(checksum_of(forced) == want);
  }

  SECTION("--timeout must be a positive number of seconds") {
    std::vector<Proc> ps(1);
    ps[0].pid = spawn({TRAIN_EXE, "--timeout", "0"}, solo_env, dir + "/bad.log");
    REQUIRE(wait_all(ps, Clock::now() + std::chrono::seconds(60)));
    REQUIRE((WIFEXITED(*ps[0].status) && WEXITSTATUS(*ps[0].status) == ddprun::worker::kExitUsage));
  }
}
