#include "ddprun/launcher/spare_plan.h"

#include <algorithm>
#include <sstream>

#include "spare_bootstrap.h"

namespace ddprun::launcher {

const std::vector<std::string>& spare_per_attempt_variables() {
  // build_worker_env()'s set() calls: the ones that change with the attempt, the rank or the
  // round. Its set_default() ones (OMP_NUM_THREADS, TORCH_NCCL_ASYNC_ERROR_HANDLING) do not
  // change between attempts and may be read at import time, so they must match.
  static const std::vector<std::string> vars = {
      "LOCAL_RANK",         "RANK",         "GROUP_RANK",       "ROLE_RANK",
      "ROLE_NAME",          "LOCAL_WORLD_SIZE", "WORLD_SIZE",   "GROUP_WORLD_SIZE",
      "ROLE_WORLD_SIZE",    "MASTER_ADDR",  "MASTER_PORT",      "TORCHELASTIC_RESTART_COUNT",
      "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
      "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE", "DDPRUN_PREEMPT_FILE",
      "DDPRUN_PROGRESS_FILE"};
  return vars;
}

std::string spare_env_mismatch(const EnvMap& started, const EnvMap& wanted) {
  const auto& free = spare_per_attempt_variables();
  auto is_free = [&](const std::string& k) { return std::find(free.begin(), free.end(), k) != free.end(); };
  for (const auto& [k, v] : wanted) {
    if (is_free(k)) continue;
    auto it = started.find(k);
    if (it == started.end()) return k + " is set now, not when the spare started";
    if (it->second != v) return k + " differs from the spare's";
  }
  for (const auto& [k, v] : started) {
    if (!is_free(k) && !wanted.count(k)) return k + " is unset now, set when the spare started";
  }
  return "";
}

bool spare_can_run(const std::vector<std::string>& argv) {
  if (argv.size() < 3 || argv[1] != "-u") return false;
  const std::string& a = argv[2];
  if (a == "-m" || a == "-c") return argv.size() >= 4;
  return !a.empty() && a[0] != '-';
}

bool spares_enabled(const SpareOptions& spares, int max_restarts, bool python_entry) {
  return python_entry && spares.enabled.value_or(max_restarts > 0);
}

std::vector<std::string> spare_argv(const std::vector<std::string>& cold_argv, int ctl_fd,
                                    const std::string& priority, const std::vector<std::string>& preload,
                                    bool cuda) {
  std::string mods;
  for (const auto& m : preload) mods += (mods.empty() ? "" : ",") + m;
  std::vector<std::string> argv = {cold_argv.at(0), "-u", "-c", spare_bootstrap_source(), std::to_string(ctl_fd),
                                   priority, mods, cuda ? "cuda" : "-", "--"};
  argv.insert(argv.end(), cold_argv.begin(), cold_argv.end());
  return argv;
}

std::optional<SpareReady> parse_spare_ready(const std::string& line) {
  std::istringstream in(line);
  std::string tag, gpu;
  SpareReady r;
  if (!(in >> tag >> r.import_s >> r.threads) || tag != "R") return std::nullopt;
  if (!(in >> gpu) || gpu == "-") return r;
  auto rest = [&] {
    std::string s;
    std::getline(in >> std::ws, s);
    return s;
  };
  if (gpu == "nogpu") {
    r.gpu = SpareReady::Gpu::Skipped;
    r.why = rest();
    if (r.why.empty()) r.why = "no reason given";
    return r;
  }
  std::string nccl;
  if (gpu != "gpu" || !(in >> r.device >> r.context_ms >> nccl) || r.device < 0) return std::nullopt;
  r.gpu = SpareReady::Gpu::Warm;
  if (nccl == "-") {
    r.why = rest();
  } else {
    try {
      size_t used = 0;
      r.nccl_ms = std::stod(nccl, &used);
      if (used != nccl.size() || r.nccl_ms < 0) return std::nullopt;
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return r;
}

std::string encode_spare_launch(const std::string& cwd, const std::vector<std::string>& argv, const EnvMap& env) {
  std::string out;
  auto field = [&](const std::string& s) {
    out += s;
    out += '\0';
  };
  field(cwd);
  field(std::to_string(argv.size()));
  for (const auto& a : argv) field(a);
  for (const auto& [k, v] : env) field(k + "=" + v);
  return out;
}

const char* spare_bootstrap_source() { return generated::kSpareBootstrap; }

}  // namespace ddprun::launcher
