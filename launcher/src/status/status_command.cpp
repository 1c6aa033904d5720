#include "ddprun/launcher/status_command.h"

#include <dirent.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <optional>
#include <tuple>

#include "ddprun/common/knobs.h"
#include "ddprun/launcher/agent_status.h"
#include "ddprun/launcher/options.h"
#include "ddprun/launcher/subcommand_args.h"
#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/auth_io.h"
#include "ddprun/rdzv/rendezvous_client.h"
#include "platform/private_files.h"
#include "status/status_server.h"

namespace ddprun::launcher {
namespace {

constexpr int kReadTimeoutMs = 3000;                 // an agent answers from a thread of its own at once
constexpr std::chrono::seconds kEndpointTimeout{5};  // to connect, and for the reply
constexpr uint16_t kDefaultRdzvPort = 29400;         // torchrun's, for an endpoint without one

struct Found {
  std::vector<AgentStatus> agents;
  std::vector<std::string> problems;  // one line each: a socket that could not be read
  std::string dir;                    // where it looked: the socket directory or the endpoint
  bool dir_missing = false;
  std::string refused;  // why the socket directory is not read (another user's, open to others)
  bool remote = false;
  bool job_unknown = false;  // the server knows no job of that run id
  std::string unreachable;   // why the server could not be asked
  int64_t members = 0;       // the job's agents at the server
};

// The whole job: what every agent last sent the rendezvous server.
Found collect_remote(const HostPort& ep, const std::string& token, const std::string& run_id) {
  Found f;
  f.remote = true;
  const uint16_t port = ep.port.value_or(kDefaultRdzvPort);
  f.dir = "the rendezvous endpoint " + ep.host + ":" + std::to_string(port);
  try {
    rdzv::RendezvousClient client(ep.host, port, kEndpointTimeout, std::chrono::hours(24), {}, token);
    const rdzv::StatusReply reply = client.query_status(run_id, kEndpointTimeout);
    f.members = reply.members;
    if (!reply.found) {
      f.job_unknown = true;
      return f;
    }
    std::string error;
    f.agents = statuses_from_json_array(reply.agents, &error);
    if (!error.empty()) f.problems.push_back("an agent's status was left out: " + error);
  } catch (const rdzv::RendezvousRefused& e) {
    f.unreachable = e.what();
  } catch (const rdzv::RendezvousError& e) {
    f.unreachable = "cannot read " + f.dir + ": " + e.what() +
                    " (a one-node job serves no rendezvous: run ddprun status on its host)";
  }
  std::sort(f.agents.begin(), f.agents.end(), [](const AgentStatus& a, const AgentStatus& b) {
    return std::tie(a.node_rank, a.agent_pid) < std::tie(b.node_rank, b.agent_pid);
  });
  return f;
}

// The answer of the agent listening on `path`, or nullopt and *problem (empty for a stale
// socket, which is removed).
std::optional<std::string> ask(const std::string& path, std::string* problem) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    *problem = path + ": path too long for a unix socket";
    return std::nullopt;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *problem = std::string("socket: ") + std::strerror(errno);
    return std::nullopt;
  }
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == ECONNREFUSED) {
      ::unlink(path.c_str());  // its agent is gone (killed before it could remove it)
      problem->clear();
    } else if (err == ENOENT) {
      problem->clear();  // its agent just ended
    } else {
      *problem = path + ": " + std::strerror(err);
    }
    return std::nullopt;
  }
  // Only an agent of this user is believed.
  ucred peer{};
  socklen_t len = sizeof peer;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.uid != ::geteuid()) {
    ::close(fd);
    *problem = path + ": served by another user (uid " + std::to_string(peer.uid) + "): not read";
    return std::nullopt;
  }
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kReadTimeoutMs);
  char buf[16384];
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    const int r = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      ::close(fd);
      *problem = path + ": no answer within " + std::to_string(kReadTimeoutMs / 1000) + " s";
      return std::nullopt;
    }
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

Found collect(const std::string& dir, const std::optional<std::string>& run_id) {
  Found f;
  f.dir = dir;
  // Only a directory of this user that no one else can change is read (and only there are
  // stale sockets removed).
  std::string real, why;
  switch (check_private_dir(dir, &real, &why)) {
    case DirState::missing: f.dir_missing = true; return f;
    case DirState::refused: f.refused = why; return f;
    case DirState::ok: break;
  }
  DIR* d = ::opendir(real.c_str());
  if (!d) {
    if (errno == ENOENT) f.dir_missing = true;
    else
      f.problems.push_back("cannot read " + real + ": " + std::strerror(errno) +
                           " (each user sees only the agents of their own uid)");
    return f;
  }
  std::vector<std::string> sockets;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".sock") == 0) sockets.push_back(real + "/" + name);
  }
  ::closedir(d);
  std::sort(sockets.begin(), sockets.end());
  for (const auto& path : sockets) {
    std::string problem;
    const auto text = ask(path, &problem);
    if (!text) {
      if (!problem.empty()) f.problems.push_back(problem);
      continue;
    }
    if (text->rfind("refused", 0) == 0) {
      f.problems.push_back(path + ": " + text->substr(0, text->find('\n')));
      continue;
    }
    std::string error;
    auto s = status_from_json(*text, &error);
    if (!s) {
      f.problems.push_back(path + ": not a status answer (" + error + ")");
      continue;
    }
    if (run_id && s->run_id != *run_id) continue;
    f.agents.push_back(std::move(*s));
  }
  std::sort(f.agents.begin(), f.agents.end(), [](const AgentStatus& a, const AgentStatus& b) {
    return std::tie(a.run_id, a.node_rank, a.agent_pid) < std::tie(b.run_id, b.node_rank, b.agent_pid);
  });
  return f;
}

std::string nothing_running(const Found& f, const StatusArgs& a) {
  if (f.remote) {
    if (!f.unreachable.empty()) return f.unreachable;
    if (f.job_unknown) return "no job " + *a.run_id + " at " + f.dir + " (a job that ended is forgotten there)";
    return "no agent of job " + *a.run_id + " at " + f.dir + " has sent its status yet (" + std::to_string(f.members) +
           " joined; each sends it every 2 s)";
  }
  if (!f.refused.empty()) return f.refused;
  std::string what = a.run_id ? "no running ddprun job with --rdzv_id " + *a.run_id : "no running ddprun job";
  return what + " of this user on this host (looked in " + f.dir + (f.dir_missing ? ", which does not exist" : "") +
         "); start one with `ddprun --nproc_per_node=N script.py`; an agent started with another "
         "XDG_RUNTIME_DIR is listed under that one";
}

void print_once(const Found& f, const StatusArgs& a) {
  for (const auto& p : f.problems) std::fprintf(stderr, "ddprun status: warning: %s\n", p.c_str());
  if (a.json) {
    std::printf("%s\n", status_document_json(f.agents).c_str());
  } else if (!f.agents.empty()) {
    std::fputs(format_status_table(f.agents).c_str(), stdout);
  }
  if (f.agents.empty())
    std::fprintf(stderr, "ddprun status: %s%s\n", f.refused.empty() ? "" : "error: ", nothing_running(f, a).c_str());
}

void sleep_for(double s) {
  timespec ts{static_cast<time_t>(s), static_cast<long>((s - std::floor(s)) * 1e9)};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

int watch(const std::function<Found()>& collect_now, const StatusArgs& a) {
  if (!a.json) std::fputs("\x1b[H\x1b[2J", stdout);  // a clean screen once
  while (true) {
    const Found f = collect_now();
    if (a.json) {
      std::printf("%s\n", status_document_json(f.agents).c_str());
    } else {
      const std::time_t now = std::time(nullptr);
      char when[32];
      std::strftime(when, sizeof when, "%H:%M:%S", std::localtime(&now));
      char head[128];
      std::snprintf(head, sizeof head, "ddprun status, every %g s (Ctrl-C to stop)   %s\n\n", a.interval_s, when);
      std::string text = head;
      text += f.agents.empty() ? nothing_running(f, a) + "\n" : format_status_table(f.agents);
      for (const auto& p : f.problems) text += "warning: " + p + "\n";
      // Redrawn in place, as top does: home, each line cleared to its end, the rest cleared.
      std::string screen = "\x1b[H";
      for (size_t pos = 0, nl; (nl = text.find('\n', pos)) != std::string::npos; pos = nl + 1)
        screen += text.substr(pos, nl - pos) + "\x1b[K\n";
      screen += "\x1b[J";
      std::fputs(screen.c_str(), stdout);
    }
    std::fflush(stdout);
    sleep_for(a.interval_s);
  }
}

}  // namespace

int run_status(const std::vector<std::string>& args, const EnvMap& env) {
  const auto parsed = parse_status_args(args);
  if (!parsed.args) {
    if (parsed.exit_code == 0) std::fputs(parsed.message.c_str(), stdout);
    else std::fprintf(stderr, "ddprun status: error: %s\n", parsed.message.c_str());
    return parsed.exit_code;
  }
  const StatusArgs& a = *parsed.args;
  std::function<Found()> collect_now;
  if (a.endpoint) {
    HostPort ep;
    std::string token;
    try {
      ep = parse_host_port("rdzv_endpoint", *a.endpoint);
      check_endpoint_host("--rdzv_endpoint", *a.endpoint, ep.host);
      const auto from_env = knobs::get(knobs::kRdzvToken, env);
      token = rdzv::load_token(a.token_file, from_env ? from_env->c_str() : nullptr);
    } catch (const std::exception& e) {  // UsageError, or the token file's std::invalid_argument
      std::fprintf(stderr, "ddprun status: error: %s\n", e.what());
      return kUsageExitCode;
    }
    collect_now = [ep, token, run_id = *a.run_id] { return collect_remote(ep, token, run_id); };
  } else {
    collect_now = [dir = status_dir(env), run_id = a.run_id] { return collect(dir, run_id); };
  }
  if (a.watch) return watch(collect_now, a);
  const Found f = collect_now();
  print_once(f, a);
  return f.agents.empty() ? 1 : 0;
}

}  // namespace ddprun::launcher
