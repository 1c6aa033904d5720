// A simulated PyTorch 2.x worker against its round's workers' store (the steps in sim.h).
// One request in flight at a time, as PyTorch's blocking TCPStore client does.
#include <cstring>

#include "sim.h"

namespace ddprun::scale {

namespace {
constexpr const char* kInitKey = "init/";
constexpr const char* kBarrierKey = "store_based_barrier_key:0";
constexpr const char* kBarrierLast = "store_based_barrier_key:0:last_worker";
constexpr const char* kNcclKey = "default_pg/0//cuda//0";
constexpr size_t kNcclIdBytes = 128;
constexpr size_t kGlooAddrBytes = 40;  // one pair's address (sockaddr_storage-sized, rounded)

std::string gloo_key(int64_t rank) { return "default_pg/0//cpu//" + std::to_string(rank); }

// The whole reply at the front of `in` for the step awaiting it (0: not yet).
size_t reply_size(int step_kind, const std::vector<uint8_t>& in) {
  const size_t n = in.size();
  switch (step_kind) {
    case 1: return n >= 1 ? 1 : 0;  // WAIT: one status byte
    case 4: return n >= 4 ? 4 : 0;  // PING: the nonce
    case 8: return n >= 8 ? 8 : 0;  // ADD: the new value
    default: {                      // GET: length + bytes
      if (n < 8) return 0;
      const uint64_t len = wire::load_u64(in.data());
      return n >= 8 + len ? 8 + len : 0;
    }
  }
}
}  // namespace

std::string store_request(wire::Op op, std::vector<std::string> keys, std::vector<std::string> values, int64_t number,
                          uint32_t u32) {
  wire::Request r;
  r.op = op;
  r.keys = std::move(keys);
  r.values = std::move(values);
  r.number = number;
  r.u32 = u32;
  std::string out;
  wire::encode_request(wire::Dialect::D2, r, out);
  return out;
}

void Worker::start(Loop& loop, const sockaddr_in& store) {
  if (relay_) return;  // the relay link connects and calls on_connected
  if (!loop.connect(*this, store, source_))
    s_.error("worker " + std::to_string(rank_) + ": connect: " + std::strerror(errno));
}

void Worker::on_connected(Loop& loop) {
  // TCPStore's client: VALIDATE (no answer) and PING, in one write.
  request(loop,
          store_request(wire::Op::Validate, {}, {}, 0, wire::kValidateMagic) +
              store_request(wire::Op::Ping, {}, {}, 0, static_cast<uint32_t>(rank_)),
          Step::Ping);
}

void Worker::request(Loop& loop, const std::string& bytes, Step next) {
  step_ = next;
  send(loop, bytes);
}

void Worker::send(Loop& loop, const std::string& bytes) {
  if (relay_) relay_->send(loop, channel_, bytes);
  else loop.send(*this, bytes);
}

bool Worker::live() const { return relay_ ? relay_->fd >= 0 : fd >= 0; }

void Worker::on_readable(Loop& loop) {
  while (live() && step_ != Step::Done && step_ != Step::Rechecked) {
    int kind = 0;
    switch (step_) {
      case Step::Ping: kind = 4; break;
      case Step::InitAdd:
      case Step::BarrierAdd:
      case Step::BarrierCount: kind = 8; break;
      case Step::BarrierWait:
      case Step::NcclWait:
      case Step::GlooWait: kind = 1; break;
      default: kind = 0;
    }
    const size_t n = reply_size(kind, in);
    if (!n) return;
    std::vector<uint8_t> reply(in.begin(), in.begin() + static_cast<long>(n));
    in.erase(in.begin(), in.begin() + static_cast<long>(n));
    on_reply(loop, reply.data(), reply.size());
  }
}

void Worker::on_reply(Loop& loop, const uint8_t* p, size_t n) {
  const std::string me = "worker " + std::to_string(rank_) + ": ";
  switch (step_) {
    case Step::Ping:
      if (wire::load_u32(p) != static_cast<uint32_t>(rank_)) s_.error(me + "PING answered with another nonce");
      request(loop, store_request(wire::Op::Add, {kInitKey}, {}, 1), Step::InitAdd);
      return;
    case Step::InitAdd:
      s_.workers_joined.fetch_add(1);
      s_.mark(s_.t_last_joined);
      request(loop, store_request(wire::Op::Add, {kBarrierKey}, {}, 1), Step::BarrierAdd);
      return;
    case Step::BarrierAdd:
      request(loop, store_request(wire::Op::Add, {kBarrierKey}, {}, 0), Step::BarrierCount);
      return;
    case Step::BarrierCount: {
      std::string b;
      if (static_cast<int64_t>(wire::load_u64(p)) == world_) b = store_request(wire::Op::Set, {kBarrierLast}, {"1"});
      request(loop, b + store_request(wire::Op::Wait, {kBarrierLast}), Step::BarrierWait);
      return;
    }
    case Step::BarrierWait:
      if (p[0] != wire::kWaitStop) s_.error(me + "the barrier's WAIT was cancelled");
      s_.barrier_passed.fetch_add(1);
      s_.mark(s_.t_last_barrier);
      nccl(loop);
      return;
    case Step::NcclWait: request(loop, store_request(wire::Op::Get, {kNcclKey}), Step::NcclGet); return;
    case Step::NcclGet:
      if (n != 8 + kNcclIdBytes) s_.error(me + "the NCCL unique id has " + std::to_string(n - 8) + " bytes");
      gloo_next(loop);
      return;
    case Step::GlooWait: request(loop, store_request(wire::Op::Get, {gloo_key(gloo_peer_)}), Step::GlooGet); return;
    case Step::GlooGet:
      if (n != 8 + static_cast<size_t>(world_) * kGlooAddrBytes) s_.error(me + "a Gloo address list of another size");
      ++gloo_peer_;
      gloo_next(loop);
      return;
    case Step::Recheck:
      if (n != 8 + kNcclIdBytes)
        s_.error(me + "after the server's restart, the NCCL id has " + std::to_string(n - 8) + " bytes");
      step_ = Step::Rechecked;
      s_.rechecked.fetch_add(1);
      s_.mark(s_.t_last_recheck);
      return;
    case Step::Done:
    case Step::Rechecked: return;
  }
}

void Worker::nccl(Loop& loop) {
  if (rank_ == 0) {
    send(loop, store_request(wire::Op::Set, {kNcclKey}, {std::string(kNcclIdBytes, 'n')}));
    gloo_next(loop);
    return;
  }
  request(loop, store_request(wire::Op::Wait, {kNcclKey}), Step::NcclWait);
}

// Gloo's connectFullMesh: this rank's addresses first (one per peer), then every other rank's.
void Worker::gloo_next(Loop& loop) {
  if (!s_.o.gloo) {
    finish();
    return;
  }
  if (gloo_peer_ == 0 && step_ != Step::GlooGet)
    send(loop, store_request(wire::Op::Set, {gloo_key(rank_)},
                             {std::string(static_cast<size_t>(world_) * kGlooAddrBytes, 'g')}));
  if (gloo_peer_ == rank_) ++gloo_peer_;
  if (gloo_peer_ >= world_) {
    finish();
    return;
  }
  request(loop, store_request(wire::Op::Wait, {gloo_key(gloo_peer_)}), Step::GlooWait);
}

void Worker::finish() {
  step_ = Step::Done;
  if (s_.tally_rounds.load()) {
    s_.on_worker_done(round_, rank_, world_);
  } else if (rank_ >= 0 && rank_ < world_ && s_.rank_seen) {
    if (s_.rank_seen[static_cast<size_t>(rank_)].fetch_add(1) != 0) s_.duplicate_ranks.fetch_add(1);
  } else {
    s_.error("worker rank " + std::to_string(rank_) + " is outside the world of " + std::to_string(world_));
  }
  s_.workers_done.fetch_add(1);
  s_.mark(s_.t_last_done);
}

void Worker::recheck(Loop& loop) {
  if (step_ != Step::Done) {
    s_.error("worker " + std::to_string(rank_) + ": not through its round when the server came back");
    return;
  }
  request(loop, store_request(wire::Op::Get, {kNcclKey}), Step::Recheck);
}

void Worker::on_failed(Loop&, int err) {
  // After a node's death (--kill-one) the server closes the round's store before its RESTARTs
  // arrive: the workers of a real node would be stopped by their agent then.
  // The same when nodes leave (--churn).
  if (s_.stop.load() || s_.kill_index.load() >= 0 || s_.tolerate_store_loss.load()) return;
  s_.error("worker " + std::to_string(rank_) + ": store connection " +
           (err ? std::string("failed: ") + std::strerror(err) : std::string("closed by the server")));
}

}  // namespace ddprun::scale
