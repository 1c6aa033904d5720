// The agent's part in --hang_timeout, --nccl_flight_recorder and `ddprun dump`: the workers'
// extra environment (the progress file every worker gets, for the end-of-run table's step
// statistics too), the record `ddprun dump` reads, the hang watch's timer and what a hang
// becomes (a message, every local rank's stack in the run's log directory, a failure with the
// cause "hang"). The decisions are hang.h's and agent_state.h's.
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include <spdlog/spdlog.h>

#include "agent/agent_impl.h"
#include "ddprun/launcher/signal_names.h"
#include "platform/sys_util.h"

namespace ddprun::launcher {
namespace fs = std::filesystem;

namespace {
constexpr size_t kSummaryStackLines = 60;  // per stuck rank, in the log and the summary
constexpr int kFlightRecorderEntries = 2000;
}  // namespace

// After the run's log directory exists, before the first round.
void Agent::start_observers() {
  run_record_ = std::make_unique<RunRecord>(run_log_dir_, opts_.rendezvous.id,
                                            plan_.interpreter.empty() ? std::string() : spawn_.executable, env_);
  if (opts_.faults.nccl_flight_recorder) nccl_trace_dir_ = (run_log_dir_ / "nccl_trace").string();
  if (opts_.faults.hang_timeout_s <= 0) return;
  if (!plan_.interpreter.empty()) {
    // The pip-installed ddprun's own interpreter imports the installed package.
    const auto installed_with = env_.find("DDPRUN_DEFAULT_PYTHON");
    if (installed_with == env_.end() || installed_with->second != spawn_.executable)
      progress_module_dir_ = write_progress_module(run_log_dir_ / "python");
  }
  hang_ = std::make_unique<HangMonitor>(opts_.faults.hang_timeout_s);
  hang_timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  DDPRUN_CHECK_SYS(hang_timer_fd_);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = hang_timer_fd_;
  DDPRUN_CHECK_SYS(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, hang_timer_fd_, &ev));
  arm_timerfd(hang_timer_fd_, kHangPollIntervalS, /*repeat=*/true);
}

// Called for each worker's environment (spawn_.env).
void Agent::add_observer_env(EnvMap& wenv, const std::string& error_file) const {
  try {
    add_progress_env(wenv, error_file, progress_module_dir_);
  } catch (const std::system_error& e) {
    if (hang_) throw;  // the watch needs it
    // Only the end-of-run table's step statistics are lost (its rank's log directory could
    // not be made: the worker group said so).
    spdlog::debug("{}: no step statistics for this rank", e.what());
  }
  if (!nccl_trace_dir_.empty()) {
    std::error_code ec;
    fs::create_directories(nccl_trace_dir_, ec);
    // Never over the user's own values.
    wenv.emplace("TORCH_NCCL_TRACE_BUFFER_SIZE", std::to_string(kFlightRecorderEntries));
    wenv.emplace("TORCH_NCCL_DUMP_ON_TIMEOUT", "1");
    wenv.emplace("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", nccl_trace_dir_ + "/rank_");
  }
}

void Agent::observers_attempt_started(int attempt) {
  std::vector<StackTarget> targets;
  std::vector<WatchedRank> watched;
  for (const auto& w : group_->current()) {
    targets.push_back({w->local_rank, w->global_rank, w->pid, !plan_.interpreter.empty()});
    watched.push_back({w->local_rank, w->global_rank, w->pid,
                       (fs::path(w->error_file).parent_path() / kProgressFileName).string()});
  }
  if (run_record_) run_record_->attempt_started(attempt, targets);
  if (hang_) hang_->attempt_started(attempt, watched);
}

void Agent::on_hang_timer() {
  uint64_t expirations = 0;
  if (::read(hang_timer_fd_, &expirations, sizeof expirations) != sizeof expirations) return;
  if (!hang_ || state_.phase() != AgentState::Phase::Running || state_.attempt() != hang_->attempt()) return;
  std::vector<bool> alive(hang_->ranks().size(), false);
  for (int lr : state_.alive()) {
    if (static_cast<size_t>(lr) < alive.size()) alive[static_cast<size_t>(lr)] = true;
  }
  const HangVerdict v = hang_->poll(alive);
  if (v.kind == HangVerdict::Kind::NeverTicked) {
    spdlog::warn("{}", format_never_ticked_message(hang_->timeout_s()));
  } else if (v.kind == HangVerdict::Kind::Hung) {
    on_hang(v);
  }
}

void Agent::on_hang(const HangVerdict& v) {
  const int attempt = hang_->attempt();
  HangRecord h;
  h.message = format_hang_message(v, hang_->identities(v), hang_->timeout_s());
  spdlog::error("{}", h.message);
  std::vector<StackTarget> targets;
  for (const auto& r : hang_->ranks()) {
    if (state_.alive().contains(r.local_rank))  // a rank that already exited has no stack
      targets.push_back({r.local_rank, r.global_rank, r.pid, !plan_.interpreter.empty()});
  }
  const char* path = std::getenv("PATH");
  const StackTools tools = find_stack_tools(plan_.interpreter.empty() ? "" : spawn_.executable, path ? path : "");
  if (!tools.refused.empty()) spdlog::warn("{}", tools.refused);
  StackDir dir;
  try {
    const auto t0 = Clock::now();
    dir = make_stack_dir(run_log_dir_, "hang_attempt_" + std::to_string(attempt));
    const auto dumps = dump_stacks(targets, tools, dir, kStackDumpTimeoutS);
    close_stack_dir(dir);
    h.stacks_dir = dir.path;
    keep_log_root_ = true;  // the stacks outlive a temporary log directory
    spdlog::error("stacks of every local rank saved in {} in {:.1f} s, by {}", h.stacks_dir,
                  std::chrono::duration<double>(Clock::now() - t0).count(), describe_stack_tools(dumps, tools));
    const auto stuck = v.stuck();
    for (const auto& d : dumps) {
      if (std::find(stuck.begin(), stuck.end(), d.target.local_rank) == stuck.end()) continue;
      h.stacks += fmt::format("r{} (local rank {}, pid {}), {}:\n{}", d.target.global_rank, d.target.local_rank,
                              d.target.pid, d.tool.empty() ? "no stack tool" : d.tool,
                              first_lines(d.text, kSummaryStackLines, d.file));
    }
    if (!h.stacks.empty()) {
      spdlog::default_logger()->flush();
      std::fprintf(stderr, "[ddprun] stack of the stuck rank(s):\n%s", h.stacks.c_str());
      std::fflush(stderr);
    }
  } catch (const std::exception& e) {
    close_stack_dir(dir);
    spdlog::error("stacks not saved: {}", e.what());
  }
  hang_record_ = std::move(h);
  const auto stuck = v.stuck();
  if (!stuck.empty()) dispatch(WorkerHung{.local_rank = stuck.front(), .attempt = attempt});
}

void Agent::record_hang(const Action& a) {
  ++failures_seen_;
  Worker* w = group_->current_rank(a.local_rank);
  if (!w) return;
  FailureDetails f;
  f.attempt = a.attempt;
  f.local_rank = w->local_rank;
  f.global_rank = w->global_rank;
  f.pid = w->pid;
  f.status = a.status;
  f.when = WallClock::now();
  f.after_s = std::chrono::duration<double>(Clock::now() - w->started).count();
  f.tail = w->tail.lines();
  f.error_file = w->error_file;
  if (hang_record_) {
    f.hang = hang_record_->message;
    f.stacks_dir = hang_record_->stacks_dir;
    f.hang_stacks = hang_record_->stacks;
  }
  failure_seen_ = Clock::now();
  failed_since_round_ = true;
  failure_ = std::move(f);
  if (metrics_) metrics_->worker_failed("hang");
  spdlog::warn("worker r{} (local rank {}, pid {}) hung after {:.2f} s; stopping the group", w->global_rank,
               w->local_rank, w->pid, failure_->after_s);
  coordinator_->report_failure(rdzv::Failure{.global_rank = w->global_rank,
                                             .local_rank = w->local_rank,
                                             .exit_code = a.status.code,
                                             .signal = "",
                                             .when = wall_time(failure_->when),
                                             .stderr_tail = failure_->hang + "\n",
                                             .runtime_ms = static_cast<int64_t>(failure_->after_s * 1000),
                                             .config_error = false});
}

void Agent::observers_summary(SummaryInput& in) const {
  if (nccl_trace_dir_.empty()) return;
  in.nccl_trace_dir = nccl_trace_dir_;
  std::error_code ec;
  // The workers can fill the directory: names only, the first kMaxListedTraces met, the rest counted.
  for (fs::directory_iterator it(nccl_trace_dir_, ec), end; !ec && it != end; it.increment(ec)) {
    if (in.nccl_traces.size() < kMaxListedTraces) in.nccl_traces.push_back(it->path().string());
    else ++in.nccl_traces_more;
  }
  std::sort(in.nccl_traces.begin(), in.nccl_traces.end());
}

void Agent::stop_observers() {
  run_record_.reset();
  if (hang_timer_fd_ >= 0) ::close(hang_timer_fd_);
  hang_timer_fd_ = -1;
}

}  // namespace ddprun::launcher
