// The agent's record of what its workers used: each reaped worker's rusage, GPU time and step
// statistics, and the end-of-run table and warnings made of them.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include <spdlog/spdlog.h>

#include "agent/agent_impl.h"
#include "ddprun/launcher/log_events.h"
#include "platform/sys_util.h"

namespace ddprun::launcher {

// A reaped worker's rusage: the current attempt's go into the table, earlier ones are totalled.
void Agent::record_usage(const Worker* w, pid_t pid, const struct rusage& ru) {
  const double cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                     static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  if (!w) {
    if (gpu_usage_) gpu_usage_->take(pid);
    ++earlier_workers_;
    earlier_cpu_s_ += cpu;
    return;
  }
  RankUsage u;
  u.global_rank = w->global_rank;
  u.local_rank = w->local_rank;
  u.attempt = w->attempt;
  u.wall_s = std::chrono::duration<double>(w->ended - w->started).count();
  u.cpu_s = cpu;
  u.peak_rss_bytes = static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // kilobytes on Linux
  if (auto g = gpu_usage_ ? gpu_usage_->take(pid) : std::nullopt; g && g->sampled_s > 0) {
    u.gpu_index = g->gpu_index;
    u.gpu_seconds = g->gpu_seconds;
    u.gpu_util_mean = g->gpu_seconds / g->sampled_s;
  }
  // Its progress file outlives it: what libddprun_worker's Reducer counted there.
  if (!w->error_file.empty())
    if (auto s = read_step_stats((std::filesystem::path(w->error_file).parent_path() / kProgressFileName).string()))
      add_step_stats(u, *s);
  usage_.push_back(u);
}

// The end-of-run table (last attempt's workers) and the low-GPU-utilisation warning.
void Agent::print_usage() const {
  UsageReport r;
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  r.host = host;
  r.gpu_util_warn = opts_.output.gpu_util_warn;
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

}  // namespace ddprun::launcher
