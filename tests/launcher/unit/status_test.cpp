// `ddprun status`, the pure parts: the snapshot's JSON both ways, the table, CPU % from two
// samples, NVML's per-device answers as per-rank GPU values, the socket directory's path.
#include <catch2/catch.hpp>

#include <map>

#include "ddprun/launcher/agent_status.h"
#include "ddprun/launcher/json.h"

using namespace ddprun::launcher;

namespace {
AgentStatus two_ranks() {
  AgentStatus s;
  s.run_id = "job7";
  s.host = "node-a";
  s.node_rank = 1;
  s.num_nodes = 2;
  s.agent_pid = 400;
  s.state = "running";
  s.attempt = 1;
  s.max_restarts = 3;
  s.uptime_s = 75;
  s.last_failure_rank = 3;
  s.last_failure = "r3: exit code 1 after 2.0 s (attempt 0)";
  RankStatus a;
  a.rank = 2;
  a.local_rank = 0;
  a.pid = 401;
  a.state = "running";
  a.uptime_s = 61;
  a.cpu_percent = 99.5;
  a.rss_bytes = 300ull << 20;
  RankStatus b = a;
  b.rank = 3;
  b.local_rank = 1;
  b.pid = 402;
  b.cpu_percent.reset();
  b.rss_bytes.reset();
  s.ranks = {a, b};
  return s;
}
}  // namespace

TEST_CASE("status JSON: every field survives the round trip; absent values are null", "[status]") {
  AgentStatus s = two_ranks();
  s.ranks[0].gpu_index = 1;
  s.ranks[0].gpu_utilization_percent = 87;
  s.ranks[0].gpu_memory_bytes = 5ull << 30;
  const std::string text = status_to_json(s);
  CHECK(text.find("\"cpu_percent\":null") != std::string::npos);  // rank 3's
  CHECK(text.find("\"restarts_used\":1,\"restarts_left\":2") != std::string::npos);
  std::string error;
  auto back = status_from_json(text, &error);
  REQUIRE(back);
  CHECK(back->run_id == "job7");
  CHECK(back->host == "node-a");
  CHECK(back->node_rank == 1);
  CHECK(back->num_nodes == 2);
  CHECK(back->agent_pid == 400);
  CHECK(back->attempt == 1);
  CHECK(back->max_restarts == 3);
  CHECK(back->restarts_left() == 2);
  CHECK(back->last_failure_rank == 3);
  CHECK(back->last_failure == s.last_failure);
  REQUIRE(back->ranks.size() == 2);
  CHECK(back->ranks[0].pid == 401);
  CHECK(*back->ranks[0].cpu_percent == Approx(99.5));
  CHECK(*back->ranks[0].rss_bytes == (300ull << 20));
  CHECK(*back->ranks[0].gpu_index == 1);
  CHECK(*back->ranks[0].gpu_utilization_percent == Approx(87));
  CHECK(*back->ranks[0].gpu_memory_bytes == (5ull << 30));
  CHECK_FALSE(back->ranks[1].cpu_percent);
  CHECK_FALSE(back->ranks[1].gpu_index);
}

TEST_CASE("status JSON: no failure is null; strings with quotes and control bytes are escaped", "[status]") {
  AgentStatus s = two_ranks();
  s.last_failure.clear();
  s.last_failure_rank.reset();
  s.run_id = "a\"b\\c\nd\x01";
  const std::string text = status_to_json(s);
  CHECK(text.find("\"last_failure\":null") != std::string::npos);
  CHECK(text.find("\\u0001") != std::string::npos);
  auto back = status_from_json(text, nullptr);
  REQUIRE(back);
  CHECK(back->run_id == s.run_id);
  CHECK(back->last_failure.empty());
}

TEST_CASE("status JSON: the document wraps the agents with the schema version", "[status]") {
  const std::string doc = status_document_json({two_ranks()});
  auto j = parse_untrusted_json(doc);
  REQUIRE(j);
  CHECK((*j)["version"] == kStatusSchemaVersion);
  REQUIRE((*j)["agents"].size() == 1);
  CHECK((*j)["agents"][0]["run_id"] == "job7");
  CHECK(status_document_json({}) == "{\"version\":1,\"agents\":[]}");
}

TEST_CASE("status JSON: what is not an agent's answer is refused with the reason", "[status]") {
  std::string error;
  CHECK_FALSE(status_from_json("refused: nope", &error));
  CHECK(error == "not a JSON object");
  CHECK_FALSE(status_from_json("{\"run_id\":\"x\"}", &error));
  CHECK(error.find("missing") != std::string::npos);
  CHECK_FALSE(status_from_json("{\"run_id\":1,\"node_rank\":0,\"agent_pid\":1,\"attempt\":0,\"ranks\":[]}", &error));
  CHECK(error == "field \"run_id\" has the wrong type");
  CHECK_FALSE(
      status_from_json("{\"run_id\":\"x\",\"node_rank\":0,\"agent_pid\":1,\"attempt\":0,\"ranks\":[1]}", &error));
}

TEST_CASE("status table: one row per rank, the job's title, the failure on the failed rank's row", "[status]") {
  const std::string t = format_status_table({two_ranks()});
  INFO(t);
  CHECK(t.rfind("NODE", 0) == 0);
  CHECK(t.find("GPU") == std::string::npos);  // no rank has a GPU value: no GPU columns
  CHECK(t.find("\njob job7\n") != std::string::npos);
  CHECK(t.find("1 used, 2 left") != std::string::npos);
  CHECK(t.find("1m01s") != std::string::npos);
  CHECK(t.find("100%") != std::string::npos);  // 99.5 rounded
  CHECK(t.find("300 MiB") != std::string::npos);
  // Rank 3's row ends with the failure, rank 2's with "-".
  std::vector<std::string> lines;
  for (size_t pos = 0, nl; (nl = t.find('\n', pos)) != std::string::npos; pos = nl + 1)
    lines.push_back(t.substr(pos, nl - pos));
  REQUIRE(lines.size() == 4);
  CHECK(lines[2].find("401") != std::string::npos);
  CHECK(lines[2].back() == '-');
  CHECK(lines[3].find("402") != std::string::npos);
  CHECK(lines[3].find("r3: exit code 1 after 2.0 s (attempt 0)") != std::string::npos);
  // Columns line up: every row's pid starts where the header's PID does.
  CHECK(lines[2].find("401") == lines[0].find("PID"));
}

TEST_CASE("status table: GPU columns when a rank has a GPU; an agent without workers has one row", "[status]") {
  AgentStatus s = two_ranks();
  s.ranks[1].gpu_index = 0;
  s.ranks[1].gpu_utilization_percent = 42;
  s.ranks[1].gpu_memory_bytes = 3ull << 30;
  AgentStatus waiting;
  waiting.run_id = "job8";
  waiting.state = "rendezvous";
  const std::string t = format_status_table({s, waiting});
  INFO(t);
  CHECK(t.find("GPU%") != std::string::npos);
  CHECK(t.find("GPU MEM") != std::string::npos);
  CHECK(t.find("42%") != std::string::npos);
  CHECK(t.find("3.0 GiB") != std::string::npos);
  CHECK(t.find("\njob job8\n") != std::string::npos);
  CHECK(t.find("rendezvous") != std::string::npos);
}

TEST_CASE("status table: control bytes an agent wrote never reach the terminal", "[status]") {
  AgentStatus s = two_ranks();
  s.run_id = "evil\x1b]0;pwned\x07";
  s.last_failure = "r3: \x1b[2Jcleared";
  const std::string t = format_status_table({s});
  CHECK(t.find('\x1b') == std::string::npos);
  CHECK(t.find('\x07') == std::string::npos);
  CHECK(t.find("job evil?]0;pwned?") != std::string::npos);
}

TEST_CASE("status JSON: an array of agents from the rendezvous server; bad entries left out", "[status]") {
  const std::string a = status_to_json(two_ranks());
  std::string error;
  auto all = statuses_from_json_array("[" + a + "," + a + "]", &error);
  CHECK(all.size() == 2);
  CHECK(error.empty());
  auto some = statuses_from_json_array("[" + a + ",17]", &error);
  CHECK(some.size() == 1);
  CHECK(error == "not a JSON object");
  error.clear();
  CHECK(statuses_from_json_array("{}", &error).empty());
  CHECK(error == "not a JSON array");
}

TEST_CASE("CPU % from two samples: of one core, nothing for a bad interval or a counter that went back", "[status]") {
  CHECK(*cpu_percent(10.0, 12.0, 1.0) == Approx(200.0));
  CHECK(*cpu_percent(10.0, 10.5, 2.0) == Approx(25.0));
  CHECK(*cpu_percent(3.0, 3.0, 1.0) == Approx(0.0));
  CHECK_FALSE(cpu_percent(10.0, 12.0, 0.0));
  CHECK_FALSE(cpu_percent(10.0, 9.0, 1.0));
}

TEST_CASE("CPU % right after a spare takes over: no rate over a near-zero uptime", "[status]") {
  // The spare's process imported torch (6.3 s of CPU) before it became a rank 0.1 s ago.
  CHECK_FALSE(cpu_percent(0, 6.3, 0.1));
  CHECK_FALSE(cpu_percent(5.0, 5.2, 0.2));  // two snapshots 200 ms apart
  // Its first sample counts from when its process started, not from the takeover.
  CHECK(first_cpu_window_s(0.1, 30.0) == Approx(30.0));
  CHECK(*cpu_percent(0, 6.3, first_cpu_window_s(0.1, 30.0)) == Approx(21.0));
  CHECK(first_cpu_window_s(12.0, std::nullopt) == Approx(12.0));
  CHECK(first_cpu_window_s(12.0, 11.9) == Approx(12.0));
}

TEST_CASE("GPU samples: a rank gets the GPU its process group uses, its utilisation and memory", "[status]") {
  std::vector<RankSample> ranks(3);
  ranks[0].pid = 100;
  ranks[1].pid = 200;
  ranks[2].pid = 300;  // on no GPU
  std::vector<GpuDeviceSample> devices(2);
  devices[0].index = 0;
  devices[0].utilization_percent = 50;
  devices[0].processes = {{100, 1000}, {555, 10}};  // 555: another job's process
  devices[1].index = 1;
  devices[1].utilization_percent = 90;
  // 201 and 202 are children in rank 1's process group (a worker that runs its trainer as a
  // child); rank 0 also holds a little memory here (a stray context).
  devices[1].processes = {{201, 4000}, {202, 2000}, {100, 10}};
  const std::map<pid_t, pid_t> group = {{201, 200}, {202, 200}, {555, 555}};
  assign_gpu_samples(ranks, devices, [&](pid_t p) -> std::optional<pid_t> {
    auto it = group.find(p);
    if (it == group.end()) return std::nullopt;
    return it->second;
  });
  CHECK(*ranks[0].gpu_index == 0);
  CHECK(*ranks[0].gpu_memory_bytes == 1000);
  CHECK(*ranks[0].gpu_utilization == Approx(0.5));
  CHECK(*ranks[1].gpu_index == 1);
  CHECK(*ranks[1].gpu_memory_bytes == 6000);
  CHECK(*ranks[1].gpu_utilization == Approx(0.9));
  CHECK_FALSE(ranks[2].gpu_index);
  CHECK_FALSE(ranks[2].gpu_memory_bytes);
}

TEST_CASE("GPU samples: no devices (no driver) leave every GPU field empty", "[status]") {
  std::vector<RankSample> ranks(1);
  ranks[0].pid = 100;
  assign_gpu_samples(ranks, {}, [](pid_t) { return std::optional<pid_t>(); });
  CHECK_FALSE(ranks[0].gpu_index);
  CHECK_FALSE(ranks[0].gpu_utilization);
}
