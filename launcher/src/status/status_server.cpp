#include "status/status_server.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "platform/private_files.h"

namespace ddprun::launcher {

namespace {
double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string host_name() {
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  return host;
}
}  // namespace

StatusBoard::StatusBoard(std::string run_id, int max_restarts, std::shared_ptr<RankSampler> sampler)
    : sampler_(std::move(sampler)) {
  base_.run_id = std::move(run_id);
  base_.host = host_name();
  base_.agent_pid = ::getpid();
  base_.max_restarts = max_restarts;
  base_.state = "rendezvous";
}

void StatusBoard::joining() {
  std::lock_guard lock(mu_);
  base_.state = "rendezvous";
}

void StatusBoard::round(const std::string& run_id, int node_rank, int num_nodes, int max_restarts) {
  std::lock_guard lock(mu_);
  base_.run_id = run_id;
  base_.node_rank = node_rank;
  base_.num_nodes = num_nodes;
  base_.max_restarts = max_restarts;
}

void StatusBoard::attempt_started(int attempt, const std::vector<Worker>& workers) {
  std::lock_guard lock(mu_);
  base_.attempt = attempt;
  base_.state = "running";
  ranks_.clear();
  const auto now = Clock::now();
  for (const auto& w : workers) ranks_.push_back(Rank{w, "running", now, {}});
}

void StatusBoard::worker_ended(int local_rank, bool success) {
  std::lock_guard lock(mu_);
  for (auto& r : ranks_) {
    if (r.w.local_rank != local_rank || r.state != "running") continue;
    r.state = success ? "succeeded" : "failed";
    r.ended = Clock::now();
  }
}

void StatusBoard::failed(int global_rank, const std::string& what) {
  std::lock_guard lock(mu_);
  base_.last_failure_rank = global_rank;
  base_.last_failure = what;
  base_.state = "stopping";
}

AgentStatus StatusBoard::snapshot() {
  AgentStatus s;
  std::vector<Rank> ranks;
  {
    std::lock_guard lock(mu_);
    s = base_;
    ranks = ranks_;
  }
  const auto now = Clock::now();
  s.uptime_s = seconds(now - agent_started_);
  std::vector<RankSample> samples;
  for (const auto& r : ranks)
    samples.push_back(RankSample{.local_rank = r.w.local_rank,
                                 .global_rank = r.w.global_rank,
                                 .pid = r.state == "running" ? r.w.pid : -1});
  RankSampler::sample_proc(samples);
  if (sampler_) sampler_->sample_gpus(samples);
  std::lock_guard lock(mu_);  // last_cpu_ (two snapshots may run at once)
  std::map<pid_t, CpuSample> seen;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const Rank& r = ranks[i];
    const RankSample& x = samples[i];
    RankStatus rs;
    rs.rank = r.w.global_rank;
    rs.local_rank = r.w.local_rank;
    rs.pid = r.w.pid;
    rs.state = r.state;
    rs.uptime_s = seconds((r.state == "running" ? now : r.ended) - r.started);
    rs.rss_bytes = x.rss_bytes;
    if (x.cpu_seconds) {
      // Over the interval since the previous snapshot; the first one: since the worker's process
      // started. A snapshot too soon after the previous one keeps that one as its base.
      auto prev = last_cpu_.find(r.w.pid);
      const bool fresh = prev == last_cpu_.end();
      rs.cpu_percent =
          fresh ? cpu_percent(0, *x.cpu_seconds, first_cpu_window_s(rs.uptime_s, RankSampler::process_age_s(r.w.pid)))
                : cpu_percent(prev->second.cpu_s, *x.cpu_seconds, seconds(now - prev->second.at));
      const bool too_soon = !fresh && seconds(now - prev->second.at) < kMinCpuWindowS;
      seen[r.w.pid] = too_soon ? prev->second : CpuSample{*x.cpu_seconds, now};
    }
    rs.gpu_index = x.gpu_index;
    if (x.gpu_utilization) rs.gpu_utilization_percent = *x.gpu_utilization * 100.0;
    rs.gpu_memory_bytes = x.gpu_memory_bytes;
    s.ranks.push_back(std::move(rs));
  }
  last_cpu_ = std::move(seen);
  return s;
}

std::string status_dir(const EnvMap& env) { return runtime_dir(env); }

std::string StatusBoard::publish_if_due() {
  {
    std::lock_guard lock(mu_);
    const auto now = Clock::now();
    if (last_publish_ && now - *last_publish_ < kPublishEvery) return "";
    last_publish_ = now;
  }
  return status_to_json(snapshot());
}

std::unique_ptr<StatusSocket> StatusSocket::start(StatusBoard& board, const std::string& wanted, std::string* why) {
  std::string dir;
  if (!ensure_private_dir(wanted, /*make_parents=*/false, &dir, why)) return nullptr;
  const std::string path = dir + "/" + std::to_string(::getpid()) + ".sock";
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    *why = path + " is longer than a unix socket path may be (" + std::to_string(sizeof addr.sun_path - 1) +
           " bytes): set XDG_RUNTIME_DIR to a shorter directory";
    return nullptr;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *why = std::string("socket(AF_UNIX): ") + std::strerror(errno);
    return nullptr;
  }
  ::unlink(path.c_str());  // a stale socket of an earlier process with this pid
  // The directory is 0700, so nobody else reaches the socket before its chmod either.
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 || ::chmod(path.c_str(), 0600) != 0 ||
      ::listen(fd, 16) != 0) {
    *why = "cannot listen on " + path + ": " + std::strerror(errno);
    ::close(fd);
    ::unlink(path.c_str());
    return nullptr;
  }
  const int stop = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop < 0) {
    *why = std::string("eventfd: ") + std::strerror(errno);
    ::close(fd);
    ::unlink(path.c_str());
    return nullptr;
  }
  std::unique_ptr<StatusSocket> s(new StatusSocket(board, path, fd, stop));
  s->thread_ = std::thread([p = s.get()] { p->serve(); });
  return s;
}

StatusSocket::StatusSocket(StatusBoard& board, std::string path, int listen_fd, int stop_fd)
    : board_(board), path_(std::move(path)), listen_fd_(listen_fd), stop_fd_(stop_fd) {}

StatusSocket::~StatusSocket() {
  const uint64_t one = 1;
  if (::write(stop_fd_, &one, sizeof one) < 0) {
    // An eventfd write fails only on overflow, which one write cannot reach.
  }
  if (thread_.joinable()) thread_.join();
  ::unlink(path_.c_str());
  ::close(listen_fd_);
  ::close(stop_fd_);
}

void StatusSocket::serve() {
  // The agent's signals are its loop's (a signalfd): this thread takes none of them.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  while (true) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;  // EAGAIN, a peer that went away, EMFILE: the next one may do
    answer(c);
    ::close(c);
  }
}

void StatusSocket::answer(int fd) {
  // Bounded: a client that does not read cannot hold this thread.
  timeval tv{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  ucred peer{};
  socklen_t len = sizeof peer;
  std::string text;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.uid != ::geteuid()) {
    text = "refused: this ddprun agent (pid " + std::to_string(::getpid()) + ") answers only its own user (uid " +
           std::to_string(::geteuid()) + ")\n";
  } else {
    text = status_to_json(board_.snapshot()) + "\n";
  }
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::send(fd, text.data() + off, text.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

}  // namespace ddprun::launcher
