#include "ddprun/launcher/agent.h"

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
#include <cerrno>
#include <deque>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <unordered_map>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <vector>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "ddprun/launcher/agent_state.h"
#include "ddprun/launcher/entrypoint.h"
#include "ddprun/launcher/error_file.h"
#include "ddprun/launcher/log_paths.h"
#include "ddprun/launcher/output.h"
#include "ddprun/launcher/process.h"
#include "ddprun/launcher/rendezvous.h"
#include "ddprun/launcher/signal_names.h"
#include "ddprun/launcher/worker_env.h"
#include "ddprun/rdzv/rendezvous_client.h"
#include "ddprun/server/store_server.h"

namespace ddprun::launcher {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using WallClock = std::chrono::system_clock;

constexpr uint16_t kDefaultMasterPort = 29500;
constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kMaxDrainBytes = 16 * 1024 * 1024;  // per stream, when a worker has exited
constexpr double kKillWaitS = 5.0;                   // SIGKILL -> stop waiting
constexpr size_t kMaxErrorFileBytes = 1024 * 1024;
constexpr double kHostWaitForAgentsS = 60.0;  // the hosting agent outlives the others, bounded

// rdzv_conf values: seconds (torchrun's unit) as milliseconds; a bad value is a usage error.
std::chrono::milliseconds conf_seconds(const LaunchOptions& o, const std::string& key, double fallback_s) {
  auto it = o.rdzv_conf.find(key);
  if (it == o.rdzv_conf.end()) return std::chrono::milliseconds(static_cast<long long>(fallback_s * 1000));
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (end == it->second.c_str() || *end != '\0' || v < 0)
    throw UsageError("--rdzv_conf " + key + "=" + it->second + ": expected a number of seconds");
  return std::chrono::milliseconds(static_cast<long long>(v * 1000));
}

// Whether `host` names an address of this machine (it can be bound here).
bool is_local_address(const std::string& host) {
  if (host == "localhost") return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  bool local = false;
  for (addrinfo* ai = res; ai && !local; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    local = ::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;  // port 0 in the result: no conflict
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return local;
}

// The interface that carries `addr` (e.g. "eth0"), or "" when none does.
std::string interface_of(const std::string& addr) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string name;
  for (ifaddrs* i = list; i && name.empty(); i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    char buf[INET6_ADDRSTRLEN] = "";
    if (i->ifa_addr->sa_family == AF_INET)
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof buf);
    else if (i->ifa_addr->sa_family == AF_INET6)
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, buf, sizeof buf);
    if (addr == buf) name = i->ifa_name;
  }
  ::freeifaddrs(list);
  return name;
}

// The local address of a connected socket: what this node is reachable at, on the network
// that leads to the rendezvous endpoint (right on multi-NIC hosts).
std::string local_address_of(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  char buf[INET6_ADDRSTRLEN] = "";
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
  } else if (ss.ss_family == AF_INET6) {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
    if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
      ::inet_ntop(AF_INET, &a6->sin6_addr.s6_addr[12], buf, sizeof buf);
    } else {
      ::inet_ntop(AF_INET6, &a6->sin6_addr, buf, sizeof buf);
    }
  }
  return buf;
}

// Every system call checked at its call site: file:line and strerror.
#define DDPRUN_CHECK_SYS(expr)                                                                  \
  do {                                                                                           \
    if ((expr) < 0) {                                                                            \
      throw std::system_error(errno, std::generic_category(),                                   \
                              std::string(#expr) + " at " + __FILE__ + ":" + std::to_string(__LINE__)); \
    }                                                                                            \
  } while (0)

// Whether this process has any child left (workers or adopted orphans), without reaping.
bool has_children() {
  siginfo_t info{};
  return ::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0;
}

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // console gone (EPIPE) or disk full: drop, the run goes on
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

std::string wall_time(WallClock::time_point t) {
  std::time_t tt = WallClock::to_time_t(t);
  std::tm tm{};
  ::gmtime_r(&tt, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

struct Stream {
  int fd = -1;
  int log_fd = -1;
  int filtered_fd = -1;  // the attempt's filtered_{stdout,stderr}.log (--duplicate_*_filters)
  DuplicateFilter filter;
  bool console = true;
  LineSplitter splitter;
};

// A waitpid() status as the state machine's WorkerStatus.
WorkerStatus status_of_wait(int st) {
  return WIFSIGNALED(st) ? WorkerStatus::killed_by(WTERMSIG(st)) : WorkerStatus::exited(WEXITSTATUS(st));
}

struct Worker {
  int attempt = 0;
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;
  bool reaped = false;
  // Its exit was seen through the early exit watch and dispatched; the reap only finishes it.
  bool exit_reported = false;
  int exit_watch_fd = -1;  // seccomp listener (process.h), -1 when none
  Stream out;
  Stream err;
  TailBuffer tail{20};
  std::string error_file;
  Clock::time_point started;
  std::optional<WorkerStatus> status;
  WallClock::time_point ended_wall;
  Clock::time_point ended;
};

// A failed attempt's workers after an overlapped restart (Action::RetireWorkers): sent
// SIGTERM, no longer the attempt's, still read (console, their own attempt's log files) and
// reaped. SIGKILL at `deadline`, then given up on kKillWaitS later.
struct RetiringGroup {
  int attempt = 0;
  std::vector<std::unique_ptr<Worker>> workers;
  Clock::time_point since;
  Clock::time_point deadline;
  bool killed = false;  // SIGKILL sent; `deadline` is now when to stop waiting
};

struct FailureDetails {
  int attempt = 0;
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;
  WorkerStatus status;
  WallClock::time_point when;
  double after_s = 0;
  std::deque<std::string> tail;
  std::string error_file;
  std::optional<std::string> error_file_content;
};

class Agent {
 public:
  Agent(const LaunchOptions& opts, const EnvMap& env)
      : opts_(opts),
        env_(env),
        state_(AgentConfig{.nproc = opts.nproc_per_node,
                           .max_restarts = opts.max_restarts,
                           .shutdown_timeout_s = opts.shutdown_timeout_s,
                           .kill_wait_s = kKillWaitS,
                           .coordinated = opts.multi_node(),
                           .overlap_restart = opts.overlap_restart}) {}
  ~Agent() { close_all(); }

  int run();

 private:
  void setup_signals();
  void start_store();
  void setup_multinode();
  void on_rendezvous();
  void handle_notice(const rdzv::Message& m);
  void wait_for_other_agents();
  void prepare_command();
  void prepare_log_root();
  void loop();
  void dispatch(const AgentEvent& e);
  void perform(const Action& a);
  void start_attempt(int attempt);
  void end_attempt();
  void kill_orphans(std::optional<unsigned long long> started_before_tick);
  void retire_workers(int attempt, double grace_s);
  void on_retired_exit(Worker& w);
  void on_retire_timer();
  void release_retired(size_t index);
  void arm_retire_timer();
  void on_signalfd();
  void reap_children();
  void worker_ended(Worker& w);
  // Of the running attempt (not retiring, not ended).
  bool is_current(const Worker& w) const {
    return std::any_of(workers_.begin(), workers_.end(), [&](const auto& x) { return x.get() == &w; });
  }
  void setup_exit_watch();
  void on_exit_watch(Worker& w);
  void close_exit_watch(Worker& w);
  void on_pipe(int fd);
  bool read_stream(Worker& w, Stream& s, bool is_err, size_t budget);
  void close_stream(Stream& s);
  void emit_lines(Worker& w, Stream& s, bool is_err, std::string_view data, bool eof);
  void drain(Worker& w);
  void signal_workers(int signo);
  void arm_timer(double seconds) { arm_timerfd(timer_fd_, seconds); }
  void arm_timerfd(int fd, double seconds);
  void record_failure(const Action& a);
  void reap_leftovers(double seconds);
  void close_all();
  std::string summary() const;

  const LaunchOptions& opts_;
  const EnvMap& env_;
  AgentState state_;
  Clock::time_point t_launch_ = Clock::now();

  std::unique_ptr<Guardian> guardian_;
  std::unique_ptr<server::StoreServer> store_;
  std::unique_ptr<Rendezvous> rdzv_;  // single node
  // Multi-node: the connection to the rendezvous server (hosted here when this node is the
  // endpoint), and what the server said.
  std::unique_ptr<rdzv::RendezvousClient> rdzv_client_;
  rdzv::JoinInfo join_info_;
  bool hosting_ = false;
  std::string endpoint_host_;
  uint16_t endpoint_port_ = 0;
  std::optional<GroupLayout> pending_layout_;
  int64_t round_ = 0;
  Clock::time_point join_sent_;
  std::string job_failure_;  // the server's JOB_FAILED / ERROR text, with the job's first failure
  EnvMap extra_env_;         // added to every worker's environment unless already set
  GroupLayout layout_;
  std::string store_host_;
  uint16_t store_port_ = 0;

  std::string executable_;
  std::vector<std::string> argv_;
  std::string interpreter_;  // Python workers: path and version, for the start line
  fs::path log_root_;
  fs::path run_log_dir_;  // log_root_/<run_id>_<unique>: never an earlier run's
  bool log_root_is_temp_ = false;
  bool keep_log_root_ = true;
  int stdin_fd_ = -1;

  int epoll_fd_ = -1;
  int signal_fd_ = -1;
  int timer_fd_ = -1;
  int retire_timer_fd_ = -1;  // the earliest deadline of the retiring groups
  sigset_t handled_{};
  std::vector<int> reset_to_default_;

  std::vector<std::unique_ptr<Worker>> workers_;  // the current attempt's
  std::unordered_map<pid_t, Worker*> by_pid_;
  std::unordered_map<int, std::pair<Worker*, bool>> by_fd_;  // fd -> (worker, is_err)
  std::unordered_map<int, Worker*> by_exit_watch_fd_;       // seccomp listener -> worker
  // Workers of ended attempts whose exit was seen early and that are not reaped yet: when.
  std::unordered_map<pid_t, Clock::time_point> dying_;
  bool exit_watch_ = false;  // --early_exit_watch and a kernel where it helps
  std::vector<pid_t> old_pgroups_;                          // previous attempts', to clean up
  std::vector<RetiringGroup> retiring_;                     // overlapped restart: old attempts
  Clock::time_point attempt_started_;
  unsigned long long attempt_started_tick_ = 0;  // boot_ticks_now() just before the spawn
  int attempts_started_ = 0;
  Clock::time_point failure_seen_;               // when the latest failure was reaped

  bool done_ = false;
  int exit_code_ = 1;
  std::optional<FailureDetails> failure_;
  int failures_seen_ = 0;
};

void Agent::setup_signals() {
  // A dead console must not kill the agent; workers get SIGPIPE back unless it was ignored
  // already when we started.
  if (::signal(SIGPIPE, SIG_IGN) != SIG_IGN) reset_to_default_.push_back(SIGPIPE);
  sigemptyset(&handled_);
  sigaddset(&handled_, SIGCHLD);
  for (int s : opts_.signals_to_handle) {
    struct sigaction current {};
    ::sigaction(s, nullptr, &current);
    if (current.sa_handler == SIG_IGN) {
      // Ignored by whoever started us (nohup: SIGHUP): keep ignoring it, and so do the workers.
      spdlog::debug("{} is ignored by ddprun's parent: not handling it", signal_name(s));
      continue;
    }
    sigaddset(&handled_, s);
  }
  // Blocked before any thread starts, so only the signalfd ever sees them.
  if (int rc = ::pthread_sigmask(SIG_BLOCK, &handled_, nullptr); rc != 0) {
    throw std::system_error(rc, std::generic_category(), "pthread_sigmask");
  }
  signal_fd_ = ::signalfd(-1, &handled_, SFD_NONBLOCK | SFD_CLOEXEC);
  DDPRUN_CHECK_SYS(signal_fd_);
  timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  DDPRUN_CHECK_SYS(timer_fd_);
  retire_timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  DDPRUN_CHECK_SYS(retire_timer_fd_);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  DDPRUN_CHECK_SYS(epoll_fd_);
  for (int fd : {signal_fd_, timer_fd_, retire_timer_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    DDPRUN_CHECK_SYS(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev));
  }
}

void Agent::setup_multinode() {
  const bool c10d = opts_.rdzv_backend == "c10d";
  endpoint_host_ = c10d ? opts_.rdzv_host : opts_.master_addr;
  endpoint_port_ = c10d ? opts_.rdzv_port : opts_.master_port.value_or(kDefaultMasterPort);
  if (c10d) {
    auto it = opts_.rdzv_conf.find("is_host");
    if (it != opts_.rdzv_conf.end()) {
      const std::string& v = it->second;
      if (v == "1" || v == "true" || v == "True") hosting_ = true;
      else if (v == "0" || v == "false" || v == "False") hosting_ = false;
      else throw UsageError("--rdzv_conf is_host=" + v + ": expected true or false");
    } else {
      hosting_ = is_local_address(endpoint_host_);
    }
  } else {
    hosting_ = opts_.node_rank == 0;
  }
  if (hosting_) {
    server::StoreServerOptions so;
    so.port = endpoint_port_;
    // The whole job's agents and workers connect here (every round's workers' store too): as
    // many I/O threads as ddprund would use. The single-node store keeps one.
    so.io_threads = 0;
    store_ = std::make_unique<server::StoreServer>(so);
    try {
      store_->start();
    } catch (const std::exception& e) {
      throw std::runtime_error("this node hosts the rendezvous (" + endpoint_host_ + ":" +
                               std::to_string(endpoint_port_) + ") but cannot listen there: " + e.what() +
                               (c10d ? "; is another job using it? (--rdzv_conf is_host=false joins it instead)"
                                     : "; choose another --master_port"));
    }
    spdlog::info("hosting the rendezvous for job {} on port {}", opts_.rdzv_id, store_->port());
  }
  const auto join_timeout = conf_seconds(opts_, "join_timeout", 600);
  const auto heartbeat_timeout = conf_seconds(opts_, "heartbeat_timeout", 5);
  rdzv_client_ = std::make_unique<rdzv::RendezvousClient>(
      endpoint_host_, endpoint_port_, join_timeout,
      std::max(std::chrono::milliseconds(100), heartbeat_timeout / 5));
  char hostname[256] = "";
  ::gethostname(hostname, sizeof hostname - 1);
  join_info_.run_id = opts_.rdzv_id;
  join_info_.host = !opts_.local_addr.empty() ? opts_.local_addr : local_address_of(rdzv_client_->fd());
  join_info_.node_id = std::string(hostname) + "_" + join_info_.host + "_" + std::to_string(::getpid());
  join_info_.local_world_size = opts_.nproc_per_node;
  join_info_.min_nodes = opts_.min_nodes;
  join_info_.max_nodes = opts_.max_nodes;
  join_info_.max_restarts = opts_.max_restarts;
  join_info_.last_call = conf_seconds(opts_, "last_call_timeout", c10d ? 30 : 0);
  join_info_.join_timeout = join_timeout;
  join_info_.heartbeat_timeout = heartbeat_timeout;
  join_info_.fixed_node_rank = c10d ? -1 : opts_.node_rank;
  // Gloo binds to whatever the hostname resolves to, often 127.0.1.1 or the wrong NIC
  // (pytorch#73656): point it at the interface that reaches the rendezvous, unless the user
  // chose one.
  if (!env_.count("GLOO_SOCKET_IFNAME")) {
    const std::string ifname = interface_of(join_info_.host);
    if (!ifname.empty() && ifname != "lo") {
      extra_env_["GLOO_SOCKET_IFNAME"] = ifname;
      spdlog::debug("workers get GLOO_SOCKET_IFNAME={} (the interface of {})", ifname, join_info_.host);
    }
  }
  join_info_.prefer_rank0 = c10d && hosting_;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = rdzv_client_->fd();
  DDPRUN_CHECK_SYS(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, rdzv_client_->fd(), &ev));
}

void Agent::on_rendezvous() {
  try {
    while (!done_) {
      auto m = rdzv_client_->poll();
      if (!m) break;
      handle_notice(*m);
    }
  } catch (const rdzv::RendezvousError& e) {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, rdzv_client_->fd(), nullptr);
    if (job_failure_.empty()) job_failure_ = std::string(e.what()) + " (the node hosting the rendezvous is gone? A standing ddprund as --rdzv_endpoint outlives any agent)";
    spdlog::error("{}", e.what());
    dispatch(CoordinatorNotice{CoordinatorNotice::Kind::JobFailed, 0});
  }
}

void Agent::handle_notice(const rdzv::Message& m) {
  using rdzv::MsgType;
  switch (m.type) {
    case MsgType::Round: {
      auto r = rdzv::RendezvousClient::parse_round(m);
      GroupLayout g;
      g.node_rank = r.node_rank;
      g.num_nodes = r.nnodes;
      g.local_world_size = opts_.nproc_per_node;
      g.world_size = r.world_size;
      g.global_rank_base = r.base_rank;
      // The workers' store lives beside the rendezvous server, on the round's own port.
      g.store_host = endpoint_host_ == "localhost" ? "127.0.0.1" : endpoint_host_;
      g.store_port = r.store_port;
      g.run_id = opts_.rdzv_id;
      g.restart_count = static_cast<int>(r.restart_count);
      pending_layout_ = g;
      round_ = r.round;
      const double rdzv_ms = ms_since(join_sent_);
      auto t_spawn = Clock::now();
      dispatch(RoundReady{g.restart_count});
      spdlog::info("round {} of job {}: node rank {} of {}, world size {}, restart {}/{}; rendezvous {:.1f} ms, "
                   "{} workers started in {:.1f} ms{}{}",
                   r.round, opts_.rdzv_id, r.node_rank, r.nnodes, r.world_size, r.restart_count, r.max_restarts,
                   rdzv_ms, opts_.nproc_per_node, ms_since(t_spawn),
                   r.round == 0 ? fmt::format(", {:.1f} ms after launch", ms_since(t_launch_)) : std::string(),
                   r.round == 0 ? start_line_note(interpreter_) : std::string());
      break;
    }
    case MsgType::Restart:
      spdlog::warn("restarting the job: {}", m.get("reason"));
      dispatch(CoordinatorNotice{CoordinatorNotice::Kind::Restart, static_cast<int>(m.get_int("restart_count"))});
      break;
    case MsgType::JobDone:
      dispatch(CoordinatorNotice{CoordinatorNotice::Kind::JobDone, 0});
      break;
    case MsgType::JobFailed:
    case MsgType::Error: {
      std::ostringstream t;
      t << (m.type == MsgType::Error ? m.get("message") : m.get("reason"));
      if (!m.get("first_failure.host").empty()) {
        t << "\n[ddprun]   first failure of the job: rank " << m.get("first_failure.global_rank") << " on host "
          << m.get("first_failure.host") << " (node rank " << m.get("first_failure.node_rank") << "), "
          << (m.get("first_failure.signal").empty() ? "exit code " + m.get("first_failure.exit_code")
                                                   : "signal " + m.get("first_failure.signal"))
          << ", at " << m.get("first_failure.when");
        const std::string& tail = m.get("first_failure.stderr_tail");
        if (!tail.empty()) {
          t << "\n[ddprun]   last lines of its stderr:";
          std::istringstream lines(tail);
          for (std::string line; std::getline(lines, line);) t << "\n    " << line;
        }
      }
      job_failure_ = t.str();
      spdlog::error("the job ended: {}", m.type == MsgType::Error ? m.get("message") : m.get("reason"));
      dispatch(CoordinatorNotice{CoordinatorNotice::Kind::JobFailed, 0});
      break;
    }
    default:
      break;
  }
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
    signalfd_siginfo si{};
    bool stop = false;
    while (::read(signal_fd_, &si, sizeof si) == sizeof si)
      if (si.ssi_signo != SIGCHLD) stop = true;
    if (stop) break;  // the user insists
  }
}

void Agent::start_store() {
  // Where the workers' store listens: --master_port (static), the rendezvous endpoint's port
  // (c10d, --standalone: 0 = free), else 29500 or a free port when 29500 is taken.
  const bool c10d = opts_.rdzv_backend == "c10d";
  std::optional<uint16_t> port = opts_.master_port;
  if (c10d) port = opts_.rdzv_port_given ? std::optional<uint16_t>(opts_.rdzv_port) : std::nullopt;
  uint16_t default_port = c10d ? opts_.rdzv_port : kDefaultMasterPort;
  // Test seam: the port tried first when none was given (tests hold it to force the fallback).
  if (auto it = env_.find("DDPRUN_DEFAULT_STORE_PORT"); it != env_.end()) {
    default_port = static_cast<uint16_t>(std::strtoul(it->second.c_str(), nullptr, 10));
  }
  auto start_on = [&](uint16_t p) {
    server::StoreServerOptions so;
    so.host = "";
    so.port = p;
    auto s = std::make_unique<server::StoreServer>(so);
    s->start();
    return s;
  };
  if (port) {
    try {
      store_ = start_on(*port);
    } catch (const std::exception& e) {
      throw std::runtime_error("cannot host the store on port " + std::to_string(*port) + ": " +
                               e.what() + (c10d ? " (use another --rdzv_endpoint port, or 0 for a free port)"
                                                 : " (use another --master_port, or 0 for a free port)"));
    }
  } else {
    try {
      store_ = start_on(default_port);
    } catch (const std::exception& e) {
      spdlog::info("port {} is taken ({}); the store uses a free port instead", default_port,
                   e.what());
      store_ = start_on(0);
    }
  }
  store_port_ = store_->port();
  if (!opts_.local_addr.empty()) {
    store_host_ = opts_.local_addr;
  } else if (opts_.rdzv_backend == "c10d") {
    // One node: the store is ours, whatever host the endpoint names.
    store_host_ = "127.0.0.1";
  } else {
    store_host_ = opts_.master_addr;
  }
}

void Agent::prepare_command() {
  WorkerCommand cmd = resolve_worker_command(opts_, env_);
  std::tie(executable_, argv_, interpreter_) = std::tie(cmd.executable, cmd.argv, cmd.interpreter);
  if (::isatty(0)) {
    // Workers live in their own process groups: reading the terminal would stop them.
    stdin_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
}

void Agent::prepare_log_root() {
  if (!opts_.log_dir.empty()) {
    log_root_ = opts_.log_dir;
    run_log_dir_ = make_run_log_dir(log_root_.string(), opts_.rdzv_id);
    return;
  }
  // Error files (and redirected logs when no --log_dir) need a home.
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/ddprun-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    throw std::system_error(errno, std::generic_category(), "mkdtemp " + templ);
  }
  log_root_ = buf.data();
  log_root_is_temp_ = true;
  bool any_files = false;
  for (int r = 0; r < opts_.nproc_per_node; ++r) {
    any_files = any_files || (opts_.redirects.for_rank(r) | opts_.tee.for_rank(r)) != 0;
  }
  keep_log_root_ = any_files;
  run_log_dir_ = make_run_log_dir(log_root_.string(), opts_.rdzv_id);
  if (any_files) spdlog::info("no --log_dir: worker logs go to {}", run_log_dir_.string());
}

int Agent::run() {
  try {
    ensure_std_fds_open();
    setup_signals();
    prepare_command();
    setup_exit_watch();
    guardian_ = std::make_unique<Guardian>();  // before the store's thread and the subreaper
    become_child_subreaper();
    if (opts_.multi_node()) {
      prepare_log_root();
      setup_multinode();
      for (const auto& a : state_.start()) perform(a);
    } else {
      auto t_store = Clock::now();
      start_store();
      double store_ms = ms_since(t_store);
      prepare_log_root();
      rdzv_ = std::make_unique<StaticSingleNodeRendezvous>(opts_.nproc_per_node, opts_.rdzv_id, store_host_,
                                                           store_port_);
      spdlog::debug("store up on port {} in {:.1f} ms", store_port_, store_ms);
      for (const auto& a : state_.start()) perform(a);
      spdlog::info("store up on {}:{} ({:.1f} ms), {} workers started in {:.1f} ms, ready {:.1f} ms "
                   "after launch{}{}",
                   store_host_, store_port_, store_ms, opts_.nproc_per_node,
                   std::chrono::duration<double, std::milli>(Clock::now() - attempt_started_).count(),
                   ms_since(t_launch_),
                   opts_.monitor_interval != 0.1 ? " (--monitor_interval is unused: exits are seen at once)" : "",
                   start_line_note(interpreter_));
    }
    loop();
  } catch (const UsageError& e) {
    spdlog::default_logger()->flush();
    std::fprintf(stderr, "ddprun: error: %s\n", e.what());
    close_all();
    return kUsageExitCode;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    signal_workers(SIGKILL);
    exit_code_ = 1;
  }
  // Tear down whatever is left: process groups of every attempt (retiring ones too), adopted
  // orphans.
  for (auto& w : workers_) drain(*w);
  for (auto& g : retiring_) {
    for (auto& w : g.workers) drain(*w);
  }
  signal_workers(SIGKILL);
  for (auto& g : retiring_) {
    for (auto& w : g.workers) signal_process_group(w->pid, SIGKILL);
  }
  for (pid_t pg : old_pgroups_) signal_process_group(pg, SIGKILL);
  if (guardian_) guardian_->release();
  reap_leftovers(kKillWaitS);
  if (rdzv_) rdzv_->leave();
  rdzv_.reset();
  if (rdzv_client_) {
    rdzv_client_->leave();
    rdzv_client_.reset();
  }
  if (hosting_) wait_for_other_agents();
  if (store_) store_->stop();
  std::string text = summary();
  close_all();
  if (log_root_is_temp_ && !keep_log_root_) {
    std::error_code ec;
    fs::remove_all(log_root_, ec);
  }
  spdlog::default_logger()->flush();
  if (!text.empty()) {
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
  }
  return exit_code_;
}

void Agent::loop() {
  epoll_event events[64];
  while (!done_) {
    int n = ::epoll_wait(epoll_fd_, events, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      DDPRUN_CHECK_SYS(n);
    }
    for (int i = 0; i < n && !done_; ++i) {
      int fd = events[i].data.fd;
      if (fd == signal_fd_) {
        on_signalfd();
      } else if (rdzv_client_ && fd == rdzv_client_->fd()) {
        on_rendezvous();
      } else if (fd == timer_fd_) {
        uint64_t expirations = 0;
        if (::read(timer_fd_, &expirations, sizeof expirations) == sizeof expirations) {
          dispatch(TimerExpired{});
        }
      } else if (fd == retire_timer_fd_) {
        uint64_t expirations = 0;
        if (::read(retire_timer_fd_, &expirations, sizeof expirations) == sizeof expirations) {
          on_retire_timer();
        }
      } else if (auto it = by_exit_watch_fd_.find(fd); it != by_exit_watch_fd_.end()) {
        on_exit_watch(*it->second);
      } else {
        on_pipe(fd);
      }
    }
  }
}

void Agent::dispatch(const AgentEvent& e) {
  for (const auto& a : state_.on_event(e)) perform(a);
}

void Agent::perform(const Action& a) {
  switch (a.kind) {
    case Action::Kind::StartAttempt:
      start_attempt(a.attempt);
      break;
    case Action::Kind::ReportFailure:
      record_failure(a);
      break;
    case Action::Kind::SignalWorkers:
      signal_workers(a.signo);
      break;
    case Action::Kind::RetireWorkers:
      retire_workers(a.attempt, a.seconds);
      break;
    case Action::Kind::ArmTimer:
      arm_timer(a.seconds);
      break;
    case Action::Kind::DisarmTimer:
      arm_timer(0);
      break;
    case Action::Kind::AbandonWorkers: {
      std::string pids;
      for (auto& w : workers_) {
        if (!w->reaped) pids += " " + std::to_string(w->pid);
      }
      spdlog::error("workers{} did not exit {:.0f} s after SIGKILL (stuck in the kernel?); no longer "
                    "waiting for them",
                    pids, kKillWaitS);
      break;
    }
    case Action::Kind::Finish:
      done_ = true;
      exit_code_ = a.exit_code;
      break;
    case Action::Kind::JoinRound:
      join_info_.local_world_size = opts_.nproc_per_node;
      join_sent_ = Clock::now();
      rdzv_client_->send_join(join_info_);
      spdlog::debug("joining the next round of job {} (attempt {})", opts_.rdzv_id, a.attempt);
      break;
    case Action::Kind::ReportSuccess:
      spdlog::info("all {} local workers succeeded; waiting for the other nodes", opts_.nproc_per_node);
      rdzv_client_->report_success(round_);
      break;
  }
}

// The ended attempt's workers (all reaped, or abandoned): close their pipes, SIGKILL what is
// left of their process groups. Retired workers are not in workers_ any more.
void Agent::end_attempt() {
  for (auto& w : workers_) {
    drain(*w);
    close_stream(w->out);
    close_stream(w->err);
    close_exit_watch(*w);
    if (w->exit_reported && !w->reaped) dying_[w->pid] = w->ended;
    by_pid_.erase(w->pid);
    signal_process_group(w->pid, SIGKILL);  // leftovers of its group (grandchildren)
    old_pgroups_.push_back(w->pid);
    guardian_->forget(w->pid);
  }
  workers_.clear();
}

// Orphans adopted as subreaper that left their worker's process group: SIGKILL every child
// that is not a worker (of the current attempt or a retiring one). With a tick, only those
// that started before it (the current attempt's own orphans are its business until it ends).
void Agent::kill_orphans(std::optional<unsigned long long> started_before_tick) {
  if (!has_children()) return;
  const auto children = started_before_tick ? children_started_before(::getpid(), *started_before_tick)
                                            : children_of(::getpid());
  for (pid_t child : children) {
    if (!by_pid_.count(child) && !dying_.count(child)) {
      spdlog::debug("killing orphan pid {} (adopted from an ended attempt)", child);
      ::kill(child, SIGKILL);
    }
  }
}

void Agent::retire_workers(int attempt, double grace_s) {
  RetiringGroup g;
  g.attempt = attempt;
  g.since = Clock::now();
  g.deadline = g.since + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_s));
  // Every worker of the attempt moves, reaped or not: a reaped leader's process group may
  // still hold grandchildren, which get the same grace as the survivors.
  g.workers = std::move(workers_);
  workers_.clear();
  size_t running = 0;
  for (auto& w : g.workers) running += !w->reaped;
  spdlog::debug("attempt {}: {} worker(s) still running retire in the background (SIGKILL in {:.1f} s)",
                attempt, running, grace_s);
  retiring_.push_back(std::move(g));
  arm_retire_timer();
}

// A retiring worker was reaped (already drained); the group goes once all of it is.
void Agent::on_retired_exit(Worker& w) {
  for (size_t i = 0; i < retiring_.size(); ++i) {
    auto& g = retiring_[i];
    if (g.attempt != w.attempt) continue;
    if (std::all_of(g.workers.begin(), g.workers.end(), [](auto& x) { return x->reaped; })) {
      release_retired(i);
      arm_retire_timer();
    }
    return;
  }
}

void Agent::on_retire_timer() {
  const auto now = Clock::now();
  for (size_t i = 0; i < retiring_.size();) {
    auto& g = retiring_[i];
    if (g.deadline > now) {
      ++i;
      continue;
    }
    std::string pids;
    for (auto& w : g.workers) {
      if (!w->reaped) pids += fmt::format(" r{} (pid {})", w->global_rank, w->pid);
    }
    if (!g.killed) {
      spdlog::warn("attempt {}'s worker(s){} still running {:.1f} s after SIGTERM (--shutdown_timeout): SIGKILL",
                   g.attempt, pids, std::chrono::duration<double>(now - g.since).count());
      for (auto& w : g.workers) signal_process_group(w->pid, SIGKILL);
      g.killed = true;
      g.deadline = now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kKillWaitS));
      ++i;
    } else {
      spdlog::error("attempt {}'s worker(s){} did not exit {:.0f} s after SIGKILL (stuck in the kernel?); no "
                    "longer waiting for them",
                    g.attempt, pids, kKillWaitS);
      release_retired(i);
    }
  }
  arm_retire_timer();
}

// The group is gone (or given up on): close its pipes, SIGKILL its leftovers, stop watching it.
void Agent::release_retired(size_t index) {
  RetiringGroup g = std::move(retiring_[index]);
  retiring_.erase(retiring_.begin() + static_cast<std::ptrdiff_t>(index));
  std::string how;
  for (auto& w : g.workers) {
    drain(*w);
    close_stream(w->out);
    close_stream(w->err);
    close_exit_watch(*w);
    by_pid_.erase(w->pid);
    signal_process_group(w->pid, SIGKILL);  // grandchildren left in its group
    old_pgroups_.push_back(w->pid);
    guardian_->forget(w->pid);
    if (w->status) how += fmt::format(" r{} {};", w->global_rank, w->status->describe());
  }
  // Their children that left the group and were adopted by us since the restart; never the
  // running attempt's (they started after it).
  kill_orphans(attempt_started_tick_);
  spdlog::debug("attempt {}'s retired workers are gone {:.1f} ms after the restart:{}", g.attempt,
                ms_since(g.since), how);
}

void Agent::arm_retire_timer() {
  if (retiring_.empty()) {
    arm_timerfd(retire_timer_fd_, 0);
    return;
  }
  auto next = retiring_.front().deadline;
  for (auto& g : retiring_) next = std::min(next, g.deadline);
  // At least 1 ns: a deadline already passed fires at once (0 would disarm).
  arm_timerfd(retire_timer_fd_, std::max(1e-9, std::chrono::duration<double>(next - Clock::now()).count()));
}

void Agent::start_attempt(int attempt) {
  const auto t0 = Clock::now();
  if (opts_.multi_node()) {
    end_attempt();  // the previous round's workers, if any (nothing on the first round)
    layout_ = *pending_layout_;
  } else if (attempt > 0) {
    end_attempt();
    // No attempt ever reads the previous attempt's keys; this also closes the old workers'
    // store connections, so retiring survivors cannot reach the new attempt.
    store_->reset_keyspace();
  }
  const double cleanup_ms = ms_since(t0);
  if (!opts_.multi_node()) layout_ = rdzv_->next_round(attempt);
  attempt_started_ = Clock::now();
  attempt_started_tick_ = boot_ticks_now();
  const fs::path attempt_dir = attempt_log_dir(run_log_dir_, attempt);
  std::vector<SpawnedProcess> spawned;
  for (int lr = 0; lr < layout_.local_world_size; ++lr) {
    auto w = std::make_unique<Worker>();
    w->attempt = attempt;
    w->local_rank = lr;
    w->global_rank = layout_.global_rank_base + lr;
    const fs::path dir = attempt_dir / std::to_string(lr);
    fs::create_directories(dir);
    w->error_file = (dir / "error.json").string();
    std::error_code ec;
    fs::remove(w->error_file, ec);
    const int redirect = opts_.redirects.for_rank(lr);
    const int tee = opts_.tee.for_rank(lr);
    const bool console_allowed = !opts_.local_ranks_filter || opts_.local_ranks_filter->count(lr);
    auto setup = [&](Stream& s, int bit, const char* name) {
      if ((redirect | tee) & bit) {
        std::string path = (dir / name).string();
        s.log_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (s.log_fd < 0) {
          throw std::system_error(errno, std::generic_category(), "open " + path);
        }
      }
      s.console = console_allowed && (!(redirect & bit) || (tee & bit));
      s.filter = DuplicateFilter(bit == kStreamOut ? opts_.duplicate_stdout_filters : opts_.duplicate_stderr_filters);
      if (s.filter.applies_to(tee, bit, console_allowed)) {
        const std::string path = (attempt_dir / (bit == kStreamOut ? "filtered_stdout.log" : "filtered_stderr.log")).string();
        s.filtered_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        DDPRUN_CHECK_SYS(s.filtered_fd);
      }
    };
    setup(w->out, kStreamOut, "stdout.log");
    setup(w->err, kStreamErr, "stderr.log");

    SpawnRequest req;
    req.executable = executable_;
    req.argv = argv_;
    EnvMap wenv = build_worker_env(env_, opts_, layout_, lr, w->error_file);
    for (const auto& [k, v] : extra_env_) wenv.emplace(k, v);  // never over the user's own
    req.envp = to_envp(wenv);
    req.stdin_fd = stdin_fd_;
    req.reset_to_default = reset_to_default_;
    req.exit_watch = exit_watch_;
    // Without CAP_SYS_ADMIN the filter needs no_new_privs: allowed, as --early_exit_watch says.
    req.exit_watch_no_new_privs = true;
    if (!opts_.numa_cpus.empty()) req.cpu_affinity = opts_.numa_cpus[static_cast<size_t>(lr)];
    SpawnedProcess p = spawn_process(req);
    w->pid = p.pid;
    w->started = Clock::now();
    w->out.fd = p.stdout_fd;
    w->err.fd = p.stderr_fd;
    for (auto [fd, is_err] : {std::pair{p.stdout_fd, false}, std::pair{p.stderr_fd, true}}) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = fd;
      DDPRUN_CHECK_SYS(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev));
      by_fd_[fd] = {w.get(), is_err};
    }
    by_pid_[w->pid] = w.get();
    guardian_->watch(w->pid);
    spawned.push_back(p);
    workers_.push_back(std::move(w));
  }
  // All forked; now take each exit watch and wait for each exec (a few ms in all, not per worker).
  for (size_t i = 0; i < spawned.size(); ++i) {
    Worker& w = *workers_[i];
    w.exit_watch_fd = receive_exit_watch(spawned[i].exit_watch_sock);
    if (w.exit_watch_fd >= 0) {
      epoll_event ev{};
      ev.events = EPOLLIN;  // POLLHUP is always reported: no task uses the filter any more
      ev.data.fd = w.exit_watch_fd;
      DDPRUN_CHECK_SYS(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, w.exit_watch_fd, &ev));
      by_exit_watch_fd_[w.exit_watch_fd] = &w;
    } else if (exit_watch_ && i == 0) {
      spdlog::debug("no early exit watch for local rank 0 (seccomp listener not allowed here): exits are "
                    "seen when reaped");
    }
  }
  for (size_t i = 0; i < spawned.size(); ++i) {
    int err = wait_exec_status(spawned[i].exec_status_fd);
    if (err != 0) {
      std::string msg = "ddprun: cannot exec " + executable_ + ": " + std::strerror(err);
      workers_[i]->tail.push(msg);
      spdlog::error("local rank {}: {}", i, msg);
    }
  }
  const auto t_spawned = Clock::now();
  const double spawn_ms = ms_since(attempt_started_);
  // After the spawn, off the restart's critical path: orphans of ended attempts (adopted as
  // subreaper) that left their worker's process group.
  if (attempts_started_++ > 0) kill_orphans(std::nullopt);
  spdlog::debug("attempt {}: {} workers exec'd in {:.1f} ms (pids{})", attempt, spawned.size(), spawn_ms, [&] {
    std::string s;
    for (auto& w : workers_) s += " " + std::to_string(w->pid);
    return s;
  }());
  if (attempt > 0 && !opts_.multi_node()) {
    size_t retiring = 0;
    for (auto& g : retiring_) {
      for (auto& w : g.workers) retiring += !w->reaped;
    }
    spdlog::info("restarting the worker group: attempt {} of {}: {} workers started {:.1f} ms after the failure "
                 "was seen (fresh store keyspace; cleanup {:.1f} ms, spawn {:.1f} ms){}",
                 attempt, opts_.max_restarts, workers_.size(),
                 std::chrono::duration<double, std::milli>(t_spawned - failure_seen_).count(), cleanup_ms, spawn_ms,
                 retiring ? fmt::format("; {} old worker(s) still stopping in the background", retiring)
                          : std::string());
  }
}

void Agent::on_signalfd() {
  bool child = false;
  std::vector<int> others;
  while (true) {
    signalfd_siginfo si{};
    ssize_t n = ::read(signal_fd_, &si, sizeof si);
    if (n != static_cast<ssize_t>(sizeof si)) break;
    if (static_cast<int>(si.ssi_signo) == SIGCHLD) {
      child = true;
    } else {
      others.push_back(static_cast<int>(si.ssi_signo));
    }
  }
  if (child) reap_children();
  for (int s : others) {
    if (done_) break;
    spdlog::warn("received {}: forwarding it to every worker's process group", signal_name(s));
    dispatch(SignalReceived{s});
  }
}

void Agent::reap_children() {
  while (true) {
    int st = 0;
    pid_t pid = ::waitpid(-1, &st, WNOHANG);
    if (pid <= 0) break;
    auto it = by_pid_.find(pid);
    if (it == by_pid_.end()) {
      if (auto d = dying_.find(pid); d != dying_.end()) {
        spdlog::debug("worker pid {} of an ended attempt reaped {:.1f} ms after its exit was seen", pid,
                      std::chrono::duration<double, std::milli>(Clock::now() - d->second).count());
        dying_.erase(d);
      } else {
        spdlog::debug("reaped descendant pid {}", pid);
      }
      continue;
    }
    Worker& w = *it->second;
    w.reaped = true;
    close_exit_watch(w);
    const WorkerStatus status = status_of_wait(st);
    if (w.exit_reported) {
      // Seen (and dispatched) as it began to exit; now it is gone.
      drain(w);
      spdlog::debug("worker r{} (pid {}) reaped {:.1f} ms after its exit was seen: {}", w.global_rank, pid,
                    std::chrono::duration<double, std::milli>(Clock::now() - w.ended).count(), status.describe());
      if (status != *w.status) {
        spdlog::warn("worker r{} (pid {}): exit status {} at the reap, {} when it began to exit", w.global_rank,
                     pid, status.describe(), w.status->describe());
      }
      const bool current = is_current(w);
      if (!current && !done_) on_retired_exit(w);  // may free `w`
      continue;
    }
    w.ended = Clock::now();
    w.ended_wall = WallClock::now();
    w.status = status;
    worker_ended(w);
  }
}

void Agent::setup_exit_watch() {
  if (!opts_.early_exit_watch) return;
  if (!kernel_reports_exit_early()) {
    spdlog::debug("early exit watch off: this kernel drops seccomp filters only at the reap (Linux < 6.11)");
    return;
  }
  exit_watch_ = true;
}

// The early exit watch fired: the worker (and whatever inherited its filter) is exiting. A
// non-zero status in /proc is final (the task is past the point of no return) and is acted on
// now, 15-30 ms before the reap; a clean exit (status 0, once stored: early_exit_status waits
// for that) waits for the reap.
void Agent::on_exit_watch(Worker& w) {
  close_exit_watch(w);
  if (w.reaped || w.exit_reported || done_) return;
  const bool current = is_current(w);
  if (!current) return;  // a retiring worker: its reap is soon enough
  const auto raw = early_exit_status(w.pid);
  if (!raw) return;
  w.exit_reported = true;
  w.ended = Clock::now();
  w.ended_wall = WallClock::now();
  w.status = status_of_wait(*raw);
  worker_ended(w);
}

void Agent::close_exit_watch(Worker& w) {
  if (w.exit_watch_fd < 0) return;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, w.exit_watch_fd, nullptr);
  by_exit_watch_fd_.erase(w.exit_watch_fd);
  ::close(w.exit_watch_fd);
  w.exit_watch_fd = -1;
}

// `w` ended with w.status (reaped, or seen by the exit watch): tell the state machine.
void Agent::worker_ended(Worker& w) {
  drain(w);  // its output is complete now (grandchildren aside), before anyone reads the tail
  spdlog::debug("worker r{} (pid {}) ended: {} after {:.1f} ms{}", w.global_rank, w.pid, w.status->describe(),
                std::chrono::duration<double, std::milli>(w.ended - w.started).count(),
                w.reaped ? "" : " (seen as it began to exit)");
  if (done_) return;
  // Not current: a retired worker of an earlier attempt (overlapped restart).
  const bool current = is_current(w);
  bool progressed = true;
  if (current && !w.status->success() && state_.phase() == AgentState::Phase::Running && store_ &&
      !opts_.multi_node()) {
    // Only the running attempt's first failure needs it (a round trip to the store's thread).
    // Every worker joined the store (PyTorch's clients and libddprun_worker add 1 to init/)?
    progressed = store_->counter("init/") >= layout_.world_size;
  }
  dispatch(WorkerExited{.local_rank = w.local_rank,
                        .status = *w.status,
                        .attempt_progressed = progressed,
                        .attempt = w.attempt});
  if (!current) on_retired_exit(w);  // may free `w`
}

void Agent::on_pipe(int fd) {
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return;
  auto [w, is_err] = it->second;
  read_stream(*w, is_err ? w->err : w->out, is_err, kReadChunk);
}

// Reads up to `budget` bytes; returns false at end of stream (and closes it).
bool Agent::read_stream(Worker& w, Stream& s, bool is_err, size_t budget) {
  char buf[kReadChunk];
  size_t total = 0;
  while (s.fd >= 0 && total < budget) {
    ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n > 0) {
      total += static_cast<size_t>(n);
      emit_lines(w, s, is_err, std::string_view(buf, static_cast<size_t>(n)), false);
      if (static_cast<size_t>(n) < sizeof buf) return true;  // nothing more right now
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    emit_lines(w, s, is_err, {}, true);
    close_stream(s);
    return false;
  }
  return s.fd >= 0;
}

void Agent::emit_lines(Worker& w, Stream& s, bool is_err, std::string_view data, bool eof) {
  if (s.log_fd >= 0 && !data.empty()) write_all(s.log_fd, data);
  std::vector<std::string> lines;
  s.splitter.feed(data, lines);
  std::string rest;
  if (eof && s.splitter.flush(rest)) lines.push_back(std::move(rest));
  if (lines.empty()) return;
  std::string console, filtered;
  const std::string prefix = console_prefix(layout_.node_rank, w.global_rank, opts_.multi_node());
  for (const auto& line : lines) {
    if (is_err) w.tail.push(line);
    if (s.filtered_fd >= 0 && s.filter.matches(line)) filtered += prefix + line + '\n';
    if (s.console) {
      console += prefix;
      console += line;
      console += '\n';
    }
  }
  if (!console.empty()) write_all(is_err ? 2 : 1, console);
  if (!filtered.empty()) write_all(s.filtered_fd, filtered);
}

void Agent::close_stream(Stream& s) {
  if (s.fd >= 0) {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, s.fd, nullptr);
    by_fd_.erase(s.fd);
    ::close(s.fd);
    s.fd = -1;
  }
  if (s.log_fd >= 0) {
    ::close(s.log_fd);
    s.log_fd = -1;
  }
  if (s.filtered_fd >= 0) {
    ::close(s.filtered_fd);
    s.filtered_fd = -1;
  }
}

void Agent::drain(Worker& w) {
  // Non-blocking: a grandchild may hold the pipe open; take what is there, bounded.
  read_stream(w, w.out, false, kMaxDrainBytes);
  read_stream(w, w.err, true, kMaxDrainBytes);
}

void Agent::signal_workers(int signo) {
  for (auto& w : workers_) {
    // The group outlives its leader while grandchildren remain, so signal it even then.
    if (signal_process_group(w->pid, signo)) {
      spdlog::debug("sent {} to process group {} (r{})", signal_name(signo), w->pid, w->global_rank);
    }
  }
}

void Agent::arm_timerfd(int fd, double seconds) {
  itimerspec spec{};
  if (seconds > 0) {
    auto ns = static_cast<long long>(seconds * 1e9);
    spec.it_value.tv_sec = static_cast<time_t>(ns / 1000000000LL);
    spec.it_value.tv_nsec = static_cast<long>(ns % 1000000000LL);
  }
  if (seconds > 0 && spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) spec.it_value.tv_nsec = 1;
  DDPRUN_CHECK_SYS(::timerfd_settime(fd, 0, &spec, nullptr));
}

void Agent::record_failure(const Action& a) {
  ++failures_seen_;
  Worker* w = nullptr;
  for (auto& x : workers_) {
    if (x->local_rank == a.local_rank) w = x.get();
  }
  if (!w) return;
  FailureDetails f;
  f.attempt = a.attempt;
  f.local_rank = w->local_rank;
  f.global_rank = w->global_rank;
  f.pid = w->pid;
  f.status = a.status;
  f.when = w->ended_wall;
  f.after_s = std::chrono::duration<double>(w->ended - w->started).count();
  f.tail = w->tail.lines();
  f.error_file = w->error_file;
  failure_seen_ = w->ended;
  std::ifstream in(w->error_file, std::ios::binary);
  if (in) {
    std::string content(kMaxErrorFileBytes, '\0');
    in.read(content.data(), static_cast<std::streamsize>(content.size()));
    content.resize(static_cast<size_t>(in.gcount()));
    f.error_file_content = std::move(content);
  }
  failure_ = std::move(f);
  if (rdzv_) rdzv_->report_local_failure(a.attempt);
  if (rdzv_client_) {
    rdzv::Message m;
    m.set("round", round_).set("global_rank", failure_->global_rank).set("local_rank", failure_->local_rank);
    if (a.status.signaled) m.set("signal", signal_name(a.status.code));
    else m.set("exit_code", a.status.code);
    std::string tail;
    for (const auto& line : failure_->tail) tail += line + "\n";
    m.set("stderr_tail", tail.size() > 8192 ? tail.substr(tail.size() - 8192) : tail);
    m.set("when", wall_time(failure_->when));
    try {
      rdzv_client_->report_failure(m);
    } catch (const rdzv::RendezvousError& e) {
      spdlog::error("{}", e.what());
    }
    spdlog::warn("worker r{} (local rank {}, pid {}) failed: {} after {:.2f} s; stopping the local group and "
                 "telling the other nodes",
                 w->global_rank, w->local_rank, w->pid, a.status.describe(), failure_->after_s);
    return;
  }
  if (a.will_restart) {
    spdlog::warn("worker r{} (local rank {}, pid {}) failed: {} after {:.2f} s; stopping the group "
                 "and restarting ({} of {} restarts left)",
                 w->global_rank, w->local_rank, w->pid, a.status.describe(), failure_->after_s,
                 opts_.max_restarts - a.attempt, opts_.max_restarts);
  } else {
    spdlog::warn("worker r{} (local rank {}, pid {}) failed: {} after {:.2f} s; stopping the group "
                 "(no restarts left)",
                 w->global_rank, w->local_rank, w->pid, a.status.describe(), failure_->after_s);
  }
}

void Agent::reap_leftovers(double seconds) {
  // Every child (workers and adopted orphans) is SIGKILLed by now or about to be; reap them,
  // bounded: something stuck in the kernel must not keep the agent.
  auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (has_children()) {
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
  for (auto& w : workers_) {
    close_stream(w->out);
    close_stream(w->err);
    close_exit_watch(*w);
  }
  for (auto& g : retiring_) {
    for (auto& w : g.workers) {
      close_stream(w->out);
      close_stream(w->err);
      close_exit_watch(*w);
    }
  }
  for (int* fd : {&epoll_fd_, &signal_fd_, &timer_fd_, &retire_timer_fd_, &stdin_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

std::string Agent::summary() const {
  std::ostringstream s;
  const std::string bar(72, '=');
  if (exit_code_ == 0) {
    if (failures_seen_ > 0) {
      spdlog::info("all {} workers succeeded after {} restart(s)", opts_.nproc_per_node, state_.attempt());
    }
    return "";
  }
  s << "[ddprun] " << bar << "\n";
  if (!job_failure_.empty()) s << "[ddprun] JOB FAILED: " << job_failure_ << "\n";
  if (auto sig = state_.stop_signal()) {
    s << "[ddprun] stopped by " << signal_name(*sig) << ": the workers were sent " << signal_name(*sig)
      << " (SIGKILL after " << opts_.shutdown_timeout_s << " s); exit code " << exit_code_ << "\n";
  }
  // A failure of an earlier attempt that was restarted is history, not the cause.
  if (failure_ && failure_->attempt == state_.attempt()) {
    const auto& f = *failure_;
    char host[256] = "?";
    ::gethostname(host, sizeof host - 1);
    s << "[ddprun] FAILED: worker rank " << f.global_rank << " (local rank " << f.local_rank
      << ", pid " << f.pid << ", host " << host << ") " << f.status.describe() << "\n";
    s << "[ddprun]   at " << wall_time(f.when) << ", " << std::fixed << std::setprecision(3) << f.after_s << " s after it started; attempt "
      << f.attempt << " (max_restarts " << opts_.max_restarts << "), run id " << layout_.run_id
      << ", exit code " << exit_code_ << "\n";
    if (f.tail.empty()) {
      s << "[ddprun]   (no stderr output)\n";
    } else {
      s << "[ddprun]   last " << f.tail.size() << " lines of its stderr:\n";
      for (const auto& line : f.tail) s << "    " << line << "\n";
    }
    if (auto hint = missing_module_hint(f.tail, interpreter_); !hint.empty()) s << "[ddprun]   " << hint << "\n";
    if (f.error_file_content) {
      s << "[ddprun]   error file " << f.error_file << ":\n";
      s << format_error_file(parse_error_file(*f.error_file_content)) << "\n";
    }
  } else if (!state_.stop_signal() && job_failure_.empty()) {
    s << "[ddprun] FAILED: exit code " << exit_code_ << " (see the errors above)\n";
  } else if (failure_) {
    s << "[ddprun]   (attempt " << failure_->attempt << " had failed: worker rank " << failure_->global_rank
      << " " << failure_->status.describe() << ")\n";
  }
  if (state_.deterministic_failure()) {
    s << "[ddprun]   not retried: attempts " << state_.attempt() - 1 << " and " << state_.attempt()
      << " both failed before every worker had joined the store (an import error or a bad path?)\n";
  }
  s << "[ddprun] " << bar << "\n";
  return s.str();
}

}  // namespace

int run(const LaunchOptions& opts, const EnvMap& env) {
  // _mt: the in-process store server logs from its own thread.
  auto logger = spdlog::stderr_logger_mt("ddprun");
  logger->set_pattern("[ddprun] %^%l%$: %v");
  logger->set_level(opts.verbosity > 0 ? spdlog::level::debug : spdlog::level::info);
  spdlog::set_default_logger(logger);
  Agent agent(opts, env);
  return agent.run();
}

}  // namespace ddprun::launcher
