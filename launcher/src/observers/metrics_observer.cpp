// --metrics_port: the Prometheus endpoint (metrics/agent_exporter.h), up before the first round
// (its rendezvous time is recorded).
#include <spdlog/spdlog.h>

#include "ddprun/launcher/log_events.h"
#include "ddprun/launcher/options.h"
#include "metrics/agent_exporter.h"
#include "observers/observers.h"
#include "status/rank_sampler.h"

namespace ddprun::launcher {
namespace {

class MetricsObserver : public AgentObserver {
 public:
  MetricsObserver(const OutputOptions& o, const std::shared_ptr<RankSampler>& sampler) {
    try {
      exporter_ = std::make_unique<AgentExporter>(o.metrics_host, *o.metrics_port);
    } catch (const metrics::MetricsEndpointError& e) {
      throw UsageError(e.what());
    }
    exporter_->set_gpu_sampler([s = sampler](std::vector<RankSample>& ranks) { s->sample_gpus(ranks); });
    // Tests read the URL at the end of this line.
    LogEvent ev("metrics_endpoint", {{"url", exporter_->url()}});
    spdlog::info("metrics on {}", exporter_->url());
  }

  void round(const GroupLayout&, int, double rendezvous_s) override { exporter_->rendezvous_done(rendezvous_s); }
  void attempt_started(const AttemptStarted& a) override {
    std::vector<AgentExporter::Worker> ws;
    for (const auto& w : a.workers) ws.push_back({w.local_rank, w.global_rank, w.pid});
    exporter_->attempt_started(a.attempt, ws, a.restart_cause);
  }
  void worker_ended(int local_rank, bool success) override { exporter_->worker_ended(local_rank, success); }
  void worker_failed(const WorkerFailed& f) override { exporter_->worker_failed(f.cause); }

 private:
  std::unique_ptr<AgentExporter> exporter_;
};

}  // namespace

std::unique_ptr<AgentObserver> make_metrics_observer(const ObserverSetup& s, std::shared_ptr<RankSampler> sampler) {
  if (!s.opts.output.metrics_port) return nullptr;
  return std::make_unique<MetricsObserver>(s.opts.output, sampler);
}

}  // namespace ddprun::launcher
