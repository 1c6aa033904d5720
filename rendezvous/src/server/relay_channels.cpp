// A store relay's multiplexed connection (wire/mux.h): each channel is a Connection of its own,
// with the state a real one has (parser, dialect, waits, memory charges) but no socket. Its
// bytes come from the relay's DATA frames and go back as DATA; CLOSE either way ends it as a
// closed socket would. So the server parses each relayed client exactly as if it had connected.
#include "ddprun/wire/mux.h"
#include "server_core.h"

namespace ddprun::server {

namespace mux = wire::mux;

// On c's thread: c announced itself as a relay, and was admitted like any store client.
void ServerCore::begin_relay(const ConnPtr& c) {
  c->session.protocol = wire::Protocol::Mux;
  c->mux = std::make_unique<MuxSessions>();
  ++counters.relays;
  first_request(c);  // its announcement proves its protocol: the first-bytes deadline goes
}

// The frames in c's input from `pos`, until one is partial or a channel blocks the rest.
void ServerCore::relay_input(const ConnPtr& c, size_t pos) {
  while (!c->closed && !c->mux->blocked) {
    const auto d = mux::decode_frame({c->in.data() + pos, c->in_size - pos});
    if (d.status == wire::ParseStatus::NeedMore) {
      c->need_total = d.need_total;  // relative to the rest, which consumed() moves to 0
      break;
    }
    if (d.status == wire::ParseStatus::Bad) {
      io.close(c, d.bad, true);
      return;
    }
    pos += d.consumed;
    relay_frame(c, d.frame);
  }
  if (!c->closed) io.consumed(c, pos);
}

void ServerCore::relay_frame(const ConnPtr& c, const mux::Frame& f) {
  auto& open = c->mux->open;
  const auto it = open.find(f.channel);
  switch (mux::judge(f.kind, it != open.end(), open.size())) {
    case mux::Verdict::Bad:
      io.close(c, "a relay opened a channel that is open", true);
      return;
    case mux::Verdict::Ignore:
      return;
    case mux::Verdict::Refuse:
      refuse_channel(c, f.channel, fmt::format("more than {} channels on one relay connection", mux::kMaxSessions));
      return;
    case mux::Verdict::Accept:
      break;
  }
  if (f.kind == mux::Kind::Open) {
    open_channel(c, f.channel);
    return;
  }
  const ConnPtr v = it->second;
  if (f.kind == mux::Kind::Close) {
    v->mux_peer_closed = true;
    io.close(v, "", false);
    return;
  }
  if (v->draining || !io.feed(v, f.payload)) return;
  io.guarded(v, [&] { on_input(v); });
  // Its batch yielded: its further bytes (and the other channels', behind them) wait for it.
  if (!v->closed && v->input_paused) {
    c->mux->blocked = v;
    c->input_paused = true;
  }
}

void ServerCore::open_channel(const ConnPtr& c, uint32_t channel) {
  auto v = std::make_shared<Connection>(c, channel);
  v->session.peer = c->session.peer;
  v->session.peer_port = c->session.peer_port;
  if (!budget.try_charge(ConnectionIo::kConnectionBytes, true)) {
    refuse_channel(c, channel, budget.refusal(ConnectionIo::kConnectionBytes));
    return;
  }
  {
    Hold hold(mu, holds, HoldSite::Relay);
    hold.set_count(rounds.num_agents());
    v->id = next_id++;
  }
  bool refused;
  {
    Hold hold(c->ks->mu, holds, HoldSite::Relay);
    refused = c->ks->discarded || c->revoked;
    if (!refused) c->ks->conns.emplace(v->id, v);
  }
  if (refused) {
    budget.release(ConnectionIo::kConnectionBytes);
    refuse_channel(c, channel, "its store is closed");
    return;
  }
  v->budgeted = true;
  ++counters.channels;
  c->mux->open.emplace(channel, std::move(v));
}

// Answers CLOSE for a channel the relay opened and this server does not serve.
void ServerCore::refuse_channel(const ConnPtr& c, uint32_t channel, const std::string& why) {
  warns.warn(Warn::ConnectionLimit, [&] {
    return fmt::format("refused channel {} of the relay connection {} from {}: {}", channel, c->id,
                       c->session.peer.to_string(), why);
  });
  std::string frame;
  mux::append_frame(frame, channel, mux::Kind::Close);
  io.send_frames(c, frame);
}

// On v's thread (on_closed): its relay forgets it and, unless the relay ended it, hears CLOSE.
void ServerCore::channel_closed(const ConnPtr& v) {
  const ConnPtr relay = v->mux_parent.lock();
  if (!relay || relay->closed || !relay->mux) return;
  relay->mux->open.erase(v->mux_channel);
  if (!v->mux_peer_closed) {
    std::string frame;
    mux::append_frame(frame, v->mux_channel, mux::Kind::Close);
    io.send_frames(relay, frame);
  }
  if (relay->mux->blocked == v) {
    boost::asio::post(relay->thread->io, [this, v] { on_channel_resumed(v); });
  }
}

// On c's thread (on_closed): a closed relay connection ends every channel of it.
void ServerCore::close_channels(const ConnPtr& c) {
  --counters.relays;
  auto channels = std::move(c->mux->open);
  c->mux->open.clear();
  c->mux->blocked.reset();
  for (auto& [id, v] : channels) {
    v->mux_peer_closed = true;
    io.close(v, "", false);
  }
}

void ServerCore::on_channel_resumed(const ConnPtr& v) {
  const ConnPtr relay = v->mux_parent.lock();
  if (!relay || relay->closed || !relay->mux || relay->mux->blocked != v) return;
  relay->mux->blocked.reset();
  relay->input_paused = false;
  io.guarded(relay, [&] { on_input(relay); });
  if (!relay->closed) io.resume_input(relay);
}

}  // namespace ddprun::server
