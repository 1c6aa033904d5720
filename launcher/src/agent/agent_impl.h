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
#include "ddprun/relay/store_relay.h"
#include "ddprun/server/store_server.h"
#include "ddprun/client/net.h"
#include "observers/observers.h"
#include "workers/worker_group.h"

namespace ddprun::launcher {

class Agent : private ObserverHost {
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
  // The current attempt's workers not reaped yet (SIGKILLed by teardown): reaped with their
  // rusage for the observers, bounded by `seconds`.
  void reap_workers(double seconds);
  void close_all();
  std::string summary() const;

  // Whoever watches the agent (observers/observers.h): told of its events, never named here.
  void start_observers();
  Observers observers_;
  bool attempt_running(int attempt) const override;
  std::vector<bool> alive(size_t ranks) const override;
  void worker_hung(int local_rank, int attempt) override;
  void keep_log_dir() override { keep_log_root_ = true; }
  void worker_reaped(const Worker* w, pid_t pid, const struct rusage& ru);

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
  EnvMap extra_env_;       // added to every worker's environment unless already set
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
};

}  // namespace ddprun::launcher
