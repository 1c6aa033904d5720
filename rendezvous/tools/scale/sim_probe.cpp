#include "sim_probe.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

#include "sim.h"

namespace ddprun::scale {

namespace {
bool send_all(int fd, const std::string& b) {
  size_t off = 0;
  while (off < b.size()) {
    const ssize_t n = ::send(fd, b.data() + off, b.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}
bool recv_exact(int fd, uint8_t* p, size_t n) {
  while (n) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
}  // namespace

Probe::Probe(const std::string& host, uint16_t port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  uint8_t echo[4];
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      !send_all(fd_, store_request(wire::Op::Validate, {}, {}, 0, wire::kValidateMagic) +
                         store_request(wire::Op::Ping, {}, {}, 0, 7)) ||
      !recv_exact(fd_, echo, 4)) {
    ::close(fd_);
    fd_ = -1;
  }
}

Probe::~Probe() {
  if (fd_ >= 0) ::close(fd_);
}

// Another job's client: SET then GET of its own key, one op at a time, ~1,000 ops/s.
void Probe::run(const std::atomic<bool>& stop) {
  const std::string key = "other_job/probe";
  const std::string set = store_request(wire::Op::Set, {key}, {std::string(32, 'p')});
  const std::string get = store_request(wire::Op::Get, {key});
  if (fd_ < 0 || !send_all(fd_, set)) {
    failed_ = true;
    return;
  }
  uint8_t buf[8 + 32];
  while (!stop.load()) {
    const auto t0 = Clock::now();
    if (!send_all(fd_, get) || !recv_exact(fd_, buf, sizeof buf)) {
      failed_ = true;
      return;
    }
    lat_us_.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

double Probe::quantile(double q) const {
  if (lat_us_.empty()) return -1;
  std::vector<double> v = lat_us_;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

ProcStats proc_stats(int pid) {
  ProcStats s;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return s;
  // Fields after the command's closing parenthesis: state is field 3; utime, stime are 14, 15.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string f;
  long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> f; ++i) {
    if (i == 14) utime = std::stoll(f);
    if (i == 15) stime = std::stoll(f);
  }
  s.cpu_s = static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) s.peak_rss_mib = std::stod(line.substr(6)) / 1024.0;
  s.ok = true;
  return s;
}

}  // namespace ddprun::scale
