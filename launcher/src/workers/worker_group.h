// The local workers of the agent (internal to launcher/src): spawning an attempt's group,
// relaying its output (console prefixes, log files, the stderr tail), signalling its process
// groups, retiring a failed attempt's survivors in the background (overlapped restart), and
// tearing everything down. The agent's loop (agent.cpp) owns the decisions; this owns the
// processes and their descriptors, registered on the agent's epoll set.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ddprun/launcher/console.h"
#include "ddprun/launcher/options.h"
#include "ddprun/launcher/output.h"
#include "ddprun/launcher/process.h"
#include "ddprun/launcher/worker_env.h"
#include "ddprun/launcher/worker_status.h"

namespace ddprun::launcher {

class Spares;

using Clock = std::chrono::steady_clock;
using WallClock = std::chrono::system_clock;

inline constexpr double kKillWaitS = 5.0;  // SIGKILL -> stop waiting

struct Stream {
  int fd = -1;
  int log_fd = -1;
  int filtered_fd = -1;                 // the attempt's filtered_{stdout,stderr}.log (--duplicate_*_filters)
  std::string log_path, filtered_path;  // for the messages when a write to them fails
  DuplicateFilter filter;
  bool console = true;
  // --local_ranks_filter lets it print: a redirected stream whose log file fails falls back
  // to the console then (nothing lost).
  bool console_allowed = true;
  LineSplitter splitter;
  uint64_t lines = 0;                   // complete lines read so far
  ConsoleMux::StreamId console_id = 0;  // its name in the console (ConsoleMux)
};

struct Worker {
  int attempt = 0;
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;
  bool reaped = false;
  // Its exit was seen through the early exit watch and dispatched; the reap only finishes it.
  bool exit_reported = false;
  bool from_spare = false;   // started from a warm spare (spares.h), not exec'd
  bool interactive = false;  // it reads ddprun's terminal (--stdin_rank)
  std::string prefix;        // of its lines on the console and in the filtered logs
  int exit_watch_fd = -1;    // seccomp listener (process.h), -1 when none
  Stream out;
  Stream err;
  TailBuffer tail{20};
  std::string error_file;
  Clock::time_point started;
  std::optional<WorkerStatus> status;
  WallClock::time_point ended_wall;
  Clock::time_point ended;
};

class WorkerGroup {
 public:
  // `output`: where the workers' streams go; `spares`: the warm spares' settings; `multi_node`:
  // the job spans nodes (worker output is prefixed with the global rank).
  WorkerGroup(const OutputOptions& output, const SpareOptions& spares, bool multi_node, int epoll_fd,
              Guardian& guardian);
  ~WorkerGroup();  // closes every descriptor (kills nothing: see teardown())
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Ends the previous attempt's workers (if any), then forks, execs and registers every local
  // worker of `attempt`; returns once each has exec'd (or failed to: the error goes to its
  // stderr tail). Logs go under `attempt_dir`/<local_rank>/.
  void start(int attempt, const GroupLayout& layout, const std::filesystem::path& attempt_dir,
             const SpawnTemplate& spawn);
  // Warm spares (spares.h) for the restarts of this run: start() launches ready ones and
  // replenishes the pool after each attempt started.
  void enable_spares();
  // After start() (the attempt is running): a spare for each local rank that has none, each
  // importing at --spare_priority.
  void start_spares(const GroupLayout& layout, const SpawnTemplate& spawn);
  // "; 2 of 2 from warm spares; started cold: r1 (why)" for the last start(), or "".
  const std::string& start_note() const { return start_note_; }
  // The reap of a pid that is not a worker: true when it was a spare's (logged).
  bool on_spare_reaped(pid_t pid, int wait_status);
  // After start(), off the restart's critical path: SIGKILLs orphans of ended attempts
  // (adopted as subreaper) that left their worker's process group.
  void kill_stale_orphans();
  // The retire timer's descriptor (on the epoll set): call on_retire_timer() when readable.
  int retire_timer_fd() const { return retire_timer_fd_; }
  // The console timer's descriptor (partial lines and progress bars held back): call
  // on_console_timer() when readable.
  int console_timer_fd() const { return console_timer_fd_; }
  void on_console_timer();

  // Look-ups for the loop's events. Null when not ours.
  Worker* by_pid(pid_t pid);
  Worker* by_exit_watch(int fd);
  bool owns_pipe(int fd) const;
  // Of the running attempt (not retiring, not ended).
  bool is_current(const Worker& w) const;
  const std::vector<std::unique_ptr<Worker>>& current() const { return workers_; }
  Worker* current_rank(int local_rank);
  size_t retiring_count() const;  // retiring workers not reaped yet

  // A worker of an ended attempt, seen exiting early, was reaped: true (and forgotten) if so.
  bool reaped_dying(pid_t pid, double& ms_since_seen);

  void on_pipe(int fd);
  void drain(Worker& w);
  void close_exit_watch(Worker& w);
  // `w` (not current) was reaped: its retiring group goes once all of it is. May free `w`.
  void on_retired_exit(Worker& w);
  void on_retire_timer();

  // Sends `signo` to every current worker's process group.
  void signal(int signo);
  // Overlapped restart: the current workers (already sent SIGTERM) retire in the background.
  void retire(int attempt, double grace_s);
  // The current workers that are not reaped, as " <pid>..." (for the abandon message).
  std::string unreaped_pids() const;
  // The end: drains and SIGKILLs what is left of every attempt's process groups.
  void teardown();
  // Log writes that failed so far (for the summary and the exit code).
  const LogWriteFailures& log_failures() const { return log_failures_; }

 private:
  struct Retiring {
    int attempt = 0;
    std::vector<std::unique_ptr<Worker>> workers;
    Clock::time_point since;
    Clock::time_point deadline;
    bool killed = false;  // SIGKILL sent; `deadline` is now when to stop waiting
  };
  // start()'s steps: a rank's launch as it is being started, and the run of them
  // (worker_group.cpp).
  struct Pending;
  struct StartRun;
  void open_logs(Worker& w, const std::filesystem::path& attempt_dir);
  void open_stream(Stream& s, int bit, int local_rank, const std::filesystem::path& dir, int dir_errno,
                   const std::filesystem::path& attempt_dir);
  void offer_spare(Worker& w, Pending& p, const SpawnTemplate& spawn, std::vector<std::string>& cold_why);
  void await_spares(StartRun& run);
  bool begin_worker(Worker& w, Pending& p, const SpawnTemplate& spawn, size_t local_rank);
  void take_exit_watches(StartRun& run, const SpawnTemplate& spawn);
  void wait_execs(StartRun& run, const SpawnTemplate& spawn);
  void note_start(int from_spares, const StartRun& run);
  void end_attempt();
  void kill_orphans(std::optional<unsigned long long> started_before_tick);
  void release_retired(size_t index);
  void arm_retire_timer();
  bool read_stream(Worker& w, Stream& s, bool is_err, size_t budget);
  void emit_lines(Worker& w, Stream& s, bool is_err, std::string_view data, bool eof);
  void close_stream(Stream& s);
  void to_console(std::vector<ConsoleMux::Write>& writes);
  void forget(Worker& w);
  void watch_fd(int fd);
  // Writes `data` to a log file; false when it failed (recorded, warned about once per file).
  bool write_log(int fd, const std::string& path, std::string_view data);
  void log_failed(const std::string& path, int err, uint64_t bytes_lost, LogWriteFailures::Console console = {});

  const OutputOptions& output_;
  const bool job_multi_node_;
  int epoll_fd_;
  Guardian& guardian_;
  int retire_timer_fd_ = -1;
  int console_timer_fd_ = -1;
  ConsoleMux console_;
  ConsoleMux::StreamId next_console_id_ = 1;
  int node_rank_ = 0;
  bool multi_node_ = false;
  std::vector<std::unique_ptr<Worker>> workers_;  // the current attempt's
  std::unordered_map<pid_t, Worker*> by_pid_;
  std::unordered_map<int, std::pair<Worker*, bool>> by_fd_;  // fd -> (worker, is_err)
  std::unordered_map<int, Worker*> by_exit_watch_fd_;        // seccomp listener -> worker
  // Workers of ended attempts whose exit was seen early and that are not reaped yet: when.
  std::unordered_map<pid_t, Clock::time_point> dying_;
  std::vector<pid_t> old_pgroups_;  // previous attempts', to clean up
  std::vector<Retiring> retiring_;  // overlapped restart: old attempts
  std::unique_ptr<Spares> spares_;  // spares/spares.h: a layer above this header
  std::string start_note_;
  unsigned long long attempt_started_tick_ = 0;  // boot_ticks_now() just before the spawn
  int attempts_started_ = 0;
  LogWriteFailures log_failures_;
};

}  // namespace ddprun::launcher
