// What each worker is started with: its environment (torchrun's worker variables, listed in
// launcher/README.md, on top of the parent's) and its argv. Pure: no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <functional>
#include <string>
#include <vector>

#include "ddprun/launcher/options.h"

namespace ddprun::launcher {

// The layout of one attempt on this node, as the rendezvous decided it.
struct GroupLayout {
  int node_rank = 0;
  int num_nodes = 1;
  int local_world_size = 1;
  int world_size = 1;
  int global_rank_base = 0;  // global rank of local rank 0
  std::string store_host = "127.0.0.1";
  uint16_t store_port = 29500;
  std::string run_id = "none";
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT of this attempt
};

// The environment of local rank `local_rank`: `parent` plus the torchrun variables (those
// marked "unless set" keep the parent's value). `error_file` is its TORCHELASTIC_ERROR_FILE;
// DDPRUN_PREEMPT_FILE (preempt_file_for) sits beside it.
EnvMap build_worker_env(const EnvMap& parent, const WorkerOptions& opts, const FaultOptions& faults,
                        const GroupLayout& g, int local_rank, const std::string& error_file);

// Where a worker announces that it stopped for a preemption (DDPRUN_PREEMPT_FILE): the file
// "preempted" beside its error file. Its lines: "preempted", then "checkpoint <what>" when it
// saved one (libddprun_worker's stop.h writes it; any worker may).
std::string preempt_file_for(const std::string& error_file);

// What a preemption announcement says (preempt_file_for's format).
struct PreemptAnnouncement {
  bool checkpoint = false;
  std::string what;  // the checkpoint line's text
};
// nullopt when the file is missing, a symbolic link or not a regular file; only its first
// kMaxPreemptFileBytes are read.
inline constexpr size_t kMaxPreemptFileBytes = 64 * 1024;
std::optional<PreemptAnnouncement> read_preempt_announcement(const std::string& error_file);

// argv of a worker: -m -> {python, -u, -m, mod, ...}; --run_path -> python runs the file
// through runpy; `with_python` (entrypoint.h's runs_with_python: `.py`, a non-executable
// script, ...) -> {python, -u, script, args...}; otherwise {program, args...}. python is
// $PYTHON_EXEC from `env`, else $DDPRUN_DEFAULT_PYTHON, else "python3" (found on PATH).
std::vector<std::string> build_worker_argv(const WorkerOptions& opts, const EnvMap& env, bool with_python);
// The same, deciding Python by the `.py` suffix alone (no file system look).
std::vector<std::string> build_worker_argv(const WorkerOptions& opts, const EnvMap& env);

// "K=V" strings, for execve.
std::vector<std::string> to_envp(const EnvMap& env);

// GLOO_SOCKET_IFNAME for the workers of a multi-node job (set only when the user set none):
// the interface of the first address this node's hostname resolves to that is not loopback
// and belongs to this host (what Gloo itself binds to, given the hostname); else the interface
// of this node's address toward the rendezvous. `name` empty: set nothing (loopback only).
struct GlooInterface {
  std::string name;
  std::string why;  // for the start line: "the interface of ..., which ... resolves to"
};
// `hostname_addrs`: what `hostname` resolves to, in getaddrinfo's order; `rendezvous_addr`:
// this node's address on its connection to the rendezvous; `iface_of`: the interface that
// holds a local address ("" for an address of no interface here).
GlooInterface choose_gloo_interface(const std::string& hostname, const std::vector<std::string>& hostname_addrs,
                                    const std::string& rendezvous_addr,
                                    const std::function<std::string(const std::string&)>& iface_of);

}  // namespace ddprun::launcher
