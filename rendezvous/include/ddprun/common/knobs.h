// Every environment variable of ddprun's own (its knobs), once: name, default, meaning and the
// part that reads it. Header-only and dependency-free, the lowest layer, so the launcher, the
// store server and the worker runtime read the same table; `ddprun --help` lists it.
//
// torchrun's own variables (PET_<FLAG>, the worker variables) are not knobs: they are the
// compatibility surface, documented in launcher/README.md.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun::knobs {

struct Knob {
  const char* name;
  const char* default_value;  // as documented; the reader owns the parse
  const char* reader;         // which program reads it
  const char* meaning;
};

inline constexpr Knob kPythonExec{
    "PYTHON_EXEC", "python3 from PATH", "ddprun",
    "the interpreter that runs Python entry points (torchrun's variable; its default is the "
    "interpreter torchrun runs in)"};
inline constexpr Knob kDefaultPython{
    "DDPRUN_DEFAULT_PYTHON", "none", "ddprun",
    "the interpreter that runs Python entry points when PYTHON_EXEC is unset; the ddprun command "
    "installed by pip sets it to the Python it was installed with, as torchrun uses its own"};
inline constexpr Knob kDefaultStorePort{
    "DDPRUN_DEFAULT_STORE_PORT", "29500", "ddprun",
    "the store port tried first when --master_port is not given (a free port when it is taken)"};
inline constexpr Knob kSysfsRoot{
    "DDPRUN_SYSFS_ROOT", "/", "ddprun",
    "the directory under which --numa-binding reads proc/driver/nvidia and sys/ (tests point it "
    "at a fake topology)"};
inline constexpr Knob kStoreLock{
    "DDPRUN_STORE_LOCK", "adaptive", "ddprund",
    "the store state's lock: adaptive (spins briefly before sleeping) or plain (a plain mutex, "
    "for comparison in benchmarks)"};
inline constexpr Knob kCollectiveTimeout{"DDPRUN_COLLECTIVE_TIMEOUT_S", "600", "worker runtime",
                                         "seconds a collective (and NCCL/Gloo set-up) may wait for its peers before it "
                                         "fails (CommError); PyTorch's default"};
inline constexpr Knob kStoreTimeout{"DDPRUN_STORE_TIMEOUT_S", "300", "worker runtime",
                                    "seconds a worker waits for the store and for its peers' keys"};
inline constexpr Knob kDevice{"DDPRUN_DEVICE", "auto", "worker runtime",
                              "cpu, cuda or auto (cuda when this build has it and a GPU is visible)"};
inline constexpr Knob kShm{"DDPRUN_SHM", "1", "worker runtime",
                           "0: the CPU backend uses TCP between ranks of one host, not shared memory"};

inline constexpr Knob kDebugCollectives{
    "DDPRUN_DEBUG_COLLECTIVES", "0", "worker runtime",
    "1: before each collective over Gloo/TCP, the ranks compare op signatures and fail on a mismatch "
    "(the shared-memory path always checks)"};

inline constexpr Knob kRdzvToken{
    "DDPRUN_RDZV_TOKEN", "none", "ddprun, ddprund",
    "the rendezvous token (16+ bytes), when --rdzv_token_file is not given: agents must prove they hold "
    "it to join; the same on every node and on a standing ddprund"};

inline constexpr Knob kMungeSocket{
    "DDPRUN_MUNGE_SOCKET", "munge's default (/run/munge/munge.socket.2)", "ddprun",
    "the socket of munged, for the rendezvous's munge authentication inside a Slurm step without a token "
    "(set it when munged listens elsewhere, as Slurm's AuthInfo=socket= says)"};

inline constexpr Knob kRunsDir{
    "DDPRUN_RUNS_DIR", "$XDG_RUNTIME_DIR/ddprun/runs, else /tmp/ddprun-<uid>/runs", "ddprun",
    "where each running agent of this user leaves a link to its run's log directory, so that "
    "`ddprun dump` with no argument finds the newest running job (a directory of this user, "
    "mode 0700, made when missing)"};

inline constexpr Knob kAll[] = {kPythonExec,        kDefaultPython, kDefaultStorePort, kSysfsRoot, kStoreLock,
                                kCollectiveTimeout, kStoreTimeout,  kDevice,           kShm,       kDebugCollectives,
                                kRdzvToken,         kMungeSocket,   kRunsDir};

// Knobs for tests and benchmarks only: read as always, documented next to their readers
// (launcher/README.md, docs/PROTOCOL.md), but not listed in --help.
inline constexpr Knob kTestOnly[] = {kSysfsRoot, kStoreLock};

inline bool test_only(const Knob& knob) {
  for (const Knob& t : kTestOnly)
    if (std::string_view(t.name) == knob.name) return true;
  return false;
}

// The knob's value from this process's environment; nullopt when unset or empty.
inline std::optional<std::string> get(const Knob& knob) {
  const char* v = std::getenv(knob.name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

// The same from an environment held as a map (the launcher's EnvMap).
template <typename Map>
std::optional<std::string> get(const Knob& knob, const Map& env) {
  auto it = env.find(knob.name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

// "  NAME (default D; read by R): meaning" per knob users set (not the test-only ones), for --help.
inline std::string describe_all() {
  std::string out;
  for (const Knob& k : kAll) {
    if (test_only(k)) continue;
    out += std::string("  ") + k.name + " (default " + k.default_value + "; read by " + k.reader + ")\n      " +
           k.meaning + "\n";
  }
  return out;
}

}  // namespace ddprun::knobs
