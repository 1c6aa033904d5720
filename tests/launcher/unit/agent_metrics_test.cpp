// The agent's metrics: /proc parsing on fixed text, and the exposition the snapshot gives.
#include <catch2/catch.hpp>
#include <prometheus/text_serializer.h>

#include <sstream>

#include "ddprun/launcher/agent_metrics.h"
#include "ddprun/launcher/options.h"

using namespace ddprun::launcher;

namespace {
std::string text_of(const AgentSnapshot& s) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, agent_metric_families(s));
  return out.str();
}
bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos || text.rfind(line + "\n", 0) == 0;
}
}  // namespace

TEST_CASE("/proc/<pid>/stat: user + system ticks, past a command name with spaces and parentheses", "[metrics]") {
  const std::string stat =
      "4242 (python3 (a) b) S 1 4242 4242 0 -1 4194304 12345 0 0 0 250 50 0 0 20 0 3 0 123456 1000000 2500 "
      "18446744073709551615 1 1 0 0 0 0 0 16781312 2 0 0 0 17 1 0 0 0 0 0";
  auto s = parse_proc_stat_cpu_seconds(stat, 100);
  REQUIRE(s);
  CHECK(*s == Approx(3.0));  // (250 + 50) / 100
  CHECK(*parse_proc_stat_cpu_seconds(stat, 1000) == Approx(0.3));
  CHECK_FALSE(parse_proc_stat_cpu_seconds("", 100));
  CHECK_FALSE(parse_proc_stat_cpu_seconds("4242 (x) S 1 2 3", 100));  // cut short
  CHECK_FALSE(parse_proc_stat_cpu_seconds("4242 (x) S 1 2 3 4 5 6 7 8 9 10 x 5", 100));
  CHECK_FALSE(parse_proc_stat_cpu_seconds(stat, 0));
}

TEST_CASE("/proc/<pid>/status: VmRSS in bytes", "[metrics]") {
  const std::string status =
      "Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nVmPeak:\t  900000 kB\nVmRSS:\t  123456 kB\n"
      "RssAnon:\t  100000 kB\nThreads:\t3\n";
  CHECK(parse_proc_status_rss_bytes(status) == 123456ull * 1024);
  CHECK_FALSE(parse_proc_status_rss_bytes("Name:\tkthreadd\nState:\tS\n"));  // a kernel thread: none
  CHECK_FALSE(parse_proc_status_rss_bytes("VmRSS:\tlots kB\n"));
  CHECK(parse_proc_status_rss_bytes("VmRSS: 1 kB") == 1024u);  // no final newline
}

TEST_CASE("agent metrics: workers by state, restarts, failures, rendezvous, per rank", "[metrics]") {
  AgentSnapshot s;
  s.attempt = 1;
  s.workers_by_state = {{"running", 2}};
  s.restarts_by_cause = {{"worker_failure", 1}};
  s.failures_by_cause = {{"signal", 1}};
  observe_rendezvous(s, 0.02);
  observe_rendezvous(s, 3.0);
  s.ranks.push_back({.local_rank = 0, .global_rank = 2, .pid = 10, .cpu_seconds = 1.5, .rss_bytes = 4096});
  s.ranks.push_back({.local_rank = 1, .global_rank = 3, .pid = 11});  // its /proc was unreadable
  const std::string t = text_of(s);
  CHECK(has_line(t, "ddprun_workers{state=\"running\"} 2"));
  CHECK(has_line(t, "ddprun_workers{state=\"failed\"} 0"));
  CHECK(has_line(t, "ddprun_attempt 1"));
  CHECK(has_line(t, "ddprun_restarts_total{cause=\"worker_failure\"} 1"));
  CHECK(has_line(t, "ddprun_restarts_total{cause=\"peer_restart\"} 0"));
  CHECK(has_line(t, "ddprun_worker_failures_total{cause=\"signal\"} 1"));
  CHECK(has_line(t, "# TYPE ddprun_rendezvous_duration_seconds histogram"));
  CHECK(has_line(t, "ddprun_rendezvous_duration_seconds_bucket{le=\"0.01\"} 0"));
  CHECK(has_line(t, "ddprun_rendezvous_duration_seconds_bucket{le=\"0.025\"} 1"));
  CHECK(has_line(t, "ddprun_rendezvous_duration_seconds_bucket{le=\"5\"} 2"));
  CHECK(has_line(t, "ddprun_rendezvous_duration_seconds_bucket{le=\"+Inf\"} 2"));
  CHECK(has_line(t, "ddprun_rendezvous_duration_seconds_count 2"));
  CHECK(has_line(t, "ddprun_last_rendezvous_duration_seconds 3"));
  CHECK(has_line(t, "ddprun_worker_cpu_seconds_total{rank=\"2\",local_rank=\"0\"} 1.5"));
  CHECK(has_line(t, "ddprun_worker_resident_memory_bytes{rank=\"2\",local_rank=\"0\"} 4096"));
  CHECK(t.find("local_rank=\"1\"") == std::string::npos);
  // No GPU sampler: no GPU series at all.
  CHECK(t.find("gpu") == std::string::npos);
  s.ranks[1].gpu_utilization = 0.75;
  s.ranks[1].gpu_memory_bytes = 1 << 20;
  const std::string g = text_of(s);
  CHECK(has_line(g, "ddprun_worker_gpu_utilization_ratio{rank=\"3\",local_rank=\"1\"} 0.75"));
  CHECK(has_line(g, "ddprun_worker_gpu_memory_bytes{rank=\"3\",local_rank=\"1\"} 1048576"));
  CHECK(g.find("gpu_utilization_ratio{rank=\"2\"") == std::string::npos);
}

TEST_CASE("--metrics_port and --metrics_host", "[metrics]") {
  auto parse = [](std::vector<std::string> args) {
    args.insert(args.begin(), "ddprun");
    args.push_back("train.py");
    return parse_command_line(args, {}, SystemInfo{.cpu_count = 8, .gpu_count = 0});
  };
  auto none = parse({});
  REQUIRE(none.options);
  CHECK_FALSE(none.options->output.metrics_port);
  CHECK(none.options->output.metrics_host == "127.0.0.1");
  auto p = parse({"--metrics_port=0"});
  REQUIRE(p.options);
  CHECK(p.options->output.metrics_port == 0);
  auto q = parse({"--metrics-port", "9101", "--metrics_host=0.0.0.0"});
  REQUIRE(q.options);
  CHECK(q.options->output.metrics_port == 9101);
  CHECK(q.options->output.metrics_host == "0.0.0.0");
  auto bad = parse({"--metrics_port=70000"});
  CHECK_FALSE(bad.options);
  CHECK(bad.message.find("metrics_port") != std::string::npos);
  auto lone = parse({"--metrics_host=::1"});
  REQUIRE(lone.options);
  REQUIRE(lone.options->warnings.size() == 1);
  CHECK(lone.options->warnings[0].find("--metrics_port") != std::string::npos);
}
