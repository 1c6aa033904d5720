// The agent before and after its loop: signals, the command, log files, hosting the store
// server, the coordinator, and the bounded waits at the end.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

#include <spdlog/spdlog.h>

#include "agent/agent_impl.h"
#include "coordination/store_hosting.h"
#include "ddprun/client/net.h"
#include "ddprun/common/knobs.h"
#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/launcher/signal_names.h"
#include "platform/sys_util.h"

namespace ddprun::launcher {

namespace {
constexpr double kHostWaitForAgentsS = 60.0;  // the hosting agent outlives the others, bounded
}  // namespace

void Agent::setup_signals() {
  // A dead console must not kill the agent; workers get SIGPIPE back unless it was ignored
  // already when we started.
  if (::signal(SIGPIPE, SIG_IGN) != SIG_IGN) spawn_.reset_to_default.push_back(SIGPIPE);
  sigemptyset(&handled_);
  sigaddset(&handled_, SIGCHLD);
  std::vector<int> signals = opts_.faults.signals_to_handle;
  signals.insert(signals.end(), opts_.faults.preempt_signals.begin(), opts_.faults.preempt_signals.end());
  for (int s : signals) {
    struct sigaction current {};
    ::sigaction(s, nullptr, &current);
    if (current.sa_handler == SIG_IGN) {
      // Ignored by whoever started us (nohup: SIGHUP): keep ignoring it, and so do the workers.
      spdlog::debug("{} is ignored by ddprun's parent: not handling it", signal_name(s));
      continue;
    }
    sigaddset(&handled_, s);
  }
  // Blocked before any thread starts, so only the signalfd ever sees them. Every blocking step
  // before the loop (the rendezvous connect) asks stop_requested() instead.
  if (int rc = ::pthread_sigmask(SIG_BLOCK, &handled_, nullptr); rc != 0)
    throw std::system_error(rc, std::generic_category(), "pthread_sigmask");
  signal_fd_ = ::signalfd(-1, &handled_, SFD_NONBLOCK | SFD_CLOEXEC);
  DDPRUN_CHECK_SYS(signal_fd_);
  timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  DDPRUN_CHECK_SYS(timer_fd_);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  DDPRUN_CHECK_SYS(epoll_fd_);
  for (int fd : {signal_fd_, timer_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    DDPRUN_CHECK_SYS(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev));
  }
}

bool Agent::is_preempt_signal(int signo) const {
  return std::find(opts_.faults.preempt_signals.begin(), opts_.faults.preempt_signals.end(), signo) !=
         opts_.faults.preempt_signals.end();
}

// A stop signal arrived (asked while a blocking step runs: the first connect, a send, a
// reconnect attempt). A SIGCHLD read meanwhile is remembered: workers may be running (a
// reconnect while a round runs), and the loop reaps for it.
bool Agent::stop_requested() {
  signalfd_siginfo si{};
  while (::read(signal_fd_, &si, sizeof si) == sizeof si) {
    if (si.ssi_signo == SIGCHLD) child_signal_taken_ = true;
    else if (!stop_signal_seen_) stop_signal_seen_ = static_cast<int>(si.ssi_signo);
  }
  return stop_signal_seen_.has_value();
}

void Agent::prepare_command() {
  // The command, the exit watch and the CPU sets are the plan's (launch_plan.h).
  // stdin: one rank reads a terminal (rank 0, or --stdin_rank), so that pdb works there, and
  // the others get /dev/null; a pipe or file is every worker's (torchrun's) unless
  // --stdin_rank says otherwise. Workers run in sessions of their own, so a read of the
  // terminal does not stop them (no SIGTTIN: it is not their controlling terminal).
  const auto& chosen = opts_.output.stdin_rank;
  if (chosen || ::isatty(0)) {
    spawn_.stdin_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const int rank = chosen.value_or(0);
    if (rank != OutputOptions::kNoStdinRank) {
      spawn_.stdin_rank = rank;
      spawn_.stdin_rank_fd = STDIN_FILENO;
      spawn_.stdin_terminal = ::isatty(STDIN_FILENO) != 0;
    }
  }
  if (opts_.workers.early_exit_watch && !spawn_.exit_watch)
    spdlog::debug("early exit watch off: this kernel drops seccomp filters only at the reap (Linux < 6.11)");
  spawn_.env = [this](const GroupLayout& g, int local_rank, const std::string& error_file) {
    EnvMap wenv = build_worker_env(env_, opts_.workers, opts_.faults, g, local_rank, error_file);
    for (const auto& [k, v] : extra_env_) wenv.emplace(k, v);  // never over the user's own
    observers_.each([&](AgentObserver& o) { o.worker_env(wenv, error_file); });
    return wenv;
  };
}

void Agent::prepare_log_root() {
  if (!opts_.output.log_dir.empty()) {
    log_root_ = opts_.output.log_dir;
    run_log_dir_ = make_run_log_dir(log_root_.string(), opts_.rendezvous.id);
    return;
  }
  // Error files (and redirected logs when no --log_dir) need a home.
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/ddprun-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) throw std::system_error(errno, std::generic_category(), "mkdtemp " + templ);
  log_root_ = buf.data();
  log_root_is_temp_ = true;
  const bool any_files = opts_.output.any_files(opts_.nodes.nproc_per_node);
  keep_log_root_ = any_files;
  run_log_dir_ = make_run_log_dir(log_root_.string(), opts_.rendezvous.id);
  if (any_files) spdlog::info("no --log_dir: worker logs go to {}", run_log_dir_.string());
}

// The store server of this process, when the plan says it hosts one. A port that cannot be
// bound: the plan decides (on_bind_failure: a free port, joining as a client, or an error).
void Agent::host_server() {
  const RendezvousPlan& plan = plan_.rendezvous;
  if (!plan.host_server) return;
  auto start_on = [&](uint16_t port) {
    StoreHosting h;
    h.listen_host = plan.listen_host;
    h.port = port;
    h.io_threads = plan.server_io_threads;
    h.serve_rendezvous = plan.serve_rendezvous;
    h.rdzv_token = server_token(plan.credential);
    h.rdzv_munge = server_munge_check(plan.credential);
    // Static multi-node: the workers' store. One node on a network address: this host only.
    const bool one_node_on_network = plan.local && plan.listen_host != "127.0.0.1";
    h.restrict_main_store = !plan.local || one_node_on_network;
    if (one_node_on_network) h.store_peers = client::local_addresses();  // before any worker exists
    return host_store(h);
  };
  try {
    store_ = start_on(plan.listen_port);
  } catch (const std::exception& e) {
    BindFallback f = on_bind_failure(plan, e.what());
    switch (f.kind) {
      case BindFallback::Kind::UseFreePort:
        spdlog::info("{}", f.message);
        store_ = start_on(0);
        break;
      case BindFallback::Kind::JoinAsClient:
        spdlog::info("{}", f.message);
        joined_as_client_ = std::move(f.plan);
        return;
      case BindFallback::Kind::Fail: throw std::runtime_error(f.message);
    }
  }
  if (!plan.local) spdlog::info("hosting the rendezvous for job {} on port {}", opts_.rendezvous.id, store_->port());
}

// Who may join a multi-node rendezvous: the plan decided (launch_plan.h); said once.
void Agent::say_credential() const {
  const RendezvousPlan& plan = plan_.rendezvous;
  if (const auto* m = std::get_if<MungeCredential>(&plan.credential)) {
    spdlog::info("the rendezvous of job {} admits only the agents of Slurm job {} step {} (munge credentials of "
                 "uid {})",
                 opts_.rendezvous.id, m->scope.job_id, m->scope.step_id, ::geteuid());
  } else if (const auto* none = std::get_if<NoCredential>(&plan.credential)) {
    spdlog::warn("the rendezvous of job {} at {}:{} is open to anyone who can reach it{}: set DDPRUN_RDZV_TOKEN or "
                 "--rdzv_token_file (a 0600 file of 16+ random bytes) the same on every node to require a token",
                 opts_.rendezvous.id, plan.endpoint_host, plan.endpoint_port,
                 none->why_no_munge.empty()
                     ? ""
                     : " (no munge authentication in this Slurm step: " + none->why_no_munge + ")");
  }
}

void Agent::start_coordinator() {
  if (!plan_.rendezvous.local) say_credential();
  host_server();
  const RendezvousPlan& plan = rdzv_plan();
  if (plan.local) {
    coordinator_ = make_local_coordinator(*store_, plan.join, plan.store_host);
  } else {
    spdlog::info("connecting to the rendezvous of job {} at {}:{}", opts_.rendezvous.id, plan.endpoint_host,
                 plan.endpoint_port);
    RemoteCoordinatorOptions co;
    co.host = plan.endpoint_host;
    co.port = plan.endpoint_port;
    co.settings = plan.join;
    co.advertise = opts_.rendezvous.local_addr;
    co.connect_timeout = plan.connect_timeout;
    co.heartbeat_interval = plan.heartbeat_interval;
    // Once stopping, no send waits for a server that stopped reading.
    co.interrupted = [this] { return state_.stop_signal().has_value() || stop_requested(); };
    co.token = agent_credentials(rdzv_plan().credential);
    // `ddprun status --rdzv_endpoint`: the server keeps what the heartbeats carry.
    co.status_source = observers_.heartbeat_source();
    coordinator_ = make_remote_coordinator(std::move(co));
  }
  // Gloo binds to whatever the hostname resolves to, often 127.0.1.1, which other nodes
  // cannot reach: keep Gloo's choice when it is a real interface of this host, else take the
  // one that reaches the rendezvous; never over the user's own (loopback needs nothing).
  if (!env_.count("GLOO_SOCKET_IFNAME")) {
    const std::string host = client::hostname();
    const GlooInterface gloo =
        choose_gloo_interface(host, client::resolve_all(host), coordinator_->node_address(), client::interface_of);
    if (!gloo.name.empty()) {
      extra_env_["GLOO_SOCKET_IFNAME"] = gloo.name;
      gloo_note_ = "; workers' GLOO_SOCKET_IFNAME=" + gloo.name + " (" + gloo.why + ")";
    }
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = coordinator_->fd();
  DDPRUN_CHECK_SYS(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, coordinator_->fd(), &ev));
}

void Agent::wait_for_other_agents() {
  // The rendezvous and the workers' stores live in this process: leaving early would take the
  // job down (torchrun's pytorch#67742). Wait, bounded, until every other agent has left.
  const auto deadline = Clock::now() + std::chrono::duration<double>(kHostWaitForAgentsS);
  bool logged = false;
  while (store_->stats().agents_connected > 0 && Clock::now() < deadline) {
    if (!logged) {
      spdlog::info("this node hosts the rendezvous: waiting for the other nodes to finish (at most {:.0f} s)",
                   kHostWaitForAgentsS);
      logged = true;
    }
    pollfd p{signal_fd_, POLLIN, 0};
    ::poll(&p, 1, 20);
    if (stop_requested()) {
      spdlog::warn("received {}: not waiting for the other nodes", signal_name(*stop_signal_seen_));
      break;  // the user insists
    }
  }
}

void Agent::reap_leftovers(double seconds) {
  // Every child (workers and adopted orphans) is SIGKILLed by now or about to be; reap them,
  // bounded: something stuck in the kernel must not keep the agent.
  auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    siginfo_t info{};
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0) return;  // no child left
    for (pid_t child : children_of(::getpid())) ::kill(child, SIGKILL);
    int st = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &st, WNOHANG)) > 0) {
    }
    if (pid < 0 && errno == ECHILD) return;
    double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (left <= 0) {
      spdlog::warn("some child processes did not exit after SIGKILL; leaving them");
      return;
    }
    pollfd p{signal_fd_, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::min(left, 0.1) * 1000) + 1);
    signalfd_siginfo si{};
    while (::read(signal_fd_, &si, sizeof si) == sizeof si) {
    }
  }
}

void Agent::close_all() {
  group_.reset();
  for (int* fd : {&epoll_fd_, &signal_fd_, &timer_fd_, &spawn_.stdin_fd}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

// A multi-node round's workers reach their store through this node's relay (--store_relay): the
// store then holds one connection per node. A new relay per round, as each round's store is new.
void Agent::relay_store() {
  store_relay_.reset();
  if (!store_relay_for(opts_.rendezvous.store_relay, layout_.num_nodes)) return;
  auto r = std::make_unique<relay::StoreRelay>(
      relay::StoreRelayOptions{.upstream_host = layout_.store_host, .upstream_port = layout_.store_port});
  try {
    const uint16_t port = r->start();
    spdlog::info("the workers reach their store {}:{} through this node's store relay on 127.0.0.1:{}",
                 layout_.store_host, layout_.store_port, port);
    layout_.store_host = "127.0.0.1";
    layout_.store_port = port;
    store_relay_ = std::move(r);
  } catch (const std::exception& e) {
    spdlog::warn("{}; the workers connect to their store {}:{} directly", e.what(), layout_.store_host,
                 layout_.store_port);
  }
}

}  // namespace ddprun::launcher
