// The remote coordinator (coordinator.h): the seam over a rendezvous client. Reconnecting to a
// standing server is the Reconnector's (reconnector.h); the workers' store offered to and
// hosted for a standing server is the RoundStoreHost's (round_store.h).
#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <system_error>

#include <spdlog/spdlog.h>

#include "coordination/reconnector.h"
#include "coordination/round_store.h"
#include "ddprun/client/net.h"
#include "ddprun/launcher/coordinator.h"
#include "ddprun/rdzv/rendezvous_client.h"

namespace ddprun::launcher {

namespace {

int make_epoll() {
  const int fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "epoll_create1");
  return fd;
}

// Many nodes: a client of the rendezvous server. fd() is an epoll set of its own around the
// client's socket and the timers of its parts, so the agent's loop keeps watching one descriptor
// when the connection is replaced (a reconnect to a standing ddprund that restarted).
class RemoteCoordinator final : public Coordinator {
 public:
  explicit RemoteCoordinator(RemoteCoordinatorOptions o)
      : endpoint_{o.host, o.port, o.heartbeat_interval, o.interrupted, o.token, o.status_source},
        client_(connect_rendezvous(endpoint_, o.connect_timeout)),
        settings_(std::move(o.settings)),
        store_host_(o.host == "localhost" ? "127.0.0.1" : o.host),
        epfd_(make_epoll()),
        reconnector_(endpoint_, epfd_),
        stores_(epfd_) {
    char hostname[256] = "";
    ::gethostname(hostname, sizeof hostname - 1);
    settings_.host = !o.advertise.empty() ? o.advertise : client::local_address_of(client_->fd());
    settings_.node_id = std::string(hostname) + "_" + settings_.host + "_" + std::to_string(::getpid());
    standing_ = client_->server_standing();
    watch();
  }
  ~RemoteCoordinator() override { client_.reset(); }

  void join() override {
    running_ = false;
    join_pending_ = true;
    pending_failure_.reset();
    // The last round's store goes with it; a new one per round, on a new port.
    const bool offer = standing_ && !settings_.fixed_store_port;
    settings_.store_offer_port = offer ? stores_.offer() : 0;
    if (!offer) stores_.drop();
    if (reconnector_.active()) return;  // sent once connected again (finish_reconnect)
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
  int fd() const override { return epfd_.fd; }
  std::vector<Notice> take_notices() override;
  void leave() override {
    if (client_) client_->leave();
  }
  std::string node_address() const override { return settings_.host; }

 private:
  struct Fd {
    int fd;
    ~Fd() { ::close(fd); }
    operator int() const { return fd; }
  };

  void on_message(const rdzv::Message& m, Notice& n);
  std::vector<Notice> lost(const rdzv::RendezvousError& e, std::vector<Notice> out);
  void check_progress();
  template <class F>
  void send_or_queue(const char* what, F&& f);
  void watch();
  void finish_reconnect();
  void report_rejected();
  template <class F>
  void guard(F&& f);

  RendezvousEndpoint endpoint_;
  std::unique_ptr<rdzv::RendezvousClient> client_;
  rdzv::Join settings_;
  std::string store_host_;
  Fd epfd_;
  Reconnector reconnector_;
  RoundStoreHost stores_;
  uint64_t next_rejected_report_ = 1;
  int64_t round_ = -1;
  rdzv::Round last_round_;
  bool running_ = false;       // a ROUND came and no RESTART/JOB_* since: a round to resume
  bool join_pending_ = false;  // a JOIN went out and no answer came yet
  bool succeeded_ = false;     // SUCCEEDED was sent for it
  bool standing_ = false;      // the server said it is a standing one (worth reconnecting to)
  std::optional<rdzv::Failure> pending_failure_;  // this round's FAILURE, sent again after a re-join
};

std::vector<Notice> RemoteCoordinator::take_notices() {
  std::vector<Notice> out;
  check_progress();
  if (reconnector_.active()) {
    client_ = reconnector_.attempt();
    if (!client_) return out;
    standing_ = client_->server_standing();
    watch();
    finish_reconnect();
  }
  if (!client_) throw CoordinatorError("no connection to the rendezvous server at " + endpoint_.where());
  try {
    while (auto m = client_->poll()) {
      if (auto n = notice_of(*m, settings_, store_host_)) {
        on_message(*m, *n);
        out.push_back(std::move(*n));
      }
    }
    report_rejected();
  } catch (const rdzv::RendezvousError& e) {
    return lost(e, std::move(out));
  }
  return out;
}

void RemoteCoordinator::on_message(const rdzv::Message& m, Notice& n) {
  join_pending_ = false;
  pending_failure_.reset();
  if (n.kind == Notice::Kind::Round) {
    round_ = n.round;
    last_round_ = rdzv::from_message<rdzv::Round>(m);
    running_ = true;
    succeeded_ = false;
    stores_.on_round(last_round_);
  } else {
    running_ = false;  // RESTART, JOB_DONE, JOB_FAILED: nothing to resume
    stores_.stop_hosting();
  }
}

// The connection ended. The server's last word (an ERROR, JOB_FAILED) comes before its close:
// deliver it; the closed connection stays readable and is reported on the next call. A
// standing server that went while a round runs or a JOIN waits: reconnect, the workers keep
// running (reconnector.h), and a failure or success reported meanwhile is carried by the
// re-join.
std::vector<Notice> RemoteCoordinator::lost(const rdzv::RendezvousError& e, std::vector<Notice> out) {
  if (!out.empty()) return out;
  if (!client_->server_standing() || !(running_ || join_pending_))
    throw CoordinatorError(std::string(e.what()) +
                           (client_->server_standing()
                                ? std::string(" (the standing rendezvous server went away after the job ended)")
                                : std::string(" (the node hosting the rendezvous is gone: its agent ended or "
                                              "crashed; a standing ddprund as --rdzv_endpoint outlives any agent)")));
  const auto budget = std::chrono::milliseconds(settings_.join_timeout_ms);
  if (running_)
    spdlog::warn("lost the standing rendezvous server at {} ({}) while round {} runs: reconnecting for up to {} s; "
                 "the workers keep running",
                 endpoint_.where(), e.what(), round_, budget.count() / 1000);
  else
    spdlog::warn("lost the standing rendezvous server at {} ({}) while joining: reconnecting for up to {} s",
                 endpoint_.where(), e.what(), budget.count() / 1000);
  client_.reset();  // its socket leaves the epoll set as it closes
  reconnector_.start(e.what(), budget);
  return out;
}

// Hosting the round's store: once every worker joined it, tell the server (a re-join says it
// when the server is away: Join::resume_progressed).
void RemoteCoordinator::check_progress() {
  if (!stores_.take_progress() || !client_) return;
  try {
    client_->report_progress(last_round_.round);
  } catch (const rdzv::RendezvousError&) {
    // The server went: the re-join after the reconnect says it.
  }
}

// A report to a standing server that went away meanwhile is not lost: the connection's end
// shows next (take_notices), and the re-join carries it (SUCCEEDED as resume_succeeded, a
// FAILURE sent again after the JOIN).
template <class F>
void RemoteCoordinator::send_or_queue(const char* what, F&& f) {
  if (reconnector_.active()) return;  // the re-join carries it
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

void RemoteCoordinator::watch() {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = client_->fd();
  if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, client_->fd(), &ev) != 0)
    throw std::system_error(errno, std::generic_category(), "epoll_ctl");
}

// Connected again: a round that was gathering is joined from scratch (the new server knows
// nothing); a running one is re-joined, which the server rebuilds from the agents' re-joins.
void RemoteCoordinator::finish_reconnect() {
  const double took_s = reconnector_.seconds();
  if (!running_) {
    guard([&] { client_->send_join(settings_); });
    spdlog::info("reconnected to the rendezvous server at {} after {:.1f} s; joining again", endpoint_.where(), took_s);
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
  resume.resume_progressed = stores_.progressed();
  guard([&] { client_->send_join(resume); });
  spdlog::info("reconnected to the rendezvous server at {} after {:.1f} s; re-joined round {} (node rank {} of {})",
               endpoint_.where(), took_s, round_, last_round_.node_rank, last_round_.nnodes);
  if (pending_failure_) {
    // It may never have reached the server that went: the new one holds it until the round
    // is whole again (round_state.h "Resume").
    guard([&] { client_->report_failure(*pending_failure_); });
    spdlog::info("sent the failure report of round {} again", round_);
  }
}

// Messages the server did not send (a relay's: rdzv/session_mac.h) were dropped: say so, at
// the 1st, 10th, 100th, ... so a flood of them cannot flood the console.
void RemoteCoordinator::report_rejected() {
  const uint64_t n = client_->rejected();
  if (n == 0 || n < next_rejected_report_) return;
  next_rejected_report_ = n * 10;
  spdlog::warn("dropped {} message(s) on the connection to the rendezvous server at {} that the server did not "
               "send (last: {}); something on the path is tampering with it, the job goes on",
               n, endpoint_.where(), client_->last_rejected());
}

template <class F>
void RemoteCoordinator::guard(F&& f) {
  if (!client_) throw CoordinatorError("no connection to the rendezvous server at " + endpoint_.where());
  try {
    f();
  } catch (const rdzv::RendezvousError& e) {
    throw CoordinatorError(e.what());
  }
}

}  // namespace

std::unique_ptr<Coordinator> make_remote_coordinator(RemoteCoordinatorOptions options) {
  return std::make_unique<RemoteCoordinator>(std::move(options));
}

}  // namespace ddprun::launcher
