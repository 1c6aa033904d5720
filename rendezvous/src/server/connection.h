// One client connection: its socket, its input buffer and framing position, its outbox and
// the back-pressure on it, and its admission session. ConnectionIo reads, writes and closes
// connections; what the bytes mean is the dispatcher's business (ConnectionEvents).
//
// Locking: everything of a connection belongs to its I/O thread, except `out_mu` and what it
// guards (its outbox may be appended to by any thread that produced bytes for it, e.g. a WAIT
// released by another client) and the fields marked "under ks->mu" or "under the rounds lock". out_mu is taken
// inside those locks or alone, never the other way round.
#pragma once

#include <atomic>
#include <cstring>
#include <utility>  // before Boost.Asio, whose awaitable.hpp uses std::exchange without it
#include <boost/asio.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/agent_protocol.h"
#include "ddprun/rdzv/round_state.h"
#include "ddprun/server/store_server.h"
#include "ddprun/store/reply.h"
#include "ddprun/store/store_state.h"
#include "ddprun/wire/codec.h"
#include "memory_budget.h"
#include "server_log.h"

namespace ddprun::server {

struct Connection;
using ConnPtr = std::shared_ptr<Connection>;
struct Keyspace;
struct SealBatch;

// One I/O thread: its io_context and the scratch of the requests handled on it.
struct IoThread {
  boost::asio::io_context io{1};
  std::thread thread;
  wire::Request req;
  rdzv::Message msg;
  // An admitted agent's message decoded before the rounds lock (ServerCore::agent_batch).
  std::optional<rdzv::RoundState::Inbound> inbound;
  store::Reply reply;
  std::vector<store::Outgoing> others;
  std::vector<rdzv::Outbound> rdzv_out;
  std::vector<ConnPtr> to_flush;  // this thread's connections that got bytes under the lock
  std::vector<ConnPtr> remote;    // other threads' connections that got bytes under the lock
  std::vector<std::shared_ptr<SealBatch>>
      to_seal;  // messages to agents made under the rounds lock (ServerCore::seal_pending)
  std::atomic<uint64_t> requests{0};
  MemoryBudget::Credit credit;  // this thread's share of the memory budget (MemoryBudget::bind_thread)
  // StoreServerOptions::collect_metrics: written by this thread only (relaxed load and store,
  // no locked instruction), read by StoreServer::metrics().
  std::atomic<uint64_t> by_op[StoreServerMetrics::kOps] = {};
  std::atomic<uint64_t> duration_buckets[StoreServerMetrics::kBuckets] = {};
  std::atomic<uint64_t> duration_sum_ns{0};
  static void bump(std::atomic<uint64_t>& a, uint64_t n = 1) {
    a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  void observe(size_t op, uint64_t ns) {
    bump(by_op[op]);
    size_t b = 0;
    while (b < std::size(StoreServerMetrics::kBucketNs) && ns > StoreServerMetrics::kBucketNs[b]) ++b;
    bump(duration_buckets[b]);
    bump(duration_sum_ns, ns);
  }
  uint64_t batch_reply_bytes = 0;  // replies produced by the batch of requests being handled
  bool more = false;               // the request in `req` is partly applied (store::ApplyResult::more)
};

// Who the peer is and what it has proved: the one place of a connection's authentication
// state. The protocol is decided by its first bytes (wire::sniff_protocol); an agent then goes
// through the token handshake, and nothing of it reaches the rounds before `admitted`.
struct Session {
  boost::asio::ip::address peer;  // plain_address of the remote end, as accept gave it
  uint16_t peer_port = 0;
  wire::Protocol protocol = wire::Protocol::Unknown;
  wire::Dialect dialect = wire::Dialect::Unknown;  // TCPStore clients
  // Read under its keyspace lock by revoke(): set once by the connection's thread.
  std::atomic<bool> agent{false};
  std::optional<rdzv::ServerHandshake> handshake;  // agents
  bool admitted = false;                           // under the rounds lock
  bool counted_stranger = false;                   // under the rounds lock (Admission)
  // Under the rounds lock (Admission): proved nothing yet, so its slot may be taken; closed for
  // a new connection whose slot it was, the close on its way.
  bool unproven = false, replaced = false;
  bool served = false;  // a TCPStore client made a request (VALIDATE is none); its thread only
  // Admitted with a token (or munge): every later message is opened and sealed with it
  // (rdzv/session_mac.h). Under the rounds lock.
  std::optional<rdzv::SessionMac> mac;
  bool decided() const { return protocol != wire::Protocol::Unknown; }
};

// A connection's input buffer. Its bytes are not zeroed when it grows, and from 1 MiB on it is
// mapped memory that grows by mremap, without a copy: as a std::vector, growing towards one
// 61 MiB request copied and zeroed up to 32 MiB at once (a 136 ms stall of its thread).
class InputBuffer {
 public:
  InputBuffer() = default;
  ~InputBuffer() { reset(); }
  InputBuffer(const InputBuffer&) = delete;
  InputBuffer& operator=(const InputBuffer&) = delete;
  uint8_t* data() { return data_; }
  size_t size() const { return size_; }
  // Makes it n bytes, of which the first `keep` are kept (throws std::bad_alloc).
  void resize(size_t n, size_t keep);
  void reset();  // frees it

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
};

// A TCPStore request of a connection that is parsed (StepParser) or applied
// (store::ApplyResult::more) over several turns of its thread.
struct ParkedRequest {
  wire::Request req;
  wire::StepParser parser;
  size_t framed = 0;      // being parsed: its length, at the start of the unconsumed input
  bool applying = false;  // a slice of it was applied
  uint64_t charge = 0;    // its memory, charged to the budget
};

// The order of an agent's messages: each gets a ticket under the rounds lock, in the order the
// rounds made it, and is sealed (sequence number, MAC), encoded and appended to the outbox after
// the lock, strictly in ticket order, by whichever thread holds it (ServerCore::seal_pending):
// a frame sealed outside the lock neither overtakes nor is overtaken by another to the agent.
struct SealOrder {
  uint64_t issued = 0;                       // tickets handed out, under the rounds lock
  std::mutex mu;                             // guards what follows; taken outside the rounds lock only, before out_mu
  uint64_t sealed = 0;                       // tickets sealed and appended
  std::map<uint64_t, rdzv::Outbound> early;  // tickets that came before their turn
};

// The messages of one hold of the rounds lock, with each one's agent and ticket.
struct SealBatch {
  std::vector<rdzv::Outbound> out;
  std::vector<std::pair<ConnPtr, uint64_t>> to;  // parallel to `out`; null: the agent is gone
};

// A store relay's multiplexed connection (wire/mux.h): its open channels, each a virtual
// Connection. Its thread only.
struct MuxSessions {
  std::unordered_map<uint32_t, ConnPtr> open;
  // A channel whose input is paused (a batch of it yielded): the relay's further frames wait
  // for it, and no read is issued for the relay connection meanwhile.
  ConnPtr blocked;
};

struct Connection {
  Connection(boost::asio::ip::tcp::socket sock, Keyspace* k, IoThread* t)
      : socket(std::move(sock)), fd(socket.native_handle()), ks(k), thread(t) {}
  // A channel of the multiplexed connection `parent`: no socket of its own, on parent's thread;
  // its input comes from parent's DATA frames, its output goes into parent's outbox as DATA.
  Connection(const ConnPtr& parent, uint32_t channel)
      : socket(parent->thread->io),
        fd(-1),
        ks(parent->ks),
        thread(parent->thread),
        mux_parent(parent),
        mux_channel(channel) {}
  bool is_channel() const { return mux_channel != 0; }
  boost::asio::ip::tcp::socket socket;
  const int fd;  // for sends from other threads (under out_mu, while !fd_closed)
  store::ConnId id = 0;
  Keyspace* ks;      // its state is used under ks->mu, and only while !revoked
  IoThread* thread;  // the one thread that reads and writes the socket
  Session session;
  SealOrder seals;  // agents
  // I/O thread only:
  InputBuffer in;              // its size counts in ConnectionIo's buffered total and the budget
  wire::RequestFramer framer;  // how far the request at the start of `in` has been framed
  bool draining = false;       // refused: its last reply is queued, it reads nothing more
  size_t in_size = 0;
  size_t need_total = 0;
  size_t chunk = 0;  // the next read's size (set by ConnectionIo)
  // A batch of its requests yielded the thread with input left (ConnectionIo::pause_input): no
  // read is in flight, so nothing writes into `in` while what is left is handled later.
  bool input_paused = false;
  // A request too large for one turn of its thread: parsed in steps, then applied in slices,
  // each after the thread's other ready work (ServerCore::store_batch). Input stays paused.
  std::unique_ptr<ParkedRequest> parked;
  store::Outbox writing;  // what the async write in flight sends (taken from `out`)
  std::vector<boost::asio::const_buffer> iov;
  bool closed = false;
  bool budgeted = false;  // ConnectionIo::kConnectionBytes charged for it (released at close)
  // Closes it when it is still unauthenticated (ServerCore::on_deadline); its thread only.
  std::optional<boost::asio::steady_timer> deadline;
  // Set under ks->mu when its keyspace was reset or dropped, for every connection of it (an
  // agent's too: whether it is one is its own thread's to know); read by its thread, which
  // ignores it for an agent, and under ks->mu.
  std::atomic<bool> revoked{false};
  // under out_mu:
  std::mutex out_mu;
  // References stored values, not copies: its wire bytes count towards
  // --max-connection-buffered-bytes, its memory is O(pieces) plus the distinct values.
  store::Outbox out;
  bool close_when_flushed = false;
  bool writer_busy = false;               // its thread has an async write in flight (which flushes again)
  bool fd_closed = false;                 // its thread closed (or is closing) the socket
  bool overflowed = false;                // its outbox passed the limit: dropped, a close is posted
  std::atomic<bool> flush_posted{false};  // queued on some thread's to_flush/remote list
  // Multiplexing (wire/mux.h), its thread only. A channel: its relay connection and number, and
  // whether the relay ended it (no CLOSE goes back). A relay connection: its channels.
  std::weak_ptr<Connection> mux_parent;
  const uint32_t mux_channel = 0;
  bool mux_peer_closed = false;
  std::unique_ptr<MuxSessions> mux;
};

// What the bytes mean: implemented by the server.
class ConnectionEvents {
 public:
  virtual ~ConnectionEvents() = default;
  // New bytes are in c->in (on c's thread); parse and apply what is complete.
  virtual void on_input(const ConnPtr& c) = 0;
  // c was closed (on c's thread): forget what it left in the state (takes the locks).
  virtual void on_closed(const ConnPtr& c) = 0;
  // A relay channel's input is no longer paused (on its thread): its relay's frames go on.
  virtual void on_channel_resumed(const ConnPtr& c) = 0;
};

struct ConnectionCounters {
  std::atomic<uint64_t> open{0}, closed_bad{0}, agents{0};
  std::atomic<uint64_t> channels{0};  // relay channels open (no socket each: not in `open`)
  std::atomic<uint64_t> relays{0};    // relays' connections open (in `open`)
  // Closed for a limit: --max-memory; --max-connection-buffered-bytes or --max-buffered-bytes.
  std::atomic<uint64_t> closed_memory{0}, closed_buffers{0};
  std::atomic<uint64_t> buffered{0};  // bytes of every connection's input buffer
};

class ConnectionIo {
 public:
  ConnectionIo(const StoreServerOptions& options, WarnLimiter& warns, ConnectionCounters& counters,
               MemoryBudget& budget, ConnectionEvents& events)
      : options_(options), warns_(warns), counters_(counters), budget_(budget), events_(events) {}

  // On c's thread: reads for good (until closed).
  void start(const ConnPtr& c);
  // Runs `fn` for c on its thread: an exception closes c only.
  template <class F>
  void guarded(const ConnPtr& c, F&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      on_exception(c, e);
    }
  }
  // On `self`, under a state lock (keyspace or rounds) or after it (a batch's last reply to
  // its own connection): appends to `target`'s outbox (a string_view is copied, a Reply's
  // values referenced) and makes sure it is written by the next flush_pending. Past
  // --max-connection-buffered-bytes the outbox is dropped and target closed. With
  // `close_after`, target is closed once this is written.
  void append(IoThread& self, const ConnPtr& target, std::string_view bytes, bool close_after = false);
  void append(IoThread& self, const ConnPtr& target, const store::Reply& bytes);
  // Outside the lock, on `t`: write what the requests just handled left for connections.
  void flush_pending(IoThread& t);
  // On c's thread. `bad_input`: counted and logged (rate-limited) with `why`.
  void close(const ConnPtr& c, const std::string& why, bool bad_input);
  // A connection closed for a limit: counted and logged as bad input (rate-limited).
  void close_for_limit(const ConnPtr& c, Warn kind, const std::string& why);
  // From any thread: c's thread closes it.
  void post_close(const ConnPtr& c);
  // Reads start small (thousands of mostly idle connections cost little) and grow to the large
  // chunk while a connection keeps filling its buffer.
  static constexpr size_t kSmallReadChunk = 4 * 1024;
  // What one connection costs beyond its buffers, charged to the budget while it is open: the
  // kernel's socket and the server's own objects (about 5 KiB measured for an idle one), with
  // room to spare. Tens of thousands of idle connections are refused at accept past the budget
  // instead of outgrowing a small memory limit.
  static constexpr uint64_t kConnectionBytes = 8 * 1024;
  static constexpr size_t kReadChunk = 64 * 1024;

  // On c's thread, after its requests were handled: drops what was parsed, shrinks the buffer.
  void consumed(const ConnPtr& c, size_t pos) {
    if (pos > 0) {
      if (pos < c->in_size) std::memmove(c->in.data(), c->in.data() + pos, c->in_size - pos);
      c->in_size -= pos;
      // need_total is relative to the unparsed rest, which now starts at 0: keep it as is.
    }
    if (c->in.size() > 4 * kReadChunk && c->in_size < kReadChunk) shrink_input(c);
  }
  // On c's thread, from on_input: the rest of c's buffered requests are handled after the
  // thread's other ready work, and no read is issued until then (a read in flight would land
  // where consumed() has moved the buffer since).
  void pause_input(const ConnPtr& c);
  // On c's thread: reads again unless its input is paused (a relay connection whose blocked
  // channel resumed).
  void resume_input(const ConnPtr& c) {
    if (!c->input_paused) guarded(c, [&] { read_some(c); });
  }
  // On a relay channel's thread: appends a DATA frame's bytes to its input, within the limits
  // of any connection's input (false: it was closed for one).
  bool feed(const ConnPtr& c, std::span<const uint8_t> bytes);
  // A channel's outbox moves into its relay connection's, framed as DATA, then is written.
  void flush_channel(const ConnPtr& c);
  // On the relay connection's thread: frames for it (OPEN/CLOSE answers) and writes them.
  void send_frames(const ConnPtr& relay, const std::string& frames);

 private:
  void on_exception(const ConnPtr& c, const std::exception& e);
  void read_some(const ConnPtr& c);
  void shrink_input(const ConnPtr& c);
  bool reserve_input(const ConnPtr& c, size_t want) { return c->in.size() >= c->in_size + want || grow_input(c, want); }
  bool grow_input(const ConnPtr& c, size_t want);
  bool admit_bytes(const ConnPtr& target, uint64_t size, bool budgeted);
  void drop_outbox(const ConnPtr& c);  // out_mu held
  void wake(IoThread& self, const ConnPtr& target);
  void send_from_here(const ConnPtr& c);
  void flush(const ConnPtr& c);
  void write_some(const ConnPtr& c);
  void on_written(const ConnPtr& c, boost::system::error_code ec, size_t n);

  const StoreServerOptions& options_;
  WarnLimiter& warns_;
  ConnectionCounters& counters_;
  MemoryBudget& budget_;
  ConnectionEvents& events_;
};

}  // namespace ddprun::server
