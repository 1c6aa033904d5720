#include "ddprun/launcher/usage_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ddprun::launcher {

std::string human_bytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(kUnits)) v /= 1024, ++u;
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, v < 10 ? "%.1f %s" : "%.0f %s", v, kUnits[u]);
  return buf;
}

namespace {

std::string seconds(double s) {
  char buf[32];
  if (s < 10) std::snprintf(buf, sizeof buf, "%.2f s", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%.1f s", s);
  else std::snprintf(buf, sizeof buf, "%.0f s", s);
  return buf;
}

std::string percent(double ratio) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.0f%%", ratio * 100);
  return buf;
}

// A share that rounding would turn into none or all when it is neither: "<1%", ">99%".
std::string share(double ratio) {
  if (ratio > 0 && ratio < 0.005) return "<1%";
  if (ratio < 1 && ratio >= 0.995) return ">99%";
  return percent(ratio);
}

std::string row(const std::vector<std::string>& cells, const std::vector<size_t>& widths) {
  std::string out = "   ";
  for (size_t i = 0; i < cells.size(); ++i) {
    out += ' ';
    out += cells[i];
    if (i + 1 < cells.size()) out.append(widths[i] > cells[i].size() ? widths[i] - cells[i].size() : 0, ' ');
  }
  while (out.back() == ' ') out.pop_back();
  return out;
}

}  // namespace

void add_step_stats(RankUsage& u, const StepStats& s) {
  if (s.steps == 0 || s.step_ns == 0) return;
  const auto comm = static_cast<double>(s.comm_ns);
  u.allreduce_share = std::clamp(comm / static_cast<double>(s.step_ns), 0.0, 1.0);
  if (s.comm_ns > 0) u.allreduce_hidden = std::clamp((comm - static_cast<double>(s.exposed_ns)) / comm, 0.0, 1.0);
}

std::string format_usage_table(const UsageReport& r) {
  if (r.ranks.empty()) return "";
  std::vector<RankUsage> ranks = r.ranks;
  std::sort(ranks.begin(), ranks.end(),
            [](const RankUsage& a, const RankUsage& b) { return a.global_rank < b.global_rank; });
  const bool gpu =
      std::any_of(ranks.begin(), ranks.end(), [](const RankUsage& u) { return u.gpu_util_mean.has_value(); });
  const bool steps =
      std::any_of(ranks.begin(), ranks.end(), [](const RankUsage& u) { return u.allreduce_share.has_value(); });
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> head = {"rank", "wall", "CPU", "CPU/wall", "peak RSS"};
  if (gpu) head.insert(head.end(), {"GPU", "GPU-s", "GPU util"});
  if (steps) head.insert(head.end(), {"all-reduce/step", "hidden"});
  const bool failed = std::any_of(ranks.begin(), ranks.end(), [](const RankUsage& u) { return !u.failure.empty(); });
  if (failed) head.push_back("");
  rows.push_back(head);
  for (const auto& u : ranks) {
    std::vector<std::string> c = {"r" + std::to_string(u.global_rank), "-", "-", "-", "-"};
    if (u.measured)
      c = {c[0], seconds(u.wall_s), seconds(u.cpu_s), u.wall_s > 0 ? percent(u.cpu_s / u.wall_s) : "-",
           human_bytes(u.peak_rss_bytes)};
    if (gpu) {
      c.push_back(u.gpu_index ? std::to_string(*u.gpu_index) : "-");
      c.push_back(u.gpu_seconds ? seconds(*u.gpu_seconds) : "-");
      c.push_back(u.gpu_util_mean ? percent(*u.gpu_util_mean) : "-");
    }
    if (steps) {
      c.push_back(u.allreduce_share ? share(*u.allreduce_share) : "-");
      c.push_back(u.allreduce_hidden ? share(*u.allreduce_hidden) : "-");
    }
    if (failed) c.push_back(u.failure.empty() ? "" : "<- failed: " + u.failure);
    rows.push_back(std::move(c));
  }
  std::vector<size_t> widths(head.size(), 0);
  for (const auto& c : rows)
    for (size_t i = 0; i < c.size(); ++i) widths[i] = std::max(widths[i], c[i].size() + 1);
  std::string out = "resource use of attempt " + std::to_string(ranks.front().attempt) + " on " + r.host + " (" +
                    std::to_string(ranks.size()) + (ranks.size() == 1 ? " worker" : " workers") +
                    (gpu ? "" : "; no GPU sampled") + "):";
  for (const auto& c : rows) out += "\n" + row(c, widths);
  if (r.earlier_workers > 0)
    out += "\n    earlier attempts: " + std::to_string(r.earlier_workers) + " workers, " + seconds(r.earlier_cpu_s) +
           " of CPU";
  return out;
}

std::string low_gpu_utilisation_warning(const UsageReport& r) {
  if (r.gpu_util_warn <= 0) return "";
  std::vector<RankUsage> low;
  for (const auto& u : r.ranks)
    if (u.gpu_util_mean && *u.gpu_util_mean < r.gpu_util_warn && u.gpu_sampled_s.value_or(0) >= kMinGpuJudgeS)
      low.push_back(u);
  if (low.empty()) return "";
  std::sort(low.begin(), low.end(),
            [](const RankUsage& a, const RankUsage& b) { return a.global_rank < b.global_rank; });
  char thr[32];
  std::snprintf(thr, sizeof thr, "%g", r.gpu_util_warn);
  std::string out = "mean GPU utilisation below " + percent(r.gpu_util_warn) + " (--gpu_util_warn=" + thr + "): ";
  for (size_t i = 0; i < low.size(); ++i)
    out += (i ? ", r" : "r") + std::to_string(low[i].global_rank) + " " + percent(*low[i].gpu_util_mean);
  out += "; the GPUs waited on something else (input pipeline, CPU work, communication, small batches): "
         "profile a step (torch.profiler, nsys)";
  return out;
}

}  // namespace ddprun::launcher
