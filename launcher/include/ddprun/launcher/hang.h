// Hangs and stragglers (--hang_timeout), the pure part: the progress page's layout (ticks and
// the step statistics of the end-of-run table, usage_report.h), the decision "which ranks are stuck" over tick counters
// and the times they last moved, and the messages. No clock, no files: the agent's hang watch (src/hang/) reads the
// pages and the clock and feeds them in; tests drive it directly.
//
// Progress: each worker has a counter of steps ("ticks") in a small shared file, one per local
// rank, whose path is in the worker's DDPRUN_PROGRESS_FILE. libddprun_worker ticks once per
// step by itself; a Python worker calls `import ddprun; ddprun.progress()`. A tick is one store
// into a mapped page (no system call); the agent reads the counters about once a second.
//
// The decision (HangWatch::observe):
//   - before any local rank of the attempt has ticked, nothing is judged (start-up, imports,
//     data loading take as long as they take); once the first tick is seen, every rank's clock
//     starts there;
//   - a rank whose counter has not moved for timeout_s is stalled;
//   - among the stalled ranks, those with the fewest ticks are the stuck ones (named); stalled
//     ranks that are ahead of them are taken to wait for them (in a collective);
//   - one verdict per attempt: Hung, then nothing until the next attempt;
//   - no tick at all for timeout_s after the start of the first attempt: NeverTicked, once per
//     watch (the job gets no hang detection until a worker ticks).
//
// Thread-safety: none (one owner).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/launcher/env_map.h"

namespace ddprun::launcher {

// The progress file of one rank: kProgressFileBytes long, little-endian 64-bit words, the rest
// zero. The agent creates it for every worker of every attempt (with or without --hang_timeout)
// and only reads it afterwards; every word after the magic is written only by the worker.
//   offset 0:  kProgressMagic ("DDPRPRG1"), written by the agent when it creates the file
//   offset 8:  the tick counter (progress(): libddprun_worker, the Python module `ddprun`)
//   offset 16: kStepStatsVersion once libddprun_worker's Reducer wrote the step statistics
//              below (0: none, e.g. a Python worker, a GPU communicator, a lone rank)
//   offset 24: synchronised steps counted: the intervals between the ends of consecutive
//              synchronised passes (finalize() / finalize_and_step() returned) that ran
//              gradient collectives on a host communicator
//   offset 32: those intervals' total wall time, ns
//   offset 40: the time spent in the gradient collectives of the passes that end them, ns
//              (Reducer::OverlapStats::comm_ms, plus the fused step's collectives)
//   offset 48: of which exposed: not hidden behind backward (OverlapStats::exposed_ms, at most
//              comm_ms per pass; all of it with inline progress, where the training thread
//              itself runs the collectives), ns
// The worker updates each word with a relaxed atomic add (no system call); the agent reads the
// statistics when it reaps the worker (the file outlives the process).
inline constexpr size_t kProgressFileBytes = 4096;
inline constexpr size_t kProgressCounterOffset = 8;
inline constexpr uint64_t kProgressMagic = 0x3147525052504444ULL;  // bytes "DDPRPRG1"
inline constexpr size_t kStepStatsOffset = 16;                     // the version word; the four totals follow
inline constexpr uint64_t kStepStatsVersion = 1;
inline constexpr size_t kStepStatsEnd = kStepStatsOffset + 5 * 8;

// A worker's step statistics (the words at kStepStatsOffset).
struct StepStats {
  uint64_t steps = 0;
  uint64_t step_ns = 0;
  uint64_t comm_ns = 0;
  uint64_t exposed_ns = 0;
};
// The statistics in the first `size` bytes of a progress file; nullopt when it is not a progress
// file (magic), is too short, or holds none of a version this agent knows.
std::optional<StepStats> parse_step_stats(const unsigned char* page, size_t size);
// The environment variable that holds the path of a worker's progress file.
inline constexpr const char* kProgressFileEnv = "DDPRUN_PROGRESS_FILE";
// The name of the file in the rank's log directory (<run>/attempt_<n>/<local_rank>/).
inline constexpr const char* kProgressFileName = "progress";
// How often the agent reads the counters.
inline constexpr double kHangPollIntervalS = 1.0;
// A whole stack dump (every local rank, in parallel) takes at most this long; a tool still
// running then is killed and the rank's file says so.
inline constexpr double kStackDumpTimeoutS = 20.0;

// What one local rank's counter looked like to the watch.
struct RankProgress {
  int local_rank = 0;
  uint64_t ticks = 0;
  double last_move_s = 0;  // when its counter last moved (the watch's clock)
  double stalled_s = 0;    // now - last_move_s
  bool stalled = false;    // stalled_s >= timeout
  bool stuck = false;      // stalled and among the fewest ticks: the one(s) named
};

struct HangVerdict {
  enum class Kind { None, NeverTicked, Hung };
  Kind kind = Kind::None;
  std::vector<RankProgress> ranks;  // every live rank observed, by local rank (Hung only)
  std::vector<int> stuck() const;   // local ranks with .stuck
};

class HangWatch {
 public:
  // timeout_s > 0.
  explicit HangWatch(double timeout_s);

  // A new attempt with `nproc` local ranks started at `now_s`: counters start from zero again.
  void start_attempt(double now_s, int nproc);

  // The counters at `now_s`, indexed by local rank; nullopt for a rank that is not running
  // (exited) or whose page cannot be read: it is not judged.
  HangVerdict observe(double now_s, const std::vector<std::optional<uint64_t>>& ticks);

  double timeout_s() const { return timeout_s_; }
  // Whether any rank ticked in the current attempt / in any attempt.
  bool attempt_ticking() const { return attempt_ticking_; }
  bool ever_ticked() const { return ever_ticked_; }

 private:
  double timeout_s_;
  double attempt_start_s_ = 0;
  std::vector<uint64_t> last_;
  std::vector<double> moved_at_;
  bool attempt_ticking_ = false;
  bool ever_ticked_ = false;
  bool fired_ = false;
  bool never_said_ = false;
};

// What the messages need to know of a rank besides its progress.
struct RankIdentity {
  int global_rank = 0;
  int pid = -1;
  std::string since;  // when it last moved, as wall time ("16:58:02")
};

// The hang's one-paragraph description, e.g.
//   "r1 (local rank 1, pid 42) made no progress for 31 s (since 16:58:02, at tick 5); the
//    others: r0 at tick 6, stalled 30 s (ahead: waiting for the stuck ranks?)"
// `ids` is indexed by local rank.
std::string format_hang_message(const HangVerdict& v, const std::vector<RankIdentity>& ids, double timeout_s);

// The one line said when a job never ticks.
std::string format_never_ticked_message(double timeout_s);

// `ddprun dump [RUN]` (src/hang/dump_command.cpp, in the launcher's I/O library): prints and
// saves the stacks of a running job's workers; `args` are the arguments after "dump", `env` the
// environment (XDG_RUNTIME_DIR, DDPRUN_RUNS_DIR, PATH). Returns the exit code: 0, 1 when no
// running job matches or what it found is not this user's, 2 for bad usage.
int run_dump(const std::vector<std::string>& args, const EnvMap& env);

}  // namespace ddprun::launcher
