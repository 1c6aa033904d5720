// A token agent on a raw socket for the server tests: it reads every message it gets through
// its MAC check (the next sequence number), or throws.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/auth_io.h"

namespace ddprun::test {

inline const std::string kSecret = "the job's shared secret, 16+ bytes";

class SealedAgent {
 public:
  explicit SealedAgent(uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("connect");
    rdzv::ClientHandshake hs(kSecret, rdzv::random_nonce(), "127.0.0.1:" + std::to_string(port));
    std::string out;
    wire::Writer(out).u8(0).u32(rdzv::kAgentMagic);
    rdzv::encode_message(hs.hello(), out);
    write(out);
    while (!hs.done()) {
      if (auto next = hs.on_reply(read_frame())) {
        out.clear();
        rdzv::encode_message(*next, out);
        write(out);
      }
    }
    mac_ = hs.session();
  }
  ~SealedAgent() { ::close(fd_); }
  void send(std::vector<rdzv::Message> ms) {
    std::string out;
    for (auto& m : ms) {
      mac_->seal(m);
      rdzv::encode_message(m, out);
    }
    write(out);
  }
  rdzv::Message next() {
    rdzv::Message m = read_frame();
    if (const auto v = mac_->open(m); v != rdzv::SessionMac::Verdict::Ok)
      throw std::runtime_error(std::string("a ") + rdzv::msg_type_name(m.type) + ": " + rdzv::SessionMac::describe(v));
    return m;
  }

 private:
  void write(const std::string& b) {
    if (::send(fd_, b.data(), b.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(b.size()))
      throw std::runtime_error("send");
  }
  rdzv::Message read_frame() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (true) {
      rdzv::Message m;
      const auto r = rdzv::parse_message({in_.data(), in_.size()}, m);
      if (r.status == wire::ParseStatus::Ok) {
        in_.erase(in_.begin(), in_.begin() + static_cast<long>(r.consumed));
        return m;
      }
      if (r.status == wire::ParseStatus::Bad) throw std::runtime_error("a frame that does not parse");
      if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("no message for 20 s");
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      uint8_t buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) throw std::runtime_error("closed by the server");
      in_.insert(in_.end(), buf, buf + n);
    }
  }
  int fd_;
  std::vector<uint8_t> in_;
  std::optional<rdzv::SessionMac> mac_;
};

}  // namespace ddprun::test
