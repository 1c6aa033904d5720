// The local coordinator (coordinator.h) and the one translation of server messages into notices
// (the remote coordinator: remote_coordinator.cpp).
#include "ddprun/launcher/coordinator.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <system_error>

#include "ddprun/rdzv/fixed_port_stores.h"
#include "ddprun/rdzv/round_state.h"
#include "ddprun/rdzv/validate.h"
#include "ddprun/server/store_server.h"

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

}  // namespace

std::unique_ptr<Coordinator> make_local_coordinator(server::StoreServer& store, rdzv::Join settings,
                                                    std::string store_host) {
  return std::make_unique<LocalCoordinator>(store, std::move(settings), std::move(store_host));
}

}  // namespace ddprun::launcher
