#include <catch2/catch.hpp>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "ddprun/worker/checks.h"
#include "ddprun/worker/env.h"
#include "ddprun/worker/error_file.h"

using namespace ddprun::worker;

namespace {
GetEnvFn from(const std::map<std::string, std::string>& m) {
  return [m](const char* n) -> const char* {
    auto it = m.find(n);
    return it == m.end() ? nullptr : it->second.c_str();
  };
}
}  // namespace

TEST_CASE("Env: torchrun variables", "[env]") {
  auto e = read_worker_env(from({{"RANK", "3"},
                                 {"WORLD_SIZE", "4"},
                                 {"LOCAL_RANK", "1"},
                                 {"LOCAL_WORLD_SIZE", "2"},
                                 {"MASTER_ADDR", "10.0.0.1"},
                                 {"MASTER_PORT", "29555"},
                                 {"TORCHELASTIC_RESTART_COUNT", "2"},
                                 {"TORCHELASTIC_ERROR_FILE", "/tmp/e.json"},
                                 {"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
  REQUIRE(e.use_agent_store);
  REQUIRE(e.rank == 3);
  REQUIRE(e.world_size == 4);
  REQUIRE(e.local_rank == 1);
  REQUIRE(e.local_world_size == 2);
  REQUIRE(e.master_addr == "10.0.0.1");
  REQUIRE(e.master_port == 29555);
  REQUIRE(e.restart_count == 2);
  REQUIRE(e.error_file == "/tmp/e.json");
  REQUIRE_FALSE(e.standalone);
  REQUIRE_FALSE(e.from_slurm);
}

TEST_CASE("Env: SLURM variables when srun starts the program directly", "[env]") {
  auto e = read_worker_env(from({{"SLURM_PROCID", "5"},
                                 {"SLURM_NTASKS", "8"},
                                 {"SLURM_LOCALID", "1"},
                                 {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
                                 {"SLURM_NODEID", "1"},
                                 {"SLURM_LAUNCH_NODE_IPADDR", "10.1.2.3"}}));
  REQUIRE(e.from_slurm);
  REQUIRE(e.rank == 5);
  REQUIRE(e.world_size == 8);
  REQUIRE(e.local_rank == 1);
  REQUIRE(e.local_world_size == 4);
  REQUIRE(e.group_rank == 1);
  REQUIRE(e.master_addr == "10.1.2.3");
}

TEST_CASE("Env: no variables is a standalone single rank", "[env]") {
  auto e = read_worker_env(from({}));
  REQUIRE(e.standalone);
  REQUIRE(e.world_size == 1);
  REQUIRE(e.rank == 0);
}

TEST_CASE("Env: malformed values are named in the error", "[env]") {
  REQUIRE_THROWS_WITH(read_worker_env(from({{"RANK", "4"}, {"WORLD_SIZE", "4"}})), Catch::Contains("RANK"));
  REQUIRE_THROWS_WITH(read_worker_env(from({{"RANK", "x"}, {"WORLD_SIZE", "4"}})), Catch::Contains("'x'"));
  REQUIRE_THROWS_AS(read_worker_env(from({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}})), WorkerError);
}

TEST_CASE("ErrorFile: PyTorch's JSON members, in its order, with escaping, on one line", "[env]") {
  const auto j = error_file_json("peer \"1\" died\n", "trace", 1700000000);
  REQUIRE(j.find('\n') == j.size() - 1);
  const auto doc = nlohmann::ordered_json::parse(j);
  // ordered_json compares members in order: the same members, in PyTorch's order.
  CHECK(doc == nlohmann::ordered_json::parse(R"({"message": {"message": "peer \"1\" died\n", "extraInfo": )"
                                             R"({"py_callstack": "trace", "timestamp": "1700000000"}}})"));
}

TEST_CASE("ErrorFile: a message that is not UTF-8 still makes a file a strict reader (Python) takes", "[env]") {
  const auto j = error_file_json("bad \xff\xfe byte \x01", "tb \xc3", 1);
  nlohmann::json doc;
  REQUIRE_NOTHROW(doc = nlohmann::json::parse(j));
  CHECK(doc["message"]["message"] == "bad \xef\xbf\xbd\xef\xbf\xbd byte \x01");
  CHECK(doc["message"]["extraInfo"]["py_callstack"] == "tb \xef\xbf\xbd");
}
