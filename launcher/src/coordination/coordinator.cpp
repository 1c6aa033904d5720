// Both coordinators (coordinator.h) and the one translation of server messages into notices.
#include "ddprun/launcher/coordinator.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <atomic>
#include <deque>
#include <system_error>

#include <spdlog/spdlog.h>

#include "ddprun/client/net.h"
#include "ddprun/rdzv/fixed_port_stores.h"
#include "ddprun/rdzv/rendezvous_client.h"
#include "ddprun/rdzv/round_state.h"
#include "ddprun/rdzv/validate.h"
#include "ddprun/server/store_server.h"
#include "coordination/store_hosting.h"
#include "platform/sys_util.h"

namespace ddprun::launcher {

std::optional<Notice> notice_of(const rdzv::Message& m, const rdzv::Join& settings, const std::string& store_host) {
  using rdzv::MsgType;
  Notice n;
  switch (m.type) {
    case MsgType::Round: {
      const auto r = rdzv::from_message<rdzv::Round>(m);
      if (auto why = rdzv::check_round(r, settings.local_world_size)) {
        n.kind = Notice::Kind::JobFailed;
        n.failed.reason = *why;
        return n;
      }
      n.kind = Notice::Kind::Round;
      n.layout.node_rank = static_cast<int>(r.node_rank);
      n.layout.num_nodes = static_cast<int>(r.nnodes);
      n.layout.local_world_size = static_cast<int>(settings.local_world_size);
      n.layout.world_size = static_cast<int>(r.world_size);
      n.layout.global_rank_base = static_cast<int>(r.base_rank);
      // Node rank 0's agent hosts the workers' store when the server says so.
      n.layout.store_host = r.store_host.empty() ? store_host : r.store_host;
      n.layout.store_port = static_cast<uint16_t>(r.store_port);
      n.layout.run_id = settings.run_id;
      n.layout.restart_count = static_cast<int>(r.restart_count);
      n.round = r.round;
      n.max_restarts = static_cast<int>(r.max_restarts);
      return n;
    }
    case MsgType::Restart:
      n.kind = Notice::Kind::Restart;
      n.restart = rdzv::from_message<rdzv::Restart>(m);
      n.restart.reason = rdzv::printable(n.restart.reason, rdzv::kMaxReasonLen);
      return n;
    case MsgType::JobDone:
      n.kind = Notice::Kind::JobDone;
      return n;
    case MsgType::JobFailed:
      n.kind = Notice::Kind::JobFailed;
      // The server's words, and a failure another node reported: printed on this console.
      n.failed = rdzv::from_message<rdzv::JobFailed>(m);
      n.failed.reason = rdzv::printable(n.failed.reason, rdzv::kMaxReasonLen);
      if (n.failed.first_failure) n.failed.first_failure = rdzv::sanitized(*n.failed.first_failure);
      return n;
    case MsgType::Error:
      n.kind = Notice::Kind::JobFailed;
      n.failed.reason = rdzv::printable(rdzv::from_message<rdzv::Error>(m).message, rdzv::kMaxReasonLen);
      return n;
    default:
      return std::nullopt;
  }
}

namespace {

// One node's rounds: the agent's own store server holds the workers' store, by the same
// fixed-port rule as the server's (rdzv/fixed_port_stores.h): its main keyspace, emptied for
// every round, on the port the workers were told.
class LocalStores final : public rdzv::WorkerStores, rdzv::MainKeyspace {
 public:
  explicit LocalStores(server::StoreServer& s) : store_(s) {}
  uint16_t open(const std::string& run_id, int64_t round, bool) override { return rounds_.open(run_id, round); }
  void close(const std::string& run_id, int64_t round) override { rounds_.close(run_id, round); }
  bool progressed(const std::string& run_id, int64_t round, int64_t world_size) override {
    return rounds_.progressed(run_id, round, world_size).value_or(false);
  }

 private:
  void reset() override { store_.reset_keyspace(); }
  std::optional<int64_t> integer(const std::string& key) override {
    const int64_t v = store_.counter(key);
    return v < 0 ? std::nullopt : std::optional<int64_t>(v);
  }
  uint16_t port() const override { return store_.port(); }

  server::StoreServer& store_;
  rdzv::FixedPortStores rounds_{*this};
};

class LocalCoordinator final : public Coordinator {
 public:
  LocalCoordinator(server::StoreServer& store, rdzv::Join settings, std::string store_host)
      : stores_(store), settings_(std::move(settings)), store_host_(std::move(store_host)) {
    char hostname[256] = "";
    ::gethostname(hostname, sizeof hostname - 1);
    settings_.host = store_host_;
    settings_.node_id = hostname;
    efd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (efd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
  }
  ~LocalCoordinator() override { ::close(efd_); }

  void join() override { feed(rdzv::to_message(settings_)); }
  void report_failure(rdzv::Failure f) override {
    f.round = round_;
    feed(rdzv::to_message(f));
  }
  void report_success() override { feed(rdzv::to_message(rdzv::Succeeded{.round = round_})); }
  int fd() const override { return efd_; }
  std::vector<Notice> take_notices() override {
    uint64_t v = 0;
    while (::read(efd_, &v, sizeof v) > 0) {
    }
    std::vector<Notice> out;
    for (; !queue_.empty(); queue_.pop_front()) {
      if (auto n = notice_of(queue_.front(), settings_, store_host_)) {
        if (n->kind == Notice::Kind::Round) round_ = n->round;
        out.push_back(std::move(*n));
      }
    }
    return out;
  }
  void leave() override {
    if (!left_) feed(rdzv::to_message(rdzv::Leave{}));
    left_ = true;
  }
  std::string node_address() const override { return store_host_; }

 private:
  static constexpr rdzv::ConnId kSelf = 1;
  // The round answers at once; the answers wait for the agent's loop (never re-entered).
  void feed(const rdzv::Message& m) {
    out_.clear();
    round_state_.on_message(kSelf, m, rdzv::Clock::now(), out_);
    for (auto& o : out_) queue_.push_back(std::move(o.msg));
    if (!out_.empty()) {
      const uint64_t one = 1;
      [[maybe_unused]] auto n = ::write(efd_, &one, sizeof one);
    }
  }

  LocalStores stores_;
  rdzv::RoundState round_state_{stores_};
  rdzv::Join settings_;
  std::string store_host_;
  int efd_ = -1;
  std::vector<rdzv::Outbound> out_;
  std::deque<rdzv::Message> queue_;
  int64_t round_ = -1;
  bool left_ = false;
};

// Many nodes: a client of the rendezvous server. fd() is an epoll set of its own around the
// client's socket, so the agent's loop keeps watching one descriptor when the connection is
// replaced (a reconnect to a standing ddprund that restarted).
class RemoteCoordinator final : public Coordinator {
 public:
  explicit RemoteCoordinator(RemoteCoordinatorOptions o)
      : host_(o.host),
        port_(o.port),
        heartbeat_(o.heartbeat_interval),
        interrupted_(o.interrupted),
        token_(o.token),
        client_(connect(o.host, o.port, o.connect_timeout, o.heartbeat_interval, o.interrupted, o.token)),
        settings_(std::move(o.settings)),
        store_host_(o.host == "localhost" ? "127.0.0.1" : o.host) {
    char hostname[256] = "";
    ::gethostname(hostname, sizeof hostname - 1);
    settings_.host = !o.advertise.empty() ? o.advertise : client::local_address_of(client_->fd());
    settings_.node_id = std::string(hostname) + "_" + settings_.host + "_" + std::to_string(::getpid());
    epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) throw std::system_error(errno, std::generic_category(), "epoll_create1");
    for (int* t : {&progress_timer_, &retry_timer_}) {
      *t = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
      if (*t < 0) throw std::system_error(errno, std::generic_category(), "timerfd_create");
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = *t;
      if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, *t, &ev) != 0)
        throw std::system_error(errno, std::generic_category(), "epoll_ctl");
    }
    standing_ = client_->server_standing();
    watch();
  }
  ~RemoteCoordinator() override {
    client_.reset();
    store_.reset();
    ::close(progress_timer_);
    ::close(retry_timer_);
    ::close(epfd_);
  }

  void join() override {
    running_ = false;
    join_pending_ = true;
    pending_failure_.reset();
    stop_hosting();
    store_.reset();  // the last round's store goes with it; a new one per round, on a new port
    settings_.store_offer_port = 0;
    if (standing_ && !settings_.fixed_store_port) offer_store();
    if (reconnecting_) return;  // sent once connected again (finish_reconnect)
    guard([&] { client_->send_join(settings_); });
  }
  void report_failure(rdzv::Failure f) override {
    f.round = round_;
    check_progress();  // the server weighs the failure by it: it goes first
    pending_failure_ = f;
    send_or_queue("the failure report", [&] { client_->report_failure(f); });
  }
  void report_success() override {
    succeeded_ = true;
    send_or_queue("the success report", [&] { client_->report_success(round_); });
  }
  int fd() const override { return epfd_; }
  std::vector<Notice> take_notices() override {
    std::vector<Notice> out;
    uint64_t expirations = 0;
    while (::read(progress_timer_, &expirations, sizeof expirations) > 0) {
    }
    check_progress();
    if (reconnecting_) {
      const bool due = ::read(retry_timer_, &expirations, sizeof expirations) > 0;
      if (!due || !try_reconnect()) return out;
    }
    if (!client_) throw CoordinatorError("no connection to the rendezvous server at " + host_ + ":" + std::to_string(port_));
    try {
      while (auto m = client_->poll()) {
        if (auto n = notice_of(*m, settings_, store_host_)) {
          join_pending_ = false;
          pending_failure_.reset();
          if (n->kind == Notice::Kind::Round) {
            round_ = n->round;
            last_round_ = rdzv::from_message<rdzv::Round>(*m);
            running_ = true;
            succeeded_ = false;
            on_round();
          } else {
            running_ = false;  // RESTART, JOB_DONE, JOB_FAILED: nothing to resume
            stop_hosting();
          }
          out.push_back(std::move(*n));
        }
      }
      report_rejected();
    } catch (const rdzv::RendezvousError& e) {
      // The server's last word (an ERROR, JOB_FAILED) comes before its close: deliver it; the
      // closed connection stays readable and is reported on the next call.
      if (!out.empty()) return out;
      if (client_->server_standing() && (running_ || join_pending_)) {
        start_reconnect(e.what());
        return out;
      }
      throw CoordinatorError(std::string(e.what()) +
                             (client_->server_standing()
                                  ? std::string(" (the standing rendezvous server went away after the job ended)")
                                  : std::string(" (the node hosting the rendezvous is gone: its agent ended or "
                                                "crashed; a standing ddprund as --rdzv_endpoint outlives any agent)")));
    }
    return out;
  }
  void leave() override {
    if (client_) client_->leave();
  }
  std::string node_address() const override { return settings_.host; }

 private:
  static std::unique_ptr<rdzv::RendezvousClient> connect(const std::string& host, uint16_t port,
                                                         std::chrono::milliseconds timeout,
                                                         std::chrono::milliseconds heartbeat,
                                                         const std::function<bool()>& interrupted,
                                                         const rdzv::AgentCredentials& token) {
    try {
      return std::make_unique<rdzv::RendezvousClient>(host, port, timeout, heartbeat, interrupted, token);
    } catch (const rdzv::RendezvousInterrupted& e) {
      throw CoordinatorInterrupted(e.what());
    } catch (const rdzv::RendezvousError& e) {
      throw CoordinatorError(e.what());
    }
  }

  // A standing server may restart while the round runs; the workers' store must not go with
  // it (PyTorch's TCPStore clients do not reconnect). So every JOIN offers a store of this
  // agent's own, bound but not yet accepting: if the round makes this node rank 0, it hosts the
  // round's workers' store (round_state.h "Agent-hosted stores"). Any failure to open one just
  // leaves the store to the server.
  void offer_store() {
    try {
      StoreHosting h;
      h.listen_host = "";  // every address: the workers of every node reach it at this node's
      h.io_threads = 0;    // the whole job's workers may connect to it
      h.restrict_main_store = true;
      h.accept_later = true;  // a worker that comes before the round's peers are known retries
      auto st = host_store(h);
      settings_.store_offer_port = st->port();
      store_ = std::move(st);
    } catch (const std::exception& e) {
      spdlog::warn("cannot open a workers' store on this node ({}); the rendezvous server keeps it", e.what());
      settings_.store_offer_port = 0;
    }
  }

  // A ROUND came: host its workers' store when it names this node's, else drop the offer.
  void on_round() {
    const rdzv::Round& r = last_round_;
    const bool ours = !r.store_host.empty() && r.node_rank == 0;
    if (!ours || !store_) {
      store_.reset();
      if (ours) throw CoordinatorError("the rendezvous server made this node host the workers' store of round " +
                                       std::to_string(r.round) + ", but it offered none");
      return;
    }
    if (r.store_port != store_->port())
      throw CoordinatorError("the rendezvous server named port " + std::to_string(r.store_port) +
                             " for this node's workers' store, which is on port " + std::to_string(store_->port()));
    std::vector<std::string> peers;
    for (size_t i = 0; i <= r.store_peers.size();) {
      const size_t j = std::min(r.store_peers.find(',', i), r.store_peers.size());
      if (j > i) peers.push_back(r.store_peers.substr(i, j - i));
      i = j + 1;
    }
    for (const auto& name : store_->set_store_peers(peers))
      spdlog::debug("workers' store: {} is no IP address; its clients come through another address", name);
    try {
      store_->accept_clients();
    } catch (const std::exception& e) {
      throw CoordinatorError(std::string("cannot serve the workers' store of round ") + std::to_string(r.round) + ": " +
                             e.what());
    }
    hosting_ = true;
    progress_sent_ = false;
    itimerspec its{};
    its.it_interval.tv_nsec = its.it_value.tv_nsec = kProgressPoll.count() * 1000000;
    ::timerfd_settime(progress_timer_, 0, &its, nullptr);
    spdlog::info("this node hosts the workers' store of round {} on port {} ({} workers)", r.round, r.store_port,
                 r.world_size);
  }

  void stop_hosting() {
    if (!hosting_) return;
    hosting_ = false;
    itimerspec off{};
    ::timerfd_settime(progress_timer_, 0, &off, nullptr);
  }

  // Hosting the store: once every worker joined it (the progress rule of
  // fixed_port_stores.h), tell the server, which weighs failures by it.
  void check_progress() {
    if (!hosting_ || progress_sent_ || !store_) return;
    const int64_t joined = store_->counter(rdzv::kWorkerJoinKey);
    if (!rdzv::all_workers_joined(joined < 0 ? std::nullopt : std::optional<int64_t>(joined), last_round_.world_size))
      return;
    progress_sent_ = true;
    itimerspec off{};
    ::timerfd_settime(progress_timer_, 0, &off, nullptr);
    if (!client_) return;  // the re-join carries it
    try {
      client_->report_progress(last_round_.round);
    } catch (const rdzv::RendezvousError&) {
      // The server went: the re-join after the reconnect says it (Join::resume_progressed).
    }
  }

  // A report to a standing server that went away meanwhile is not lost: the connection's end
  // shows next (take_notices), and the re-join carries it (SUCCEEDED as resume_succeeded, a
  // FAILURE sent again after the JOIN).
  template <class F>
  void send_or_queue(const char* what, F&& f) {
    if (reconnecting_) return;  // the re-join carries it
    if (client_ && client_->server_standing()) {
      try {
        f();
      } catch (const rdzv::RendezvousError& e) {
        spdlog::warn("{} did not reach the standing rendezvous server ({}); it is sent again after the reconnect", what,
                     e.what());
      }
      return;
    }
    guard(std::forward<F>(f));
  }

  void watch() {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = client_->fd();
    if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, client_->fd(), &ev) != 0)
      throw std::system_error(errno, std::generic_category(), "epoll_ctl");
  }

  // The standing server went away while this node's workers run (or while it joins):
  // reconnect, with backoff (50 ms doubling to 500 ms), for at most the join timeout, then
  // re-join the running round, which the server rebuilds from the agents' re-joins. Between
  // attempts the agent's loop runs on (retry_timer_ in epfd_ wakes it for the next one), so
  // worker output and exits, signals and reports are handled meanwhile; a failure or success
  // reported in between is carried by the re-join.
  void start_reconnect(const std::string& why) {
    const auto timeout = std::chrono::milliseconds(settings_.join_timeout_ms);
    const std::string where = host_ + ":" + std::to_string(port_);
    if (running_)
      spdlog::warn("lost the standing rendezvous server at {} ({}) while round {} runs: reconnecting for up to {} s; "
                   "the workers keep running",
                   where, why, round_, timeout.count() / 1000);
    else
      spdlog::warn("lost the standing rendezvous server at {} ({}) while joining: reconnecting for up to {} s", where,
                   why, timeout.count() / 1000);
    client_.reset();  // its socket leaves the epoll set as it closes
    reconnecting_ = true;
    lost_why_ = why;
    reconnect_t0_ = std::chrono::steady_clock::now();
    reconnect_deadline_ = reconnect_t0_ + timeout;
    backoff_ = std::chrono::milliseconds(50);
    arm_retry(std::chrono::milliseconds(0));
  }

  void arm_retry(std::chrono::milliseconds after) {
    arm_timerfd(retry_timer_, std::max(1e-9, std::chrono::duration<double>(after).count()));
  }

  // One connect attempt, bounded by kReconnectAttempt, then the handshake when something
  // answers, bounded by the client's kHandshakeTimeout and by the reconnect time left. True
  // once connected and re-joined; false: the next attempt is armed.
  bool try_reconnect() {
    using Clock = std::chrono::steady_clock;
    const std::string where = host_ + ":" + std::to_string(port_);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(reconnect_deadline_ - Clock::now());
    std::string failed;
    try {
      if (left.count() <= 0) throw rdzv::RendezvousError("no time left");
      client_ = connect_within_budget(std::min(left, kReconnectAttempt));
    } catch (const rdzv::RendezvousError& e) {
      // A daemon still dying (its backlog accepts, then resets) or not listening yet: again.
      // A refusal too (an ERROR, a wrong or replayed proof): nothing there proved the token,
      // so it is not the server yet (anyone may answer on its port while it is down), and only
      // the authenticated server can end the job. The deadline's error names the last one.
      failed = e.what();
    }
    if (!client_) {
      if (Clock::now() + backoff_ >= reconnect_deadline_)
        throw CoordinatorError("lost the standing rendezvous server at " + where + " (" + lost_why_ +
                               ") and it did not come back within " +
                               std::to_string(settings_.join_timeout_ms / 1000) + " s (last attempt: " + failed +
                               "); the job's rounds lived there");
      arm_retry(backoff_);
      backoff_ = std::min(backoff_ * 2, std::chrono::milliseconds(500));
      return false;
    }
    reconnecting_ = false;
    standing_ = client_->server_standing();
    watch();
    finish_reconnect(where, std::chrono::duration<double>(Clock::now() - reconnect_t0_).count());
    return true;
  }

  // A client connected within `connect_timeout`, whose handshake gives up once the reconnect
  // deadline passes (the client asks `interrupted` every 100 ms while it waits for the
  // server's answers). Throws rdzv::RendezvousError, or CoordinatorInterrupted for a stop.
  std::unique_ptr<rdzv::RendezvousClient> connect_within_budget(std::chrono::milliseconds connect_timeout) {
    // Only while connecting: afterwards the client asks it before its sends, which the
    // deadline has nothing to do with.
    auto connecting = std::make_shared<std::atomic<bool>>(true);
    auto budget_spent = std::make_shared<std::atomic<bool>>(false);
    auto interrupted = [user = interrupted_, connecting, budget_spent, deadline = reconnect_deadline_] {
      if (user && user()) return true;
      if (!*connecting || std::chrono::steady_clock::now() < deadline) return false;
      *budget_spent = true;
      return true;
    };
    try {
      auto c = std::make_unique<rdzv::RendezvousClient>(host_, port_, connect_timeout, heartbeat_, interrupted, token_);
      *connecting = false;
      return c;
    } catch (const rdzv::RendezvousInterrupted& e) {
      if (!*budget_spent) throw CoordinatorInterrupted(e.what());
      throw rdzv::RendezvousError("no answer to the handshake before the reconnect time ran out");
    }
  }

  void finish_reconnect(const std::string& where, double took_s) {
    if (!running_) {
      // It was gathering a round: join again from scratch (the new server knows nothing).
      guard([&] { client_->send_join(settings_); });
      spdlog::info("reconnected to the rendezvous server at {} after {:.1f} s; joining again", where, took_s);
      return;
    }
    rdzv::Join resume = settings_;
    resume.resume_round = last_round_.round;
    resume.resume_restart_count = last_round_.restart_count;
    resume.resume_node_rank = last_round_.node_rank;
    resume.resume_nnodes = last_round_.nnodes;
    resume.resume_store_port = last_round_.store_port;
    resume.resume_succeeded = succeeded_;
    resume.resume_store_host = last_round_.store_host;
    resume.resume_progressed = hosting_ && progress_sent_;
    guard([&] { client_->send_join(resume); });
    spdlog::info("reconnected to the rendezvous server at {} after {:.1f} s; re-joined round {} (node rank {} of {})",
                 where, took_s, round_, last_round_.node_rank, last_round_.nnodes);
    if (pending_failure_) {
      // It may never have reached the server that went: the new one holds it until the round
      // is whole again (round_state.h "Resume").
      guard([&] { client_->report_failure(*pending_failure_); });
      spdlog::info("sent the failure report of round {} again", round_);
    }
  }

  // Messages the server did not send (a relay's: rdzv/session_mac.h) were dropped: say so, at
  // the 1st, 10th, 100th, ... so a flood of them cannot flood the console.
  void report_rejected() {
    const uint64_t n = client_->rejected();
    if (n == 0 || n < next_rejected_report_) return;
    next_rejected_report_ = n * 10;
    spdlog::warn("dropped {} message(s) on the connection to the rendezvous server at {}:{} that the server did not "
                 "send (last: {}); something on the path is tampering with it, the job goes on",
                 n, host_, port_, client_->last_rejected());
  }

  template <class F>
  void guard(F&& f) {
    if (!client_) throw CoordinatorError("no connection to the rendezvous server at " + host_ + ":" + std::to_string(port_));
    try {
      f();
    } catch (const rdzv::RendezvousError& e) {
      throw CoordinatorError(e.what());
    }
  }

  std::string host_;
  uint16_t port_;
  std::chrono::milliseconds heartbeat_;
  std::function<bool()> interrupted_;
  rdzv::AgentCredentials token_;
  uint64_t next_rejected_report_ = 1;
  std::unique_ptr<rdzv::RendezvousClient> client_;
  rdzv::Join settings_;
  std::string store_host_;
  int epfd_ = -1;
  int64_t round_ = -1;
  rdzv::Round last_round_;
  bool running_ = false;    // a ROUND came and no RESTART/JOB_* since: a round to resume
  bool join_pending_ = false;  // a JOIN went out and no answer came yet
  bool succeeded_ = false;  // SUCCEEDED was sent for it
  // This node's offered store (Join::store_offer_port): kept for the round when it hosts it.
  std::unique_ptr<server::StoreServer> store_;
  bool hosting_ = false;        // store_ is the current round's workers' store
  bool progress_sent_ = false;  // every worker joined it (PROGRESS sent or owed to a re-join)
  int progress_timer_ = -1;     // in epfd_: polls the store's join counter while hosting
  int retry_timer_ = -1;        // in epfd_: the next reconnect attempt is due
  bool standing_ = false;       // the server said it is a standing one (worth reconnecting to)
  bool reconnecting_ = false;   // client_ is gone; attempts run from take_notices
  std::string lost_why_;
  std::chrono::steady_clock::time_point reconnect_t0_, reconnect_deadline_;
  std::chrono::milliseconds backoff_{50};
  static constexpr std::chrono::milliseconds kReconnectAttempt{250};
  static constexpr std::chrono::milliseconds kProgressPoll{50};
  std::optional<rdzv::Failure> pending_failure_;  // this round's FAILURE, sent again after a re-join
};

}  // namespace

std::unique_ptr<Coordinator> make_local_coordinator(server::StoreServer& store, rdzv::Join settings,
                                                    std::string store_host) {
  return std::make_unique<LocalCoordinator>(store, std::move(settings), std::move(store_host));
}

std::unique_ptr<Coordinator> make_remote_coordinator(RemoteCoordinatorOptions options) {
  return std::make_unique<RemoteCoordinator>(std::move(options));
}

}  // namespace ddprun::launcher
