// What the workers used (--gpu_util_warn >= 0, the default): each reaped worker's rusage, its
// GPU time (status/gpu_usage.h, where NVML finds GPUs) and step statistics (its progress file),
// and the end-of-run table and warnings made of them (usage_report.h).
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "ddprun/launcher/log_events.h"
#include "ddprun/launcher/usage_report.h"
#include "hang/progress_files.h"
#include "observers/observers.h"
#include "status/gpu_usage.h"

namespace ddprun::launcher {
namespace {

constexpr double kGpuSampleIntervalS = 2.0;

double cpu_seconds(const struct rusage& ru) {
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

class UsageObserver : public AgentObserver {
 public:
  UsageObserver(double gpu_util_warn, std::shared_ptr<RankSampler> sampler)
      : gpu_util_warn_(gpu_util_warn), gpu_(std::move(sampler), kGpuSampleIntervalS) {}

  void attempt_started(const AttemptStarted& a) override {
    std::vector<RankSample> ws;
    for (const auto& w : a.workers) ws.push_back({.local_rank = w.local_rank, .global_rank = w.global_rank, .pid = w.pid});
    gpu_.set_workers(ws);
  }
  void worker_reaped(const WorkerReaped& r) override;
  void run_ended() override;

 private:
  UsageReport report() const;

  double gpu_util_warn_;
  GpuUsageRecorder gpu_;
  std::vector<RankUsage> usage_;
  int earlier_workers_ = 0;  // reaped workers of ended attempts that the group no longer knows
  double earlier_cpu_s_ = 0;
};

// A reaped worker's rusage: the current attempt's go into the table, earlier ones are totalled.
void UsageObserver::worker_reaped(const WorkerReaped& r) {
  const auto g = gpu_.take(r.pid);
  if (!r.known) {
    ++earlier_workers_;
    earlier_cpu_s_ += cpu_seconds(r.usage);
    return;
  }
  RankUsage u;
  u.global_rank = r.global_rank;
  u.local_rank = r.local_rank;
  u.attempt = r.attempt;
  u.wall_s = r.wall_s;
  u.cpu_s = cpu_seconds(r.usage);
  u.peak_rss_bytes = static_cast<uint64_t>(r.usage.ru_maxrss) * 1024;  // kilobytes on Linux
  if (g && g->sampled_s > 0) {
    u.gpu_index = g->gpu_index;
    u.gpu_seconds = g->gpu_seconds;
    u.gpu_util_mean = g->gpu_seconds / g->sampled_s;
    u.gpu_sampled_s = g->sampled_s;
  }
  // Its progress file outlives it: what libddprun_worker's Reducer counted there.
  if (!r.error_file.empty())
    if (auto s = read_step_stats((std::filesystem::path(r.error_file).parent_path() / kProgressFileName).string()))
      add_step_stats(u, *s);
  usage_.push_back(u);
}

// The last attempt's workers in the table, the earlier ones totalled.
UsageReport UsageObserver::report() const {
  UsageReport r;
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  r.host = host;
  r.gpu_util_warn = gpu_util_warn_;
  int last = -1;
  for (const auto& u : usage_) last = std::max(last, u.attempt);
  for (const auto& u : usage_) {
    if (u.attempt == last) {
      r.ranks.push_back(u);
    } else {
      ++r.earlier_workers;
      r.earlier_cpu_s += u.cpu_s;
    }
  }
  r.earlier_workers += earlier_workers_;
  r.earlier_cpu_s += earlier_cpu_s_;
  return r;
}

// The end-of-run table and the low-GPU-utilisation warning.
void UsageObserver::run_ended() {
  const UsageReport r = report();
  const std::string table = format_usage_table(r);
  if (table.empty()) return;
  if (log_format() == LogFormat::Json) {
    for (const auto& u : r.ranks) {
      std::vector<LogField> f{{"attempt", int64_t{u.attempt}},   {"local_rank", int64_t{u.local_rank}},
                              {"wall_s", u.wall_s},              {"cpu_s", u.cpu_s},
                              {"peak_rss_bytes", static_cast<int64_t>(u.peak_rss_bytes)}};
      if (u.gpu_index) f.push_back({"gpu", int64_t{*u.gpu_index}});
      if (u.gpu_seconds) f.push_back({"gpu_seconds", *u.gpu_seconds});
      if (u.gpu_util_mean) f.push_back({"gpu_util_mean", *u.gpu_util_mean});
      if (u.allreduce_share) f.push_back({"allreduce_share", *u.allreduce_share});
      if (u.allreduce_hidden) f.push_back({"allreduce_hidden", *u.allreduce_hidden});
      LogEvent ev("rank_usage", std::move(f), u.global_rank);
      spdlog::info("resource use of r{}", u.global_rank);
    }
  } else {
    write_log_line("info", "usage", "[ddprun] info: " + table + "\n", table);
  }
  if (const std::string warn = low_gpu_utilisation_warning(r); !warn.empty()) {
    LogEvent ev("low_gpu_utilisation", {{"threshold", r.gpu_util_warn}});
    spdlog::warn("{}", warn);
  }
}

}  // namespace

std::unique_ptr<AgentObserver> make_usage_observer(const ObserverSetup& s, std::shared_ptr<RankSampler> sampler) {
  if (s.opts.output.gpu_util_warn < 0) return nullptr;  // --gpu_util_warn=-1: no table
  return std::make_unique<UsageObserver>(s.opts.output.gpu_util_warn, std::move(sampler));
}

}  // namespace ddprun::launcher
