#include "ddprun/launcher/worker_env.h"

#include <sstream>

#include "ddprun/common/knobs.h"
#include "ddprun/launcher/worker_files.h"

namespace ddprun::launcher {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, ',')) {
    if (!cur.empty()) out.push_back(cur);
  }
  return out;
}

}  // namespace

EnvMap build_worker_env(const EnvMap& parent, const WorkerOptions& opts, const FaultOptions& faults,
                        const GroupLayout& g, int local_rank, const std::string& error_file) {
  EnvMap env = parent;
  // The rendezvous secret authenticates agents; workers never need it, and a worker's
  // environment is readable by anything the training script spawns or dumps.
  env.erase("DDPRUN_RDZV_TOKEN");
  const int rank = g.global_rank_base + local_rank;
  auto set = [&](const char* k, const std::string& v) { env[k] = v; };
  auto set_default = [&](const char* k, const std::string& v) { env.emplace(k, v); };

  set("LOCAL_RANK", std::to_string(opts.virtual_local_rank ? 0 : local_rank));
  set("RANK", std::to_string(rank));
  set("GROUP_RANK", std::to_string(g.node_rank));
  set("ROLE_RANK", std::to_string(rank));
  set("ROLE_NAME", opts.role);
  set("LOCAL_WORLD_SIZE", std::to_string(g.local_world_size));
  set("WORLD_SIZE", std::to_string(g.world_size));
  set("GROUP_WORLD_SIZE", std::to_string(g.num_nodes));
  set("ROLE_WORLD_SIZE", std::to_string(g.world_size));
  set("MASTER_ADDR", g.store_host);
  set("MASTER_PORT", std::to_string(g.store_port));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(g.restart_count));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(faults.max_restarts));
  set("TORCHELASTIC_RUN_ID", g.run_id);
  set("TORCHELASTIC_USE_AGENT_STORE", "True");
  set("TORCHELASTIC_ERROR_FILE", error_file);
  set("DDPRUN_PREEMPT_FILE", preempt_file_for(error_file));
  set("TORCHELASTIC_SIGNALS_TO_HANDLE", faults.signals_to_handle_text);
  set_default("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  if (g.local_world_size > 1) set_default("OMP_NUM_THREADS", "1");
  if (opts.virtual_local_rank) {
    auto it = parent.find("CUDA_VISIBLE_DEVICES");
    std::string device = std::to_string(local_rank);
    if (it != parent.end()) {
      auto devices = split_commas(it->second);
      if (local_rank < static_cast<int>(devices.size())) device = devices[local_rank];
    }
    set("CUDA_VISIBLE_DEVICES", device);
  }
  return env;
}

std::string preempt_file_for(const std::string& error_file) {
  const auto slash = error_file.rfind('/');
  return (slash == std::string::npos ? std::string() : error_file.substr(0, slash + 1)) + "preempted";
}

std::optional<PreemptAnnouncement> read_preempt_announcement(const std::string& error_file) {
  // The worker's file: a FIFO, a link to /dev/zero or a huge file must neither block nor flood
  // the agent (worker_files.h). Longer than kMaxPreemptFileBytes: only its start is read.
  const auto text = read_worker_file(preempt_file_for(error_file), kMaxPreemptFileBytes);
  if (!text) return std::nullopt;
  PreemptAnnouncement a;
  std::istringstream f(*text);
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("checkpoint", 0) == 0) {
      a.checkpoint = true;
      a.what = line.size() > 11 ? line.substr(11) : "";
    }
  }
  return a;
}

std::vector<std::string> build_worker_argv(const WorkerOptions& opts, const EnvMap& env) {
  return build_worker_argv(opts, env, !opts.no_python && ends_with(opts.entrypoint, ".py"));
}

std::vector<std::string> build_worker_argv(const WorkerOptions& opts, const EnvMap& env, bool with_python) {
  // PYTHON_EXEC, else the interpreter the pip-installed ddprun command runs in, else PATH's.
  const std::string python =
      knobs::get(knobs::kPythonExec, env).value_or(knobs::get(knobs::kDefaultPython, env).value_or("python3"));
  std::vector<std::string> argv;
  if (opts.no_python) {
    argv.push_back(opts.entrypoint);
  } else if (opts.module) {
    argv = {python, "-u", "-m", opts.entrypoint};
  } else if (opts.run_path) {
    // runpy itself is never taken from the working directory (first on sys.path under -c); the
    // script then sees the path as before.
    argv = {python, "-u", "-c",
            "import sys; cwd = sys.path[:1] == ['']; cwd and sys.path.pop(0); import runpy; "
            "cwd and sys.path.insert(0, ''); sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')",
            opts.entrypoint};
  } else if (with_python) {
    argv = {python, "-u", opts.entrypoint};
  } else {
    argv.push_back(opts.entrypoint);
  }
  argv.insert(argv.end(), opts.args.begin(), opts.args.end());
  return argv;
}

std::vector<std::string> to_envp(const EnvMap& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

namespace {
bool is_loopback(const std::string& addr) {
  return addr.rfind("127.", 0) == 0 || addr == "::1" || addr.rfind("::ffff:127.", 0) == 0;
}
}  // namespace

GlooInterface choose_gloo_interface(const std::string& hostname, const std::vector<std::string>& hostname_addrs,
                                    const std::string& rendezvous_addr,
                                    const std::function<std::string(const std::string&)>& iface_of) {
  for (const auto& addr : hostname_addrs) {
    if (is_loopback(addr)) continue;
    const std::string name = iface_of(addr);
    if (!name.empty() && name != "lo")
      return {name, "the interface of " + addr + ", which the hostname " + hostname + " resolves to, as Gloo would"};
  }
  const std::string name = iface_of(rendezvous_addr);
  if (name.empty() || name == "lo") return {};
  std::string reason;
  if (hostname_addrs.empty()) {
    reason = "the hostname " + hostname + " does not resolve";
  } else if (is_loopback(hostname_addrs.front())) {
    reason = "the hostname " + hostname + " resolves to loopback (" + hostname_addrs.front() +
             "), which other nodes cannot reach";
  } else {
    reason =
        "the hostname " + hostname + " resolves to " + hostname_addrs.front() + ", an address of no interface here";
  }
  return {name, "the interface that reaches the rendezvous (" + rendezvous_addr + "): " + reason};
}

}  // namespace ddprun::launcher
