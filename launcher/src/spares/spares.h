// Warm spare interpreters (internal to launcher/src; the pure decisions are spare_plan.h).
//
// One spare per local rank: `python -u -c <bootstrap>` started like a worker (spawn_process:
// its own process group, PR_SET_PDEATHSIG, the guardian, the rank's CPU set, the exit watch),
// with the rank's environment, that imports the preload modules and then parks on a control
// socket (its fd 4). It joins no process group, so nothing in it belongs to a rank; with
// --spare_cuda=1 it also creates the CUDA context of its local rank's GPU and pays NCCL's
// one-time set-up (spare_bootstrap.py's _warm_gpu), outside torch. On a restart WorkerGroup::start() hands a ready
// spare the attempt's cwd, argv and environment, and the write ends of the new stdout/stderr pipes (SCM_RIGHTS); the
// spare answers and becomes the worker (same pid, same process group, same exit watch).
//
// A spare that is not ready, died, or answers badly is never a failure: the rank starts cold
// and the restart line says why. Dead and used spares are replaced when the next attempt has
// started (replenish()), importing at SCHED_IDLE (spare_priority) so they take no CPU from the
// job. A spare that exits with an error before it is ready (the preload failed) turns spares
// off for the run, with the reason.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ddprun/launcher/options.h"
#include "ddprun/launcher/output.h"
#include "ddprun/launcher/process.h"
#include "ddprun/launcher/worker_env.h"

namespace ddprun::launcher {

namespace platform {
class Nvml;
}

class Spares {
 public:
  // A spare still importing at idle priority this long after its start is likely starved.
  static constexpr double kIdleStarvedHintS = 15.0;
  Spares(const SpareOptions& opts, int epoll_fd, Guardian& guardian);
  ~Spares();  // closes descriptors; kills nothing (kill_all())
  Spares(const Spares&) = delete;
  Spares& operator=(const Spares&) = delete;

  void enable() { enabled_ = true; }
  bool enabled() const { return enabled_; }
  // Why spares were turned off during the run (a preload that failed), else "".
  const std::string& off_reason() const { return off_reason_; }

  // After an attempt started: a spare for every local rank below layout.local_world_size
  // that has none.
  void replenish(const GroupLayout& layout, const SpawnTemplate& spawn);

  // A spare that has taken a launch, until answer() says whether it runs.
  struct Launch {
    int local_rank = 0;
    pid_t pid = -1;
    int ctl_fd = -1;
    int exit_watch_fd = -1;
  };
  // Sends local rank `local_rank`'s ready spare the launch (stdout_w/stderr_w are the write
  // ends of the worker's pipes; the caller keeps and closes its own copies). The spare leaves
  // the pool either way once sent. Nullopt with `why` when there is no usable spare (one
  // started with another stdin than `stdin_fd`, SpawnTemplate::stdin_for, is dropped).
  std::optional<Launch> launch(int local_rank, const std::vector<std::string>& argv, const EnvMap& env, int stdin_fd,
                               int stdout_w, int stderr_w, std::string& why);
  // Waits (at most `timeout_ms`) for the spare's answer: empty when it runs the entry point,
  // else why not (the caller then SIGKILLs it and starts the rank cold). Closes ctl_fd.
  static std::string answer(Launch& l, int timeout_ms);
  // A launch that answer() refused: SIGKILLs the spare (reaped as a dropped spare).
  void reject(Launch& l, const std::string& why);

  bool owns_fd(int fd) const { return by_fd_.count(fd) != 0; }
  void on_fd(int fd);
  // A spare's pid (parked or gone but not reaped yet): not an orphan.
  bool owns_pid(pid_t pid) const { return pids_.count(pid) != 0; }
  // The reap of a spare's pid: logs how it ended; true when it was one.
  bool on_reaped(pid_t pid, int wait_status);
  // What happened to local rank `local_rank`'s last spare, when it is gone ("" if nothing).
  std::string loss(int local_rank) const;
  // SIGKILLs every spare's process group (the agent's end).
  void kill_all();

 private:
  struct Spare {
    int local_rank = 0;
    pid_t pid = -1;
    int ctl = -1, out = -1, err = -1, exit_watch = -1;
    EnvMap env;
    int stdin_fd = -1;  // what it was started with (SpawnTemplate::stdin_for)
    bool ready = false;
    std::chrono::steady_clock::time_point started;
    std::string ctl_buf;
    LineSplitter split_out, split_err;
    TailBuffer tail{8};
  };
  void read_ctl(Spare& s);
  void read_output(Spare& s, int fd);
  void unwatch(int& fd);
  void drop(int local_rank, const std::string& why, bool kill);
  void disable(const std::string& why);
  // "holds 512 MiB of GPU 0 (NVML index)" for a GPU-warm spare, or why that is unknown.
  std::string gpu_memory_of(pid_t pid);

  const SpareOptions& opts_;
  int epoll_fd_;
  Guardian& guardian_;
  bool enabled_ = false;
  std::string off_reason_;
  std::map<int, std::unique_ptr<Spare>> by_rank_;  // the pool: one per local rank
  std::unordered_map<int, Spare*> by_fd_;          // ctl/out/err -> spare
  std::unordered_map<pid_t, int> pids_;            // pid -> local rank, until reaped (pool or dropped)
  std::map<int, std::string> loss_;                // local rank -> why its spare is gone
  std::unique_ptr<platform::Nvml> nvml_;           // loaded at the first GPU-warm spare (--spare_cuda)
  bool nvml_tried_ = false;
  std::string nvml_error_;
  bool gpu_skip_said_ = false;  // a spare that could not warm its GPU was reported
};

}  // namespace ddprun::launcher
