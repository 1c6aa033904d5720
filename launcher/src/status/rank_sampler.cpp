#include "status/rank_sampler.h"

#include <unistd.h>

#include <exception>
#include <fstream>
#include <sstream>
#include <string>

#include "ddprun/launcher/agent_status.h"

namespace ddprun::launcher {
namespace {

std::string read_small(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

RankSampler::RankSampler() = default;
RankSampler::~RankSampler() = default;

void RankSampler::sample_proc(std::vector<RankSample>& ranks) {
  static const long ticks = ::sysconf(_SC_CLK_TCK);
  for (auto& r : ranks) {
    if (r.pid <= 0) continue;
    const std::string dir = "/proc/" + std::to_string(r.pid);
    r.cpu_seconds = parse_proc_stat_cpu_seconds(read_small(dir + "/stat"), ticks);
    r.rss_bytes = parse_proc_status_rss_bytes(read_small(dir + "/status"));
  }
}

std::optional<pid_t> RankSampler::process_group_of(pid_t pid) {
  const std::string stat = read_small("/proc/" + std::to_string(pid) + "/stat");
  // After the command name in parentheses: state, ppid, pgrp.
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(stat.substr(close + 1));
  std::string state;
  long ppid = 0, pgrp = 0;
  if (!(rest >> state >> ppid >> pgrp)) return std::nullopt;
  return static_cast<pid_t>(pgrp);
}

std::optional<double> RankSampler::process_age_s(pid_t pid) {
  static const long ticks = ::sysconf(_SC_CLK_TCK);
  const std::string stat = read_small("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  if (close == std::string::npos || ticks <= 0) return std::nullopt;
  // After "pid (comm)": state is field 3, starttime field 22 (clock ticks since boot).
  std::istringstream rest(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i)
    if (!(rest >> field)) return std::nullopt;
  double uptime = 0;
  std::istringstream up(read_small("/proc/uptime"));
  if (!(up >> uptime)) return std::nullopt;
  try {
    const double age = uptime - static_cast<double>(std::stoull(field)) / static_cast<double>(ticks);
    return age >= 0 ? std::optional<double>(age) : std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

bool RankSampler::nvml_available() {
  std::lock_guard lock(mu_);
  if (!tried_nvml_) {
    tried_nvml_ = true;
    std::string why;
    nvml_ = platform::Nvml::load(&why);
  }
  return nvml_ != nullptr;
}

void RankSampler::sample_gpus(std::vector<RankSample>& ranks) {
  std::lock_guard lock(mu_);
  if (!tried_nvml_) {
    tried_nvml_ = true;
    std::string why;
    nvml_ = platform::Nvml::load(&why);
  }
  if (!nvml_) return;
  const auto count = nvml_->device_count();
  if (!count) return;
  std::vector<GpuDeviceSample> devices;
  for (int i = 0; i < *count; ++i) {
    GpuDeviceSample d;
    d.index = i;
    d.utilization_percent = nvml_->utilization(i);
    if (auto procs = nvml_->compute_processes(i))
      for (const auto& p : *procs) d.processes.push_back({static_cast<pid_t>(p.pid), p.used_bytes});
    devices.push_back(std::move(d));
  }
  assign_gpu_samples(ranks, devices, &RankSampler::process_group_of);
}

}  // namespace ddprun::launcher
