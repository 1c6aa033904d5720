// The agent's implementation, shared by agent.cpp (the loop and its events) and
// agent_setup.cpp (what runs before and after the loop). Internal to launcher/src.
#pragma once

#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "ddprun/launcher/agent_state.h"
#include "ddprun/launcher/coordinator.h"
#include "ddprun/launcher/entrypoint.h"
#include "ddprun/launcher/log_paths.h"
#include "ddprun/launcher/launch_plan.h"
#include "ddprun/launcher/rendezvous_plan.h"
#include "ddprun/launcher/summary.h"
#include "ddprun/launcher/usage_report.h"
#include "ddprun/relay/store_relay.h"
#include "ddprun/server/store_server.h"
#include "ddprun/client/net.h"
#include "hang/progress_files.h"
#include "hang/run_record.h"
#include "metrics/agent_exporter.h"
#include "status/gpu_usage.h"
#include "status/rank_sampler.h"
#include "status/status_server.h"
#include "workers/worker_group.h"

namespace ddprun::launcher {

class Agent {
 public:
  Agent(const LaunchPlan& plan, const EnvMap& env)
      : plan_(plan),
        opts_(plan.options),
        env_(env),
        spawn_(plan.spawn),
        state_(AgentConfig{.nproc = opts_.nodes.nproc_per_node,
                           .shutdown_timeout_s = opts_.faults.shutdown_timeout_s,
                           .kill_wait_s = kKillWaitS,
                           // A local policy: a job-wide restart waits for every node's group.
                           .overlap_restart = opts_.faults.overlap_restart && plan.rendezvous.local,
                           .preempt_grace_s = opts_.faults.preempt_grace_s,
                           .exit_barrier_timeout_s = opts_.faults.exit_barrier_timeout_s}) {}
  ~Agent() { close_all(); }

  int run();

 private:
  void setup_signals();
  void prepare_command();
  void prepare_log_root();
  void host_server();
  void say_credential() const;
  void start_coordinator();
  bool stop_requested();
  bool is_preempt_signal(int signo) const;
  void wait_for_other_agents();
  void loop();
  void dispatch(const AgentEvent& e);
  void perform(const Action& a);
  void on_coordinator();
  void on_notice(const Notice& n);
  void relay_store();  // agent_setup.cpp
  void coordinator_lost(const std::string& what);
  void start_attempt(int attempt);
  void on_signalfd();
  void reap_children();
  void on_exit_watch(Worker& w);
  void worker_ended(Worker& w);
  void record_failure(const Action& a);
  void stop_stragglers(const Action& a);
  void reap_leftovers(double seconds);
  void close_all();
  std::string summary() const;

  // --hang_timeout, --nccl_flight_recorder and `ddprun dump` (agent_hang.cpp).
  void start_observers();
  void add_observer_env(EnvMap& wenv, const std::string& error_file) const;
  void observers_attempt_started(int attempt);
  void on_hang_timer();
  void on_hang(const HangVerdict& v);
  void record_hang(const Action& a);
  void observers_summary(SummaryInput& in) const;
  void stop_observers();
  struct HangRecord {
    std::string message, stacks_dir, stacks;
  };
  std::unique_ptr<RunRecord> run_record_;
  std::unique_ptr<HangMonitor> hang_;
  int hang_timer_fd_ = -1;
  std::string progress_module_dir_;  // appended to the Python workers' PYTHONPATH, or ""
  std::string nccl_trace_dir_;       // --nccl_flight_recorder: <run dir>/nccl_trace
  std::optional<HangRecord> hang_record_;

  const LaunchPlan& plan_;
  const LaunchOptions& opts_;  // plan_.options
  const EnvMap& env_;
  // The store's port was taken by a rendezvous already served there: this node joins it as a
  // client instead of hosting it (rendezvous_plan.h's BindFallback). Else plan_.rendezvous.
  std::optional<RendezvousPlan> joined_as_client_;
  const RendezvousPlan& rdzv_plan() const { return joined_as_client_ ? *joined_as_client_ : plan_.rendezvous; }
  // The plan's template plus what exists only while the agent runs: stdin, the signals to
  // reset, the environment of each attempt.
  SpawnTemplate spawn_;
  AgentState state_;
  Clock::time_point t_launch_ = Clock::now();

  std::unique_ptr<Guardian> guardian_;
  std::unique_ptr<server::StoreServer> store_;  // when this process hosts it
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<WorkerGroup> group_;
  std::unique_ptr<AgentExporter> metrics_;  // --metrics_port
  void start_metrics();
  // `ddprun status`: the board the loop records on and the owner-only socket that serves it;
  // the sampler (/proc, NVML) is shared with the metrics endpoint.
  std::shared_ptr<RankSampler> sampler_ = std::make_shared<RankSampler>();
  std::shared_ptr<StatusBoard> status_;  // shared with the heartbeats that carry its snapshots
  std::unique_ptr<StatusSocket> status_socket_;
  void start_status();
  EnvMap extra_env_;  // added to every worker's environment unless already set
  std::string gloo_note_;  // the start line's "; workers' GLOO_SOCKET_IFNAME=... (why)", or ""
  GroupLayout layout_;
  // This round's store relay (--store_relay): the workers' MASTER_ADDR:MASTER_PORT when set.
  std::unique_ptr<relay::StoreRelay> store_relay_;
  int max_restarts_ = 0;  // the job's, as the round says
  std::optional<rdzv::JobFailed> job_failed_;
  std::string agent_error_;
  std::string stragglers_;  // what --exit_barrier_timeout stopped, for the summary
  Clock::time_point join_sent_, restart_seen_, failure_seen_;
  bool failed_since_round_ = false;  // this node reported a failure since the last round began
  bool workers_started_ = false;

  std::filesystem::path log_root_;
  std::filesystem::path run_log_dir_;  // log_root_/<run_id>_<unique> (log_paths.h): never an earlier run's
  bool log_root_is_temp_ = false;
  bool keep_log_root_ = true;

  int epoll_fd_ = -1;
  int signal_fd_ = -1;
  int timer_fd_ = -1;
  sigset_t handled_{};
  std::optional<int> stop_signal_seen_;  // read from the signalfd outside the loop
  // A SIGCHLD that stop_requested() took off the signalfd while the loop runs (a reconnect
  // attempt asks it): the loop reaps for it.
  bool child_signal_taken_ = false;

  bool done_ = false;
  // What a worker of this node said it saved when it stopped for a preemption ("r0: <what>").
  std::optional<std::string> preempt_checkpoint_;
  int exit_code_ = 1;
  std::optional<FailureDetails> failure_;
  int failures_seen_ = 0;
  // Each reaped worker's use of the machine (wait4's rusage), for the end-of-run table.
  std::vector<RankUsage> usage_;
  int earlier_workers_ = 0;  // reaped workers of ended attempts that the group no longer knows
  double earlier_cpu_s_ = 0;
  void record_usage(const Worker* w, pid_t pid, const struct rusage& ru);
  // Each worker's GPU use while it runs (none without NVML), for the end-of-run table.
  std::unique_ptr<GpuUsageRecorder> gpu_usage_;
  void print_usage() const;
};

}  // namespace ddprun::launcher
