// A TCPStore request too large for one turn of its I/O thread: parsed in steps, applied in
// slices, and freed in slices, each step parked on its connection between turns (store_batch).
#include <algorithm>
#include <memory>
#include <utility>

#include "server_core.h"

namespace ddprun::server {

// The next request of c to apply: its parked one, else the next whole one of its input (in
// t.req). Null when none is whole yet, when c sent something bad (b.bad), or when a step of a
// large request's parse was done in this turn (b.yield).
wire::Request* ServerCore::next_request(IoThread& t, const ConnPtr& c, Batch& b) {
  if (!c->parked && (b.pos >= c->in_size || !take_request(c, b))) return nullptr;
  if (!c->parked) return &t.req;
  ParkedRequest& p = *c->parked;
  if (p.framed == 0) return &p.req;  // parsed, partly applied
  const wire::ParseResult res =
      p.parser.step({c->in.data() + b.pos, p.framed}, c->session.dialect, options.limits, p.req, kParseStepBytes);
  // What it holds so far: its bytes, and the strings they went to.
  const uint64_t holds = p.parser.parsed_bytes() + sizeof(std::string) * (p.req.keys.size() + p.req.values.size());
  if (holds > p.charge && !budget.try_charge(holds - p.charge)) {
    ++counters.closed_memory;
    b.bad = "its request: " + budget.refusal(holds - p.charge);
    return nullptr;
  }
  p.charge = std::max(p.charge, holds);
  if (res.status == wire::ParseStatus::Partial) {
    b.yield = true;
    return nullptr;
  }
  if (res.status != wire::ParseStatus::Ok || res.consumed != p.framed) {
    b.bad = res.status == wire::ParseStatus::Bad ? res.error : "request framing and parsing disagree";
    return nullptr;
  }
  b.pos += p.framed;
  p.framed = 0;
  IoThread::bump(t.requests);
  return &p.req;
}

// The request in t.req is partly applied: it moves to c, charged to the budget (the bytes of
// its input buffer, released once consumed, move to it).
void ServerCore::park(IoThread& t, const ConnPtr& c) {
  c->parked = std::make_unique<ParkedRequest>();
  ParkedRequest& p = *c->parked;
  p.charge = sizeof(ParkedRequest);
  for (const auto& k : t.req.keys) p.charge += sizeof(std::string) + k.capacity();
  for (const auto& v : t.req.values) p.charge += sizeof(std::string) + v.capacity();
  p.req = std::move(t.req);
  t.req = wire::Request();
  budget.charge(p.charge);
}

void ServerCore::unpark(const ConnPtr& c) {
  if (!c->parked) return;
  std::shared_ptr<ParkedRequest> p(std::move(c->parked));
  discard(*c->thread, std::move(p));
}

// Frees a request's keys and values a slice per turn of the thread (128 Ki keys of 480 bytes
// took tens of milliseconds at once), then its charge.
void ServerCore::discard(IoThread& t, std::shared_ptr<ParkedRequest> p) {
  for (size_t n = 0; n < store::kWaitSlice && !p->req.keys.empty(); ++n) p->req.keys.pop_back();
  for (size_t n = 0; n < store::kWaitSlice && !p->req.values.empty(); ++n) p->req.values.pop_back();
  if (p->req.keys.empty() && p->req.values.empty()) {
    budget.release(p->charge);
    return;
  }
  boost::asio::post(t.io, [this, &t, p = std::move(p)]() mutable { discard(t, std::move(p)); });
}

}  // namespace ddprun::server
