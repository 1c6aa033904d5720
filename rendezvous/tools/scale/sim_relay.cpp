// A node's store relay, simulated (--relay): the node's P workers reach the round's store over
// one multiplexed connection (wire/mux.h), as the agent's StoreRelay carries them. Each worker
// is a channel; its bytes are the same TCPStore requests as over a socket of its own, so the
// store serves the same operations; only the local hop, worker to relay, is not simulated.
#include <cstring>

#include "ddprun/wire/mux.h"
#include "sim.h"

namespace ddprun::scale {

namespace mux = wire::mux;

void RelayLink::start(Loop& loop, const sockaddr_in& store, uint32_t source) {
  std::string hello;
  mux::append_hello(hello);
  for (size_t i = 0; i < workers_.size(); ++i) mux::append_frame(hello, channel_of(i), mux::Kind::Open);
  out = std::move(hello);  // queued: written once connected
  if (!loop.connect(*this, store, source))
    s_.error("relay of node " + std::to_string(node_) + ": connect: " + std::strerror(errno));
}

void RelayLink::on_connected(Loop& loop) {
  for (Worker* w : workers_) w->on_connected(loop);
}

void RelayLink::send(Loop& loop, uint32_t channel, const std::string& bytes) {
  std::string framed;
  mux::append_data(framed, channel, bytes);
  loop.send(*this, framed);
}

void RelayLink::on_readable(Loop& loop) {
  size_t off = 0;
  while (fd >= 0) {
    const auto d = mux::decode_frame({in.data() + off, in.size() - off});
    if (d.status == wire::ParseStatus::NeedMore) break;
    if (d.status == wire::ParseStatus::Bad) {
      s_.error("relay of node " + std::to_string(node_) + ": a frame that does not parse: " + d.bad);
      loop.close(*this);
      return;
    }
    off += d.consumed;
    const uint32_t channel = d.frame.channel;
    if (channel == 0 || channel > workers_.size()) {
      s_.error("relay of node " + std::to_string(node_) + ": a frame for channel " + std::to_string(channel));
      continue;
    }
    Worker& w = *workers_[channel - 1];
    if (d.frame.kind == mux::Kind::Data) {
      w.in.insert(w.in.end(), d.frame.payload.begin(), d.frame.payload.end());
      w.on_readable(loop);
    } else if (d.frame.kind == mux::Kind::Close) {
      w.on_failed(loop, 0);
    }
  }
  in.erase(in.begin(), in.begin() + static_cast<long>(off));
}

void RelayLink::on_failed(Loop& loop, int err) {
  for (Worker* w : workers_) w->on_failed(loop, err);
}

}  // namespace ddprun::scale
