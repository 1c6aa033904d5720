// StoreServer: the lifecycle of a ServerCore (start, accept, stop) and its public handle. The
// parts: listener.h, connection.h, admission.h, keyspaces.h, dispatch.cpp.
#include "ddprun/server/store_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "server_core.h"

namespace ddprun::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {
int resolve_io_threads(int wanted) {
  if (wanted > 0) return wanted;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores, 1, kMaxAutoIoThreads);
}

int backlog_of(const StoreServerOptions& o) {
  return o.backlog > 0 ? o.backlog : 65535;
}  // the kernel caps it at somaxconn
}  // namespace

ServerCore::ServerCore(StoreServerOptions o) : options(std::move(o)), mu(options.adaptive_lock) {
  const int n = resolve_io_threads(options.io_threads);
  for (int i = 0; i < n; ++i) threads.push_back(std::make_unique<IoThread>());
  warns.set_sink(options.peer_warning);
  warns.set_prefix(options.log_prefix);
  tick_timer.emplace(control());
  trim_timer.emplace(control());
  rounds.set_tick_period(kHeartbeatCheckPeriod);
  rounds.set_deferred_rounds(true);  // a round's ROUNDs are made after the lock (agent_seal.cpp)
  keyspaces.main().listener = make_listener("main");
}

ServerCore::~ServerCore() {
  stop();
  // Seal batches still queued or posted hold connections of every thread: let go of them while
  // every io_context is alive.
  {
    std::lock_guard lock(posted_mu);
    for (auto& w : posted)
      if (auto b = w.lock()) b->to.clear();
    posted.clear();
  }
  for (auto& t : threads)
    if (t)
      for (auto& b : t->to_seal) b->to.clear();
  // Sockets and acceptors before the io_contexts they belong to (pending handlers own nothing
  // but connections of their own io_context).
  {
    std::lock_guard lock(mu);
    agents.clear();
  }
  keyspaces.destroy();
  tick_timer.reset();
  trim_timer.reset();
  for (auto& t : threads) t.reset();
}

std::unique_ptr<Listener> ServerCore::make_listener(const std::string& name) {
  std::vector<asio::io_context*> ios;
  for (auto& t : threads) ios.push_back(&t->io);
  return std::make_unique<Listener>(std::move(ios), name, warns, accept_errors);
}

void ServerCore::start_accepting(Keyspace* ks) {
  ks->listener->start(
      [this, ks](tcp::socket sock, const tcp::endpoint& from, size_t i) { on_socket(ks, std::move(sock), from, i); });
}

// `from`: the peer as accept gave it (asking the socket later fails once the peer reset).
void ServerCore::on_socket(Keyspace* ks, tcp::socket sock, const tcp::endpoint& from, size_t thread_index) {
  if (options.socket_buffer_bytes > 0) {
    boost::system::error_code e;
    sock.set_option(asio::socket_base::send_buffer_size(options.socket_buffer_bytes), e);
    sock.set_option(asio::socket_base::receive_buffer_size(options.socket_buffer_bytes), e);
  }
  auto c = std::make_shared<Connection>(std::move(sock), ks, threads[thread_index].get());
  c->session.peer = plain_address(from.address());
  c->session.peer_port = from.port();
  // A fresh connection is small: it may use the reserve of connections that stay small.
  const bool over_budget = !budget.try_charge(ConnectionIo::kConnectionBytes, true);
  bool refused = over_budget, stranger = false;
  ConnPtr replaced;
  {
    Hold hold(mu, holds, HoldSite::Admission);
    hold.set_count(rounds.num_agents());
    c->id = next_id++;
    if (!refused && ks->discarded) refused = true;
    // A round's store serves that round's workers only (PyTorch clients cannot authenticate).
    if (!refused && !keyspaces.is_main(ks) &&
        !admission.store_client_allowed_locked(*ks, false, c->session.peer, rounds))
      refused = stranger = true;
    if (!refused) {
      auto admit = admission.may_connect_locked(descriptors_in_use(), c, std::chrono::steady_clock::now());
      refused = !admit.ok;
      replaced = std::move(admit.replaces);
    }
  }
  if (refused && !over_budget) budget.release(ConnectionIo::kConnectionBytes);
  if (replaced) io.post_close(replaced);  // its slot is c's
  if (!refused) {
    // Not inside mu: the rounds lock never waits for a keyspace's. A round closed meanwhile set
    // `discarded` before it took ks->mu to revoke its connections: this one is refused, or
    // registered in time to be revoked.
    Hold hold(ks->mu, holds, HoldSite::Admission);
    refused = ks->discarded;
    if (!refused) ks->conns.emplace(c->id, c);
    else budget.release(ConnectionIo::kConnectionBytes);
  }
  if (!refused) {
    c->budgeted = true;
    ++accepted;
    ++counters.open;
    io.start(c);
    arm_deadline(c, options.first_bytes_timeout);
    return;
  }
  // Closed before it reads a byte.
  {
    Hold hold(mu, holds, HoldSite::Admission);
    hold.set_count(rounds.num_agents());
    admission.closed_locked(*c);
  }
  if (stranger) admission.refused_store_client(ks->name, c->session.peer, false);
  if (over_budget) {
    ++counters.closed_memory;
    warns.warn(Warn::MemoryLimit, [&] {
      return fmt::format("refused a connection from {}: {}", c->session.peer.to_string(),
                         budget.refusal(ConnectionIo::kConnectionBytes));
    });
  }
  boost::system::error_code ignored;
  c->socket.close(ignored);
}

std::optional<std::string> ServerCore::no_descriptors_for(size_t n) {
  const uint64_t in_use = descriptors_in_use();
  if (in_use + n <= admission.max_connections()) return std::nullopt;
  // A round's store, like a connection, may take the slots of unproven connections.
  auto room = admission.make_room_locked(in_use, n, std::chrono::steady_clock::now());
  for (const auto& c : room.replaced) io.post_close(c);
  if (room.ok) return std::nullopt;
  return std::to_string(in_use) + " descriptors in use by connections and listeners, " + std::to_string(n) +
         " more would pass the limit of " + std::to_string(admission.max_connections()) +
         " (--max-connections within the descriptor limit)";
}

// `after` 0: no deadline for this phase, and none left from the one before.
void ServerCore::arm_deadline(const ConnPtr& c, std::chrono::milliseconds after) {
  if (after.count() <= 0 && c->deadline) c->deadline->cancel();
  if (after.count() <= 0 || c->closed) return;
  if (!c->deadline) c->deadline.emplace(c->thread->io);
  c->deadline->expires_after(after);
  c->deadline->async_wait([this, c](boost::system::error_code ec) {
    if (!ec && !c->closed) io.guarded(c, [&] { on_deadline(c); });
  });
}

// A connection still unauthenticated at its deadline: silent (or too little to tell its
// protocol), a TCPStore client that sent VALIDATE and no request, or an agent not through the
// token handshake. Half-open connections cannot hold slots that agents need.
void ServerCore::on_deadline(const ConnPtr& c) {
  const char* what = nullptr;
  if (!c->session.decided()) {
    what = "sent nothing to tell its protocol";
  } else if (c->session.agent) {
    std::lock_guard lock(mu);
    if (!c->session.admitted) what = "did not finish the rendezvous handshake";
  } else if (!c->session.served) {
    what = "made no request after VALIDATE";
  }
  if (!what) return;
  ++deadline_closed;
  warns.warn(Warn::Deadline, [&] {
    return fmt::format("closed connection {} from {}: it {} in time (a deadline for unauthenticated connections)",
                       c->id, c->session.peer.to_string(), what);
  });
  io.close(c, "", false);
}

// Under ks->mu: every TCPStore connection of `ks` stops touching state now and is closed by its
// thread. Agents' rendezvous connections (main keyspace) stay: they belong to no round.
void ServerCore::revoke_locked(const Keyspace* ks) {
  for (const auto& entry : ks->conns) {
    const auto& c = entry.second;  // a plain name: lambdas may capture it (clang 14)
    if (c->revoked.exchange(true)) continue;
    // Whether c is an agent is decided on its thread (its first bytes): asked there.
    asio::post(c->thread->io, [this, c] {
      if (!c->session.agent) io.guarded(c, [&] { io.close(c, "", false); });
    });
  }
}

void ServerCore::schedule_trim() {
  trim_timer->expires_after(kIdleTrimPeriod);
  trim_timer->async_wait([this](boost::system::error_code ec) {
    if (ec || stopped) return;
    budget.trim_if_due();
    schedule_trim();
  });
}

void ServerCore::check_limits() const {
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
  if (options.max_memory < l.max_request_bytes + options.store.max_reply_bytes)
    throw std::invalid_argument("--max-memory must hold at least one request and one reply (--max-request-bytes + "
                                "--max-reply-bytes = " +
                                std::to_string(l.max_request_bytes + options.store.max_reply_bytes) + " bytes)");
}

void ServerCore::listen_main() {
  try {
    // StoreServerOptions::accept_later: the main port is bound now, listened on later.
    keyspaces.main().listener->bind(options.host, options.port, backlog_of(options), !options.accept_later);
  } catch (const boost::system::system_error& e) {
    throw std::system_error(e.code().value(), std::generic_category(),
                            "cannot listen on " + (options.host.empty() ? std::string("*") : options.host) + ":" +
                                std::to_string(options.port));
  }
}

void ServerCore::start() {
  check_limits();
  admission.size_to_descriptors();
  if (threads.size() > 1) presize_descriptor_table();
  listen_main();
  keyspaces.main_listening();
  if (!options.accept_later) start_accepting(&keyspaces.main());
  started = true;
  schedule_trim();
  for (auto& t : threads) {
    t->thread = std::thread([this, io = &t->io, credit = &t->credit] {
      budget.bind_thread(credit);
      auto guard = asio::make_work_guard(*io);
      io->run();
      budget.unbind_thread();
    });
  }
}

void ServerCore::accept_clients() {
  if (!started || stopped || !options.accept_later || accepting.exchange(true)) return;
  keyspaces.main().listener->listen(backlog_of(options));  // no operation of theirs is pending yet
  start_accepting(&keyspaces.main());
}

void ServerCore::stop() {
  if (!started || stopped.exchange(true)) return;
  {
    std::lock_guard lock(mu);
    keyspaces.discard_all_locked();
    asio::post(control(), [this] {
      std::lock_guard l(mu);
      tick_timer->cancel();
      trim_timer->cancel();
    });
    keyspaces.for_each([this](Keyspace& ks) {
      std::lock_guard ks_lock(ks.mu);
      for (auto& [_, c] : ks.conns) io.post_close(c);
    });
  }
  // Each thread runs what was posted before its stop (FIFO), then returns.
  for (auto& t : threads) asio::post(t->io, [io = &t->io] { io->stop(); });
  for (auto& t : threads) {
    if (t->thread.joinable() && t->thread.get_id() != std::this_thread::get_id()) t->thread.join();
  }
}

StoreServerStats ServerCore::stats() const {
  StoreServerStats s;
  s.connections_accepted = accepted;
  s.connections_open = counters.open;
  s.connections_closed_for_bad_input = counters.closed_bad;
  for (auto& t : threads) s.requests += t->requests.load(std::memory_order_relaxed);
  s.agents_connected = counters.agents;
  s.connections_refused_over_limit = admission.refused_over_limit();
  s.accept_errors = accept_errors;
  s.agents_refused = admission.agents_refused();
  s.store_clients_refused = admission.store_strangers();
  s.connections_closed_for_deadline = deadline_closed;
  s.strangers_refused = admission.strangers_refused();
  for (const HoldEntry& e : holds.entries())
    s.lock_holds.push_back({hold_site_name(e.site), e.describe(), static_cast<uint64_t>(e.ns / 1000), e.count});
  if (!s.lock_holds.empty()) {
    s.longest_lock_hold_us = s.lock_holds.front().longest_us;
    s.longest_lock_holder = s.lock_holds.front().what;
  }
  s.round_stores_retained = keyspaces.retained();
  s.relay_connections_open = counters.relays;
  s.relay_sessions_open = counters.channels;
  return s;
}

StoreServerMetrics ServerCore::metrics() {
  StoreServerMetrics m;
  m.stats = stats();
  m.collected = options.collect_metrics;
  for (auto& t : threads) {
    for (size_t i = 0; i < StoreServerMetrics::kOps; ++i)
      m.requests_by_op[i] += t->by_op[i].load(std::memory_order_relaxed);
    for (size_t i = 0; i < StoreServerMetrics::kBuckets; ++i)
      m.duration_buckets[i] += t->duration_buckets[i].load(std::memory_order_relaxed);
    m.duration_sum_ns += t->duration_sum_ns.load(std::memory_order_relaxed);
  }
  {
    Hold hold(mu, holds, HoldSite::Stats);
    hold.set_count(rounds.num_agents());
    m.jobs = rounds.num_jobs();
    m.agents = rounds.num_agents();
    keyspaces.for_each([&m](Keyspace& ks) {
      std::lock_guard ks_lock(ks.mu);
      ++m.keyspaces;
      m.keys += ks.state.num_keys();
      m.stored_bytes += ks.state.memory();
    });
  }
  m.refused_jobs = jobs_refused.load(std::memory_order_relaxed);
  m.closed_for_memory = counters.closed_memory.load(std::memory_order_relaxed);
  m.closed_for_buffers = counters.closed_buffers.load(std::memory_order_relaxed);
  return m;
}

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

StoreServer::StoreServer(StoreServerOptions options) : impl_(std::make_unique<ServerCore>(std::move(options))) {}
StoreServer::~StoreServer() = default;
void StoreServer::start() { impl_->start(); }
void StoreServer::stop() { impl_->stop(); }
int StoreServer::io_threads() const { return static_cast<int>(impl_->threads.size()); }
uint16_t StoreServer::port() const { return impl_->keyspaces.main().listener->port(); }
void StoreServer::accept_clients() { impl_->accept_clients(); }

std::vector<std::string> StoreServer::set_store_peers(const std::vector<std::string>& addresses) {
  std::lock_guard lock(impl_->mu);
  return impl_->admission.set_store_peers_locked(addresses);
}

void StoreServer::reset_keyspace() {
  std::lock_guard lock(impl_->mu);
  impl_->keyspaces.reset_main_locked();
}

int64_t StoreServer::counter(const std::string& key) {
  Keyspace& main = impl_->keyspaces.main();
  std::lock_guard lock(main.mu);
  return main.state.integer(key).value_or(-1);
}

StoreServerStats StoreServer::stats() const { return impl_->stats(); }
StoreServerMetrics StoreServer::metrics() const { return impl_->metrics(); }

}  // namespace ddprun::server
