#include "metrics/agent_exporter.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

namespace ddprun::launcher {

namespace {
std::string read_small(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

AgentExporter::AgentExporter(const std::string& host, uint16_t port) {
  source_ = std::make_shared<metrics::FunctionCollectable>([this] { return collect(); });
  endpoint_ = metrics::MetricsEndpoint::start(host, port, source_, "--metrics_");
}

// The endpoint (its thread) first: no scrape runs while the rest goes.
AgentExporter::~AgentExporter() { endpoint_.reset(); }

void AgentExporter::set_gpu_sampler(GpuSampler fn) {
  std::lock_guard lock(mu_);
  gpu_ = std::move(fn);
}

void AgentExporter::attempt_started(int attempt, const std::vector<Worker>& workers, const char* restart_cause) {
  std::lock_guard lock(mu_);
  snap_.attempt = attempt;
  if (restart_cause) ++snap_.restarts_by_cause[restart_cause];
  snap_.ranks.clear();
  state_of_rank_.clear();
  for (const auto& w : workers) {
    snap_.ranks.push_back(RankSample{.local_rank = w.local_rank, .global_rank = w.global_rank, .pid = w.pid});
    if (static_cast<size_t>(w.local_rank) >= state_of_rank_.size()) state_of_rank_.resize(w.local_rank + 1);
    state_of_rank_[w.local_rank] = "running";
  }
}

void AgentExporter::worker_ended(int local_rank, bool success) {
  std::lock_guard lock(mu_);
  if (local_rank >= 0 && static_cast<size_t>(local_rank) < state_of_rank_.size())
    state_of_rank_[local_rank] = success ? "succeeded" : "failed";
  for (auto& r : snap_.ranks)
    if (r.local_rank == local_rank) r.pid = -1;  // its /proc entry is gone or soon will be
}

void AgentExporter::worker_failed(const char* cause) {
  std::lock_guard lock(mu_);
  ++snap_.failures_by_cause[cause];
}

void AgentExporter::rendezvous_done(double seconds) {
  std::lock_guard lock(mu_);
  observe_rendezvous(snap_, seconds);
}

std::vector<prometheus::MetricFamily> AgentExporter::collect() const {
  AgentSnapshot s;
  GpuSampler gpu;
  {
    std::lock_guard lock(mu_);
    s = snap_;
    for (const auto& st : state_of_rank_)
      if (!st.empty()) ++s.workers_by_state[st];
    gpu = gpu_;
  }
  static const long ticks = ::sysconf(_SC_CLK_TCK);
  std::vector<RankSample> live;
  for (auto& r : s.ranks) {
    if (r.pid <= 0) continue;
    const std::string dir = "/proc/" + std::to_string(r.pid);
    r.cpu_seconds = parse_proc_stat_cpu_seconds(read_small(dir + "/stat"), ticks);
    r.rss_bytes = parse_proc_status_rss_bytes(read_small(dir + "/status"));
    live.push_back(r);
  }
  if (gpu) gpu(live);
  s.ranks = std::move(live);
  return agent_metric_families(s);
}

}  // namespace ddprun::launcher
