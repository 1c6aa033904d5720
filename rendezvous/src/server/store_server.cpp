#include "ddprun/server/store_server.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <string_view>
#include <map>
#include <set>
#include <mutex>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include "ddprun/common/knobs.h"
#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/agent_protocol.h"
#include "ddprun/rdzv/fixed_port_stores.h"
#include "ddprun/rdzv/round_state.h"

namespace ddprun::server {

namespace asio = boost::asio;
using asio::ip::tcp;
using store::ConnId;

namespace {
// Reads start small (thousands of mostly idle connections cost little) and grow to the large
// chunk while a connection keeps filling its buffer.
constexpr size_t kSmallReadChunk = 4 * 1024;
constexpr size_t kReadChunk = 64 * 1024;
constexpr auto kHeartbeatCheckPeriod = std::chrono::milliseconds(200);
// Bytes for at most this many other threads' connections, produced by one batch of requests,
// are sent by the producing thread itself; more are handed to the connections' threads.
constexpr size_t kMaxDirectSends = 16;
// Pieces of an outbox handed to one async_write (a MULTI_GET of many keys is written in several
// rounds rather than with one buffer table of its whole length), and to one sendmsg.
constexpr size_t kWritePieces = 1024;
constexpr size_t kSendPieces = 64;
// A thread's scratch reply keeps at most this much memory between requests.
constexpr size_t kKeptReplyBytes = 1 << 20;

// Grows this process's descriptor table once, now, to what `RLIMIT_NOFILE` allows (at most
// kPresizedDescriptors): in a process with several threads every doubling of the table waits
// for an RCU grace period (milliseconds), so a server accepting thousands of connections would
// otherwise stall its accepting threads a dozen times in the middle of a join storm.
constexpr long kPresizedDescriptors = 1 << 16;
void presize_descriptor_table() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < 64) return;
  const long want = static_cast<long>(std::min<rlim_t>(rl.rlim_cur, kPresizedDescriptors));
  const int fd = ::fcntl(2, F_DUPFD_CLOEXEC, static_cast<int>(want - 1));
  if (fd >= 0) ::close(fd);
}

// The lock around the store state. Its critical sections are a few microseconds, and with
// several I/O threads a plain mutex sends a waiter to sleep in the kernel and costs a wake-up
// each time (context switches were the top item of a wait-hop profile). An adaptive mutex
// (glibc) spins briefly first. DDPRUN_STORE_LOCK=plain selects the plain one, to compare.
class StateLock {
 public:
  explicit StateLock(bool adaptive) {
    pthread_mutexattr_t attr;
    ::pthread_mutexattr_init(&attr);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
    if (adaptive) ::pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
#else
    (void)adaptive;
#endif
    ::pthread_mutex_init(&m_, &attr);
    ::pthread_mutexattr_destroy(&attr);
  }
  ~StateLock() { ::pthread_mutex_destroy(&m_); }
  StateLock(const StateLock&) = delete;
  StateLock& operator=(const StateLock&) = delete;
  void lock() { ::pthread_mutex_lock(&m_); }
  void unlock() { ::pthread_mutex_unlock(&m_); }
  bool try_lock() { return ::pthread_mutex_trylock(&m_) == 0; }

 private:
  pthread_mutex_t m_;
};

bool adaptive_state_lock() {
  return ::ddprun::knobs::get(::ddprun::knobs::kStoreLock) != std::optional<std::string>("plain");
}

// Warnings about peers (bad bytes, limits, accept errors) are what a stranger controls: at most
// one line per second per kind, the next one saying how many were left out, so a fuzzer or a
// connection flood cannot fill the console of the job the server runs in.
enum class Warn { BadInput, Accept, ConnectionLimit, JobLimit, BufferLimit, Exception, AgentRefused, StoreStranger, Stall, kCount };
class WarnLimiter {
 public:
  // `line` is called only when the line is printed.
  template <class F>
  void warn(Warn kind, F&& line) {
    uint64_t left_out = 0;
    {
      std::lock_guard lock(mu_);
      auto& k = kinds_[static_cast<size_t>(kind)];
      const auto now = std::chrono::steady_clock::now();
      if (k.printed && now - k.last < kPeriod) {
        ++k.left_out;
        return;
      }
      k.printed = true;
      k.last = now;
      left_out = std::exchange(k.left_out, 0);
    }
    std::string text = left_out > 0 ? fmt::format("{} ({} more like it since the last one shown)", line(), left_out)
                                    : line();
    if (sink_) sink_(text);
    else spdlog::warn("{}", text);
  }
  // Set once, before the server starts (StoreServerOptions::peer_warning).
  void set_sink(std::function<void(const std::string&)> sink) { sink_ = std::move(sink); }

 private:
  static constexpr auto kPeriod = std::chrono::seconds(1);
  struct Kind {
    bool printed = false;
    std::chrono::steady_clock::time_point last{};
    uint64_t left_out = 0;
  };
  std::mutex mu_;
  Kind kinds_[static_cast<size_t>(Warn::kCount)];
  std::function<void(const std::string&)> sink_;
};

// Accept errors that mean "no descriptor or memory now": the connection waits in the backlog
// while the server pauses accepting this long (closing connections frees descriptors).
constexpr auto kAcceptBackoff = std::chrono::milliseconds(50);
// Descriptors kept out of --max-connections: listeners of the jobs' stores, logs, pipes.
constexpr uint64_t kReservedDescriptors = 64;

// IPv4 peers of a dual-stack listener show as ::ffff:a.b.c.d: compare them as IPv4.
asio::ip::address plain_address(const asio::ip::address& a) {
  if (a.is_v6() && a.to_v6().is_v4_mapped()) return asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
  return a;
}

int resolve_io_threads(int wanted) {
  if (wanted > 0) return wanted;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores, 1, kMaxAutoIoThreads);
}
}  // namespace

// Locking: `mu` guards every keyspace's state, the rounds, `conns`, `round_ks`, each
// connection's `revoked` flag and the tick timer. Each connection's `out_mu` guards its
// outbox; it is taken inside `mu` or alone, never the other way round. Everything else of a
// connection belongs to its I/O thread. Every keyspace has one listening socket per I/O thread
// (a SO_REUSEPORT group, see bind()), each used only on its thread, which accepts straight into
// its own io_context: accepts run in parallel and no connection is handed between threads.
struct StoreServer::Impl : rdzv::WorkerStores {
  struct Connection;
  using ConnPtr = std::shared_ptr<Connection>;

  struct IoThread {
    asio::io_context io{1};
    std::thread thread;
    // Scratch of the requests handled on this thread.
    wire::Request req;
    rdzv::Message msg;
    store::Reply reply;
    std::vector<store::Outgoing> others;
    std::vector<rdzv::Outbound> rdzv_out;
    std::vector<ConnPtr> to_flush;  // this thread's connections that got bytes under `mu`
    std::vector<ConnPtr> remote;    // other threads' connections that got bytes under `mu`
    std::atomic<uint64_t> requests{0};
  };

  // A keyspace with its own listener: the main one (TCPStore + agents' rendezvous) and one
  // per rendezvous round for that round's workers, so every attempt starts empty and no
  // worker of an old attempt can reach the new one's keys.
  struct Keyspace {
    explicit Keyspace(const store::StoreLimits& limits) : state(limits) {}
    std::vector<std::unique_ptr<tcp::acceptor>> acceptors;  // [i] belongs to threads[i]
    store::StoreState state;
    std::string name;
    std::string run_id;      // a round's store: its job ("" for the main keyspace)
    bool discarded = false;  // under mu: its round is over; refuse new connections
  };

  struct Connection {
    Connection(tcp::socket sock, Keyspace* k, IoThread* t)
        : socket(std::move(sock)), fd(socket.native_handle()), ks(k), thread(t) {}
    tcp::socket socket;
    const int fd;       // for sends from other threads (under out_mu, while !fd_closed)
    ConnId id = 0;
    Keyspace* ks;       // dereferenced under mu, and only while !revoked
    IoThread* thread;   // the one thread that reads and writes the socket
    // I/O thread only:
    // speaks the agents' rendezvous protocol, not TCPStore; set once by its thread, read under
    // mu by revoke_connections_locked
    std::atomic<bool> agent{false};
    asio::ip::address peer;  // plain_address of the remote end, set at accept
    // agents: the token handshake; `admitted` (under mu) once it let the agent in
    std::optional<rdzv::ServerHandshake> handshake;
    bool admitted = false;
    std::optional<rdzv::SessionMac> session;  // under mu: admitted with a token (session_mac.h)
    wire::Dialect dialect = wire::Dialect::Unknown;
    std::vector<uint8_t> in;  // its size counts in Impl::buffered
    wire::RequestFramer framer;  // how far the request at the start of `in` has been framed
    bool draining = false;       // refused: its last reply is queued, it reads nothing more
    size_t in_size = 0;
    size_t need_total = 0;
    size_t chunk = kSmallReadChunk;
    // What the async write in flight sends (taken from `out`), and its buffer table.
    store::Outbox writing;
    std::vector<asio::const_buffer> iov;
    bool closed = false;
    // under mu: its keyspace was reset or dropped; it must not touch any state again
    bool revoked = false;
    // under out_mu:
    std::mutex out_mu;
    // References stored values, not copies: its wire bytes count towards
    // --max-connection-buffered-bytes, its memory is O(pieces) plus the distinct values.
    store::Outbox out;
    bool close_when_flushed = false;
    bool writer_busy = false;  // its thread has an async write in flight (which flushes again)
    bool fd_closed = false;    // its thread closed (or is closing) the socket
    bool overflowed = false;   // its outbox passed the limit: dropped, a close is posted
    // queued on some thread's to_flush/remote list and not flushed yet
    std::atomic<bool> flush_posted{false};
  };

  explicit Impl(StoreServerOptions o) : options(std::move(o)) {
    const int n = resolve_io_threads(options.io_threads);
    for (int i = 0; i < n; ++i) threads.push_back(std::make_unique<IoThread>());
    main_ks = std::make_unique<Keyspace>(options.store);
    main_ks->name = "main";
    tick_timer.emplace(control());
    warns.set_sink(options.peer_warning);
  }

  ~Impl() {
    stop();
    // Sockets and acceptors before the io_contexts they belong to (pending handlers own nothing
    // but connections of their own io_context).
    {
      std::lock_guard lock(mu);
      conns.clear();
      round_ks.clear();
      retired_ks.clear();
    }
    main_ks.reset();
    tick_timer.reset();
    for (auto& t : threads) t.reset();
  }

  StoreServerOptions options;
  std::vector<std::unique_ptr<IoThread>> threads;  // the first also runs the rendezvous tick timer
  StateLock mu{adaptive_state_lock()};
  std::unique_ptr<Keyspace> main_ks;
  std::map<std::pair<std::string, int64_t>, std::unique_ptr<Keyspace>> round_ks;
  // Rounds that ended: emptied and closed, kept until the server goes (accept handlers may still
  // name them; a job has few rounds).
  std::vector<std::unique_ptr<Keyspace>> retired_ks;
  // Rounds whose workers' store is the main keyspace (Join::fixed_store_port), by the rule
  // shared with the launcher's in-process rounds; called under mu.
  struct MainView final : rdzv::MainKeyspace {
    explicit MainView(Impl& i) : impl(i) {}
    void reset() override {
      impl.revoke_connections_locked(impl.main_ks.get());
      impl.main_ks->state.clear();
    }
    std::optional<int64_t> integer(const std::string& key) override { return impl.main_ks->state.integer(key); }
    uint16_t port() const override { return impl.bound_port; }
    Impl& impl;
  };
  MainView main_view{*this};
  rdzv::FixedPortStores main_rounds{main_view};
  rdzv::RoundState rounds{*this};
  std::optional<asio::steady_timer> tick_timer;
  std::unordered_map<ConnId, ConnPtr> conns;
  ConnId next_id = 1;
  std::atomic<uint16_t> bound_port{0};
  std::atomic<uint64_t> accepted{0}, closed_bad{0}, open_conns{0}, agents{0};
  std::atomic<uint64_t> refused_over_limit{0}, accept_errors{0}, agents_refused{0}, store_strangers{0};
  std::atomic<uint64_t> buffered{0};  // bytes of every connection's input buffer
  uint64_t max_conns = 0;             // options.max_connections within the descriptor limit (start())
  WarnLimiter warns;
  std::atomic<bool> started{false}, stopped{false}, accepting{false};
  // Under mu: set_store_peers()'s addresses, admitted to the main keyspace besides the others.
  std::vector<asio::ip::address> store_peers;
  tcp::endpoint bound_endpoint;

  asio::io_context& control() { return threads.front()->io; }

  // ---- listening ----
  // Opens `a` for `ep` and binds it: SO_REUSEADDR, dual-stack for IPv6, TCP_NODELAY (accepted
  // sockets inherit it from the listener on Linux: no call per accept), SO_REUSEPORT if asked.
  static void open_and_bind(tcp::acceptor& a, const tcp::endpoint& ep, bool reuse_port) {
    a.open(ep.protocol());
    a.set_option(tcp::acceptor::reuse_address(true));
    if (ep.protocol() == tcp::v6()) a.set_option(asio::ip::v6_only(false));
    a.set_option(tcp::no_delay(true));
    if (reuse_port) {
      int one = 1;
      if (::setsockopt(a.native_handle(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0)
        throw boost::system::system_error(boost::system::error_code(errno, boost::system::system_category()));
    }
    a.bind(ep);
  }

  // One listening socket per I/O thread on the same address. With several threads they form a
  // SO_REUSEPORT group: the kernel spreads connections over them, each with its own backlog and
  // lock, so accepts run in parallel and a join storm does not overflow one backlog (somaxconn
  // caps each). A plain socket binds the address alone first, so a port someone holds (another
  // ddprund too) still fails with EADDRINUSE, and port 0 becomes a port nobody holds.
  void bind(Keyspace& ks, const std::string& host, uint16_t port) {
    const int backlog = options.backlog > 0 ? options.backlog : 65535;  // the kernel caps it at somaxconn
    std::vector<tcp::endpoint> candidates;
    if (host.empty()) {
      candidates = {tcp::endpoint(tcp::v6(), port), tcp::endpoint(tcp::v4(), port)};
    } else {
      tcp::resolver resolver(control());
      for (const auto& r : resolver.resolve(host, std::to_string(port), tcp::resolver::passive | tcp::resolver::numeric_service))
        candidates.push_back(r.endpoint());
    }
    boost::system::error_code last = boost::system::errc::make_error_code(boost::system::errc::address_not_available);
    for (tcp::endpoint ep : candidates) {
      ks.acceptors.clear();
      try {
        auto probe = std::make_unique<tcp::acceptor>(control());
        open_and_bind(*probe, ep, false);
        // StoreServerOptions::accept_later: the main port is bound now, listened on later.
        const bool now = &ks != main_ks.get() || !options.accept_later;
        if (threads.size() == 1) {
          if (now) probe->listen(backlog);
          ks.acceptors.push_back(std::move(probe));
          return;
        }
        ep.port(probe->local_endpoint().port());
        probe->close();
        for (auto& t : threads) {
          auto a = std::make_unique<tcp::acceptor>(t->io);
          open_and_bind(*a, ep, true);
          if (now) a->listen(backlog);
          ks.acceptors.push_back(std::move(a));
        }
        return;
      } catch (const boost::system::system_error& e) {
        last = e.code();
        ks.acceptors.clear();
      }
    }
    if (host.empty()) throw boost::system::system_error(last);  // listen() says which address
    throw std::system_error(last.value(), std::generic_category(),
                            "cannot bind the store to " + host + ":" + std::to_string(port));
  }

  void start_accepting(Keyspace* ks) {
    for (size_t i = 0; i < threads.size(); ++i) asio::post(threads[i]->io, [this, ks, i] { do_accept(ks, i); });
  }

  // Closes ks's acceptors, each on its own thread.
  void stop_accepting(Keyspace* ks) {
    for (size_t i = 0; i < threads.size(); ++i) {
      asio::post(threads[i]->io, [ks, i] {
        boost::system::error_code ignored;
        ks->acceptors[i]->close(ignored);
      });
    }
  }

  void listen() {
    try {
      bind(*main_ks, options.host, options.port);
    } catch (const boost::system::system_error& e) {
      throw std::system_error(e.code().value(), std::generic_category(),
                              "cannot listen on " + (options.host.empty() ? std::string("*") : options.host) + ":" +
                                  std::to_string(options.port));
    }
    bound_endpoint = main_ks->acceptors.front()->local_endpoint();
    bound_port = bound_endpoint.port();
  }

  // On threads[i]: accepts into that thread's io_context, for good.
  void do_accept(Keyspace* ks, size_t i) {
    IoThread* t = threads[i].get();
    tcp::acceptor& acceptor = *ks->acceptors[i];
    acceptor.async_accept([this, ks, i, t](boost::system::error_code ec, tcp::socket sock) {
      try {
        on_accept(ks, i, t, ec, std::move(sock));
      } catch (const std::exception& e) {
        // Nothing of the new connection is registered yet (or it was closed): keep accepting.
        warns.warn(Warn::Exception, [&] { return fmt::format("[ddprund] accept on the {} store: {}", ks->name, e.what()); });
        retry_accept_later(ks, i, t);
      }
    });
  }

  void retry_accept_later(Keyspace* ks, size_t i, IoThread* t) {
    auto timer = std::make_shared<asio::steady_timer>(t->io, kAcceptBackoff);
    timer->async_wait([this, ks, i, timer](boost::system::error_code e2) {
      if (e2 || !ks->acceptors[i]->is_open()) return;
      try {
        do_accept(ks, i);
      } catch (const std::exception& e) {
        warns.warn(Warn::Exception, [&] { return fmt::format("[ddprund] accept on the {} store: {}", ks->name, e.what()); });
      }
    });
  }

  void on_accept(Keyspace* ks, size_t i, IoThread* t, boost::system::error_code ec, tcp::socket sock) {
    tcp::acceptor& a = *ks->acceptors[i];
    if (ec == asio::error::operation_aborted || !a.is_open()) return;
    if (ec) {
      ++accept_errors;
      // EMFILE, ENFILE, ENOBUFS, ENOMEM: the connection waits in the backlog; pause briefly so
      // a descriptor can come free instead of spinning on the error. Others (ECONNABORTED: the
      // peer gave up) concern one connection only.
      const bool exhausted = ec.value() == EMFILE || ec.value() == ENFILE || ec.value() == ENOBUFS || ec.value() == ENOMEM;
      warns.warn(Warn::Accept, [&] {
        return fmt::format("[ddprund] accept failed on the {} store: {}{}", ks->name, ec.message(),
                           exhausted ? "; pausing accepts briefly (raise the descriptor limit or lower --max-connections)" : "");
      });
      if (exhausted) retry_accept_later(ks, i, t);
      else do_accept(ks, i);
      return;
    }
    if (open_conns.load() >= max_conns) {
      ++refused_over_limit;
      boost::system::error_code e;
      const auto ep = sock.remote_endpoint(e);
      sock.close(e);
      warns.warn(Warn::ConnectionLimit, [&] {
        return fmt::format("[ddprund] {} connections open, the limit (--max-connections {} within the descriptor limit): "
                           "closed a new one from {}",
                           open_conns.load(), max_conns, e ? std::string("?") : ep.address().to_string());
      });
      do_accept(ks, i);
      return;
    }
    auto c = std::make_shared<Connection>(std::move(sock), ks, t);
    {
      boost::system::error_code e;
      const auto ep = c->socket.remote_endpoint(e);
      if (!e) c->peer = plain_address(ep.address());
    }
    bool refused = false;
    bool stranger = false;
    {
      std::lock_guard lock(mu);
      refused = ks->discarded;
      // A round's store serves that round's workers only (PyTorch clients cannot authenticate).
      if (!refused && ks != main_ks.get() && !store_peer_allowed_locked(*ks, c->peer)) refused = stranger = true;
      if (!refused) {
        c->id = next_id++;
        conns.emplace(c->id, c);
      }
    }
    if (!refused) {
      ++accepted;
      ++open_conns;
      guarded(c, [&] { start_read(c); });
    } else if (stranger) {
      refused_stranger(c);
    }
    do_accept(ks, i);
  }

  // Under mu: whether a TCPStore client from `peer` may use `ks`: loopback, or the address of
  // an agent in the current round of ks's job (the main keyspace: of any job).
  bool store_peer_allowed_locked(const Keyspace& ks, const asio::ip::address& peer) const {
    if (peer.is_loopback() || (peer.is_v4() && (peer.to_v4().to_uint() >> 24) == 127)) return true;
    auto agent_at = [&](rdzv::ConnId id) {
      auto it = conns.find(id);
      return it != conns.end() && it->second->admitted && it->second->peer == peer;
    };
    if (ks.run_id.empty() && std::find(store_peers.begin(), store_peers.end(), peer) != store_peers.end()) return true;
    if (!ks.run_id.empty()) {
      for (rdzv::ConnId id : rounds.participants(ks.run_id))
        if (agent_at(id)) return true;
      return false;
    }
    for (const auto& [id, c] : conns)
      if (c->agent && c->admitted && c->peer == peer && rounds.is_participant(id)) return true;
    return false;
  }

  // A store connection from an address that is no node of the job: closed before it reads a byte.
  void refused_stranger(const ConnPtr& c) {
    ++store_strangers;
    warns.warn(Warn::StoreStranger, [&] {
      return fmt::format("[ddprund] closed a connection to the {} store from {}: only loopback and the nodes of the "
                         "job's current round may use it",
                         c->ks->name, c->peer.to_string());
    });
    boost::system::error_code ignored;
    c->socket.close(ignored);
  }

  // Runs `fn` for connection c on its thread: an exception closes c only.
  template <class F>
  void guarded(const ConnPtr& c, F&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      try {
        warns.warn(Warn::Exception, [&] { return fmt::format("[ddprund] connection {}: {}; closing it", c->id, e.what()); });
        close(c, "", false);
      } catch (...) {
        // Out of memory while closing: the socket closes with its last reference.
      }
    }
  }

  // ---- reading and dispatch (the connection's thread) ----
  void start_read(const ConnPtr& c) {
    if (c->closed) return;
    // A request announces its length before its bytes: grow towards it only as bytes arrive
    // (doubling what is buffered), so announced-but-unsent megabytes cost nothing.
    size_t missing = c->need_total > c->in_size ? c->need_total - c->in_size : 0;
    size_t want = std::max(c->chunk, std::min(missing, std::max(c->in_size, kReadChunk)));
    if (c->in.size() < c->in_size + want) {
      const size_t grow = c->in_size + want - c->in.size();
      if (buffered.fetch_add(grow) + grow > options.max_buffered_bytes) {
        buffered -= grow;
        closed_for_limit(c, Warn::BufferLimit,
                         fmt::format("partly received requests of all connections would pass {} bytes (--max-buffered-bytes)",
                                     options.max_buffered_bytes));
        return;
      }
      c->in.resize(c->in_size + want);
    }
    c->socket.async_read_some(asio::buffer(c->in.data() + c->in_size, want),
                              [this, c](boost::system::error_code ec, size_t n) {
                                if (c->closed) return;
                                if (ec) {
                                  close(c, "", false);
                                  return;
                                }
                                c->in_size += n;
                                if (n == c->in.size() - (c->in_size - n) && c->chunk < kReadChunk) c->chunk *= 2;
                                guarded(c, [&] {
                                  process(c);
                                  start_read(c);
                                });
                              });
  }

  // Parses every complete request in the buffer and applies them under one lock.
  void process(const ConnPtr& c) {
    if (c->draining || c->in_size < c->need_total) return;
    c->need_total = 0;
    IoThread& t = *c->thread;
    size_t pos = 0;
    if (c->dialect == wire::Dialect::Unknown && !c->agent) {
      if (c->in_size >= 5 && c->in[0] == 0 && wire::load_u32(c->in.data() + 1) == rdzv::kAgentMagic &&
          c->ks == main_ks.get() && options.enable_rendezvous) {
        c->agent = true;
        ++agents;
        c->handshake.emplace(options.rdzv_token, rdzv::random_nonce(), options.standing, options.rdzv_munge);
        pos = 5;
      } else {
        auto det = wire::detect_dialect({c->in.data(), c->in_size}, options.legacy_dialect, options.limits);
        if (det.status == wire::ParseStatus::NeedMore) return;
        if (det.status == wire::ParseStatus::Bad) {
          close(c, "first message is VALIDATE with a wrong magic", true);
          return;
        }
        if (c->ks == main_ks.get() && options.restrict_main_store) {
          bool allowed;
          {
            std::lock_guard lock(mu);
            allowed = store_peer_allowed_locked(*c->ks, c->peer);
          }
          if (!allowed) {
            ++store_strangers;
            warns.warn(Warn::StoreStranger, [&] {
              return fmt::format("[ddprund] closed a TCPStore connection from {}: only loopback and the nodes of the "
                                 "job's current round may use the workers' store",
                                 c->peer.to_string());
            });
            close(c, "", false);
            return;
          }
        }
        c->dialect = det.dialect;
        pos = det.consumed;
      }
    }
    std::string bad;
    bool revoked = false;
    {
      std::unique_lock lock(mu, std::defer_lock);
      while (pos < c->in_size) {
        std::span<const uint8_t> rest{c->in.data() + pos, c->in_size - pos};
        if (!c->agent) {
          // Frame first, resuming where the last read stopped; parse once the request is whole.
          // Parsing from its start on every read made a 64 MiB request cost 21 s of CPU.
          auto framed = c->framer.scan(rest, c->dialect, options.limits);
          if (framed.status == wire::ParseStatus::NeedMore) {
            c->need_total = framed.need_total;
            break;
          }
          if (framed.status == wire::ParseStatus::Bad) {
            bad = framed.error;
            break;
          }
          rest = rest.first(framed.consumed);
          c->framer.reset();
        }
        auto res = c->agent ? rdzv::parse_message(rest, t.msg) : wire::parse_request(rest, c->dialect, options.limits, t.req);
        if (res.status == wire::ParseStatus::NeedMore && !c->agent) res = {wire::ParseStatus::Bad, 0, 0, "request framing and parsing disagree"};
        if (res.status == wire::ParseStatus::NeedMore) {
          c->need_total = res.need_total;
          break;
        }
        if (res.status == wire::ParseStatus::Bad) {
          bad = res.error;
          break;
        }
        pos += res.consumed;
        t.requests.fetch_add(1, std::memory_order_relaxed);
        if (!lock.owns_lock()) lock.lock();
        if (c->revoked) {
          revoked = true;
          break;
        }
        if (c->agent && !c->admitted) {
          // Nothing of an agent reaches the rounds before the handshake let it in.
          auto step = c->handshake->on_message(t.msg);
          if (step.reply) {
            std::string bytes;
            rdzv::encode_message(*step.reply, bytes);
            append_locked(t, c, bytes, step.refused);
          }
          if (step.refused) {
            c->draining = true;
            ++agents_refused;
            warns.warn(Warn::AgentRefused, [&] {
              return fmt::format("[ddprund] refused an agent from {}: {}", c->peer.to_string(), step.why);
            });
            break;
          }
          c->admitted = step.admitted;
          c->session = std::move(step.session);
          if (!step.forward) continue;
        } else if (c->agent && c->session) {
          if (auto v = c->session->open(t.msg); v != rdzv::SessionMac::Verdict::Ok) {
            ++agents_refused;
            warns.warn(Warn::AgentRefused, [&] {
              return fmt::format("[ddprund] dropped {} from agent connection {} ({}): {}", rdzv::msg_type_name(t.msg.type),
                                 c->id, c->peer.to_string(), rdzv::SessionMac::describe(v));
            });
            continue;
          }
        }
        if (c->agent) {
          t.rdzv_out.clear();
          std::string refusal;
          try {
            // Who the agent is, as this server sees it (not as it says): what the store of a
            // round that its node rank 0 hosts admits (round_state.h).
            if (t.msg.type == rdzv::MsgType::Join) t.msg.set("seen_from", c->peer.to_string());
            const size_t jobs_before = rounds.num_jobs();
            rounds.on_message(c->id, t.msg, std::chrono::steady_clock::now(), t.rdzv_out);
            // A job still gathering its nodes opens no store (open() checks the others).
            if (rounds.num_jobs() > jobs_before && rounds.num_jobs() > options.max_jobs) refusal = jobs_limit_message();
          } catch (const std::exception& e) {
            // The job limit (open()) or no descriptor for its store: this agent is refused;
            // its connection's close makes the rounds forget what the JOIN began.
            refusal = e.what();
          }
          if (!refusal.empty()) {
            t.rdzv_out.clear();
            std::string bytes;
            auto error = rdzv::to_message(rdzv::Error{.message = refusal});
            if (c->session) c->session->seal(error);
            rdzv::encode_message(error, bytes);
            append_locked(t, c, bytes, true);
            c->draining = true;
            warns.warn(Warn::JobLimit, [&] { return fmt::format("[ddprund] refused agent connection {}: {}", c->id, refusal); });
            break;
          }
          route_locked(t, t.rdzv_out);
          continue;
        }
        t.others.clear();
        t.reply.clear();
        store::ApplyResult applied;
        try {
          applied = c->ks->state.apply(c->id, c->dialect, t.req, t.reply, t.others);
        } catch (const std::bad_alloc&) {
          applied = {true, "out of memory while serving it"};
          t.reply = store::Reply();
          t.others.clear();
        }
        if (applied.close) {
          bad = std::string(wire::op_name(t.req.op)) + ": " + applied.error;
          break;
        }
        if (!t.reply.empty()) append_locked(t, c, t.reply);
        route_locked(t, t.others);
        t.others.clear();
        // Drop references now (a value replaced later is freed) and memory a LIST_KEYS grew.
        if (t.reply.owned_bytes() > kKeptReplyBytes) t.reply = store::Reply();
        else t.reply.clear();
      }
    }
    flush_pending(t);
    if (!bad.empty()) {
      close(c, bad, true);
      return;
    }
    if (revoked) {
      close(c, "", false);
      return;
    }
    if (pos > 0) {
      std::memmove(c->in.data(), c->in.data() + pos, c->in_size - pos);
      c->in_size -= pos;
      // need_total is relative to the unparsed rest, which now starts at 0: keep it as is.
    }
    if (c->in.size() > 4 * kReadChunk && c->in_size < kReadChunk) {
      buffered -= c->in.size() - kReadChunk;
      c->in.resize(kReadChunk);
      c->in.shrink_to_fit();
    }
  }

  // ---- the outbox (under mu) ----
  // Appends to `target`'s outbox and makes sure it is written once the lock is released
  // (flush_pending): by `self` if `target` lives there, else sent from `self` right away when
  // nobody is writing it (a wake-up must not wait for another thread to wake), or handed to
  // its thread.
  // `bytes`: a std::string_view (copied) or a store::Reply (its values referenced).
  template <class Bytes>
  void append_locked(IoThread& self, const ConnPtr& target, const Bytes& bytes, bool close_after = false) {
    uint64_t size = 0;
    if constexpr (std::is_same_v<Bytes, store::Reply>) size = bytes.wire_size();
    else size = std::string_view(bytes).size();
    {
      std::lock_guard out_lock(target->out_mu);
      if (target->overflowed || target->fd_closed) return;
      // Wire bytes, not memory: the limit is back-pressure on a peer that does not read.
      if (target->out.wire_bytes() + size > options.max_connection_buffered_bytes) {
        // Its peer does not read what it asks for: drop it rather than buffer without end.
        target->overflowed = true;
        target->out.clear();
        asio::post(target->thread->io, [this, target] {
          guarded(target, [&] {
            closed_for_limit(target, Warn::BufferLimit,
                             fmt::format("more than {} bytes queued for a peer that does not read them "
                                         "(--max-connection-buffered-bytes)",
                                         options.max_connection_buffered_bytes));
          });
        });
        return;
      }
      if constexpr (std::is_same_v<Bytes, store::Reply>) target->out.append(bytes);
      else target->out.append(std::string_view(bytes));
      if (close_after) target->close_when_flushed = true;
    }
    wake(self, target);
  }

  void wake(IoThread& self, const ConnPtr& target) {
    if (target->flush_posted.exchange(true)) return;  // queued already, not flushed yet
    (target->thread == &self ? self.to_flush : self.remote).push_back(target);
  }

  void route_locked(IoThread& self, std::vector<store::Outgoing>& others) {
    for (auto& o : others) {
      auto it = conns.find(o.conn);
      if (it == conns.end() || it->second->revoked) continue;
      append_locked(self, it->second, o.reply);
    }
  }

  void route_locked(IoThread& self, std::vector<rdzv::Outbound>& out) {
    std::string bytes;
    for (auto& o : out) {
      auto it = conns.find(o.conn);
      if (it == conns.end() || it->second->revoked) continue;
      bytes.clear();
      if (it->second->session) it->second->session->seal(o.msg);
      rdzv::encode_message(o.msg, bytes);
      append_locked(self, it->second, std::string_view(bytes), o.close_after);
    }
    schedule_tick_locked();
  }

  // Outside mu, on `t`: write what the requests just handled left for connections.
  void flush_pending(IoThread& t) {
    // Each list is swapped out (handling it may queue more) and handed back emptied, so its
    // capacity is reused instead of reallocated on every batch of requests.
    auto take = [](std::vector<ConnPtr>& list, auto&& each) {
      std::vector<ConnPtr> batch;
      batch.swap(list);
      for (auto& c : batch) {
        c->flush_posted = false;
        each(c, batch.size());
      }
      batch.clear();
      if (list.empty()) list.swap(batch);
    };
    // A few wake-ups (a WAIT released, a ROUND) go out from here at once; a broadcast (a
    // join storm's release) is spread over the connections' own threads.
    if (!t.remote.empty()) {
      take(t.remote, [this](const ConnPtr& c, size_t n) {
        if (n <= kMaxDirectSends) send_from_here(c);
        else asio::post(c->thread->io, [this, c] { guarded(c, [&] { flush(c); }); });
      });
    }
    if (!t.to_flush.empty()) take(t.to_flush, [this](const ConnPtr& c, size_t) { flush(c); });
  }

  // On a thread that is not c's: one non-blocking send of c's outbox while nobody else writes
  // it (out_mu held, so c's thread neither writes nor closes the descriptor meanwhile). What
  // does not go now, a close after the flush, or an error, is left to c's thread.
  void send_from_here(const ConnPtr& c) {
    {
      std::lock_guard out_lock(c->out_mu);
      if (c->fd_closed || c->out.empty() || c->writer_busy) return;  // a busy writer flushes again
      if (!c->close_when_flushed) {
        iovec iov[kSendPieces];
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = c->out.front_pieces(kSendPieces, [&, i = size_t{0}](const char* p, size_t n) mutable {
          iov[i++] = {const_cast<char*>(p), n};
        });
        const ssize_t n = ::sendmsg(c->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) c->out.consume(static_cast<size_t>(n));
        if (c->out.empty()) return;
      }
    }
    asio::post(c->thread->io, [this, c] { guarded(c, [&] { flush(c); }); });
  }

  void schedule_tick_locked() {
    auto next = rounds.next_deadline();
    if (rounds.num_agents() > 0) {
      auto hb = std::chrono::steady_clock::now() + kHeartbeatCheckPeriod;
      if (!next || hb < *next) next = hb;
    }
    if (!next) return;
    if (tick_timer->expiry() > std::chrono::steady_clock::now() && tick_timer->expiry() <= *next) return;
    tick_timer->expires_at(*next);
    tick_timer->async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      IoThread& t = *threads.front();
      try {
        {
          std::lock_guard lock(mu);
          t.rdzv_out.clear();
          rounds.on_tick(std::chrono::steady_clock::now(), t.rdzv_out);
          if (const auto stall = rounds.last_stall(); stall.count() > 0)
            warns.warn(Warn::Stall, [&] {
              return fmt::format("[ddprund] the server made no progress for {:.1f} s (a request or the host held it); "
                                 "its agents' heartbeats waited unread meanwhile, so none is dropped for them",
                                 std::chrono::duration<double>(stall).count());
            });
          route_locked(t, t.rdzv_out);
        }
        flush_pending(t);
      } catch (const std::exception& e) {
        warns.warn(Warn::Exception, [&] { return fmt::format("[ddprund] rendezvous tick: {}", e.what()); });
      }
    });
  }

  // ---- writing and closing (the connection's thread) ----
  void flush(const ConnPtr& c) {
    if (c->closed) return;
    bool close_now = false;
    {
      std::lock_guard out_lock(c->out_mu);
      if (c->writer_busy) return;  // its completion flushes again
      if (c->out.empty()) {
        close_now = c->close_when_flushed;
      } else {
        c->writing.swap(c->out);  // `writing` was drained by the last write: `out` gets its buffers
        c->writer_busy = true;
      }
    }
    if (c->writing.empty()) {
      if (close_now) close(c, "", false);
      return;
    }
    write_some(c);
  }

  // The completion of a write of c->writing: on to the next pieces, or to `out` again.
  auto on_written(const ConnPtr& c) {
    return [this, c](boost::system::error_code ec, size_t n) {
      if (!ec && !c->closed) {
        c->writing.consume(n);
        if (!c->writing.empty()) {
          guarded(c, [&] { write_some(c); });
          return;
        }
      }
      {
        std::lock_guard out_lock(c->out_mu);
        c->writer_busy = false;
      }
      if (c->closed || ec) {
        c->writing.clear();  // what was not sent goes, with the values it held
        if (!c->closed) close(c, "", false);
        return;
      }
      guarded(c, [&] { flush(c); });
    };
  }

  // Writes the next pieces of c->writing (a gather write straight from the stored values),
  // then the next, until it is empty; then looks at `out` again.
  void write_some(const ConnPtr& c) {
    c->iov.clear();
    c->writing.front_pieces(kWritePieces, [&](const char* p, size_t n) { c->iov.emplace_back(p, n); });
    // One piece (small replies, the common case) is written as one buffer: a buffer sequence
    // is copied into the write operation, an allocation per write.
    if (c->iov.size() == 1) asio::async_write(c->socket, c->iov.front(), on_written(c));
    else asio::async_write(c->socket, c->iov, on_written(c));
  }


  void close(const ConnPtr& c, const std::string& why, bool bad_input) {
    if (c->closed) return;
    c->closed = true;
    if (bad_input) {
      ++closed_bad;
      warns.warn(Warn::BadInput, [&] {
        boost::system::error_code e;
        auto ep = c->socket.remote_endpoint(e);
        const std::string peer = e ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
        return fmt::format("[ddprund] closing connection {} from {}: {}", c->id, peer, why);
      });
    }
    {
      std::lock_guard out_lock(c->out_mu);  // no other thread is sending on it past this point
      c->fd_closed = true;
      c->out.clear();  // nothing more goes out: let go of the values it references
    }
    boost::system::error_code ignored;
    c->socket.shutdown(tcp::socket::shutdown_both, ignored);
    c->socket.close(ignored);
    buffered -= c->in.size();
    std::vector<uint8_t>().swap(c->in);
    --open_conns;
    if (c->agent) --agents;
    IoThread& t = *c->thread;
    {
      std::lock_guard lock(mu);
      conns.erase(c->id);
      if (!c->revoked) {
        if (c->agent) {
          t.rdzv_out.clear();
          rounds.on_disconnect(c->id, std::chrono::steady_clock::now(), t.rdzv_out);
          route_locked(t, t.rdzv_out);
        } else {
          c->ks->state.disconnect(c->id);
        }
      }
    }
    flush_pending(t);
  }

  // Under mu: every TCPStore connection of `ks` stops touching state now and is closed by its
  // thread. Agents' rendezvous connections (main keyspace) stay: they belong to no round.
  void revoke_connections_locked(const Keyspace* ks) {
    for (auto& [_, c] : conns) {
      if (c->ks != ks || c->revoked || c->agent) continue;
      c->revoked = true;
      asio::post(c->thread->io, [this, c] { guarded(c, [&] { close(c, "", false); }); });
    }
  }

  std::string jobs_limit_message() const {
    return "the rendezvous server runs " + std::to_string(options.max_jobs) +
           " jobs, its limit (ddprund --max-jobs); try again when one ends, or raise the limit";
  }

  // ---- rdzv::WorkerStores: one keyspace and listener per round (called under mu) ----
  uint16_t open(const std::string& run_id, int64_t round, bool fixed_port) override {
    return open_on(run_id, round, fixed_port, 0);
  }
  uint16_t reopen(const std::string& run_id, int64_t round, bool fixed_port, uint16_t port) override {
    return open_on(run_id, round, fixed_port, port);
  }
  void resumed(const std::string& run_id, int64_t round, bool agent_hosted) override {
    spdlog::info("[ddprund] job {}: round {} rebuilt from its agents' re-joins after a restart of this server{}", run_id,
                 round,
                 agent_hosted ? " (its workers' store is on its node rank 0, untouched)"
                              : " (its workers' store reopened here, empty)");
  }
  // `port` 0: any free one; else that one when free (a rebuilt round's workers know it).
  uint16_t open_on(const std::string& run_id, int64_t round, bool fixed_port, uint16_t want) {
    if (fixed_port) {
      spdlog::debug("[ddprund] job {} round {}: workers' store is the main keyspace (port {}), emptied", run_id,
                    round, bound_port.load());
      return main_rounds.open(run_id, round);
    }
    if (rounds.num_jobs() > options.max_jobs) throw std::runtime_error(jobs_limit_message());
    auto ks = std::make_unique<Keyspace>(options.store);
    ks->name = run_id + "/round " + std::to_string(round);
    ks->run_id = run_id;
    // Same address as the main listener, any free port. Out of descriptors, this throws: the
    // joining agent gets an ERROR (process()), the server goes on.
    try {
      try {
        bind(*ks, options.host, want);
      } catch (const std::exception&) {
        if (want == 0) throw;
        bind(*ks, options.host, 0);  // taken meanwhile: the rebuilt round's store moves
      }
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("cannot open the workers' store of job ") + run_id + ": " + e.what());
    }
    const uint16_t port = ks->acceptors.front()->local_endpoint().port();
    start_accepting(ks.get());
    round_ks[{run_id, round}] = std::move(ks);
    spdlog::debug("[ddprund] job {} round {}: workers' store on port {}", run_id, round, port);
    return port;
  }
  void close(const std::string& run_id, int64_t round) override {
    if (main_rounds.close(run_id, round)) return;
    auto it = round_ks.find({run_id, round});
    if (it == round_ks.end()) return;
    std::unique_ptr<Keyspace> ks = std::move(it->second);
    round_ks.erase(it);
    ks->discarded = true;
    revoke_connections_locked(ks.get());
    ks->state.clear();
    stop_accepting(ks.get());
    retired_ks.push_back(std::move(ks));
  }
  bool progressed(const std::string& run_id, int64_t round, int64_t world_size) override {
    if (auto fixed = main_rounds.progressed(run_id, round, world_size)) return *fixed;
    auto it = round_ks.find({run_id, round});
    if (it == round_ks.end()) return false;
    return rdzv::all_workers_joined(it->second->state.integer(rdzv::kWorkerJoinKey), world_size);
  }

  // ---- lifecycle ----
  // A connection closed for a limit: counted and logged as bad input (rate-limited).
  void closed_for_limit(const ConnPtr& c, Warn kind, const std::string& why) {
    ++closed_bad;
    warns.warn(kind, [&] { return fmt::format("[ddprund] closing connection {}: {}", c->id, why); });
    close(c, "", false);
  }

  void check_limits() const {
    const auto& l = options.limits;
    if (l.max_request_bytes < min_request_bytes(l))
      throw std::invalid_argument("a request limit of " + std::to_string(l.max_request_bytes) +
                                  " bytes cannot hold a SET of the longest key and value (" +
                                  std::to_string(min_request_bytes(l)) +
                                  " bytes): raise --max-request-bytes or lower --max-value-len/--max-key-len");
    if (options.store.max_reply_bytes < l.max_value_len + 16)
      throw std::invalid_argument("a reply limit of " + std::to_string(options.store.max_reply_bytes) +
                                  " bytes cannot carry the longest value (" + std::to_string(l.max_value_len) +
                                  "): raise --max-reply-bytes or lower --max-value-len");
    if (options.max_connection_buffered_bytes < options.store.max_reply_bytes)
      throw std::invalid_argument("--max-connection-buffered-bytes must be at least --max-reply-bytes");
    if (options.max_buffered_bytes < l.max_request_bytes)
      throw std::invalid_argument("--max-buffered-bytes must be at least --max-request-bytes");
  }

  void start() {
    check_limits();
    {
      rlimit rl{};
      uint64_t fds = UINT64_MAX;
      if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        fds = rl.rlim_cur > 2 * kReservedDescriptors ? rl.rlim_cur - kReservedDescriptors : rl.rlim_cur / 2;
      max_conns = std::min<uint64_t>(options.max_connections, fds);
    }
    if (threads.size() > 1) presize_descriptor_table();
    listen();
    if (!options.accept_later) start_accepting(main_ks.get());
    started = true;
    for (auto& t : threads) {
      t->thread = std::thread([io = &t->io] {
        auto guard = asio::make_work_guard(*io);
        io->run();
      });
    }
  }

  void accept_clients() {
    if (!started || stopped || !options.accept_later || accepting.exchange(true)) return;
    const int backlog = options.backlog > 0 ? options.backlog : 65535;
    for (auto& a : main_ks->acceptors) a->listen(backlog);  // no operation of theirs is pending yet
    start_accepting(main_ks.get());
  }

  void stop() {
    if (!started || stopped.exchange(true)) return;
    {
      std::lock_guard lock(mu);
      main_ks->discarded = true;
      stop_accepting(main_ks.get());
      for (auto& [_, ks] : round_ks) {
        ks->discarded = true;
        stop_accepting(ks.get());
      }
      asio::post(control(), [this] {
        std::lock_guard l(mu);
        tick_timer->cancel();
      });
      for (auto& [_, c] : conns) asio::post(c->thread->io, [this, c] { guarded(c, [&] { close(c, "", false); }); });
    }
    // Each thread runs what was posted before its stop (FIFO), then returns.
    for (auto& t : threads) asio::post(t->io, [io = &t->io] { io->stop(); });
    for (auto& t : threads) {
      if (t->thread.joinable() && t->thread.get_id() != std::this_thread::get_id()) t->thread.join();
    }
  }
};

uint64_t min_request_bytes(const wire::Limits& l) {
  // MULTI_SET of one pair: code, count, two length prefixes.
  return 1 + 8 + 8 + l.max_key_len + 8 + l.max_value_len;
}

uint64_t raise_fd_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit want = rl;
    want.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &want) == 0) rl = want;
  }
  return rl.rlim_cur;
}

StoreServer::StoreServer(StoreServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

StoreServer::~StoreServer() = default;

void StoreServer::start() { impl_->start(); }

void StoreServer::stop() { impl_->stop(); }

int StoreServer::io_threads() const { return static_cast<int>(impl_->threads.size()); }

uint16_t StoreServer::port() const { return impl_->bound_port; }

void StoreServer::accept_clients() { impl_->accept_clients(); }

std::vector<std::string> StoreServer::set_store_peers(const std::vector<std::string>& addresses) {
  std::vector<asio::ip::address> parsed;
  std::vector<std::string> skipped;
  for (const auto& a : addresses) {
    boost::system::error_code ec;
    const auto addr = asio::ip::make_address(a, ec);
    if (ec) skipped.push_back(a);
    else parsed.push_back(plain_address(addr));
  }
  std::lock_guard lock(impl_->mu);
  impl_->store_peers = std::move(parsed);
  return skipped;
}

void StoreServer::reset_keyspace() {
  std::lock_guard lock(impl_->mu);
  impl_->revoke_connections_locked(impl_->main_ks.get());
  impl_->main_ks->state.clear();
}

int64_t StoreServer::counter(const std::string& key) {
  std::lock_guard lock(impl_->mu);
  return impl_->main_ks->state.integer(key).value_or(-1);
}

StoreServerStats StoreServer::stats() const {
  StoreServerStats s;
  s.connections_accepted = impl_->accepted;
  s.connections_open = impl_->open_conns;
  s.connections_closed_for_bad_input = impl_->closed_bad;
  for (auto& t : impl_->threads) s.requests += t->requests.load(std::memory_order_relaxed);
  s.agents_connected = impl_->agents;
  s.connections_refused_over_limit = impl_->refused_over_limit;
  s.accept_errors = impl_->accept_errors;
  s.agents_refused = impl_->agents_refused;
  s.store_clients_refused = impl_->store_strangers;
  return s;
}

}  // namespace ddprun::server
