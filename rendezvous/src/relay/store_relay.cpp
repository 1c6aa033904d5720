#include "ddprun/relay/store_relay.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <utility>  // before Boost.Asio, whose awaitable.hpp uses std::exchange without it
#include <boost/asio.hpp>
#include <vector>

#include "ddprun/wire/mux.h"

namespace ddprun::relay {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
namespace mux = wire::mux;

namespace {
constexpr size_t kReadChunk = 64 * 1024;

// One worker's connection: one channel upstream.
struct Client {
  Client(tcp::socket s, uint32_t i) : sock(std::move(s)), id(i), buf(kReadChunk) {}
  tcp::socket sock;
  const uint32_t id;
  std::vector<char> buf;
  std::deque<std::string> out;  // bytes from the store, towards the worker
  size_t out_bytes = 0;
  bool writing = false, close_after = false, closed = false;
};
using ClientPtr = std::shared_ptr<Client>;
}  // namespace

struct StoreRelay::Impl {
  explicit Impl(StoreRelayOptions o) : opts(std::move(o)) {}
  StoreRelayOptions opts;
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  tcp::socket up{io};
  asio::steady_timer retry{io};
  asio::steady_timer accept_pause{io};
  std::thread thread;
  std::chrono::steady_clock::time_point give_up;
  std::unordered_map<uint32_t, ClientPtr> clients;
  uint32_t next_id = 1;
  std::string up_out, up_writing;  // frames queued towards the store; the write in flight
  std::vector<uint8_t> up_in;
  size_t up_in_size = 0;
  bool up_busy = false, up_connected = false, up_lost = false;
  std::atomic<uint64_t> accepted{0}, refused{0}, dropped_slow{0}, sessions_open{0};
  std::atomic<bool> connected_flag{false}, lost_flag{false};

  void connect();
  void on_connect_error(const boost::system::error_code& ec);
  void accept();
  void read_client(const ClientPtr& c);
  void write_client(const ClientPtr& c);
  void close_client(const ClientPtr& c, bool tell_store);
  void send_up(uint32_t channel, mux::Kind kind, std::span<const uint8_t> bytes = {});
  void write_up();
  void read_up();
  void on_frame(const mux::Frame& f);
  void lose_upstream(const std::string& why);
};

void StoreRelay::Impl::connect() {
  auto resolver = std::make_shared<tcp::resolver>(io);
  resolver->async_resolve(opts.upstream_host, std::to_string(opts.upstream_port),
                          [this, resolver](boost::system::error_code ec, tcp::resolver::results_type eps) {
                            if (ec) return on_connect_error(ec);
                            asio::async_connect(up, eps, [this](boost::system::error_code ec2, const tcp::endpoint&) {
                              if (ec2) return on_connect_error(ec2);
                              boost::system::error_code ignored;
                              up.set_option(tcp::no_delay(true), ignored);
                              up_connected = true;
                              connected_flag = true;
                              spdlog::debug("store relay: connected to the store at {}:{}", opts.upstream_host,
                                            opts.upstream_port);
                              read_up();
                              write_up();
                            });
                          });
}

// Refused (the store is not up yet) and the like: tried again until connect_timeout.
void StoreRelay::Impl::on_connect_error(const boost::system::error_code& ec) {
  if (up_lost) return;
  if (std::chrono::steady_clock::now() >= give_up) {
    return lose_upstream(
        fmt::format("could not connect to the store at {}:{} within {} s: {}", opts.upstream_host, opts.upstream_port,
                    std::chrono::duration_cast<std::chrono::seconds>(opts.connect_timeout).count(), ec.message()));
  }
  boost::system::error_code ignored;
  up.close(ignored);
  retry.expires_after(opts.connect_retry);
  retry.async_wait([this](boost::system::error_code e) {
    if (!e) connect();
  });
}

void StoreRelay::Impl::accept() {
  acceptor.async_accept([this](boost::system::error_code ec, tcp::socket s) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {  // out of descriptors and the like: accept again a little later, not in a busy loop
      spdlog::warn("store relay: accepting a worker connection: {}", ec.message());
      accept_pause.expires_after(std::chrono::milliseconds(100));
      accept_pause.async_wait([this](boost::system::error_code e) {
        if (!e) accept();
      });
      return;
    }
    {
      boost::system::error_code e;
      const auto peer = s.remote_endpoint(e);
      const char* refuse = nullptr;
      if (e || !peer.address().is_loopback()) refuse = "not from this host";
      else if (up_lost) refuse = "the store is lost";
      else if (clients.size() >= mux::kMaxSessions) refuse = "too many connections";
      if (refuse) {
        ++refused;
        spdlog::warn("store relay: refused a connection ({})", refuse);
        s.close(e);
      } else {
        s.set_option(tcp::no_delay(true), e);
        uint32_t id = next_id++;
        if (next_id == 0) next_id = 1;
        auto c = std::make_shared<Client>(std::move(s), id);
        clients.emplace(id, c);
        ++accepted;
        ++sessions_open;
        send_up(id, mux::Kind::Open);
        read_client(c);
      }
    }
    accept();
  });
}

void StoreRelay::Impl::read_client(const ClientPtr& c) {
  c->sock.async_read_some(asio::buffer(c->buf), [this, c](boost::system::error_code ec, size_t n) {
    if (c->closed) return;
    if (ec) return close_client(c, true);
    send_up(c->id, mux::Kind::Data, {reinterpret_cast<const uint8_t*>(c->buf.data()), n});
    if (!c->closed) read_client(c);
  });
}

void StoreRelay::Impl::write_client(const ClientPtr& c) {
  if (c->writing || c->closed) return;
  if (c->out.empty()) {
    if (c->close_after) close_client(c, false);
    return;
  }
  c->writing = true;
  asio::async_write(c->sock, asio::buffer(c->out.front()), [this, c](boost::system::error_code ec, size_t n) {
    c->writing = false;
    if (c->closed) return;
    if (ec) return close_client(c, true);
    c->out_bytes -= n;
    c->out.pop_front();
    write_client(c);
  });
}

// `tell_store`: the worker went (or was dropped), so the store ends its channel too.
void StoreRelay::Impl::close_client(const ClientPtr& c, bool tell_store) {
  if (c->closed) return;
  c->closed = true;
  boost::system::error_code ignored;
  c->sock.shutdown(tcp::socket::shutdown_both, ignored);
  c->sock.close(ignored);
  c->out.clear();
  clients.erase(c->id);
  --sessions_open;
  if (tell_store && !up_lost) send_up(c->id, mux::Kind::Close);
}

void StoreRelay::Impl::send_up(uint32_t channel, mux::Kind kind, std::span<const uint8_t> bytes) {
  if (up_lost) return;
  mux::append_frame(up_out, channel, kind, bytes);
  if (up_out.size() + up_writing.size() > opts.max_upstream_buffered) {
    return lose_upstream(
        fmt::format("more than {} bytes queued for a store that does not read them", opts.max_upstream_buffered));
  }
  write_up();
}

void StoreRelay::Impl::write_up() {
  if (!up_connected || up_busy || up_lost || up_out.empty()) return;
  up_busy = true;
  up_writing.clear();
  up_writing.swap(up_out);
  asio::async_write(up, asio::buffer(up_writing), [this](boost::system::error_code ec, size_t) {
    up_busy = false;
    if (up_lost) return;
    if (ec) return lose_upstream("writing to the store: " + ec.message());
    write_up();
  });
}

void StoreRelay::Impl::read_up() {
  if (up_in.size() < up_in_size + kReadChunk) up_in.resize(up_in_size + kReadChunk);
  up.async_read_some(asio::buffer(up_in.data() + up_in_size, up_in.size() - up_in_size),
                     [this](boost::system::error_code ec, size_t n) {
                       if (up_lost) return;
                       if (ec)
                         return lose_upstream(ec == asio::error::eof ? "the store closed the connection"
                                                                     : "reading from the store: " + ec.message());
                       up_in_size += n;
                       size_t pos = 0;
                       while (!up_lost) {
                         const auto d = mux::decode_frame({up_in.data() + pos, up_in_size - pos});
                         if (d.status == wire::ParseStatus::NeedMore) break;
                         if (d.status != wire::ParseStatus::Ok)
                           return lose_upstream(std::string("the store sent ") + d.bad);
                         on_frame(d.frame);
                         pos += d.consumed;
                       }
                       if (up_lost) return;
                       up_in.erase(up_in.begin(), up_in.begin() + static_cast<std::ptrdiff_t>(pos));
                       up_in_size -= pos;
                       if (up_in.size() > 4 * kReadChunk && up_in_size < kReadChunk) {
                         up_in.resize(kReadChunk);
                         up_in.shrink_to_fit();
                       }
                       read_up();
                     });
}

void StoreRelay::Impl::on_frame(const mux::Frame& f) {
  const auto it = clients.find(f.channel);
  if (it == clients.end()) return;  // a worker that went meanwhile (its CLOSE is on its way)
  const ClientPtr c = it->second;
  if (f.kind == mux::Kind::Close) {
    c->close_after = true;  // what the store sent before its CLOSE still reaches the worker
    return write_client(c);
  }
  if (f.kind != mux::Kind::Data) return lose_upstream("the store opened a channel");
  if (c->out_bytes + f.payload.size() > opts.max_client_buffered) {
    ++dropped_slow;
    spdlog::debug("store relay: dropped worker connection {}: more than {} bytes queued for it, unread", c->id,
                  opts.max_client_buffered);
    return close_client(c, true);
  }
  c->out.emplace_back(reinterpret_cast<const char*>(f.payload.data()), f.payload.size());
  c->out_bytes += f.payload.size();
  write_client(c);
}

// Every worker connection closes: their TCPStore clients fail as on a lost store.
void StoreRelay::Impl::lose_upstream(const std::string& why) {
  if (up_lost) return;
  up_lost = true;
  lost_flag = true;
  spdlog::warn("store relay: lost the store at {}:{} ({}); closing its {} worker connections", opts.upstream_host,
               opts.upstream_port, why, clients.size());
  boost::system::error_code ignored;
  up.close(ignored);
  retry.cancel();
  auto all = std::move(clients);
  clients.clear();
  for (auto& [id, c] : all) close_client(c, false);
  sessions_open = 0;
  up_out.clear();
}

StoreRelay::StoreRelay(StoreRelayOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

StoreRelay::~StoreRelay() { stop(); }

uint16_t StoreRelay::start() {
  Impl& m = *impl_;
  try {
    const tcp::endpoint ep(asio::ip::make_address(m.opts.listen_host), 0);
    m.acceptor.open(ep.protocol());
    m.acceptor.set_option(tcp::acceptor::reuse_address(true));
    m.acceptor.bind(ep);
    m.acceptor.listen(asio::socket_base::max_listen_connections);
    port_ = m.acceptor.local_endpoint().port();
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("store relay: cannot listen on {}: {}", m.opts.listen_host, e.what()));
  }
  std::string hello;
  mux::append_hello(hello);
  m.up_out = hello;
  m.give_up = std::chrono::steady_clock::now() + m.opts.connect_timeout;
  m.connect();
  m.accept();
  m.thread = std::thread([&m] {
    try {
      m.io.run();
    } catch (const std::exception& e) {
      spdlog::error("store relay: {}", e.what());
    }
  });
  return port_;
}

void StoreRelay::stop() {
  if (!impl_ || !impl_->thread.joinable()) return;
  impl_->io.stop();
  impl_->thread.join();
}

StoreRelayStats StoreRelay::stats() const {
  StoreRelayStats s;
  s.accepted = impl_->accepted;
  s.sessions_open = impl_->sessions_open;
  s.refused = impl_->refused;
  s.dropped_slow = impl_->dropped_slow;
  s.upstream_connected = impl_->connected_flag;
  s.upstream_lost = impl_->lost_flag;
  return s;
}

}  // namespace ddprun::relay
