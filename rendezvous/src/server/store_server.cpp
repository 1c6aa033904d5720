#include "ddprun/server/store_server.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <boost/asio.hpp>
#include <cstring>
#include <future>
#include <thread>
#include <unordered_map>

namespace ddprun::server {

namespace asio = boost::asio;
using asio::ip::tcp;
using store::ConnId;

namespace {
constexpr size_t kReadChunk = 64 * 1024;
}

struct StoreServer::Impl {
  struct Connection : std::enable_shared_from_this<Connection> {
    Connection(Impl& s, tcp::socket sock, ConnId i) : server(s), socket(std::move(sock)), id(i) {}
    Impl& server;
    tcp::socket socket;
    ConnId id;
    wire::Dialect dialect = wire::Dialect::Unknown;
    std::vector<uint8_t> in;      // received, not yet parsed
    size_t in_size = 0;
    size_t need_total = 0;        // don't re-parse until this many bytes are there
    std::string out;              // replies waiting to be written
    std::string writing;          // the buffer of the write in flight
    bool write_in_flight = false;
    bool closed = false;
    std::string peer;
  };

  explicit Impl(StoreServerOptions o) : options(std::move(o)), acceptor(io) {}

  StoreServerOptions options;
  asio::io_context io;
  tcp::acceptor acceptor;
  store::StoreState state;
  std::unordered_map<ConnId, std::shared_ptr<Connection>> conns;
  ConnId next_id = 1;
  std::thread thread;
  std::atomic<uint16_t> bound_port{0};
  std::atomic<uint64_t> accepted{0}, closed_bad{0}, requests{0}, open{0};
  std::vector<store::Outgoing> others;  // scratch
  wire::Request req;                    // scratch
  std::unique_ptr<asio::steady_timer> accept_retry;

  void listen() {
    auto open_and_bind = [&](const tcp::endpoint& ep) {
      acceptor.open(ep.protocol());
      acceptor.set_option(tcp::acceptor::reuse_address(true));
      if (ep.protocol() == tcp::v6()) acceptor.set_option(asio::ip::v6_only(false));
      acceptor.bind(ep);
    };
    const int backlog = options.backlog > 0 ? options.backlog : 65535;  // kernel caps at somaxconn
    if (options.host.empty()) {
      try {
        open_and_bind(tcp::endpoint(tcp::v6(), options.port));
      } catch (const boost::system::system_error&) {
        if (acceptor.is_open()) acceptor.close();
        open_and_bind(tcp::endpoint(tcp::v4(), options.port));
      }
    } else {
      tcp::resolver resolver(io);
      auto results = resolver.resolve(options.host, std::to_string(options.port),
                                      tcp::resolver::passive | tcp::resolver::numeric_service);
      boost::system::error_code last;
      for (const auto& r : results) {
        try {
          open_and_bind(r.endpoint());
          last = {};
          break;
        } catch (const boost::system::system_error& e) {
          last = e.code();
          if (acceptor.is_open()) acceptor.close();
        }
      }
      if (last || !acceptor.is_open())
        throw std::system_error(last ? last.value() : EADDRNOTAVAIL, std::generic_category(),
                                "cannot bind the store to " + options.host + ":" + std::to_string(options.port));
    }
    acceptor.listen(backlog);
    bound_port = acceptor.local_endpoint().port();
  }

  void do_accept() {
    acceptor.async_accept([this](boost::system::error_code ec, tcp::socket sock) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
      if (ec) {
        // EMFILE/ENFILE and friends: the listener stays up; try again shortly.
        spdlog::warn("[ddprund] accept failed: {}; retrying", ec.message());
        accept_retry = std::make_unique<asio::steady_timer>(io, std::chrono::milliseconds(10));
        accept_retry->async_wait([this](boost::system::error_code e2) {
          if (!e2) do_accept();
        });
        return;
      }
      boost::system::error_code ignored;
      sock.set_option(tcp::no_delay(true), ignored);
      auto c = std::make_shared<Connection>(*this, std::move(sock), next_id++);
      auto ep = c->socket.remote_endpoint(ignored);
      if (!ignored) c->peer = ep.address().to_string() + ":" + std::to_string(ep.port());
      conns.emplace(c->id, c);
      ++accepted;
      ++open;
      start_read(c);
      do_accept();
    });
  }

  void start_read(const std::shared_ptr<Connection>& c) {
    size_t want = std::max(kReadChunk, c->need_total > c->in_size ? c->need_total - c->in_size : 0);
    // need_total is bounded by the request limit, so this never trusts a length blindly.
    if (c->in.size() < c->in_size + want) c->in.resize(c->in_size + want);
    c->socket.async_read_some(asio::buffer(c->in.data() + c->in_size, want),
                              [this, c](boost::system::error_code ec, size_t n) {
                                if (c->closed) return;
                                if (ec) {
                                  close(c, "", false);
                                  return;
                                }
                                c->in_size += n;
                                process(c);
                                if (!c->closed) start_read(c);
                              });
  }

  void process(const std::shared_ptr<Connection>& c) {
    size_t pos = 0;
    if (c->in_size < c->need_total) return;
    c->need_total = 0;
    if (c->dialect == wire::Dialect::Unknown) {
      auto det = wire::detect_dialect({c->in.data(), c->in_size}, options.legacy_dialect, options.limits);
      if (det.status == wire::ParseStatus::NeedMore) return;
      if (det.status == wire::ParseStatus::Bad) {
        close(c, "first message is VALIDATE with a wrong magic", true);
        return;
      }
      c->dialect = det.dialect;
      pos = det.consumed;
      spdlog::debug("[ddprund] connection {} from {} speaks {}", c->id, c->peer, wire::dialect_name(c->dialect));
    }
    while (pos < c->in_size) {
      auto res = wire::parse_request({c->in.data() + pos, c->in_size - pos}, c->dialect, options.limits, req);
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
      others.clear();
      auto applied = state.apply(c->id, c->dialect, req, c->out, others);
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
    // Compact what is left (a partial request) to the front of the buffer.
    if (pos > 0) {
      std::memmove(c->in.data(), c->in.data() + pos, c->in_size - pos);
      c->in_size -= pos;
      if (c->need_total) c->need_total -= pos;
    }
    if (c->in.size() > 4 * kReadChunk && c->in_size < kReadChunk) {
      c->in.resize(kReadChunk);
      c->in.shrink_to_fit();
    }
    flush(c);
  }

  void flush(const std::shared_ptr<Connection>& c) {
    if (c->write_in_flight || c->out.empty() || c->closed) return;
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
    state.disconnect(c->id);
    boost::system::error_code ignored;
    c->socket.shutdown(tcp::socket::shutdown_both, ignored);
    c->socket.close(ignored);
    conns.erase(c->id);
    --open;
  }

  void close_all() {
    auto copy = conns;
    for (auto& [_, c] : copy) close(c, "", false);
  }
};

StoreServer::StoreServer(StoreServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

StoreServer::~StoreServer() { stop(); }

void StoreServer::start() {
  impl_->listen();
  impl_->do_accept();
  impl_->thread = std::thread([impl = impl_.get()] { impl->io.run(); });
}

void StoreServer::run() {
  impl_->listen();
  impl_->do_accept();
  impl_->io.run();
}

void StoreServer::stop() {
  if (!impl_) return;
  asio::post(impl_->io, [impl = impl_.get()] {
    boost::system::error_code ignored;
    impl->acceptor.close(ignored);
    impl->close_all();
    impl->io.stop();
  });
  if (impl_->thread.joinable() && impl_->thread.get_id() != std::this_thread::get_id()) impl_->thread.join();
}

uint16_t StoreServer::port() const { return impl_->bound_port; }

void StoreServer::reset_keyspace() {
  if (!impl_->thread.joinable()) {  // not serving on a background thread: nothing runs concurrently
    impl_->close_all();
    impl_->state.clear();
    return;
  }
  std::promise<void> done;
  auto fut = done.get_future();
  asio::post(impl_->io, [impl = impl_.get(), &done] {
    impl->close_all();
    impl->state.clear();
    done.set_value();
  });
  if (impl_->thread.get_id() == std::this_thread::get_id()) return;  // posted from a handler
  fut.wait();
}

StoreServerStats StoreServer::stats() const {
  StoreServerStats s;
  s.connections_accepted = impl_->accepted;
  s.connections_open = impl_->open;
  s.connections_closed_for_bad_input = impl_->closed_bad;
  s.requests = impl_->requests;
  return s;
}

}  // namespace ddprun::server
