// Starting and signalling worker processes (Linux). The only place that forks.
//
// Each worker runs in its own process group (so a signal reaches its children too), gets
// SIGKILL when the agent dies (PR_SET_PDEATHSIG, with the getppid() race checked), starts with
// an empty signal mask, and inherits no descriptor but 0-2.
//
// Early exit watch (SpawnRequest::exit_watch): the kernel tells a parent that its child died
// (SIGCHLD, pidfd, waitpid) only after it has torn the child down, and tearing down a process
// with PyTorch loaded takes 15-30 ms (its address space is freed first). Since Linux 6.11 a
// task drops its seccomp filters at the very start of its exit, and the listener of a filter
// reports POLLHUP once no task uses the filter any more. So the child installs a filter that
// allows every system call, with a listener (SECCOMP_FILTER_FLAG_NEW_LISTENER), and hands the
// listener to the agent: POLLHUP on it means "the worker (and every descendant that inherited
// the filter) is exiting", well before the exit is reaped, and /proc/<pid>/stat holds its
// exit status then, or a few instructions later (early_exit_status). Installing a filter needs CAP_SYS_ADMIN or the
// no_new_privs bit; the latter is set only when allowed (exit_watch_no_new_privs).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/launcher/worker_env.h"

namespace ddprun::launcher {

// What every worker of the job is started with (the worker group and the warm spares build
// each rank's SpawnRequest from it).
struct SpawnTemplate {
  std::string executable;
  std::vector<std::string> argv;
  int stdin_fd = -1;  // every worker's stdin (-1: the agent's own)
  // --stdin_rank: this global rank gets stdin_rank_fd instead (the agent's terminal).
  std::optional<int> stdin_rank;
  int stdin_rank_fd = -1;
  bool stdin_terminal = false;  // stdin_rank_fd is a terminal (its output is interactive)
  int stdin_for(int global_rank) const { return stdin_rank && *stdin_rank == global_rank ? stdin_rank_fd : stdin_fd; }
  std::vector<int> reset_to_default;
  bool exit_watch = false;
  // The CPUs of each local rank (--numa_binding; empty: the agent's own affinity).
  std::vector<std::vector<int>> cpu_affinity;
  // The environment of one local rank (its error file given).
  std::function<EnvMap(const GroupLayout&, int local_rank, const std::string& error_file)> env;
};

struct SpawnRequest {
  std::string executable;         // resolved path (see find_executable)
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> envp;  // "K=V"
  int stdin_fd = -1;              // -1: inherit the agent's stdin
  // Signals the agent ignores for itself (SIGPIPE) that the worker gets back as SIG_DFL.
  // Every other disposition is left as inherited (exec resets handlers; a SIG_IGN from the
  // agent's own parent, e.g. nohup's SIGHUP, stays, as with torchrun).
  std::vector<int> reset_to_default;
  // Early exit watch (see above). Without CAP_SYS_ADMIN the filter needs PR_SET_NO_NEW_PRIVS
  // (exec of setuid programs then gains no privileges); only set when this allows it.
  bool exit_watch = false;
  bool exit_watch_no_new_privs = false;
  // CPUs the worker may run on (sched_setaffinity in the child before exec; --numa-binding).
  // Empty: the agent's own set is inherited. If the kernel refuses the set, the worker does not
  // start: it shows as a failed exec (exec_status_fd) with sched_setaffinity's errno.
  std::vector<int> cpu_affinity;
  // A descriptor the child gets as fd 4 (not close-on-exec), e.g. a warm spare's control
  // socket (spares.cpp); -1: none, and the child has only 0-2.
  int pass_fd = -1;
};

struct SpawnedProcess {
  pid_t pid = -1;
  int stdout_fd = -1;  // read ends, non-blocking, close-on-exec; the caller owns them
  int stderr_fd = -1;
  int exec_status_fd = -1;  // reads EOF once exec succeeded, or an errno (int) if it failed
  int exit_watch_sock = -1;  // exit_watch: brings the listener (receive_exit_watch), else -1
};

// Forks the worker. Throws std::system_error when pipe/fork fail. An exec failure shows later
// as exit code 127 (and through exec_status_fd).
SpawnedProcess spawn_process(const SpawnRequest& req);

// Waits until exec succeeded or failed, at most `timeout_ms` (then assumes it is under way);
// returns 0 or the errno of the failed exec. Closes the fd.
int wait_exec_status(int exec_status_fd, int timeout_ms = 30000);

// The seccomp listener the child sent over `sock` (SpawnedProcess::exit_watch_sock), close-on-
// exec; -1 when the child could not install one (old kernel, seccomp not allowed, a listener
// already in its filter chain) or exited first. Waits at most `timeout_ms`. Closes `sock`.
int receive_exit_watch(int sock, int timeout_ms = 5000);

// Whether this kernel drops a task's seccomp filters as the task starts to exit (Linux 6.11+);
// on older kernels the listener reports only after the reap and the watch is of no use.
bool kernel_reports_exit_early();

// The exit status, in waitpid's format, that /proc/<pid>/stat shows for an exiting child that
// has not been reaped yet; nullopt when it shows 0 (a clean exit: the reap tells) or cannot be
// read. Called as the listener reports, it waits (about 2 ms at most) for a status the exiting
// task has not stored yet.
std::optional<int> early_exit_status(pid_t pid);

// `name` with a '/' is returned as is when executable; otherwise searched on `path_var`.
std::optional<std::string> find_executable(const std::string& name, const std::string& path_var);

// Makes this process the reaper of orphaned descendants (PR_SET_CHILD_SUBREAPER).
void become_child_subreaper();

// kill(-pgid, signo); ESRCH (group already gone) is not an error. Returns whether any
// process was signalled.
bool signal_process_group(pid_t pgid, int signo);

// Children of `parent` right now (from /proc), e.g. orphans adopted as subreaper.
std::vector<pid_t> children_of(pid_t parent);

// Clock ticks since boot, now: the unit of a process's start time in /proc/<pid>/stat.
unsigned long long boot_ticks_now();
// Children of `parent` that started in a tick before `tick` (boot_ticks_now()), i.e. surely
// before the moment `tick` was taken; one that started in the same tick is not listed.
std::vector<pid_t> children_started_before(pid_t parent, unsigned long long tick);

// Makes sure descriptors 0, 1 and 2 are open (on /dev/null when not).
void ensure_std_fds_open();

// A helper process that makes "workers die with the agent" hold for their children too.
// PR_SET_PDEATHSIG kills a worker when the agent dies, but not the worker's own children
// (dataloader workers, shells' children). The guardian is told each worker's process group
// over a pipe; when the pipe closes without release() (the agent died, even by SIGKILL), it
// SIGKILLs every group it was told of, then exits. It holds no other descriptor and ignores
// the job-control signals (the agent stops the workers itself when it is signalled).
class Guardian {
 public:
  // Forks the guardian (not a child of the agent: double fork, own session). Call while the
  // agent is single-threaded and before it becomes a subreaper. Throws std::system_error.
  Guardian();
  ~Guardian();  // release()
  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  void watch(pid_t pgid);
  void forget(pid_t pgid);
  // Normal end: the guardian exits without killing anything.
  void release();

 private:
  void send(int32_t value);
  int fd_ = -1;
};

}  // namespace ddprun::launcher
