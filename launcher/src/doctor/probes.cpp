// The doctor's probes: what the machine says, into doctor.h's Facts. Each probe fills its
// facts and never throws; a probe that cannot look says why in the facts.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ddprun/launcher/doctor.h"
#include "ddprun/launcher/entrypoint.h"
#include "ddprun/launcher/worker_env.h"
#include "platform/nvml.h"

namespace ddprun::launcher::doctor {

namespace {

using Clock = std::chrono::steady_clock;

int count_dev_nvidia() {
  int devs = 0;
  if (DIR* d = ::opendir("/dev")) {
    while (dirent* e = ::readdir(d)) {
      const char* n = e->d_name;
      if (std::strncmp(n, "nvidia", 6) != 0 || n[6] == '\0') continue;
      bool digits = true;
      for (const char* p = n + 6; *p; ++p) digits = digits && *p >= '0' && *p <= '9';
      if (digits) ++devs;
    }
    ::closedir(d);
  }
  return devs;
}

void probe_shm(ShmFacts& s) {
  struct statvfs vs {};
  if (::statvfs("/dev/shm", &vs) != 0) {
    s.present = false;
    s.error = std::strerror(errno);
    return;
  }
  s.present = true;
  s.total_bytes = static_cast<uint64_t>(vs.f_blocks) * vs.f_frsize;
  s.avail_bytes = static_cast<uint64_t>(vs.f_bavail) * vs.f_frsize;
}

void probe_token(TokenFacts& t) {
  if (t.file.empty()) return;
  struct stat st {};
  if (::stat(t.file.c_str(), &st) != 0) {
    t.error = std::strerror(errno);
    return;
  }
  t.exists = true;
  t.regular = S_ISREG(st.st_mode);
  t.own = st.st_uid == ::geteuid();
  t.mode = static_cast<unsigned>(st.st_mode);
}

std::string address_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  } else if (sa->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

bool is_loopback(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
  return false;
}

// The first address of the rendezvous host, kept for the connect and route probes.
struct Resolved {
  sockaddr_storage addr{};
  socklen_t len = 0;
};

Resolved resolve(NetworkFacts& n) {
  Resolved first;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(n.host.c_str(), nullptr, &hints, &res);
  if (rc != 0) {
    n.resolve_error = ::gai_strerror(rc);
    return first;
  }
  for (addrinfo* a = res; a; a = a->ai_next) {
    const std::string text = address_text(a->ai_addr);
    bool seen = false;
    for (const auto& x : n.addresses) seen = seen || x == text;
    if (!seen) n.addresses.push_back(text);
    if (a == res) {
      n.loopback = is_loopback(a->ai_addr);
      std::memcpy(&first.addr, a->ai_addr, a->ai_addrlen);
      first.len = static_cast<socklen_t>(a->ai_addrlen);
    }
  }
  ::freeaddrinfo(res);
  return first;
}

void set_port(Resolved& r, uint16_t port) {
  if (r.addr.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&r.addr)->sin_port = htons(port);
  if (r.addr.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&r.addr)->sin6_port = htons(port);
}

// Whether `r` is one of this node's addresses (binding it works), and whether `port` is taken.
void probe_local(NetworkFacts& n, Resolved r) {
  set_port(r, 0);
  int fd = ::socket(r.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  n.local = ::bind(fd, reinterpret_cast<sockaddr*>(&r.addr), r.len) == 0;
  ::close(fd);
  if (!n.local) return;
  set_port(r, n.port);
  fd = ::socket(r.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  n.port_taken = ::bind(fd, reinterpret_cast<sockaddr*>(&r.addr), r.len) != 0 && errno == EADDRINUSE;
  ::close(fd);
}

void probe_connect(NetworkFacts& n, Resolved r, int timeout_ms) {
  set_port(r, n.port);
  const int fd = ::socket(r.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    n.reach = NetworkFacts::Reach::Unreachable;
    n.reach_error = std::strerror(errno);
    return;
  }
  int err = 0;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&r.addr), r.len) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int rc = ::poll(&p, 1, timeout_ms);
      if (rc == 0) {
        err = ETIMEDOUT;
      } else {
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
  }
  ::close(fd);
  if (err == 0) n.reach = NetworkFacts::Reach::Listening;
  else if (err == ECONNREFUSED) n.reach = NetworkFacts::Reach::Refused;
  else {
    n.reach = NetworkFacts::Reach::Unreachable;
    n.reach_error = err == ETIMEDOUT ? "no answer within " + std::to_string(timeout_ms) + " ms" : std::strerror(err);
  }
}

int read_mtu(const std::string& ifname) {
  std::ifstream in("/sys/class/net/" + ifname + "/mtu");
  int mtu = 0;
  in >> mtu;
  return in ? mtu : 0;
}

struct Interface {
  std::string name;
  std::string address;
};

std::vector<Interface> list_interfaces() {
  std::vector<Interface> out;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
    out.push_back({i->ifa_name, address_text(i->ifa_addr)});
  }
  ::freeifaddrs(ifs);
  return out;
}

InterfaceFacts named_interface(const std::string& source, std::string spec, const std::vector<Interface>& all) {
  // NCCL_SOCKET_IFNAME: "=eth0" exact, "eth" a prefix, "^docker" an exclusion (not checked).
  InterfaceFacts f;
  f.source = source;
  bool exact = source == "GLOO_SOCKET_IFNAME";
  if (!spec.empty() && spec[0] == '=') {
    exact = true;
    spec.erase(0, 1);
  }
  spec = spec.substr(0, spec.find(','));
  f.name = spec;
  for (const auto& i : all) {
    if (exact ? i.name == spec : i.name.rfind(spec, 0) == 0) {
      f.exists = true;
      f.name = i.name;
      f.address = i.address;
      f.mtu = read_mtu(i.name);
      break;
    }
  }
  return f;
}

InterfaceFacts routed_interface(Resolved r, uint16_t port, const std::vector<Interface>& all) {
  InterfaceFacts f;
  f.source = "route";
  set_port(r, port);
  const int fd = ::socket(r.addr.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&r.addr), r.len) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
    f.name = std::string("no route (") + std::strerror(errno) + ")";
    if (fd >= 0) ::close(fd);
    return f;
  }
  ::close(fd);
  f.address = address_text(reinterpret_cast<sockaddr*>(&local));
  for (const auto& i : all) {
    if (i.address == f.address) {
      f.exists = true;
      f.name = i.name;
      f.mtu = read_mtu(i.name);
      break;
    }
  }
  if (!f.exists) f.name = "none holds " + f.address;
  return f;
}

void probe_network(NetworkFacts& n, const EnvMap& env) {
  Resolved r = resolve(n);
  if (!n.resolve_error.empty()) return;
  probe_local(n, r);
  probe_connect(n, r, 1000);
  const auto all = list_interfaces();
  bool named = false;
  for (const char* var : {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"}) {
    auto it = env.find(var);
    if (it == env.end() || it->second.empty() || it->second[0] == '^') continue;
    n.interfaces.push_back(named_interface(var, it->second, all));
    named = true;
  }
  if (!named) n.interfaces.push_back(routed_interface(r, n.port, all));
}

void probe_limits(LimitsFacts& l) {
  if (DIR* d = ::opendir("/sys/class/infiniband")) {
    while (dirent* e = ::readdir(d)) l.rdma = l.rdma || e->d_name[0] != '.';
    ::closedir(d);
  }
  rlimit rl{};
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
    l.memlock_unlimited = rl.rlim_cur == RLIM_INFINITY;
    l.memlock_bytes = l.memlock_unlimited ? 0 : rl.rlim_cur;
  }
}

void probe_gpus(GpuFacts& g) {
  std::string why;
  auto nvml = platform::Nvml::load(&why);
  if (!nvml) {
    // dlerror's text names the path tried; one stable sentence is what the user needs.
    g.driver_error = why.rfind("libnvidia-ml.so.1:", 0) == 0 ? "libnvidia-ml.so.1 cannot be loaded" : why;
    return;
  }
  auto count = nvml->device_count();
  if (!count) {
    g.driver_error = nvml->last_error();
    return;
  }
  g.driver = true;
  g.driver_cuda_version = nvml->driver_cuda_version().value_or(0);
  for (int i = 0; i < *count; ++i) {
    GpuDeviceFacts d;
    d.name = nvml->name(i).value_or("?");
    d.uuid = nvml->uuid(i).value_or("");
    d.compute_mode = static_cast<int>(nvml->compute_mode(i).value_or(platform::ComputeMode::Default));
    d.memory_used = nvml->memory_used(i).value_or(0);
    for (const auto& p : nvml->compute_processes(i).value_or(std::vector<platform::GpuProcess>{}))
      d.processes.push_back({p.pid, p.used_bytes});
    g.devices.push_back(std::move(d));
  }
}

// What the workers' interpreter says about torch: one line, "TORCH version\tcuda\tnccl" or
// "NOTORCH error". `python -c` puts the working directory first on sys.path: it goes before
// anything is imported, so a torch.py there (another user's, in a shared directory) is never
// run. The rest of the path (PYTHONPATH, the user's site directory) stays: the workers see it.
constexpr const char* kPythonProbe = R"(import sys
if sys.path[:1] == [""]:
    del sys.path[0]
try:
    import torch
except BaseException as e:
    print("NOTORCH %s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")); sys.exit(0)
nccl = ""
try:
    if torch.version.cuda:
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else "%d.%d.%d" % (v // 1000, v % 1000 // 100, v % 100)
except BaseException:
    pass
print("TORCH %s\t%s\t%s" % (torch.__version__, torch.version.cuda or "", nccl))
)";

// A child's stdout and stderr, read to its end or until `timeout_ms`, when it is killed.
struct Captured {
  bool started = false;
  std::string error;  // why it did not start, or "no answer within N s"
  std::string output;
  int status = 0;  // waitpid's
};

Captured run_captured(const std::vector<std::string>& argv_s, const EnvMap& env, int timeout_ms) {
  Captured c;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    c.error = std::strerror(errno);
    return c;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  std::vector<std::string> args = argv_s;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> envp_s = to_envp(env);
  std::vector<char*> envp;
  for (auto& e : envp_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, args[0].c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    c.error = std::strerror(rc);
    return c;
  }
  c.started = true;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  bool timed_out = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd pf{fds[0], POLLIN, 0};
    if (::poll(&pf, 1, static_cast<int>(left)) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    c.output.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  while (::waitpid(pid, &c.status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) c.error = "no answer within " + std::to_string(timeout_ms / 1000) + " s";
  return c;
}

void probe_python(PythonFacts& p, const EnvMap& env, int timeout_ms) {
  if (!p.needed) return;
  const Captured c = run_captured({p.python, "-c", kPythonProbe}, env, timeout_ms);
  if (!c.error.empty()) {
    p.error = c.error;
    return;
  }
  const std::string& out = c.output;
  const size_t at = out.rfind("TORCH ");
  const size_t no = out.rfind("NOTORCH ");
  if (no != std::string::npos) {
    p.ran = true;
    std::string e = out.substr(no + 8);
    while (!e.empty() && (e.back() == '\n' || e.back() == ' ' || e.back() == ':')) e.pop_back();
    p.error = e;
  } else if (at != std::string::npos) {
    p.ran = true;
    p.torch = true;
    std::string line = out.substr(at + 6);
    line = line.substr(0, line.find('\n'));
    const size_t t1 = line.find('\t');
    const size_t t2 = line.find('\t', t1 == std::string::npos ? line.size() : t1 + 1);
    p.torch_version = line.substr(0, t1);
    if (t1 != std::string::npos)
      p.torch_cuda = line.substr(t1 + 1, t2 == std::string::npos ? std::string::npos : t2 - t1 - 1);
    if (t2 != std::string::npos) p.nccl = line.substr(t2 + 1);
  } else {
    // The interpreter broke before printing (a shim that failed, a broken install): its last line.
    std::string tail = out;
    while (!tail.empty() && tail.back() == '\n') tail.pop_back();
    const int st = c.status;
    p.error = !tail.empty() ? tail.substr(tail.rfind('\n') == std::string::npos ? 0 : tail.rfind('\n') + 1)
                            : "exit status " + std::to_string(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  }
}

// "libcudart.so.12.1.105" -> "12.1.105": the version in a library's file name after ".so.".
std::string soname_version(const std::string& path) {
  char resolved[PATH_MAX];
  const std::string real = ::realpath(path.c_str(), resolved) ? std::string(resolved) : path;
  const size_t so = real.rfind(".so.");
  return so == std::string::npos ? "" : real.substr(so + 4);
}

// The CUDA runtime and NCCL a program loads, as the dynamic loader resolves them (ldd).
void probe_program(ProgramFacts& p, const EnvMap& env, int timeout_ms) {
  if (p.program.empty()) return;
  const Captured c = run_captured({"ldd", p.program}, env, timeout_ms);
  if (!c.error.empty() || !WIFEXITED(c.status) || WEXITSTATUS(c.status) != 0) {
    std::string tail = c.output.substr(0, c.output.find('\n'));
    p.error = !c.error.empty() ? "ldd: " + c.error : tail.empty() ? "ldd failed" : tail;
    return;
  }
  p.ran = true;
  size_t start = 0;
  while (start < c.output.size()) {
    size_t nl = c.output.find('\n', start);
    if (nl == std::string::npos) nl = c.output.size();
    const std::string line = c.output.substr(start, nl - start);
    start = nl + 1;
    const size_t arrow = line.find("=> ");
    if (arrow == std::string::npos) continue;
    std::string path = line.substr(arrow + 3);
    path = path.substr(0, path.find(" ("));
    if (line.find("libcudart.so") != std::string::npos) {
      p.cudart = soname_version(path);
      if (path == "not found") p.cudart = "not found";
    } else if (line.find("libnccl.so") != std::string::npos) {
      p.nccl = soname_version(path);
      if (path == "not found") p.nccl = "not found";
    }
  }
}

}  // namespace

// The preflight's bounded resolution: an address literal, else the first /etc/hosts line that
// names the host (where a 127.0.1.1 entry comes from). No DNS query: its time has no bound, and
// DNS rarely answers loopback; `ddprun doctor` asks the resolver itself.
void resolve_without_dns(NetworkFacts& n) {
  in6_addr a6{};
  in_addr a4{};
  std::string address;
  if (::inet_pton(AF_INET, n.host.c_str(), &a4) == 1 || ::inet_pton(AF_INET6, n.host.c_str(), &a6) == 1) {
    address = n.host;
  } else {
    std::ifstream hosts("/etc/hosts");
    std::string line;
    while (address.empty() && std::getline(hosts, line)) {
      line = line.substr(0, line.find('#'));
      std::istringstream words(line);
      std::string addr, name;
      words >> addr;
      while (words >> name) {
        if (name == n.host) {
          address = addr;
          break;
        }
      }
    }
  }
  if (address.empty()) return;  // not known without DNS: nothing to say
  n.addresses.push_back(address);
  n.loopback = (::inet_pton(AF_INET, address.c_str(), &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127) ||
               (::inet_pton(AF_INET6, address.c_str(), &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6));
}

void probe_preflight_facts(Facts& f) {
  f.dev_nvidia_nodes = count_dev_nvidia();
  probe_shm(f.shm);
  probe_token(f.token);
  if (f.multi_node) resolve_without_dns(f.network);
}

void probe_doctor_facts(Facts& f, const LaunchOptions& opts, const EnvMap& env, int python_timeout_ms) {
  // What the workers really run (a program on PATH, `./a.out`, a non-executable script that
  // Python runs), as the launch resolves it; an entry point that cannot run keeps the guess.
  if (!opts.workers.entrypoint.empty()) {
    try {
      const WorkerCommand cmd = resolve_worker_command(opts.workers, env);
      f.python.needed = !cmd.interpreter.empty();
      if (!f.python.needed) f.program.program = cmd.executable;
    } catch (const UsageError&) {
    }
  }
  f.dev_nvidia_nodes = count_dev_nvidia();
  f.gpus_probed = true;
  probe_gpus(f.gpus);
  probe_python(f.python, env, python_timeout_ms);
  probe_program(f.program, env, 10000);
  probe_shm(f.shm);
  probe_limits(f.limits);
  if (f.multi_node) probe_network(f.network, env);
  probe_token(f.token);
}

}  // namespace ddprun::launcher::doctor
