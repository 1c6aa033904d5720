// An agent's messages leave the rounds lock unsealed, each with a ticket that fixes its place
// among the messages to that agent; they are sealed (sequence number, MAC), encoded and appended
// after the lock, in ticket order (connection.h, SealOrder). A round's broadcast to thousands
// of agents is sealed on the agents' own threads, in parallel: under the lock, 16,000 of them
// (their MACs, their encoding) held it for most of 100 ms.
#include <unordered_map>

#include "server_core.h"

namespace ddprun::server {
namespace {
// Up to this many messages are sealed by the thread that made them; more are spread.
constexpr size_t kMaxDirectSeals = 32;
}  // namespace

void ServerCore::queue_locked(IoThread& self, std::vector<rdzv::Outbound>& out) {
  if (out.empty()) return;
  auto batch = std::make_shared<SealBatch>();
  batch->out.swap(out);
  batch->to.reserve(batch->out.size());
  for (const auto& o : batch->out) {
    auto it = agents.find(o.conn);
    if (it == agents.end()) batch->to.emplace_back(nullptr, 0);
    else batch->to.emplace_back(it->second, ++it->second->seals.issued);
  }
  self.to_seal.push_back(std::move(batch));
}

void ServerCore::seal_one(IoThread& self, const ConnPtr& c, rdzv::Outbound& o) {
  std::string bytes;
  rdzv::Message& m = o.message();
  // The MAC's sending side (its sequence number) is used here only, in ticket order; its
  // receiving side is checked under the rounds lock.
  if (c->session.mac) c->session.mac->seal(m);
  rdzv::encode_message(m, bytes);
  io.append(self, c, bytes, o.close_after);
}

// From any thread: o goes out now if its turn has come (and then the ones that came early and
// follow it), else it waits in `early` for the thread that has the ticket before it.
void ServerCore::seal_in_turn(IoThread& self, const ConnPtr& c, uint64_t ticket, rdzv::Outbound& o) {
  try {
    std::lock_guard turn(c->seals.mu);
    SealOrder& s = c->seals;
    if (ticket != s.sealed + 1) {
      s.early.emplace(ticket, std::move(o));
      return;
    }
    ++s.sealed;  // a failure below closes c: what follows it is not sent either
    seal_one(self, c, o);
    for (auto it = s.early.begin(); it != s.early.end() && it->first == s.sealed + 1; it = s.early.erase(it)) {
      ++s.sealed;
      seal_one(self, c, it->second);
    }
  } catch (const std::exception& e) {
    warns.warn(Warn::Exception, [&] { return fmt::format("connection {}: {}; closing it", c->id, e.what()); });
    io.post_close(c);
  }
}

void ServerCore::seal_pending(IoThread& self) {
  if (self.to_seal.empty()) return;
  std::vector<std::shared_ptr<SealBatch>> batches;
  batches.swap(self.to_seal);
  for (auto& b : batches) {
    const size_t n = b->out.size();
    if (n <= kMaxDirectSeals) {
      for (size_t i = 0; i < n; ++i)
        if (b->to[i].first) seal_in_turn(self, b->to[i].first, b->to[i].second, b->out[i]);
      continue;
    }
    std::unordered_map<IoThread*, std::vector<size_t>> by_thread;
    for (size_t i = 0; i < n; ++i)
      if (b->to[i].first) by_thread[b->to[i].first->thread].push_back(i);
    if (by_thread.size() > 1 || !by_thread.count(&self)) {
      std::lock_guard lock(posted_mu);
      if (posted.size() >= 256) std::erase_if(posted, [](const auto& w) { return w.expired(); });
      posted.push_back(b);
    }
    for (auto& entry : by_thread) {
      IoThread* thread = entry.first;  // not a structured binding: clang 14 cannot capture one
      if (thread == &self) continue;
      boost::asio::post(thread->io, [this, thread, b, picks = std::move(entry.second)] {
        for (size_t i : picks) seal_in_turn(*thread, b->to[i].first, b->to[i].second, b->out[i]);
        io.flush_pending(*thread);
      });
    }
    if (auto own = by_thread.find(&self); own != by_thread.end())
      for (size_t i : own->second) seal_in_turn(self, b->to[i].first, b->to[i].second, b->out[i]);
  }
}

}  // namespace ddprun::server
