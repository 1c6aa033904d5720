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
    for (const auto& w : a.workers)
      ws.push_back({.local_rank = w.local_rank, .global_rank = w.global_rank, .pid = w.pid});
    gpu_.set_workers(ws);
    start_rows(a);
  }
  void worker_failed(const WorkerFailed& f) override {
    if (RankUsage* u = row(f.attempt, f.local_rank); u && u->failure.empty()) u->failure = f.what;
  }
  void worker_reaped(const WorkerReaped& r) override;
  void run_ended() override;

 private:
  void start_rows(const AttemptStarted& a);
  RankUsage* row(int attempt, int local_rank);
  UsageReport report() const;

  double gpu_util_warn_;
  GpuUsageRecorder gpu_;
  // A row for every worker of the last attempt started, measured once it is reaped.
  std::vector<RankUsage> rows_;
  int earlier_workers_ = 0;  // reaped workers of ended attempts
  double earlier_cpu_s_ = 0;
};

// A new attempt: its every worker gets a row (the measured rows of the one before are totalled).
void UsageObserver::start_rows(const AttemptStarted& a) {
  for (const auto& u : rows_) {
    if (!u.measured) continue;
    ++earlier_workers_;
    earlier_cpu_s_ += u.cpu_s;
  }
  rows_.clear();
  for (const auto& w : a.workers)
    rows_.push_back(
        {.global_rank = w.global_rank, .local_rank = w.local_rank, .attempt = a.attempt, .measured = false});
}

RankUsage* UsageObserver::row(int attempt, int local_rank) {
  for (auto& u : rows_)
    if (u.attempt == attempt && u.local_rank == local_rank) return &u;
  return nullptr;
}

// A reaped worker's rusage: the last attempt's fill its rows, earlier ones are totalled.
void UsageObserver::worker_reaped(const WorkerReaped& r) {
  const auto g = gpu_.take(r.pid);
  RankUsage* row_of = r.known ? row(r.attempt, r.local_rank) : nullptr;
  if (!row_of || row_of->measured) {
    ++earlier_workers_;
    earlier_cpu_s_ += cpu_seconds(r.usage);
    return;
  }
  RankUsage& u = *row_of;
  u.measured = true;
  u.global_rank = r.global_rank;
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
}

// The last attempt's workers in the table, every one of them; the earlier ones totalled.
UsageReport UsageObserver::report() const {
  UsageReport r;
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  r.host = host;
  r.gpu_util_warn = gpu_util_warn_;
  r.ranks = rows_;
  r.earlier_workers = earlier_workers_;
  r.earlier_cpu_s = earlier_cpu_s_;
  return r;
}

// The end-of-run table and the low-GPU-utilisation warning.
void UsageObserver::run_ended() {
  const UsageReport r = report();
  const std::string table = format_usage_table(r);
  if (table.empty()) return;
  if (log_format() == LogFormat::Json) {
    for (const auto& u : r.ranks) {
      std::vector<LogField> f{{"attempt", int64_t{u.attempt}},
                              {"local_rank", int64_t{u.local_rank}},
                              {"failed", !u.failure.empty()},
                              {"measured", u.measured}};
      if (!u.failure.empty()) f.push_back({"failure", u.failure});
      if (u.measured)
        f.insert(f.end(), {{"wall_s", u.wall_s},
                           {"cpu_s", u.cpu_s},
                           {"peak_rss_bytes", static_cast<int64_t>(u.peak_rss_bytes)}});
      if (u.gpu_index) f.push_back({"gpu", int64_t{*u.gpu_index}});
      if (u.gpu_seconds) f.push_back({"gpu_seconds", *u.gpu_seconds});
      if (u.gpu_util_mean) f.push_back({"gpu_util_mean", *u.gpu_util_mean});
      if (u.allreduce_share) f.push_back({"allreduce_share", *u.allreduce_share});
      if (u.allreduce_hidden) f.push_back({"allreduce_hidden", *u.allreduce_hidden});
      LogEvent ev("rank_usage", std::move(f), u.global_rank);
      if (u.failure.empty()) spdlog::info("resource use of r{}", u.global_rank);
      else spdlog::info("resource use of r{} (failed: {})", u.global_rank, u.failure);
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
