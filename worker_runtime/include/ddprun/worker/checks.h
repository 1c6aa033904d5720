// Error policy of the worker runtime (see worker_runtime/README.md).
//
// Two kinds of failure:
//  * Recoverable: typed exceptions. CommError = a collective or the store failed (peer died,
//    timeout, I/O error); the program should let it reach run_worker_main()/report_fatal(),
//    which writes the error file and exits with kExitCommFailure so the launcher restarts the
//    group. ConfigError = a set-up that no restart fixes (exit kExitConfig). WorkerError =
//    anything else the runtime could not do (bad env, bad checkpoint dir).
//  * Broken invariants: DDPRUN_ENFORCE, which throws std::logic_error with file:line and both
//    the condition and a message.
// Every system / library call is checked at the call site with a macro adding file:line and
// the library's own error string (DDPRUN_SYSCHECK here; CUDA/NCCL/cuBLAS in gpu_checks.h).
#pragma once

#include <stdexcept>
#include <string>

#include "ddprun/worker/export.h"

namespace ddprun::worker {

// Exit codes of a worker (documented in worker_runtime/README.md).
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;          // unexpected error (bug, bad input)
inline constexpr int kExitUsage = 2;          // bad command line
inline constexpr int kExitCommFailure = 75;   // EX_TEMPFAIL: a peer/collective/store failed; restart the group
// EX_CONFIG: a ConfigError, which a restart cannot fix (a model that differs across ranks).
// ddprun does not spend a restart on it when the error file says "ConfigError" too.
inline constexpr int kExitConfig = 78;
// Stopped for a preemption after agreeing with every rank (stop.h): not a failure. ddprun's
// kPreemptedExitCode: ddprun then stops the job without a restart and exits with it too.
inline constexpr int kExitPreempted = 99;

class DDPRUN_WORKER_API WorkerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective, the store, or a peer failed. Recoverable by restarting the group.
class DDPRUN_WORKER_API CommError : public WorkerError {
 public:
  using WorkerError::WorkerError;
};

// The program's set-up cannot work and a restart would repeat it (the ranks built different
// models). report_fatal() exits with kExitConfig and "ConfigError: ..." in the error file.
class DDPRUN_WORKER_API ConfigError : public WorkerError {
 public:
  using WorkerError::WorkerError;
};

namespace detail {
[[noreturn]] DDPRUN_WORKER_API void throw_errno(const char* expr, const char* file, int line, int err);
[[noreturn]] DDPRUN_WORKER_API void throw_enforce(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace ddprun::worker

// For POSIX calls that return -1 and set errno.
#define DDPRUN_SYSCHECK(expr)                                                        \
  do {                                                                               \
    if ((expr) == -1)                                                                \
      ::ddprun::worker::detail::throw_errno(#expr, __FILE__, __LINE__, errno);       \
  } while (0)

#define DDPRUN_ENFORCE(cond, msg)                                                    \
  do {                                                                               \
    if (!(cond))                                                                     \
      ::ddprun::worker::detail::throw_enforce(#cond, __FILE__, __LINE__, (msg));     \
  } while (0)
