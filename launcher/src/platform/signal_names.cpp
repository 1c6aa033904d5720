#include "ddprun/launcher/signal_names.h"

#include <algorithm>
#include <cctype>
#include <csignal>
#include <string_view>

namespace ddprun::launcher {
namespace {

struct NamedSignal {
  int signo;
  std::string_view name;
};

constexpr NamedSignal kSignals[] = {
    {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
    {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
    {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
    {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
    {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
    {SIGTTOU, "SIGTTOU"}, {SIGURG, "SIGURG"},   {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"},
    {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGWINCH, "SIGWINCH"}, {SIGIO, "SIGIO"},
    {SIGPWR, "SIGPWR"},   {SIGSYS, "SIGSYS"},
};

}  // namespace

std::string signal_name(int signo) {
  for (const auto& s : kSignals) {
    if (s.signo == signo) return std::string(s.name);
  }
  return "signal " + std::to_string(signo);
}

std::optional<int> signal_from_name(const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (std::all_of(name.begin(), name.end(), [](unsigned char c) { return std::isdigit(c); })) {
    if (name.size() > 3) return std::nullopt;
    int n = std::stoi(name);
    if (n <= 0 || n > 64) return std::nullopt;
    return n;
  }
  std::string upper;
  for (unsigned char c : name) upper.push_back(static_cast<char>(std::toupper(c)));
  if (upper.rfind("SIG", 0) != 0) upper = "SIG" + upper;
  for (const auto& s : kSignals) {
    if (s.name == upper) return s.signo;
  }
  return std::nullopt;
}

}  // namespace ddprun::launcher
