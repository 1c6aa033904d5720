#include "listener.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <system_error>

namespace ddprun::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {
// Accept errors that mean "no descriptor or memory now": the connection waits in the backlog
// while the server pauses accepting this long (closing connections frees descriptors).
constexpr auto kAcceptBackoff = std::chrono::milliseconds(50);
constexpr long kPresizedDescriptors = 1 << 16;

// One descriptor kept free for the whole process: out of descriptors, a listener frees it to
// accept and close one waiting connection, then takes it again.
// When taking it again fails (another thread took the descriptor meanwhile), it is taken at
// the next chance: a reserve is used up only once.
std::mutex reserve_mu;
int reserve_fd = -1;
std::atomic<bool> reserve_missing{false};
int open_reserve() { return ::open("/dev/null", O_RDONLY | O_CLOEXEC); }
void retake_reserve_locked() {
  if (reserve_fd < 0) reserve_fd = open_reserve();
  reserve_missing.store(reserve_fd < 0, std::memory_order_relaxed);
}
void retake_reserve_if_missing() {
  if (!reserve_missing.load(std::memory_order_relaxed)) return;
  std::lock_guard lock(reserve_mu);
  retake_reserve_locked();
}

// Opens `a` for `ep` and binds it: SO_REUSEADDR, dual-stack for IPv6, TCP_NODELAY (accepted
// sockets inherit it from the listener on Linux: no call per accept), SO_REUSEPORT if asked.
void open_and_bind(tcp::acceptor& a, const tcp::endpoint& ep, bool reuse_port) {
  a.open(ep.protocol());
  a.set_option(tcp::acceptor::reuse_address(true));
  if (ep.protocol() == tcp::v6()) a.set_option(asio::ip::v6_only(false));
  a.set_option(tcp::no_delay(true));
  if (reuse_port) {
    int one = 1;
    if (::setsockopt(a.native_handle(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0)
      throw boost::system::system_error(boost::system::error_code(errno, boost::system::system_category()));
  }
  a.bind(ep);
}
}  // namespace

void presize_descriptor_table() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < 64) return;
  const long want = static_cast<long>(std::min<rlim_t>(rl.rlim_cur, kPresizedDescriptors));
  const int fd = ::fcntl(2, F_DUPFD_CLOEXEC, static_cast<int>(want - 1));
  if (fd >= 0) ::close(fd);
}

Listener::Listener(std::vector<asio::io_context*> ios, std::string name, WarnLimiter& warns,
                   std::atomic<uint64_t>& accept_errors)
    : ios_(std::move(ios)), name_(std::move(name)), warns_(warns), accept_errors_(accept_errors) {
  std::lock_guard lock(reserve_mu);
  retake_reserve_locked();
}

bool Listener::refuse_one(size_t i) {
  std::lock_guard lock(reserve_mu);
  retake_reserve_locked();
  if (reserve_fd < 0) return false;
  ::close(reserve_fd);
  reserve_fd = -1;
  const int fd = ::accept4(acceptors_[i]->native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd >= 0) ::close(fd);
  retake_reserve_locked();
  return fd >= 0;
}

// One listening socket per I/O thread on the same address. With several threads they form a
// SO_REUSEPORT group: the kernel spreads connections over them, each with its own backlog and
// lock, so accepts run in parallel and a join storm does not overflow one backlog (somaxconn
// caps each). A plain socket binds the address alone first, so a port someone holds (another
// ddprund too) still fails with EADDRINUSE, and port 0 becomes a port nobody holds.
bool Listener::bind_one(tcp::endpoint ep, int backlog, bool listen_now) {
  auto probe = std::make_unique<tcp::acceptor>(*ios_.front());
  open_and_bind(*probe, ep, false);
  if (ios_.size() == 1) {
    if (listen_now) probe->listen(backlog);
    acceptors_.push_back(std::move(probe));
    return true;
  }
  ep.port(probe->local_endpoint().port());
  probe->close();
  for (auto* io : ios_) {
    auto a = std::make_unique<tcp::acceptor>(*io);
    open_and_bind(*a, ep, true);
    if (listen_now) a->listen(backlog);
    acceptors_.push_back(std::move(a));
  }
  return true;
}

void Listener::bind(const std::string& host, uint16_t port, int backlog, bool listen_now) {
  std::vector<tcp::endpoint> candidates;
  if (host.empty()) {
    candidates = {tcp::endpoint(tcp::v6(), port), tcp::endpoint(tcp::v4(), port)};
  } else {
    tcp::resolver resolver(*ios_.front());
    for (const auto& r :
         resolver.resolve(host, std::to_string(port), tcp::resolver::passive | tcp::resolver::numeric_service))
      candidates.push_back(r.endpoint());
  }
  boost::system::error_code last = boost::system::errc::make_error_code(boost::system::errc::address_not_available);
  for (const tcp::endpoint& ep : candidates) {
    acceptors_.clear();
    try {
      bind_one(ep, backlog, listen_now);
      endpoint_ = acceptors_.front()->local_endpoint();
      port_ = endpoint_.port();
      return;
    } catch (const boost::system::system_error& e) {
      last = e.code();
      acceptors_.clear();
    }
  }
  if (host.empty()) throw boost::system::system_error(last);  // the caller says which address
  throw std::system_error(last.value(), std::generic_category(),
                          "cannot bind the store to " + host + ":" + std::to_string(port));
}

void Listener::listen(int backlog) {
  for (auto& a : acceptors_) a->listen(backlog);
}

void Listener::start(OnSocket on_socket) {
  on_socket_ = std::move(on_socket);
  peers_.resize(acceptors_.size());
  for (size_t i = 0; i < ios_.size() && i < acceptors_.size(); ++i) asio::post(*ios_[i], [this, i] { do_accept(i); });
}

void Listener::stop() {
  if (stopping_.exchange(true)) return;
  for (size_t i = 0; i < ios_.size() && i < acceptors_.size(); ++i) {
    ++busy_;
    asio::post(*ios_[i], [this, i] {
      boost::system::error_code ignored;
      acceptors_[i]->close(ignored);
      // The accept the close aborted was queued by it: this runs after its handler (FIFO).
      asio::post(*ios_[i], [this] { --busy_; });
    });
  }
}

// On thread i: accepts into that thread's io_context, for good.
void Listener::do_accept(size_t i) {
  if (!acceptors_[i]->is_open()) return;  // closed by stop() (on this thread): no new handler
  acceptors_[i]->async_accept(peers_[i], [this, i](boost::system::error_code ec, tcp::socket sock) {
    try {
      on_accept(i, ec, std::move(sock));
    } catch (const std::exception& e) {
      // Nothing of the new connection is registered yet (or it was closed): keep accepting.
      warns_.warn(Warn::Exception, [&] { return fmt::format("accept on the {} store: {}", name_, e.what()); });
      retry_later(i);
    }
  });
}

void Listener::retry_later(size_t i) {
  auto timer = std::make_shared<asio::steady_timer>(*ios_[i], kAcceptBackoff);
  ++busy_;
  timer->async_wait([this, i, timer](boost::system::error_code e2) {
    struct Done {
      std::atomic<int>& n;
      ~Done() { --n; }
    } done{busy_};
    if (e2 || !acceptors_[i]->is_open()) return;
    try {
      retake_reserve_if_missing();
      do_accept(i);
    } catch (const std::exception& e) {
      warns_.warn(Warn::Exception, [&] { return fmt::format("accept on the {} store: {}", name_, e.what()); });
    }
  });
}

void Listener::on_accept(size_t i, boost::system::error_code ec, tcp::socket sock) {
  if (ec == asio::error::operation_aborted || !acceptors_[i]->is_open()) return;
  if (ec) {
    ++accept_errors_;
    // EMFILE, ENFILE, ENOBUFS, ENOMEM: the connection waits in the backlog; pause briefly so
    // a descriptor can come free instead of spinning on the error. Others (ECONNABORTED: the
    // peer gave up) concern one connection only.
    const bool exhausted =
        ec.value() == EMFILE || ec.value() == ENFILE || ec.value() == ENOBUFS || ec.value() == ENOMEM;
    warns_.warn(Warn::Accept, [&] {
      return fmt::format("accept failed on the {} store: {}{}", name_, ec.message(),
                         exhausted ? "; pausing accepts briefly (raise the descriptor limit or lower --max-connections)"
                                   : "");
    });
    if (exhausted && refuse_one(i)) {
      warns_.warn(Warn::ConnectionLimit, [&] {
        return fmt::format("out of descriptors on the {} store: closed a waiting connection at once", name_);
      });
      do_accept(i);
    } else if (exhausted) {
      retry_later(i);
    } else {
      do_accept(i);
    }
    return;
  }
  on_socket_(std::move(sock), peers_[i], i);
  retake_reserve_if_missing();
  do_accept(i);
}

}  // namespace ddprun::server
