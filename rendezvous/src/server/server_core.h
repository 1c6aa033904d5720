// The server's parts put together: the I/O threads, the listeners (one per keyspace), the
// connections (ConnectionIo), admission, the keyspaces and the rounds, and the dispatch of
// requests to them (dispatch.cpp). StoreServer is a handle on one ServerCore.
//
// Locking: `mu`, the rounds lock, guards the rounds, `agents`, admission's register, the
// keyspaces' table and the tick timer. Each keyspace's own lock guards its state and its
// connections (keyspaces.h): a TCPStore request takes only its keyspace's lock, an agent's
// message only `mu`, so neither waits for another job's store. Order: `mu`, then a keyspace's
// lock, then a connection's `out_mu` (connection.h).
#pragma once

#include <atomic>
#include <chrono>
#include <utility>  // before Boost.Asio, whose awaitable.hpp uses std::exchange without it
#include <boost/asio.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "admission.h"
#include "connection.h"
#include "ddprun/rdzv/round_state.h"
#include "ddprun/server/store_server.h"
#include "ddprun/wire/mux.h"
#include "keyspaces.h"
#include "listener.h"
#include "lock_holds.h"
#include "server_log.h"
#include "state_lock.h"

namespace ddprun::server {

// While agents are connected, the rounds tick at least this often (heartbeat expiry); a longer
// gap between ticks is this server's own stall (RoundState::set_tick_period).
inline constexpr std::chrono::milliseconds kHeartbeatCheckPeriod{200};
// How often an idle server looks whether memory it freed should go back to the system
// (MemoryBudget::trim_if_due; requests and closes look too, as they come).
inline constexpr std::chrono::seconds kIdleTrimPeriod{1};
// A request larger than this is parsed in steps of about this many bytes (StepParser), each in
// its own turn of the thread: a parse of 64 MiB at once took 71 ms.
inline constexpr size_t kParseStepBytes = 1 << 20;

class ServerCore final : public ConnectionEvents, public KeyspaceHost {
 public:
  explicit ServerCore(StoreServerOptions o);
  ~ServerCore() override;

  void start();
  void accept_clients();
  void stop();
  StoreServerStats stats() const;
  StoreServerMetrics metrics();

  // ConnectionEvents (dispatch.cpp, store_server.cpp)
  void on_input(const ConnPtr& c) override;
  void on_closed(const ConnPtr& c) override;
  void on_channel_resumed(const ConnPtr& c) override;  // relay_channels.cpp
  // KeyspaceHost (revoke_locked: under ks->mu)
  void revoke_locked(const Keyspace* ks) override;
  std::unique_ptr<Listener> make_listener(const std::string& name) override;
  void start_accepting(Keyspace* ks) override;
  size_t num_jobs_locked() const override { return rounds.num_jobs(); }
  std::optional<std::string> no_descriptors_for(size_t n) override;

  StoreServerOptions options;
  WarnLimiter warns;
  std::vector<std::unique_ptr<IoThread>> threads;  // the first also runs the rendezvous tick timer
  StateLock mu;
  ConnectionCounters counters;
  std::atomic<uint64_t> accepted{0}, accept_errors{0}, deadline_closed{0}, jobs_refused{0};
  HoldRecord holds;  // each lock site's longest hold (lock_holds.h)
  MemoryBudget budget{options.max_memory};
  ConnectionIo io{options, warns, counters, budget, *this};
  Admission admission{options, warns};
  Keyspaces keyspaces{options, *this, budget};
  rdzv::RoundState rounds{keyspaces};
  std::optional<boost::asio::steady_timer> tick_timer;
  std::optional<boost::asio::steady_timer> trim_timer;  // on the first thread
  std::unordered_map<store::ConnId, ConnPtr> agents;    // agents' connections, under mu
  // The rounds' clock: steady time. The rounds themselves find this server's own stalls in the
  // gaps between its ticks (RoundState::on_tick), so no agent is blamed for them.
  static std::chrono::steady_clock::time_point rdzv_now_locked() { return std::chrono::steady_clock::now(); }
  store::ConnId next_id = 1;  // under mu
  std::atomic<bool> started{false}, stopped{false}, accepting{false};

 private:
  boost::asio::io_context& control() { return threads.front()->io; }
  void check_limits() const;
  void listen_main();
  void on_socket(Keyspace* ks, boost::asio::ip::tcp::socket sock, const boost::asio::ip::tcp::endpoint& from,
                 size_t thread_index);
  // On c's thread, at its first request: a TCPStore client, no longer unproven.
  void first_request(const ConnPtr& c);
  uint64_t descriptors_in_use() const { return counters.open + keyspaces.listener_descriptors(); }
  // On c's thread: on_deadline(c) after `after` (replacing the one set before), unless closed.
  void arm_deadline(const ConnPtr& c, std::chrono::milliseconds after);
  void on_deadline(const ConnPtr& c);
  // Every kIdleTrimPeriod until stopped, on the first thread: freed memory goes back to the
  // system without waiting for a request.
  void schedule_trim();

  // ---- relay_channels.cpp: a store relay's connection and its channels (wire/mux.h) ----
  void begin_relay(const ConnPtr& c);
  void relay_input(const ConnPtr& c, size_t pos);
  void relay_frame(const ConnPtr& c, const wire::mux::Frame& f);
  void open_channel(const ConnPtr& c, uint32_t channel);
  void refuse_channel(const ConnPtr& c, uint32_t channel, const std::string& why);
  void channel_closed(const ConnPtr& v);
  void close_channels(const ConnPtr& c);

  // ---- dispatch.cpp ----
  enum class Sniffed { Go, NeedMore, Closed };
  Sniffed sniff(const ConnPtr& c, size_t& pos);
  // How far a batch of c's buffered requests got, and how it ended.
  struct Batch {
    size_t pos = 0;   // bytes of c->in handled
    std::string bad;  // c sent something it must be closed for
    bool revoked = false, yield = false;
    bool tampered = false;  // an agent's message failed its MAC or sequence check: close it
  };
  using Hold = TimedHold<StateLock>;
  void agent_batch(const ConnPtr& c, Batch& b);
  void store_batch(const ConnPtr& c, Batch& b);
  // Frames and parses the next request at b.pos (into c's thread's t.req or t.msg); false: none
  // is whole yet (c->need_total says how much it needs), or it is bad (b.bad).
  bool take_request(const ConnPtr& c, Batch& b);
  void send_reply(IoThread& t, const ConnPtr& c);
  // Under mu. Each returns false when c must stop reading (refused, draining).
  bool on_handshake_message(IoThread& t, const ConnPtr& c, rdzv::ServerHandshake::Step& step, bool& forward);
  bool on_agent_message(IoThread& t, const ConnPtr& c);
  void decode_agent_message(IoThread& t, const ConnPtr& c);
  // Leaves c's reply in t.reply for send_reply, unless the request woke or notified anyone: then
  // the reply and those events are queued, in that order.
  bool on_store_request(IoThread& t, const ConnPtr& c, wire::Request& req, std::string& bad, bool continued);
  // A request parsed in steps or applied in slices is kept on c (park) until its last slice (unpark).
  wire::Request* next_request(IoThread& t, const ConnPtr& c, Batch& b);
  void park(IoThread& t, const ConnPtr& c);
  void unpark(const ConnPtr& c);
  void discard(IoThread& t, std::shared_ptr<ParkedRequest> p);
  void route_locked(IoThread& self, Keyspace& ks, std::vector<store::Outgoing>& others);
  void route_locked(IoThread& self, std::vector<rdzv::Outbound>& out);
  // ---- agent_seal.cpp ----
  // Under mu: a ticket for each of `out` (SealOrder); they go onto self.to_seal.
  void queue_locked(IoThread& self, std::vector<rdzv::Outbound>& out);
  // After mu is let go, on `self`: what self queued is sealed, encoded and appended; a large
  // batch (a round's broadcast) is spread over the agents' own threads.
  void seal_pending(IoThread& self);
  // Batches handed to other threads' io_contexts: the destructor drops their connections while
  // every io_context is alive (a handler destroyed with its io_context must not free a
  // connection that belongs to another, already destroyed, one).
  std::mutex posted_mu;
  std::vector<std::weak_ptr<SealBatch>> posted;
  void seal_in_turn(IoThread& self, const ConnPtr& c, uint64_t ticket, rdzv::Outbound& o);
  void seal_one(IoThread& self, const ConnPtr& c, rdzv::Outbound& o);
  void schedule_tick_locked();
  void on_tick();
  void forget(const ConnPtr& c);
};

}  // namespace ddprun::server
