// The run's record and its hangs: the record `ddprun dump` reads (hang/run_record.h), every
// worker's progress file (the end-of-run table's step statistics too), --nccl_flight_recorder's
// variables and what landed in its directory, and --hang_timeout's watch: a timerfd polls the
// progress files; a hang becomes a message, every local rank's stack in the run's log directory,
// and a failure (ObserverHost::worker_hung) whose record carries them. The decisions are
// hang.h's.
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <system_error>

#include <spdlog/spdlog.h>

#include "ddprun/launcher/hang.h"
#include "ddprun/launcher/log_events.h"
#include "hang/progress_files.h"
#include "hang/run_record.h"
#include "hang/stack_dump.h"
#include "observers/observers.h"
#include "platform/sys_util.h"

namespace ddprun::launcher {
namespace fs = std::filesystem;
namespace {

constexpr size_t kSummaryStackLines = 60;  // per stuck rank, in the log and the summary
constexpr int kFlightRecorderEntries = 2000;
constexpr size_t kMaxListedTraces = 64;  // --nccl_flight_recorder's files the summary names
using Clock = std::chrono::steady_clock;

class HangObserver : public AgentObserver {
 public:
  explicit HangObserver(const ObserverSetup& s)
      : host_(s.host),
        run_log_dir_(s.run_log_dir),
        python_(s.python),
        record_(s.run_log_dir, s.opts.rendezvous.id, s.python, s.env) {
    if (s.opts.faults.nccl_flight_recorder) nccl_trace_dir_ = (run_log_dir_ / "nccl_trace").string();
    if (s.opts.faults.hang_timeout_s <= 0) return;
    if (!python_.empty()) {
      // The pip-installed ddprun's own interpreter imports the installed package.
      const auto installed_with = s.env.find("DDPRUN_DEFAULT_PYTHON");
      if (installed_with == s.env.end() || installed_with->second != python_)
        progress_module_dir_ = write_progress_module(run_log_dir_ / "python");
    }
    hang_ = std::make_unique<HangMonitor>(s.opts.faults.hang_timeout_s);
    timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    DDPRUN_CHECK_SYS(timer_fd_);
    arm_timerfd(timer_fd_, kHangPollIntervalS, /*repeat=*/true);
  }
  ~HangObserver() override {
    if (timer_fd_ >= 0) ::close(timer_fd_);
  }

  void worker_env(EnvMap& wenv, const std::string& error_file) override;
  void attempt_started(const AttemptStarted& a) override;
  void failure_notes(const WorkerFailed& f, FailureNotes& n) override {
    if (f.hung && hang_note_) n = *hang_note_;
  }
  void summary_notes(SummaryNotes& n) const override;
  std::vector<int> watched_fds() const override {
    return timer_fd_ >= 0 ? std::vector<int>{timer_fd_} : std::vector<int>{};
  }
  void on_ready(int fd) override;

 private:
  void on_hang(const HangVerdict& v);
  std::vector<LogField> hang_fields(const HangVerdict& v, int attempt, const std::string& stacks_dir) const;
  std::string stuck_stacks(const HangVerdict& v, const std::vector<StackDump>& dumps) const;

  ObserverHost& host_;
  fs::path run_log_dir_;
  std::string python_;
  RunRecord record_;
  std::unique_ptr<HangMonitor> hang_;
  int timer_fd_ = -1;
  std::string progress_module_dir_;  // appended to the Python workers' PYTHONPATH, or ""
  std::string nccl_trace_dir_;       // --nccl_flight_recorder: <run dir>/nccl_trace
  std::optional<FailureNotes> hang_note_;
};

void HangObserver::worker_env(EnvMap& wenv, const std::string& error_file) {
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

void HangObserver::attempt_started(const AttemptStarted& a) {
  std::vector<StackTarget> targets;
  std::vector<WatchedRank> watched;
  for (const auto& w : a.workers) {
    targets.push_back({w.local_rank, w.global_rank, w.pid, !python_.empty()});
    watched.push_back(
        {w.local_rank, w.global_rank, w.pid, (fs::path(w.error_file).parent_path() / kProgressFileName).string()});
  }
  record_.attempt_started(a.attempt, targets);
  if (hang_) hang_->attempt_started(a.attempt, watched);
}

void HangObserver::on_ready(int fd) {
  uint64_t expirations = 0;
  if (::read(fd, &expirations, sizeof expirations) != sizeof expirations) return;
  if (!hang_ || !host_.attempt_running(hang_->attempt())) return;
  const HangVerdict v = hang_->poll(host_.alive(hang_->ranks().size()));
  if (v.kind == HangVerdict::Kind::NeverTicked) {
    spdlog::warn("{}", format_never_ticked_message(hang_->timeout_s()));
  } else if (v.kind == HangVerdict::Kind::Hung) {
    on_hang(v);
  }
}

void HangObserver::on_hang(const HangVerdict& v) {
  const int attempt = hang_->attempt();
  FailureNotes h;
  h.hang = format_hang_message(v, hang_->identities(v), hang_->timeout_s());
  StackDir dir;
  std::string dir_error;
  try {
    dir = make_stack_dir(run_log_dir_, "hang_attempt_" + std::to_string(attempt));
  } catch (const std::exception& e) {
    dir_error = e.what();
  }
  {
    LogEvent ev("hang", hang_fields(v, attempt, dir.path));
    spdlog::error("{}", h.hang);
  }
  const auto alive = host_.alive(hang_->ranks().size());
  std::vector<StackTarget> targets;
  for (const auto& r : hang_->ranks()) {
    if (alive[static_cast<size_t>(r.local_rank)])  // a rank that already exited has no stack
      targets.push_back({r.local_rank, r.global_rank, r.pid, !python_.empty()});
  }
  const char* path = std::getenv("PATH");
  const StackTools tools = find_stack_tools(python_, path ? path : "");
  if (!tools.refused.empty()) spdlog::warn("{}", tools.refused);
  try {
    if (!dir_error.empty()) throw std::runtime_error(dir_error);
    const auto t0 = Clock::now();
    const auto dumps = dump_stacks(targets, tools, dir, kStackDumpTimeoutS);
    close_stack_dir(dir);
    h.stacks_dir = dir.path;
    host_.keep_log_dir();  // the stacks outlive a temporary log directory
    spdlog::error("stacks of every local rank saved in {} in {:.1f} s, by {}", h.stacks_dir,
                  std::chrono::duration<double>(Clock::now() - t0).count(), describe_stack_tools(dumps, tools));
    h.hang_stacks = stuck_stacks(v, dumps);
    // The stacks themselves: on the console in text mode; JSON lines name their folder only.
    if (!h.hang_stacks.empty() && log_format() != LogFormat::Json) {
      spdlog::default_logger()->flush();
      std::fprintf(stderr, "[ddprun] stack of the stuck rank(s):\n%s", h.hang_stacks.c_str());
      std::fflush(stderr);
    }
  } catch (const std::exception& e) {
    close_stack_dir(dir);
    spdlog::error("stacks not saved: {}", e.what());
  }
  hang_note_ = std::move(h);
  const auto stuck = v.stuck();
  if (!stuck.empty()) host_.worker_hung(stuck.front(), attempt);
}

// The `hang` event's fields: the stuck ranks (global), every observed rank's ticks
// ("r0=120,r1=3"), the timeout and the folder the stacks go to.
std::vector<LogField> HangObserver::hang_fields(const HangVerdict& v, int attempt,
                                                const std::string& stacks_dir) const {
  std::string stuck, ticks;
  double stalled_s = 0;
  for (const auto& p : v.ranks) {
    int global = p.local_rank;
    for (const auto& r : hang_->ranks())
      if (r.local_rank == p.local_rank) global = r.global_rank;
    ticks += fmt::format("{}r{}={}", ticks.empty() ? "" : ",", global, p.ticks);
    if (!p.stuck) continue;
    stuck += fmt::format("{}{}", stuck.empty() ? "" : ",", global);
    stalled_s = std::max(stalled_s, p.stalled_s);
  }
  return {{"attempt", int64_t{attempt}},     {"stuck_ranks", stuck},    {"ticks", ticks}, {"stalled_s", stalled_s},
          {"timeout_s", hang_->timeout_s()}, {"stacks_dir", stacks_dir}};
}

std::string HangObserver::stuck_stacks(const HangVerdict& v, const std::vector<StackDump>& dumps) const {
  const auto stuck = v.stuck();
  std::string out;
  for (const auto& d : dumps) {
    if (std::find(stuck.begin(), stuck.end(), d.target.local_rank) == stuck.end()) continue;
    out += fmt::format("r{} (local rank {}, pid {}), {}:\n{}", d.target.global_rank, d.target.local_rank, d.target.pid,
                       d.tool.empty() ? "no stack tool" : d.tool, first_lines(d.text, kSummaryStackLines, d.file));
  }
  return out;
}

void HangObserver::summary_notes(SummaryNotes& n) const {
  if (nccl_trace_dir_.empty()) return;
  n.nccl_trace_dir = nccl_trace_dir_;
  std::error_code ec;
  // The workers can fill the directory: names only, the first kMaxListedTraces met, the rest counted.
  for (fs::directory_iterator it(nccl_trace_dir_, ec), end; !ec && it != end; it.increment(ec)) {
    if (n.nccl_traces.size() < kMaxListedTraces) n.nccl_traces.push_back(it->path().string());
    else ++n.nccl_traces_more;
  }
  std::sort(n.nccl_traces.begin(), n.nccl_traces.end());
}

}  // namespace

std::unique_ptr<AgentObserver> make_hang_observer(const ObserverSetup& s) { return std::make_unique<HangObserver>(s); }

}  // namespace ddprun::launcher
