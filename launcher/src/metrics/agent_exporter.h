// The agent's metrics endpoint (--metrics_port): the agent records its events here (a mutex
// and a few counters, only on those events); a scrape, on the endpoint's thread, copies them and
// reads each current worker's /proc/<pid>/stat and /proc/<pid>/status. Nothing runs on a timer:
// an agent that is never scraped costs nothing more.
//
// GPU series: set_gpu_sampler() takes a function that fills RankSample's GPU fields for the
// ranks it knows (from NVML); without one, or for a rank it leaves empty, there is no GPU
// series.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddprun/launcher/agent_metrics.h"
#include "ddprun/metrics/exposition.h"

namespace ddprun::launcher {

class AgentExporter {
 public:
  using GpuSampler = std::function<void(std::vector<RankSample>&)>;
  struct Worker {
    int local_rank, global_rank;
    pid_t pid;
  };

  // Starts the endpoint; throws metrics::MetricsEndpointError (port taken, bad address).
  AgentExporter(const std::string& host, uint16_t port);
  ~AgentExporter();
  uint16_t port() const { return endpoint_->port(); }
  std::string url() const { return endpoint_->url(); }
  void set_gpu_sampler(GpuSampler fn);

  // From the agent's loop.
  void attempt_started(int attempt, const std::vector<Worker>& workers, const char* restart_cause);
  void worker_ended(int local_rank, bool success);
  void worker_failed(const char* cause);
  void rendezvous_done(double seconds);

  std::vector<prometheus::MetricFamily> collect() const;

 private:
  mutable std::mutex mu_;
  AgentSnapshot snap_;  // its ranks: pids only, sampled at collect()
  std::vector<std::string> state_of_rank_;
  GpuSampler gpu_;
  std::shared_ptr<metrics::FunctionCollectable> source_;
  std::unique_ptr<metrics::MetricsEndpoint> endpoint_;
};

}  // namespace ddprun::launcher
