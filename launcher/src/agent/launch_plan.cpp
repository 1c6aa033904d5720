// The launch plan: every fact the agent needs, resolved before it starts (launch_plan.h).
#include "ddprun/launcher/launch_plan.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <stdexcept>

#include "ddprun/client/net.h"
#include "ddprun/common/knobs.h"
#include "ddprun/launcher/entrypoint.h"
#include "ddprun/launcher/numa.h"
#include "ddprun/launcher/spare_plan.h"
#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/auth_io.h"

namespace ddprun::launcher {

namespace {

// Who may join a multi-node rendezvous: the same token on every node (--rdzv_token_file, else
// DDPRUN_RDZV_TOKEN), or none.
std::string load_rendezvous_token(const RendezvousOptions& r, const EnvMap& env) {
  const auto from_env = knobs::get(knobs::kRdzvToken, env);
  try {
    return rdzv::load_token(r.token_file, from_env ? from_env->c_str() : nullptr);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

// Who may join a multi-node rendezvous: the token; without one, inside an srun step, munge
// (rdzv/munge_auth.h), when it loads; else nobody needs to prove anything.
RendezvousCredential resolve_credential(const LaunchOptions& o, const EnvMap& env, const PlanProbes& probes) {
  if (std::string token = load_rendezvous_token(o.rendezvous, env); !token.empty())
    return TokenCredential{std::move(token)};
  const auto job = env.find("SLURM_JOB_ID"), step = env.find("SLURM_STEP_ID");
  if (o.platform.slurm_summary.empty() || job == env.end() || step == env.end()) return NoCredential{};
  std::string why;
  const std::string socket = knobs::get(knobs::kMungeSocket, env).value_or("");
  std::shared_ptr<const rdzv::MungeClient> munge =
      probes.open_munge ? probes.open_munge(socket, why) : rdzv::MungeClient::open(socket, why);
  if (!munge) return NoCredential{why};
  const rdzv::MungeScope scope{job->second, step->second};
  return MungeCredential{scope, rdzv::munge_credential_maker(munge, scope), rdzv::munge_credential_check(munge, scope)};
}

// The command, interpreter and CPU sets every worker is started with.
void resolve_spawn(LaunchPlan& plan, const EnvMap& env, const PlanProbes& probes) {
  const LaunchOptions& o = plan.options;
  WorkerCommand cmd = resolve_worker_command(o.workers, env);  // Python or the program
  plan.spawn.executable = std::move(cmd.executable);
  plan.spawn.argv = std::move(cmd.argv);
  plan.interpreter = std::move(cmd.interpreter);
  if (o.workers.early_exit_watch)
    plan.spawn.exit_watch =
        probes.kernel_reports_exit_early ? probes.kernel_reports_exit_early() : kernel_reports_exit_early();
  const bool python = !plan.interpreter.empty() && spare_can_run(plan.spawn.argv);
  plan.spares = spares_enabled(o.spares, o.faults.max_restarts, python);
}

// Whether a server already answers on host:port, an address of this host (a standing ddprund
// that a one-node c10d job joins): one connect, refused at once when nobody listens.
bool port_served(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return false;
  bool served = false;
  for (addrinfo* a = res; a && !served; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    timeval limit{0, 300000};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    served = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return served;
}

}  // namespace

LaunchPlan make_launch_plan(LaunchOptions options, const EnvMap& env, const PlanProbes& probes) {
  LaunchPlan plan;
  plan.options = std::move(options);
  const LaunchOptions& o = plan.options;
  // torchrun fails the launch too (no worker starts) when it cannot bind.
  if (o.platform.numa_binding)
    plan.spawn.cpu_affinity = numa_cpus_for(*o.platform.numa_binding, o.nodes.nproc_per_node, env,
                                            knobs::get(knobs::kSysfsRoot, env).value_or("/"));
  plan.rendezvous = resolve_plan(o.nodes, o.rendezvous, o.faults.max_restarts, env,
                                 probes.is_local_host ? probes.is_local_host : client::is_local_address,
                                 probes.port_served ? probes.port_served : port_served);
  plan.rendezvous.join.retry_deterministic = o.faults.retry_deterministic;  // job-wide, as max_restarts
  resolve_spawn(plan, env, probes);
  if (!plan.rendezvous.local) plan.rendezvous.credential = resolve_credential(o, env, probes);
  return plan;
}

}  // namespace ddprun::launcher
