// Token handshakes and sealed messages as bytes on the wire, recorded once
// (handshake_transcripts.txt) and checked against every later build: the proofs, the binding
// and the MACs must come out byte for byte the same, whatever computes them.
//
//   handshake_transcript fixed              the transcripts of fixed inputs (in-process), printed
//   handshake_transcript live PORT          one token agent against ddprund on 127.0.0.1:PORT, printed
//   handshake_transcript check FILE         recompute every proof and MAC of FILE's transcripts, and
//                                           the fixed ones in full
//   handshake_transcript replay PORT FILE   FILE's live agent side again, against ddprund on PORT
//
// A transcript: "transcript NAME", "token HEX", then one frame a line: "a> HEX" (agent to
// server; the first is the 5-byte agent announcement) or "s> HEX" (server to agent).
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/auth_io.h"

namespace rdzv = ddprun::rdzv;
namespace wire = ddprun::wire;

namespace {

struct Frame {
  bool from_agent = true;
  std::string bytes;
};
struct Transcript {
  std::string name, token;
  std::vector<Frame> frames;
};

std::string hex(const std::string& b) {
  static const char d[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) s += d[c >> 4], s += d[c & 15];
  return s;
}
std::string unhex(const std::string& h) {
  if (h.size() % 2 != 0) throw std::runtime_error("odd hex length");
  std::string b;
  for (size_t i = 0; i < h.size(); i += 2) b += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return b;
}
std::string encoded(const rdzv::Message& m) {
  std::string out;
  rdzv::encode_message(m, out);
  return out;
}
std::string announcement() {
  std::string out;
  wire::Writer(out).u8(0).u32(rdzv::kAgentMagic);
  return out;
}
rdzv::Message parsed(const std::string& bytes) {
  rdzv::Message m;
  const auto r = rdzv::parse_message({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, m);
  if (r.status != wire::ParseStatus::Ok || r.consumed != bytes.size())
    throw std::runtime_error("a frame that does not parse");
  return m;
}

void print(const Transcript& t, std::ostream& out) {
  out << "transcript " << t.name << "\ntoken " << hex(t.token) << "\n";
  for (const auto& f : t.frames) out << (f.from_agent ? "a> " : "s> ") << hex(f.bytes) << "\n";
}

std::vector<Transcript> read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<Transcript> ts;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto sp = line.find(' ');
    const std::string key = line.substr(0, sp), val = sp == std::string::npos ? "" : line.substr(sp + 1);
    if (key == "transcript") ts.push_back({.name = val});
    else if (ts.empty()) throw std::runtime_error("a line before the first transcript: " + line);
    else if (key == "token") ts.back().token = unhex(val);
    else if (key == "a>" || key == "s>") ts.back().frames.push_back({key == "a>", unhex(val)});
    else throw std::runtime_error("an unknown line: " + line);
  }
  return ts;
}

// The agent's messages after the handshake, and the server's answers, of the fixed transcripts.
std::vector<rdzv::Message> agent_messages() {
  return {rdzv::to_message(rdzv::Join{.run_id = "wire-compat",
                                      .node_id = "node-0",
                                      .host = "10.0.0.1",
                                      .local_world_size = 8,
                                      .min_nodes = 2,
                                      .max_nodes = 2}),
          rdzv::to_message(rdzv::Heartbeat{.status = "training step 7"}), rdzv::to_message(rdzv::Leave{})};
}
std::vector<rdzv::Message> server_messages() {
  return {rdzv::to_message(
              rdzv::Round{.run_id = "wire-compat", .round = 1, .nnodes = 2, .world_size = 16, .store_port = 29500}),
          rdzv::to_message(rdzv::Restart{})};
}

Transcript fixed(const std::string& name, bool standing) {
  Transcript t{.name = name, .token = "the job's shared secret, 16+ bytes"};
  const std::string nc(64, 'c'), ns = standing ? std::string(64, '5') : std::string(64, 'e');
  rdzv::ServerHandshake server(t.token, ns, standing);
  rdzv::ClientHandshake agent(t.token, nc, "fixed:1");
  t.frames.push_back({true, announcement()});
  std::optional<rdzv::Message> next = agent.hello();
  std::optional<rdzv::SessionMac> server_mac;
  while (next) {
    t.frames.push_back({true, encoded(*next)});
    auto step = server.on_message(*next);
    if (!step.reply) throw std::runtime_error("the server did not answer");
    t.frames.push_back({false, encoded(*step.reply)});
    if (step.session) server_mac = step.session;
    next = agent.on_reply(*step.reply);
  }
  auto agent_mac = agent.session();
  if (!agent_mac || !server_mac) throw std::runtime_error("no session after the handshake");
  const auto to_server = agent_messages(), to_agent = server_messages();
  for (size_t i = 0; i < to_server.size(); ++i) {
    auto m = to_server[i];
    agent_mac->seal(m);
    t.frames.push_back({true, encoded(m)});
    if (i < to_agent.size()) {
      auto r = to_agent[i];
      server_mac->seal(r);
      t.frames.push_back({false, encoded(r)});
    }
  }
  return t;
}
std::vector<Transcript> fixed_transcripts() { return {fixed("fixed", false), fixed("fixed-standing", true)}; }

// ---- checking a transcript with this build ----
void expect(bool ok, const Transcript& t, size_t i, const std::string& what) {
  if (!ok) throw std::runtime_error(t.name + ", frame " + std::to_string(i) + ": " + what);
}

void check(const Transcript& t) {
  if (t.frames.size() < 5 || t.frames[0].bytes != announcement()) throw std::runtime_error(t.name + ": too short");
  const auto hello = rdzv::from_message<rdzv::Hello>(parsed(t.frames[1].bytes));
  const auto ch = rdzv::from_message<rdzv::Challenge>(parsed(t.frames[2].bytes));
  const auto auth = rdzv::from_message<rdzv::Auth>(parsed(t.frames[3].bytes));
  const std::string& nc = hello.client_nonce;
  expect(ch.server_proof == rdzv::server_proof(t.token, nc, ch.server_nonce), t, 2, "the server's proof differs");
  expect(ch.binding == rdzv::challenge_binding(t.token, nc, ch.server_nonce, ch.standing, ch.version), t, 2,
         "the CHALLENGE's binding differs");
  expect(auth.proof == rdzv::agent_proof(t.token, ch.server_nonce, nc), t, 3, "the agent's proof differs");
  rdzv::ClientHandshake agent(t.token, nc, "check:1");
  expect(encoded(agent.hello()) == t.frames[1].bytes, t, 1, "HELLO differs");
  const auto auth_again = agent.on_reply(parsed(t.frames[2].bytes));
  expect(auth_again && encoded(*auth_again) == t.frames[3].bytes, t, 3, "AUTH differs");
  expect(parsed(t.frames[4].bytes).type == rdzv::MsgType::Welcome, t, 4, "no WELCOME");
  using Side = rdzv::SessionMac::Side;
  rdzv::SessionMac agent_seal(t.token, nc, ch.server_nonce, Side::Agent), agent_open = agent_seal;
  rdzv::SessionMac server_seal(t.token, nc, ch.server_nonce, Side::Server), server_open = server_seal;
  for (size_t i = 5; i < t.frames.size(); ++i) {
    const bool a = t.frames[i].from_agent;
    rdzv::Message m = parsed(t.frames[i].bytes);
    expect((a ? server_open : agent_open).open(m) == rdzv::SessionMac::Verdict::Ok, t, i, "its MAC does not verify");
    (a ? agent_seal : server_seal).seal(m);
    expect(encoded(m) == t.frames[i].bytes, t, i, "sealed again, its bytes differ");
  }
}

int check_file(const std::string& path) {
  const auto recorded = read_file(path);
  size_t n_fixed = 0;
  for (const auto& t : recorded) {
    check(t);
    for (const auto& f : fixed_transcripts()) {
      if (f.name != t.name) continue;
      ++n_fixed;
      std::ostringstream a, b;
      print(f, a), print(t, b);
      if (a.str() != b.str())
        throw std::runtime_error(t.name + ": this build's transcript differs from the recorded one");
    }
    std::cout << "ok: " << t.name << " (" << t.frames.size() << " frames)\n";
  }
  if (n_fixed != fixed_transcripts().size() || recorded.size() <= n_fixed)
    throw std::runtime_error(path + " lacks a fixed or a live transcript");
  return 0;
}

// ---- a real ddprund ----
class Conn {
 public:
  explicit Conn(int port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("cannot connect");
  }
  ~Conn() { ::close(fd_); }
  void send(const std::string& b) {
    if (::send(fd_, b.data(), b.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(b.size()))
      throw std::runtime_error("send");
  }
  std::string frame() {  // one whole frame's bytes
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (true) {
      rdzv::Message m;
      const auto r = rdzv::parse_message({reinterpret_cast<const uint8_t*>(in_.data()), in_.size()}, m);
      if (r.status == wire::ParseStatus::Ok) {
        std::string f = in_.substr(0, r.consumed);
        in_.erase(0, r.consumed);
        return f;
      }
      if (r.status == wire::ParseStatus::Bad) throw std::runtime_error("a frame that does not parse");
      if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("no frame for 20 s");
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) throw std::runtime_error("closed by ddprund");
      in_.append(buf, static_cast<size_t>(n));
    }
  }

 private:
  int fd_;
  std::string in_;
};

const char* const kLiveToken = "the live transcript's token, 16+ bytes";

Transcript live(int port) {
  Transcript t{.name = "live", .token = kLiveToken};
  Conn c(port);
  rdzv::ClientHandshake agent(t.token, rdzv::random_nonce(), "127.0.0.1:" + std::to_string(port));
  auto out = [&](const std::string& b) { c.send(b), t.frames.push_back({true, b}); };
  auto in = [&] { return t.frames.push_back({false, c.frame()}), parsed(t.frames.back().bytes); };
  out(announcement());
  std::optional<rdzv::Message> next = agent.hello();
  while (next) out(encoded(*next)), next = agent.on_reply(in());
  auto mac = *agent.session();
  auto join = rdzv::to_message(rdzv::Join{.run_id = "wire-compat-live", .node_id = "node-0", .host = "127.0.0.1"});
  mac.seal(join), out(encoded(join));
  auto round = in();
  if (mac.open(round) != rdzv::SessionMac::Verdict::Ok || round.type != rdzv::MsgType::Round)
    throw std::runtime_error("no sealed ROUND after JOIN");
  auto beat = rdzv::to_message(rdzv::Heartbeat{.status = "recorded"});
  mac.seal(beat), out(encoded(beat));
  return t;
}

// The recorded agent's frames again (its HELLO as it was; the rest, which hang on the server's
// fresh nonce, sealed anew): ddprund must answer them as it did.
int replay(int port, const std::string& path) {
  for (const auto& t : read_file(path)) {
    if (t.name != "live") continue;
    Conn c(port);
    c.send(t.frames[0].bytes);
    c.send(t.frames[1].bytes);
    const auto nc = rdzv::from_message<rdzv::Hello>(parsed(t.frames[1].bytes)).client_nonce;
    const auto ns = rdzv::from_message<rdzv::Challenge>(parsed(t.frames[2].bytes)).server_nonce;
    rdzv::ClientHandshake agent(t.token, nc, "replay");
    if (auto auth = agent.on_reply(parsed(c.frame()))) c.send(encoded(*auth));
    agent.on_reply(parsed(c.frame()));
    if (!agent.done()) throw std::runtime_error("the replayed handshake did not finish");
    auto mac = *agent.session();
    rdzv::SessionMac recorded(t.token, nc, ns, rdzv::SessionMac::Side::Server);
    for (size_t i = 5; i < t.frames.size(); ++i) {
      rdzv::Message m = parsed(t.frames[i].bytes);
      if (t.frames[i].from_agent) {
        if (recorded.open(m) != rdzv::SessionMac::Verdict::Ok) throw std::runtime_error("a recorded frame's MAC fails");
        mac.seal(m), c.send(encoded(m));
        continue;
      }
      rdzv::Message got = parsed(c.frame());
      if (mac.open(got) != rdzv::SessionMac::Verdict::Ok || got.type != m.type)
        throw std::runtime_error(std::string("ddprund answered ") + rdzv::msg_type_name(got.type) +
                                 ", recorded: " + rdzv::msg_type_name(m.type));
    }
    std::cout << "ok: replayed " << t.name << " against ddprund\n";
    return 0;
  }
  throw std::runtime_error(path + " has no live transcript");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> a(argv + 1, argv + argc);
    if (a.size() == 1 && a[0] == "fixed") {
      for (const auto& t : fixed_transcripts()) print(t, std::cout);
      return 0;
    }
    if (a.size() == 2 && a[0] == "live") return print(live(std::stoi(a[1])), std::cout), 0;
    if (a.size() == 2 && a[0] == "check") return check_file(a[1]);
    if (a.size() == 3 && a[0] == "replay") return replay(std::stoi(a[1]), a[2]);
    std::cerr << "usage: handshake_transcript fixed | live PORT | check FILE | replay PORT FILE\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "handshake_transcript: " << e.what() << "\n";
    return 1;
  }
}
