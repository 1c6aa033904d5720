// Dispatch: the requests of a connection go to its keyspace's StoreState (TCPStore clients) or,
// once admitted, to the RoundState (agents); what they produce goes to the connections' outboxes.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <utility>

#include "server_core.h"

namespace ddprun::server {

namespace {
// A thread's scratch reply keeps at most this much memory between requests.
constexpr size_t kKeptReplyBytes = 1 << 20;
// A batch of pipelined requests that produced this many reply bytes yields its thread: the
// rest is handled after the other connections' ready work (a client asking for large replies
// cannot monopolise the connections that share its thread).
constexpr uint64_t kYieldAfterReplyBytes = 1 << 20;
// Likewise a batch that held its keyspace's lock this long (checked every 16 requests): a deep
// pipeline of small requests is served in slices, so the lock is never held for long.
constexpr auto kYieldAfterHold = std::chrono::milliseconds(2);
// A parsed request is a copy of its bytes, which the input buffer keeps until its batch ends: one
// this large is counted in the memory budget while it is applied (smaller ones are in the slack
// the budget leaves under the memory limit).
constexpr uint64_t kCountedCopyBytes = 64 * 1024;
// The lock site of an agent's message that passed its handshake.
HoldSite hold_site_of(rdzv::MsgType type) {
  switch (type) {
    case rdzv::MsgType::Join: return HoldSite::Join;
    case rdzv::MsgType::Heartbeat: return HoldSite::Heartbeat;
    case rdzv::MsgType::StatusQuery: return HoldSite::StatusQuery;
    default: return HoldSite::AgentReport;
  }
}
static_assert(wire::kAgentHelloMagic == rdzv::kAgentMagic, "the codec sniffs the agents' announcement");

// Whether a request of `op` may make its keyspace hold more (values, queued items, keys that
// waiters or watchers name).
bool stores_bytes(wire::Op op) {
  switch (op) {
    case wire::Op::Set:
    case wire::Op::CompareSet:
    case wire::Op::Add:
    case wire::Op::Append:
    case wire::Op::MultiSet:
    case wire::Op::QueuePush:
    case wire::Op::Wait:
    case wire::Op::WatchKey:
    case wire::Op::Barrier: return true;
    default: return false;
  }
}

// What applying `req` may add to its store, at most: its keys and values; a WAIT or WATCH_KEY
// keeps each key twice with an entry of its own (store_state_detail.h entry_bytes).
uint64_t stored_growth(const wire::Request& req) {
  const bool names_keys = req.op == wire::Op::Wait || req.op == wire::Op::WatchKey;
  uint64_t bytes = 0;
  for (const auto& k : req.keys) bytes += names_keys ? 2 * k.size() + 64 : k.size();
  for (const auto& v : req.values) bytes += v.size();
  return bytes;
}
}  // namespace

// The first bytes of c decide its protocol (wire::sniff_protocol); a TCPStore client of a
// restricted main keyspace must pass the stranger filter then.
ServerCore::Sniffed ServerCore::sniff(const ConnPtr& c, size_t& pos) {
  Keyspace& main = keyspaces.main();
  const bool serves_agents = c->ks == &main && options.enable_rendezvous && !c->is_channel();
  auto det = wire::sniff_protocol({c->in.data(), c->in_size}, serves_agents, options.legacy_dialect, options.limits);
  if (det.status == wire::ParseStatus::NeedMore) return Sniffed::NeedMore;
  if (det.status == wire::ParseStatus::Bad || (det.protocol == wire::Protocol::Mux && c->is_channel())) {
    io.close(c,
             det.status == wire::ParseStatus::Bad ? "first message is VALIDATE with a wrong magic"
                                                  : "a relay channel announced a relay",
             true);
    return Sniffed::Closed;
  }
  if (det.protocol == wire::Protocol::Agent) {
    admission.begin_agent(*c);
    ++counters.agents;
    {
      Hold hold(mu, holds, HoldSite::Admission);
      hold.set_count(rounds.num_agents());
      agents.emplace(c->id, c);
    }
    arm_deadline(c, options.handshake_timeout);
    pos = det.consumed;
    return Sniffed::Go;
  }
  if (c->ks == &main && options.restrict_main_store) {
    bool allowed;
    {
      Hold hold(mu, holds, HoldSite::Admission);
      hold.set_count(rounds.num_agents());
      allowed = admission.store_client_allowed_locked(main, true, c->session.peer, rounds);
    }
    if (!allowed) {
      admission.refused_store_client(main.name, c->session.peer, true);
      io.close(c, "", false);
      return Sniffed::Closed;
    }
  }
  // The first-bytes deadline stays until its first request (first_request): VALIDATE alone
  // proves nothing, and a client that sends no more is closed at it.
  pos = det.consumed;
  if (det.protocol == wire::Protocol::Mux) {
    begin_relay(c);
    return Sniffed::Go;
  }
  c->session.protocol = wire::Protocol::TcpStore;
  c->session.dialect = det.dialect;
  return Sniffed::Go;
}

namespace {
// The budget's charge for `req`, the parsed copy of a request of `bytes` (kCountedCopyBytes and
// more), held while it is applied; then what is left of the copy goes (the thread's scratch
// request would keep it until its next request).
class ParsedCopy {
 public:
  ParsedCopy(MemoryBudget& budget, uint64_t bytes, wire::Request& req)
      : budget_(budget),
        req_(req),
        bytes_(bytes >= kCountedCopyBytes ? bytes : 0),
        ok_(bytes_ == 0 || budget.try_charge(bytes_)) {}
  ~ParsedCopy() {
    if (bytes_ == 0) return;
    req_ = wire::Request{.op = req_.op};  // the batch still reads which operation it was
    if (ok_) budget_.release(bytes_);
  }
  ParsedCopy(const ParsedCopy&) = delete;
  ParsedCopy& operator=(const ParsedCopy&) = delete;
  bool ok() const { return ok_; }

 private:
  MemoryBudget& budget_;
  wire::Request& req_;
  const uint64_t bytes_;
  const bool ok_;
};

// collect_metrics: each request's time from its parse to its reply queued (lock wait
// included), one clock read per request; the end of one is the start of the next.
class RequestClock {
 public:
  explicit RequestClock(bool timed) : timed_(timed) {
    if (timed_) mark_ = std::chrono::steady_clock::now();
  }
  void observe(IoThread& t, size_t op) {
    if (!timed_) return;
    const auto now = std::chrono::steady_clock::now();
    t.observe(op, static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - mark_).count()));
    mark_ = now;
  }

 private:
  const bool timed_;
  std::chrono::steady_clock::time_point mark_;
};
}  // namespace

// Parses every complete request in the buffer and applies them under one acquisition of one
// lock: its keyspace's for a TCPStore client, the rounds lock for an agent.
void ServerCore::on_input(const ConnPtr& c) {
  if (c->closed || c->draining || c->in_size < c->need_total) return;
  c->need_total = 0;
  Batch b;
  if (!c->session.decided()) {
    const Sniffed s = sniff(c, b.pos);
    if (s != Sniffed::Go) return;
  }
  if (c->mux) {
    relay_input(c, b.pos);
    return;
  }
  if (c->session.agent) {
    agent_batch(c, b);
    seal_pending(*c->thread);
  } else {
    store_batch(c, b);
  }
  io.flush_pending(*c->thread);
  if (!b.bad.empty()) {
    io.close(c, b.bad, true);
    return;
  }
  if (b.revoked || b.tampered) {
    io.close(c, "", false);
    return;
  }
  io.consumed(c, b.pos);
  budget.trim_if_due();
  if (b.yield) io.pause_input(c);
}

bool ServerCore::take_request(const ConnPtr& c, Batch& b) {
  IoThread& t = *c->thread;
  const std::span<const uint8_t> rest{c->in.data() + b.pos, c->in_size - b.pos};
  // Each result is read where it is made (a ParseResult carries a string: no moves of it).
  auto took = [&](const wire::ParseResult& res) {
    if (res.status == wire::ParseStatus::NeedMore) {
      c->need_total = res.need_total;
      return false;
    }
    if (res.status == wire::ParseStatus::Bad) {
      b.bad = res.error;
      return false;
    }
    b.pos += res.consumed;
    IoThread::bump(t.requests);
    return true;
  };
  if (c->session.agent) return took(rdzv::parse_message(rest, t.msg));
  // Frame first, resuming where the last read stopped; parse once the request is whole.
  // Parsing from its start on every read made a 64 MiB request cost 21 s of CPU.
  const wire::ParseResult framed = c->framer.scan(rest, c->session.dialect, options.limits);
  if (framed.status != wire::ParseStatus::Ok) return took(framed);
  c->framer.reset();
  if (framed.consumed > kParseStepBytes) {  // parsed in steps by next_request
    c->parked = std::make_unique<ParkedRequest>();
    c->parked->framed = framed.consumed;
    return true;
  }
  const wire::ParseResult parsed =
      wire::parse_request(rest.first(framed.consumed), c->session.dialect, options.limits, t.req);
  if (parsed.status == wire::ParseStatus::NeedMore)
    return took({wire::ParseStatus::Bad, 0, 0, "request framing and parsing disagree"});
  return took(parsed);
}

void ServerCore::agent_batch(const ConnPtr& c, Batch& b) {
  IoThread& t = *c->thread;
  RequestClock clock(options.collect_metrics);
  // The batch's hold is named after its weightiest message: a JOIN that completed a round stays
  // the round's completion.
  Hold hold(mu, holds, HoldSite::Handshake, false);
  // Each message is read, checked and decoded outside the rounds lock, then applied under it.
  while (b.pos < c->in_size) {
    hold.release();
    hold.set(HoldSite::Handshake, 0);
    if (!take_request(c, b)) break;
    bool forward = true;
    t.inbound.reset();
    if (!c->session.admitted) {
      // The handshake step outside the rounds lock (a munge credential is checked by munged).
      auto step = admission.handshake_step(*c, t.msg);
      hold.acquire();
      if (!on_handshake_message(t, c, step, forward)) break;
    } else {
      const auto verdict = Admission::open(*c, t.msg);
      if (verdict == rdzv::SessionMac::Verdict::Ok) decode_agent_message(t, c);
      hold.acquire();
      // Not the admitted agent's (a relay's, or one it altered): dropped, and the connection
      // closed, since nothing after it would pass the sequence check (an agent of a standing
      // server reconnects and joins again).
      if (!admission.authentic_locked(*c, t.msg, verdict)) {
        b.tampered = true;
        break;
      }
    }
    const uint64_t rounds_before = rounds.rounds_completed();
    const bool go_on = !forward || on_agent_message(t, c);
    if (hold.site() != HoldSite::RoundCompletion)
      hold.set(rounds.rounds_completed() != rounds_before ? HoldSite::RoundCompletion
               : forward                                  ? hold_site_of(t.msg.type)
                                                          : HoldSite::Handshake,
               rounds.num_agents());
    clock.observe(t, StoreServerMetrics::kAgentOp);
    if (!go_on) break;
  }
}

// The reply of the batch's last request is queued once the keyspace's lock is let go: with one
// request per read (every PyTorch client) nothing of the outbox is done under the lock. The
// reply's references keep its values alive (and shared, so no APPEND grows them in place)
// meanwhile. Nothing else can be queued for c in between that its reply must precede: a reply
// whose request woke or notified anyone was queued under the lock (on_store_request), and so
// is a WATCH_KEY's.
//
// A request applied in slices (a WAIT of many keys) is parked on c after each slice and the
// batch yields the thread (Batch::yield): its next slice runs after the other ready work of
// every connection of the thread, whatever their keyspace, so none waits for more than a slice
// of it; a request of more than kParseStepBytes is parsed in steps the same way. c's later
// requests wait for its last slice (c reads nothing meanwhile).
void ServerCore::store_batch(const ConnPtr& c, Batch& b) {
  IoThread& t = *c->thread;
  RequestClock clock(options.collect_metrics);
  Hold hold(c->ks->mu, holds, HoldSite::StoreRequests, false);
  t.batch_reply_bytes = 0;
  uint32_t served = 0;
  bool last_reply = false;  // t.reply holds the last request's reply, not queued yet
  wire::Op op{};
  for (size_t at = b.pos;; at = b.pos) {
    wire::Request* req = next_request(t, c, b);
    if (!req) break;
    // A large request parsed whole in this turn is charged while it is applied (a parked one
    // carries its own charge).
    const ParsedCopy copy(budget, req == &t.req ? b.pos - at : 0, t.req);
    if (!copy.ok()) {
      ++counters.closed_memory;
      b.bad = std::string(wire::op_name(req->op)) + ": " + budget.refusal(b.pos - at);
      break;
    }
    if (!c->session.served) first_request(c);  // its first request: no lock held yet
    hold.acquire();
    if (c->revoked) {
      b.revoked = true;
      break;
    }
    op = req->op;
    hold.set_count(served + 1);
    const bool ok = on_store_request(t, c, *req, b.bad, c->parked && c->parked->applying);
    if (ok && t.more) {
      if (!c->parked) park(t, c);
      c->parked->applying = true;
      send_reply(t, c);  // what the slice wrote of the reply (a MULTI_GET's values)
      b.yield = true;
      break;
    }
    if (c->parked) unpark(c);
    if (!ok) break;
    // A WATCH_KEY's acknowledgement goes before any event of the key it registered.
    if (b.pos == c->in_size && op != wire::Op::WatchKey) {
      last_reply = true;
      break;
    }
    send_reply(t, c);
    clock.observe(t, static_cast<size_t>(op));
    if (t.batch_reply_bytes > kYieldAfterReplyBytes || ((++served & 15) == 0 && hold.longer_than(kYieldAfterHold))) {
      b.yield = true;
      break;
    }
  }
  hold.release();
  if (last_reply) {
    send_reply(t, c);
    clock.observe(t, static_cast<size_t>(op));
  }
}

void ServerCore::first_request(const ConnPtr& c) {
  c->session.served = true;
  if (c->deadline) c->deadline->cancel();
  Hold hold(mu, holds, HoldSite::Admission);
  hold.set_count(rounds.num_agents());
  admission.proven_locked(*c);
}

// Queues t.reply for c and empties it (dropping its references).
void ServerCore::send_reply(IoThread& t, const ConnPtr& c) {
  if (!t.reply.empty()) io.append(t, c, t.reply);
  if (t.reply.owned_bytes() > kKeptReplyBytes) t.reply = store::Reply();  // a LIST_KEYS grew it
  else t.reply.clear();
}

// Nothing of an agent reaches the rounds before the handshake let it in.
bool ServerCore::on_handshake_message(IoThread& t, const ConnPtr& c, rdzv::ServerHandshake::Step& step, bool& forward) {
  admission.on_handshake_locked(*c, step);
  if (step.reply) {
    std::string bytes;
    rdzv::encode_message(*step.reply, bytes);
    io.append(t, c, bytes, step.refused);
  }
  if (step.refused) {
    c->draining = true;
    return false;
  }
  forward = step.forward;
  return true;
}

// Without the lock: t.msg in its typed form (t.inbound), or nothing when it cannot be decoded
// (on_agent_message decodes it again under the lock and refuses it there).
void ServerCore::decode_agent_message(IoThread& t, const ConnPtr& c) {
  try {
    // Who the agent is, as this server sees it (not as it says): what the store of a round
    // that its node rank 0 hosts admits (round_state.h).
    if (t.msg.type == rdzv::MsgType::Join) t.msg.set("seen_from", c->session.peer.to_string());
    t.inbound = rdzv::RoundState::decode(t.msg);
  } catch (const std::exception&) {
    t.inbound.reset();
  }
}

bool ServerCore::on_agent_message(IoThread& t, const ConnPtr& c) {
  t.rdzv_out.clear();
  std::string refusal;
  try {
    if (!t.inbound) {
      if (t.msg.type == rdzv::MsgType::Join) t.msg.set("seen_from", c->session.peer.to_string());
      t.inbound = rdzv::RoundState::decode(t.msg);
    }
    const size_t jobs_before = rounds.num_jobs();
    rounds.on_inbound(c->id, std::move(*t.inbound), rdzv_now_locked(), t.rdzv_out);
    t.inbound.reset();
    // A job still gathering its nodes opens no store (open() checks the others).
    if (rounds.num_jobs() > jobs_before && rounds.num_jobs() > options.max_jobs) {
      refusal = keyspaces.jobs_limit_message();
      ++jobs_refused;
    }
  } catch (const std::exception& e) {
    // The job limit (open()) or no descriptor for its store: this agent is refused; its
    // connection's close makes the rounds forget what the JOIN began.
    refusal = e.what();
  }
  if (refusal.empty()) {
    route_locked(t, t.rdzv_out);
    return true;
  }
  t.rdzv_out.clear();
  t.rdzv_out.push_back({c->id, rdzv::to_message(rdzv::Error{.message = refusal}), true});
  queue_locked(t, t.rdzv_out);
  c->draining = true;
  warns.warn(Warn::JobLimit, [&] { return fmt::format("refused agent connection {}: {}", c->id, refusal); });
  return false;
}

// Serves `req` (t.req, or a request parked on c); false: c must be closed, `bad` says why. `continued`: the next
// slice of a request that was partly applied (its budget check was done with its first).
bool ServerCore::on_store_request(IoThread& t, const ConnPtr& c, wire::Request& req, std::string& bad, bool continued) {
  t.others.clear();  // t.reply is empty between requests (send_reply)
  t.more = false;
  // What the request may add to the store: refused before anything changes when past the budget.
  // It adds at most twice its bytes (a waiter or watcher keeps each key it names in two places):
  // while that fits, nothing needs adding up.
  if (!continued && !budget.fits(2 * options.limits.max_request_bytes) && stores_bytes(req.op)) {
    if (!budget.fits(stored_growth(req))) {
      ++counters.closed_memory;
      bad = std::string(wire::op_name(req.op)) + ": " + budget.refusal(stored_growth(req));
      return false;
    }
  }
  bool out_of_memory = false;
  try {
    const store::ApplyResult applied =
        c->ks->state.apply(c->id, c->session.dialect, req, t.reply, t.others, budget.room(true));
    budget.settle(c->ks->charged, c->ks->state.memory());
    if (applied.close) {
      t.reply.clear();
      bad = std::string(wire::op_name(req.op)) + ": " + applied.error;
      return false;
    }
    t.more = applied.more;
  } catch (const std::bad_alloc&) {
    out_of_memory = true;
  }
  if (out_of_memory) {
    t.reply = store::Reply();
    t.others.clear();
    bad = std::string(wire::op_name(req.op)) + ": out of memory while serving it";
    return false;
  }
  t.batch_reply_bytes += t.reply.wire_size();
  if (!t.others.empty()) {
    // c's reply before the events its request caused (a D0 watcher that wrote a key it
    // watches reads them in that order); only a reply that caused nothing waits for the unlock.
    send_reply(t, c);
    route_locked(t, *c->ks, t.others);
    t.others.clear();
  }
  return true;
}

// Under ks.mu: wake-ups of ks's own connections.
void ServerCore::route_locked(IoThread& self, Keyspace& ks, std::vector<store::Outgoing>& others) {
  for (auto& o : others) {
    if (!o.dropped.empty()) {  // freed in steps, after the lock
      auto p = std::make_shared<ParkedRequest>();
      p->req.keys = std::move(o.dropped);
      boost::asio::post(self.io, [this, &self, p]() mutable { discard(self, std::move(p)); });
    }
    auto it = ks.conns.find(o.conn);
    if (it == ks.conns.end() || it->second->revoked) continue;
    io.append(self, it->second, o.reply);
  }
}

// Sealing and encoding wait for the lock to be let go (seal_pending): a round of 16,000 agents
// sealed under it held the lock for most of 100 ms.
void ServerCore::route_locked(IoThread& self, std::vector<rdzv::Outbound>& out) {
  queue_locked(self, out);
  schedule_tick_locked();
}

void ServerCore::schedule_tick_locked() {
  auto next = rounds.next_deadline();
  if (rounds.num_agents() > 0) {
    auto hb = std::chrono::steady_clock::now() + kHeartbeatCheckPeriod;
    if (!next || hb < *next) next = hb;
  }
  if (!next) return;
  if (tick_timer->expiry() > std::chrono::steady_clock::now() && tick_timer->expiry() <= *next) return;
  tick_timer->expires_at(*next);
  tick_timer->async_wait([this](boost::system::error_code ec) {
    if (!ec) on_tick();
  });
}

void ServerCore::on_tick() {
  IoThread& t = *threads.front();
  try {
    {
      Hold hold(mu, holds, HoldSite::Tick);
      const uint64_t rounds_before = rounds.rounds_completed();
      t.rdzv_out.clear();
      rounds.on_tick(rdzv_now_locked(), t.rdzv_out);
      hold.set(rounds.rounds_completed() != rounds_before ? HoldSite::RoundCompletion : HoldSite::Tick,
               rounds.num_agents());
      keyspaces.reap_retired_locked();
      if (const auto stall = rounds.last_stall(); stall > std::chrono::steady_clock::duration::zero())
        warns.warn(Warn::Deadline, [&] {
          return fmt::format(
              "the rendezvous server did not run for {} ms (an overloaded host, or the process was stopped); "
              "no node is dropped for heartbeats or deadlines missed in that time",
              std::chrono::duration_cast<std::chrono::milliseconds>(stall).count());
        });
      route_locked(t, t.rdzv_out);
    }
    seal_pending(t);
    io.flush_pending(t);
  } catch (const std::exception& e) {
    warns.warn(Warn::Exception, [&] { return fmt::format("rendezvous tick: {}", e.what()); });
  }
}

// c was closed on its thread: the rounds or its keyspace forget it.
void ServerCore::on_closed(const ConnPtr& c) {
  IoThread& t = *c->thread;
  if (c->is_channel()) channel_closed(c);
  if (c->mux) close_channels(c);
  unpark(c);
  {
    Hold hold(mu, holds, HoldSite::Admission);
    hold.set_count(rounds.num_agents());
    admission.closed_locked(*c);
  }
  if (c->session.agent) {
    Hold hold(mu, holds, HoldSite::Disconnect);
    hold.set_count(rounds.num_agents());
    agents.erase(c->id);
    admission.forget_locked(*c);
    t.rdzv_out.clear();
    rounds.on_disconnect(c->id, rdzv_now_locked(), t.rdzv_out);
    route_locked(t, t.rdzv_out);
  }
  seal_pending(t);
  forget(c);
}

// c's keyspace forgets what c left in its state, one slice per turn of c's thread (a waiter of
// 128 Ki keys took 133 ms at once). c stays in the keyspace's connections until then, so that
// a retired keyspace is not freed meanwhile; nothing is sent to it (its socket is closed).
void ServerCore::forget(const ConnPtr& c) {
  Hold hold(c->ks->mu, holds, HoldSite::StoreDisconnect);
  if (!c->session.agent && !c->revoked) {
    const bool more = c->ks->state.disconnect(c->id);
    budget.settle(c->ks->charged, c->ks->state.memory());  // its waiter's and watches' keys
    if (more) {
      boost::asio::post(c->thread->io, [this, c] { forget(c); });
      return;
    }
  }
  c->ks->conns.erase(c->id);
}

}  // namespace ddprun::server
