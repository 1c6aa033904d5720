#include "ddprun/worker/env.h"

#include <charconv>
#include <cstdlib>
#include <string_view>

#include "ddprun/worker/checks.h"

namespace ddprun::worker {
namespace {

long long parse_int(const char* name, const char* v, long long lo, long long hi) {
  std::string_view s(v);
  long long out = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ec != std::errc() || p != s.data() + s.size() || out < lo || out > hi)
    throw WorkerError(std::string("environment variable ") + name + "='" + v +
                      "' is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return out;
}

// SLURM_STEP_TASKS_PER_NODE looks like "4(x2),3": the first count is ours when homogeneous.
int first_count(const char* v) {
  int n = 0;
  for (const char* c = v; *c >= '0' && *c <= '9'; ++c) n = n * 10 + (*c - '0');
  return n;
}

}  // namespace

WorkerEnv read_worker_env(const GetEnvFn& get) {
  WorkerEnv e;
  auto has = [&](const char* n) { const char* v = get(n); return v != nullptr && *v != '\0'; };
  auto geti = [&](const char* n, long long lo, long long hi, long long def) -> long long {
    return has(n) ? parse_int(n, get(n), lo, hi) : def;
  };
  constexpr long long kMaxWorld = 1 << 20;
  if (has("RANK") || has("WORLD_SIZE")) {
    e.standalone = false;
    e.world_size = static_cast<int>(geti("WORLD_SIZE", 1, kMaxWorld, 1));
    e.rank = static_cast<int>(geti("RANK", 0, e.world_size - 1, 0));
    e.local_world_size = static_cast<int>(geti("LOCAL_WORLD_SIZE", 1, kMaxWorld, 1));
    e.local_rank = static_cast<int>(geti("LOCAL_RANK", 0, e.local_world_size - 1, 0));
    e.group_rank = static_cast<int>(geti("GROUP_RANK", 0, kMaxWorld, 0));
  } else if (has("SLURM_PROCID") && has("SLURM_NTASKS")) {
    e.standalone = false;
    e.from_slurm = true;
    e.world_size = static_cast<int>(geti("SLURM_NTASKS", 1, kMaxWorld, 1));
    e.rank = static_cast<int>(geti("SLURM_PROCID", 0, e.world_size - 1, 0));
    const char* tpn = has("SLURM_NTASKS_PER_NODE") ? get("SLURM_NTASKS_PER_NODE")
                      : has("SLURM_STEP_TASKS_PER_NODE") ? get("SLURM_STEP_TASKS_PER_NODE") : nullptr;
    e.local_world_size = tpn ? std::max(1, first_count(tpn)) : 1;
    e.local_rank = static_cast<int>(geti("SLURM_LOCALID", 0, kMaxWorld, 0));
    if (e.local_rank >= e.local_world_size) e.local_world_size = e.local_rank + 1;
    e.group_rank = static_cast<int>(geti("SLURM_NODEID", 0, kMaxWorld, 0));
    if (has("SLURM_LAUNCH_NODE_IPADDR")) e.master_addr = get("SLURM_LAUNCH_NODE_IPADDR");
  }
  if (has("MASTER_ADDR")) e.master_addr = get("MASTER_ADDR");
  e.master_port = static_cast<uint16_t>(geti("MASTER_PORT", 1, 65535, 29500));
  e.restart_count = static_cast<int>(geti("TORCHELASTIC_RESTART_COUNT", 0, 1LL << 30, 0));
  e.max_restarts = static_cast<int>(geti("TORCHELASTIC_MAX_RESTARTS", 0, 1LL << 30, 0));
  if (has("TORCHELASTIC_ERROR_FILE")) e.error_file = get("TORCHELASTIC_ERROR_FILE");
  if (has("TORCHELASTIC_RUN_ID")) e.run_id = get("TORCHELASTIC_RUN_ID");
  if (has("TORCHELASTIC_USE_AGENT_STORE")) {
    const std::string v = get("TORCHELASTIC_USE_AGENT_STORE");
    e.use_agent_store = v == "True" || v == "true" || v == "1";
  }
  return e;
}

WorkerEnv read_worker_env() {
  return read_worker_env([](const char* n) { return std::getenv(n); });
}

}  // namespace ddprun::worker
