#include "ddprun/server/store_server.h"

#include <spdlog/spdlog.h>

#include <boost/asio.hpp>
#include <cstring>
#include <future>
#include <map>
#include <thread>
#include <unordered_map>

#include "ddprun/rdzv/agent_protocol.h"
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
}  // namespace

struct StoreServer::Impl : rdzv::WorkerStores {
  // A keyspace with its own listener: the main one (TCPStore + agents' rendezvous) and one
  // per rendezvous round for that round's workers, so every attempt starts empty and no
  // worker of an old attempt can reach the new one's keys.
  struct Keyspace {
    explicit Keyspace(asio::io_context& io) : acceptor(io) {}
    tcp::acceptor acceptor;
    store::StoreState state;
    std::string name;
  };

  struct Connection {
    Connection(tcp::socket sock, ConnId i, Keyspace* k) : socket(std::move(sock)), id(i), ks(k) {}
    tcp::socket socket;
    ConnId id;
    Keyspace* ks;
    bool agent = false;  // speaks the agents' rendezvous protocol, not TCPStore
    wire::Dialect dialect = wire::Dialect::Unknown;
    std::vector<uint8_t> in;
    size_t in_size = 0;
    size_t need_total = 0;
    size_t chunk = kSmallReadChunk;
    std::string out, writing;
    bool write_in_flight = false;
    bool close_when_flushed = false;
    bool closed = false;
    std::string peer;
  };

  explicit Impl(StoreServerOptions o) : options(std::move(o)), main_ks(io), rounds(*this), tick_timer(io) {
    main_ks.name = "main";
  }

  StoreServerOptions options;
  asio::io_context io{1};  // one thread runs it: no scheduler locking needed
  Keyspace main_ks;
  std::map<std::pair<std::string, int64_t>, std::unique_ptr<Keyspace>> round_ks;
  rdzv::RoundState rounds;
  asio::steady_timer tick_timer;
  std::unordered_map<ConnId, std::shared_ptr<Connection>> conns;
  ConnId next_id = 1;
  std::thread thread;
  std::atomic<uint16_t> bound_port{0};
  std::atomic<uint64_t> accepted{0}, closed_bad{0}, requests{0}, open_conns{0}, agents{0};
  std::vector<store::Outgoing> others;
  std::vector<rdzv::Outbound> rdzv_out;
  wire::Request req;
  rdzv::Message msg;
  tcp::endpoint bound_endpoint;

  // ---- listening ----
  void bind(Keyspace& ks, const std::string& host, uint16_t port) {
    auto open_and_bind = [&](const tcp::endpoint& ep) {
      ks.acceptor.open(ep.protocol());
      ks.acceptor.set_option(tcp::acceptor::reuse_address(true));
      if (ep.protocol() == tcp::v6()) ks.acceptor.set_option(asio::ip::v6_only(false));
      ks.acceptor.bind(ep);
    };
    const int backlog = options.backlog > 0 ? options.backlog : 65535;  // the kernel caps it at somaxconn
    if (host.empty()) {
      try {
        open_and_bind(tcp::endpoint(tcp::v6(), port));
      } catch (const boost::system::system_error&) {
        if (ks.acceptor.is_open()) ks.acceptor.close();
        open_and_bind(tcp::endpoint(tcp::v4(), port));
      }
    } else {
      tcp::resolver resolver(io);
      auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive | tcp::resolver::numeric_service);
      boost::system::error_code last = boost::system::errc::make_error_code(boost::system::errc::address_not_available);
      for (const auto& r : results) {
        try {
          open_and_bind(r.endpoint());
          last = {};
          break;
        } catch (const boost::system::system_error& e) {
          last = e.code();
          if (ks.acceptor.is_open()) ks.acceptor.close();
        }
      }
      if (last)
        throw std::system_error(last.value(), std::generic_category(),
                                "cannot bind the store to " + host + ":" + std::to_string(port));
    }
    ks.acceptor.listen(backlog);
  }

  void listen() {
    try {
      bind(main_ks, options.host, options.port);
    } catch (const boost::system::system_error& e) {
      throw std::system_error(e.code().value(), std::generic_category(),
                              "cannot listen on " + (options.host.empty() ? std::string("*") : options.host) + ":" +
                                  std::to_string(options.port));
    }
    bound_endpoint = main_ks.acceptor.local_endpoint();
    bound_port = bound_endpoint.port();
  }

  void do_accept(Keyspace* ks) {
    ks->acceptor.async_accept([this, ks](boost::system::error_code ec, tcp::socket sock) {
      if (ec == asio::error::operation_aborted || !ks->acceptor.is_open()) return;
      if (ec) {
        spdlog::warn("[ddprund] accept failed on the {} store: {}; retrying", ks->name, ec.message());
        auto t = std::make_shared<asio::steady_timer>(io, std::chrono::milliseconds(10));
        t->async_wait([this, ks, t](boost::system::error_code e2) {
          if (!e2) do_accept(ks);
        });
        return;
      }
      boost::system::error_code ignored;
      sock.set_option(tcp::no_delay(true), ignored);
      auto c = std::make_shared<Connection>(std::move(sock), next_id++, ks);
      auto ep = c->socket.remote_endpoint(ignored);
      if (!ignored) c->peer = ep.address().to_string() + ":" + std::to_string(ep.port());
      conns.emplace(c->id, c);
      ++accepted;
      ++open_conns;
      start_read(c);
      do_accept(ks);
    });
  }

  // ---- reading and dispatch ----
  void start_read(const std::shared_ptr<Connection>& c) {
    // A request announces its length before its bytes: grow towards it only as bytes arrive
    // (doubling what is buffered), so announced-but-unsent megabytes cost nothing.
    size_t missing = c->need_total > c->in_size ? c->need_total - c->in_size : 0;
    size_t want = std::max(c->chunk, std::min(missing, std::max(c->in_size, kReadChunk)));
    if (c->in.size() < c->in_size + want) c->in.resize(c->in_size + want);
    c->socket.async_read_some(asio::buffer(c->in.data() + c->in_size, want),
                              [this, c](boost::system::error_code ec, size_t n) {
                                if (c->closed) return;
                                if (ec) {
                                  close(c, "", false);
                                  return;
                                }
                                c->in_size += n;
                                if (n == c->in.size() - (c->in_size - n) && c->chunk < kReadChunk) c->chunk *= 2;
                                process(c);
                                if (!c->closed) start_read(c);
                              });
  }

  void process(const std::shared_ptr<Connection>& c) {
    if (c->in_size < c->need_total) return;
    c->need_total = 0;
    size_t pos = 0;
    if (c->dialect == wire::Dialect::Unknown && !c->agent) {
      if (c->in_size >= 5 && c->in[0] == 0 && wire::load_u32(c->in.data() + 1) == rdzv::kAgentMagic &&
          c->ks == &main_ks && options.enable_rendezvous) {
        c->agent = true;
        ++agents;
        pos = 5;
      } else {
        auto det = wire::detect_dialect({c->in.data(), c->in_size}, options.legacy_dialect, options.limits);
        if (det.status == wire::ParseStatus::NeedMore) return;
        if (det.status == wire::ParseStatus::Bad) {
          close(c, "first message is VALIDATE with a wrong magic", true);
          return;
        }
        c->dialect = det.dialect;
        pos = det.consumed;
      }
    }
    while (pos < c->in_size && !c->closed) {
      std::span<const uint8_t> rest{c->in.data() + pos, c->in_size - pos};
      auto res = c->agent ? rdzv::parse_message(rest, msg) : wire::parse_request(rest, c->dialect, options.limits, req);
      if (res.status == wire::ParseStatus::NeedMore) {
        c->need_total = res.need_total;
        break;
      }
      if (res.status == wire::ParseStatus::Bad) {
        close(c, res.error, true);
        return;
      }
      pos += res.consumed;
      ++requests;
      if (c->agent) {
        rdzv_out.clear();
        rounds.on_message(c->id, msg, std::chrono::steady_clock::now(), rdzv_out);
        deliver(rdzv_out);
        continue;
      }
      others.clear();
      auto applied = c->ks->state.apply(c->id, c->dialect, req, c->out, others);
      if (applied.close) {
        close(c, std::string(wire::op_name(req.op)) + ": " + applied.error, true);
        return;
      }
      for (auto& o : others) {
        auto it = conns.find(o.conn);
        if (it == conns.end() || it->second->closed) continue;
        it->second->out += o.bytes;
        if (it->second != c) flush(it->second);
      }
    }
    if (c->closed) return;
    if (pos > 0) {
      std::memmove(c->in.data(), c->in.data() + pos, c->in_size - pos);
      c->in_size -= pos;
      // need_total is relative to the unparsed rest, which now starts at 0: keep it as is.
    }
    if (c->in.size() > 4 * kReadChunk && c->in_size < kReadChunk) {
      c->in.resize(kReadChunk);
      c->in.shrink_to_fit();
    }
    flush(c);
  }

  void deliver(std::vector<rdzv::Outbound>& out) {
    for (auto& o : out) {
      auto it = conns.find(o.conn);
      if (it == conns.end() || it->second->closed || it->second->close_when_flushed) continue;
      rdzv::encode_message(o.msg, it->second->out);
      if (o.close_after) it->second->close_when_flushed = true;
      flush(it->second);
    }
    schedule_tick();
  }

  void schedule_tick() {
    auto next = rounds.next_deadline();
    if (rounds.num_agents() > 0) {
      auto hb = std::chrono::steady_clock::now() + kHeartbeatCheckPeriod;
      if (!next || hb < *next) next = hb;
    }
    if (!next) return;
    if (tick_timer.expiry() > std::chrono::steady_clock::now() && tick_timer.expiry() <= *next) return;
    tick_timer.expires_at(*next);
    tick_timer.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      rdzv_out.clear();
      rounds.on_tick(std::chrono::steady_clock::now(), rdzv_out);
      deliver(rdzv_out);
    });
  }

  void flush(const std::shared_ptr<Connection>& c) {
    if (c->closed || c->write_in_flight) return;
    if (c->out.empty()) {
      if (c->close_when_flushed) close(c, "", false);
      return;
    }
    c->writing.swap(c->out);
    c->out.clear();
    c->write_in_flight = true;
    asio::async_write(c->socket, asio::buffer(c->writing), [this, c](boost::system::error_code ec, size_t) {
      c->write_in_flight = false;
      c->writing.clear();
      if (c->closed) return;
      if (ec) {
        close(c, "", false);
        return;
      }
      flush(c);
    });
  }

  void close(const std::shared_ptr<Connection>& c, const std::string& why, bool bad_input) {
    if (c->closed) return;
    c->closed = true;
    if (bad_input) {
      ++closed_bad;
      spdlog::warn("[ddprund] closing connection {} from {}: {}", c->id, c->peer, why);
    }
    boost::system::error_code ignored;
    c->socket.shutdown(tcp::socket::shutdown_both, ignored);
    c->socket.close(ignored);
    conns.erase(c->id);
    --open_conns;
    if (c->agent) {
      --agents;
      rdzv_out.clear();
      rounds.on_disconnect(c->id, std::chrono::steady_clock::now(), rdzv_out);
      deliver(rdzv_out);
    } else {
      c->ks->state.disconnect(c->id);
    }
  }

  void close_connections_of(Keyspace* ks) {
    std::vector<std::shared_ptr<Connection>> victims;
    for (auto& [_, c] : conns)
      if (c->ks == ks) victims.push_back(c);
    for (auto& c : victims) close(c, "", false);
  }

  void close_all() {
    std::vector<std::shared_ptr<Connection>> all;
    for (auto& [_, c] : conns) all.push_back(c);
    for (auto& c : all) close(c, "", false);
  }

  // ---- rdzv::WorkerStores: one keyspace and listener per round ----
  uint16_t open(const std::string& run_id, int64_t round) override {
    auto ks = std::make_unique<Keyspace>(io);
    ks->name = run_id + "/round " + std::to_string(round);
    // Same address as the main listener, any free port.
    bind(*ks, options.host, 0);
    const uint16_t port = ks->acceptor.local_endpoint().port();
    do_accept(ks.get());
    round_ks[{run_id, round}] = std::move(ks);
    spdlog::debug("[ddprund] job {} round {}: workers' store on port {}", run_id, round, port);
    return port;
  }
  void close(const std::string& run_id, int64_t round) override {
    auto it = round_ks.find({run_id, round});
    if (it == round_ks.end()) return;
    boost::system::error_code ignored;
    it->second->acceptor.close(ignored);
    close_connections_of(it->second.get());
    // The acceptor may still have a completion queued: free the keyspace after it ran.
    auto ks = std::shared_ptr<Keyspace>(std::move(it->second));
    round_ks.erase(it);
    asio::post(io, [ks] {});
  }
  bool progressed(const std::string& run_id, int64_t round, int64_t world_size) override {
    auto it = round_ks.find({run_id, round});
    if (it == round_ks.end()) return false;
    return it->second->state.integer("init/").value_or(0) >= world_size;
  }
};

StoreServer::StoreServer(StoreServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

StoreServer::~StoreServer() { stop(); }

void StoreServer::start() {
  impl_->listen();
  impl_->do_accept(&impl_->main_ks);
  impl_->thread = std::thread([impl = impl_.get()] { impl->io.run(); });
}

void StoreServer::run() {
  impl_->listen();
  impl_->do_accept(&impl_->main_ks);
  impl_->io.run();
}

void StoreServer::stop() {
  if (!impl_) return;
  asio::post(impl_->io, [impl = impl_.get()] {
    boost::system::error_code ignored;
    impl->main_ks.acceptor.close(ignored);
    for (auto& [_, ks] : impl->round_ks) ks->acceptor.close(ignored);
    impl->tick_timer.cancel();
    impl->close_all();
    impl->io.stop();
  });
  if (impl_->thread.joinable() && impl_->thread.get_id() != std::this_thread::get_id()) impl_->thread.join();
}

uint16_t StoreServer::port() const { return impl_->bound_port; }

void StoreServer::reset_keyspace() {
  auto reset = [impl = impl_.get()] {
    impl->close_connections_of(&impl->main_ks);
    impl->main_ks.state.clear();
  };
  if (!impl_->thread.joinable()) {
    reset();
    return;
  }
  std::promise<void> done;
  auto fut = done.get_future();
  asio::post(impl_->io, [&] {
    reset();
    done.set_value();
  });
  if (impl_->thread.get_id() == std::this_thread::get_id()) return;
  fut.wait();
}

int64_t StoreServer::counter(const std::string& key) {
  auto read = [impl = impl_.get(), &key]() -> int64_t { return impl->main_ks.state.integer(key).value_or(-1); };
  if (!impl_->thread.joinable() || impl_->thread.get_id() == std::this_thread::get_id()) return read();
  std::promise<int64_t> done;
  auto fut = done.get_future();
  asio::post(impl_->io, [&] { done.set_value(read()); });
  return fut.get();
}

StoreServerStats StoreServer::stats() const {
  StoreServerStats s;
  s.connections_accepted = impl_->accepted;
  s.connections_open = impl_->open_conns;
  s.connections_closed_for_bad_input = impl_->closed_bad;
  s.requests = impl_->requests;
  s.agents_connected = impl_->agents;
  return s;
}

}  // namespace ddprun::server
