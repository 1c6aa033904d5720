#include "ddprun/launcher/agent_metrics.h"

#include <charconv>

#include "ddprun/metrics/exposition.h"

namespace ddprun::launcher {

namespace {
using prometheus::MetricType;
using metrics::Labels;

Labels rank_labels(const RankSample& r) {
  return {{"rank", std::to_string(r.global_rank)}, {"local_rank", std::to_string(r.local_rank)}};
}

std::string_view next_field(std::string_view& rest) {
  const size_t start = rest.find_first_not_of(" \t");
  if (start == std::string_view::npos) {
    rest = {};
    return {};
  }
  rest.remove_prefix(start);
  const size_t end = rest.find_first_of(" \t");
  std::string_view f = rest.substr(0, end);
  rest.remove_prefix(end == std::string_view::npos ? rest.size() : end);
  return f;
}

template <class T>
std::optional<T> number(std::string_view s) {
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}
}  // namespace

void observe_rendezvous(AgentSnapshot& s, double seconds) {
  size_t b = 0;
  while (b < std::size(kRendezvousBuckets) && seconds > kRendezvousBuckets[b]) ++b;
  ++s.rendezvous_buckets[b];
  s.rendezvous_seconds_sum += seconds;
  s.last_rendezvous_seconds = seconds;
}

std::optional<double> parse_proc_stat_cpu_seconds(std::string_view stat, long ticks_per_second) {
  const size_t close = stat.rfind(')');
  if (close == std::string_view::npos || ticks_per_second <= 0) return std::nullopt;
  std::string_view rest = stat.substr(close + 1);
  // After "pid (comm)": state is field 3, utime 14, stime 15.
  std::optional<uint64_t> utime, stime;
  for (int field = 3; field <= 15; ++field) {
    const std::string_view f = next_field(rest);
    if (f.empty()) return std::nullopt;
    if (field == 14) utime = number<uint64_t>(f);
    if (field == 15) stime = number<uint64_t>(f);
  }
  if (!utime || !stime) return std::nullopt;
  return static_cast<double>(*utime + *stime) / static_cast<double>(ticks_per_second);
}

std::optional<uint64_t> parse_proc_status_rss_bytes(std::string_view status) {
  size_t pos = 0;
  while (pos < status.size()) {
    size_t eol = status.find('\n', pos);
    if (eol == std::string_view::npos) eol = status.size();
    std::string_view line = status.substr(pos, eol - pos);
    pos = eol + 1;
    if (!line.starts_with("VmRSS:")) continue;
    line.remove_prefix(6);
    const std::string_view value = next_field(line);
    const std::string_view unit = next_field(line);
    auto n = number<uint64_t>(value);
    if (!n || unit != "kB") return std::nullopt;
    return *n * 1024;
  }
  return std::nullopt;
}

std::vector<prometheus::MetricFamily> agent_metric_families(const AgentSnapshot& s) {
  using metrics::add_counter;
  using metrics::add_gauge;
  using metrics::family;
  std::vector<prometheus::MetricFamily> out;

  out.push_back(family("ddprun_workers", "Workers of the current attempt on this node, by state.", MetricType::Gauge));
  for (const char* state : {"running", "succeeded", "failed"}) {
    auto it = s.workers_by_state.find(state);
    add_gauge(out.back(), it == s.workers_by_state.end() ? 0 : it->second, {{"state", state}});
  }
  out.push_back(family("ddprun_attempt", "The worker group's attempt: restarts so far (0 = the first attempt).",
                       MetricType::Gauge));
  add_gauge(out.back(), s.attempt);

  out.push_back(family("ddprun_restarts_total",
                       "Restarts of this node's worker group, by cause: worker_failure (a worker of this node "
                       "failed), peer_restart (another node's failure or a membership change).",
                       MetricType::Counter));
  for (const char* cause : {"worker_failure", "peer_restart"}) {
    auto it = s.restarts_by_cause.find(cause);
    add_counter(out.back(), it == s.restarts_by_cause.end() ? 0 : static_cast<double>(it->second), {{"cause", cause}});
  }
  out.push_back(family("ddprun_worker_failures_total",
                       "Workers of this node that failed, by cause: exit_code (a non-zero exit), signal (killed "
                       "by one), config_error (an exit that says the configuration is wrong), hang (no progress for "
                       "--hang_timeout).",
                       MetricType::Counter));
  for (const char* cause : {"exit_code", "signal", "config_error", "hang"}) {
    auto it = s.failures_by_cause.find(cause);
    add_counter(out.back(), it == s.failures_by_cause.end() ? 0 : static_cast<double>(it->second), {{"cause", cause}});
  }
  out.push_back(family("ddprun_rendezvous_duration_seconds",
                       "Time from asking for a place in a round to the round being complete.",
                       MetricType::Histogram));
  metrics::add_histogram(out.back(), std::vector<double>(std::begin(kRendezvousBuckets), std::end(kRendezvousBuckets)),
                         std::vector<uint64_t>(std::begin(s.rendezvous_buckets), std::end(s.rendezvous_buckets)),
                         s.rendezvous_seconds_sum);
  out.push_back(family("ddprun_last_rendezvous_duration_seconds", "The last round's rendezvous time.",
                       MetricType::Gauge));
  add_gauge(out.back(), s.last_rendezvous_seconds);

  auto per_rank = [&](const char* name, const char* help, MetricType type, auto field) {
    prometheus::MetricFamily f = family(name, help, type);
    for (const auto& r : s.ranks) {
      const auto v = field(r);
      if (!v) continue;
      if (type == MetricType::Counter) add_counter(f, static_cast<double>(*v), rank_labels(r));
      else add_gauge(f, static_cast<double>(*v), rank_labels(r));
    }
    if (!f.metric.empty()) out.push_back(std::move(f));
  };
  per_rank("ddprun_worker_cpu_seconds_total", "CPU time (user + system) of the worker's process.",
           MetricType::Counter, [](const RankSample& r) { return r.cpu_seconds; });
  per_rank("ddprun_worker_resident_memory_bytes", "Resident memory of the worker's process.", MetricType::Gauge,
           [](const RankSample& r) { return r.rss_bytes; });
  per_rank("ddprun_worker_gpu_utilization_ratio", "Utilisation of the worker's GPU, 0 to 1.", MetricType::Gauge,
           [](const RankSample& r) { return r.gpu_utilization; });
  per_rank("ddprun_worker_gpu_memory_bytes", "GPU memory the worker's process uses.", MetricType::Gauge,
           [](const RankSample& r) { return r.gpu_memory_bytes; });
  return out;
}

}  // namespace ddprun::launcher
