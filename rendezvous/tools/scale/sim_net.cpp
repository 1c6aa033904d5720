#include "sim_net.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>

namespace ddprun::scale {

uint32_t node_address(int64_t node) {
  const auto n = static_cast<uint32_t>(node);
  return (127u << 24) | ((1u + n / 62500u) << 16) | (((n / 250u) % 250u) << 8) | (1u + n % 250u);
}

std::string address_text(uint32_t addr) {
  return std::to_string(addr >> 24) + "." + std::to_string((addr >> 16) & 255) + "." +
         std::to_string((addr >> 8) & 255) + "." + std::to_string(addr & 255);
}

Loop::Loop() {
  ep_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (ep_ < 0 || wake_fd_ < 0) throw std::runtime_error("epoll_create1/eventfd failed");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  ::epoll_ctl(ep_, EPOLL_CTL_ADD, wake_fd_, &ev);
}

Loop::~Loop() {
  // The endpoints may be gone already: the table's index is the descriptor.
  for (size_t fd = 0; fd < by_fd_.size(); ++fd)
    if (by_fd_[fd]) ::close(static_cast<int>(fd));
  ::close(wake_fd_);
  ::close(ep_);
}

bool Loop::connect(Endpoint& e, const sockaddr_in& to, uint32_t source) {
  e.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (e.fd < 0) return false;
  int one = 1;
  ::setsockopt(e.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (source) {
    // The port is picked at connect(), per destination: many connections per source address.
    ::setsockopt(e.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    src.sin_addr.s_addr = htonl(source);
    if (::bind(e.fd, reinterpret_cast<const sockaddr*>(&src), sizeof src) != 0) {
      const int err = errno;
      ::close(e.fd);
      e.fd = -1;
      errno = err;
      return false;
    }
  }
  if (::connect(e.fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0 && errno != EINPROGRESS) {
    const int err = errno;
    ::close(e.fd);
    e.fd = -1;
    errno = err;
    return false;
  }
  if (static_cast<size_t>(e.fd) >= by_fd_.size()) by_fd_.resize(static_cast<size_t>(e.fd) + 1024, nullptr);
  by_fd_[static_cast<size_t>(e.fd)] = &e;
  ++open_;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT;
  ev.data.fd = e.fd;
  ::epoll_ctl(ep_, EPOLL_CTL_ADD, e.fd, &ev);
  e.want_out = true;
  return true;
}

void Loop::send(Endpoint& e, const std::string& bytes) {
  if (e.fd < 0) return;
  e.out += bytes;
  if (e.connected) flush(e);
}

void Loop::flush(Endpoint& e) {
  while (e.fd >= 0 && e.out_off < e.out.size()) {
    const ssize_t n = ::send(e.fd, e.out.data() + e.out_off, e.out.size() - e.out_off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      fail(e, errno);
      return;
    }
    e.out_off += static_cast<size_t>(n);
  }
  if (e.fd < 0) return;
  if (e.out_off == e.out.size()) {
    e.out.clear();
    e.out_off = 0;
  }
  want(e, !e.out.empty());
}

void Loop::want(Endpoint& e, bool out) {
  if (out == e.want_out) return;
  epoll_event ev{};
  ev.events = EPOLLIN | (out ? EPOLLOUT : 0u);
  ev.data.fd = e.fd;
  ::epoll_ctl(ep_, EPOLL_CTL_MOD, e.fd, &ev);
  e.want_out = out;
}

void Loop::close(Endpoint& e) {
  if (e.fd < 0) return;
  by_fd_[static_cast<size_t>(e.fd)] = nullptr;
  ::close(e.fd);
  e.fd = -1;
  --open_;
}

void Loop::fail(Endpoint& e, int err) {
  close(e);
  e.on_failed(*this, err);
}

void Loop::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof one);
}

int Loop::poll(int timeout_ms) {
  epoll_event evs[512];
  const int n = ::epoll_wait(ep_, evs, 512, timeout_ms);
  for (int i = 0; i < n; ++i) {
    const int fd = evs[i].data.fd;
    if (fd == wake_fd_) {
      uint64_t v;
      [[maybe_unused]] const ssize_t r = ::read(wake_fd_, &v, sizeof v);
      continue;
    }
    Endpoint* e = static_cast<size_t>(fd) < by_fd_.size() ? by_fd_[static_cast<size_t>(fd)] : nullptr;
    if (!e) continue;
    const uint32_t what = evs[i].events;
    if (!e->connected && (what & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err) {
        fail(*e, err);
        continue;
      }
      e->connected = true;
      e->on_connected(*this);
      if (e->fd >= 0) flush(*e);
      continue;
    }
    if ((what & EPOLLOUT) && e->fd >= 0) flush(*e);
    if (e->fd < 0 || !(what & (EPOLLIN | EPOLLERR | EPOLLHUP))) continue;
    uint8_t buf[65536];
    bool got = false;
    while (e->fd >= 0) {
      const ssize_t r = ::recv(e->fd, buf, sizeof buf, 0);
      if (r > 0) {
        e->in.insert(e->in.end(), buf, buf + r);
        got = true;
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && errno == EAGAIN) break;
      if (got) e->on_readable(*this);  // what came before the close still counts
      if (e->fd >= 0) fail(*e, r == 0 ? 0 : errno);
      got = false;
      break;
    }
    if (got && e->fd >= 0) e->on_readable(*this);
  }
  return n;
}

}  // namespace ddprun::scale
