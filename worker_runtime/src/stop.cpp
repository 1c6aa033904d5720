#include "ddprun/worker/stop.h"

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ddprun::worker {
namespace {

// -1: request_stop(); > 0: the first signal; 0: nothing yet. Lock-free, so a store is
// async-signal-safe.
std::atomic<int> g_stop{0};
static_assert(std::atomic<int>::is_always_lock_free);

void on_stop_signal(int signo) {
  int none = 0;
  g_stop.compare_exchange_strong(none, signo, std::memory_order_relaxed);
}

}  // namespace

void install_stop_handlers(const std::vector<int>& signals) {
  for (int s : signals) {
    if (s == SIGKILL || s == SIGSTOP || s <= 0 || s >= NSIG)
      throw WorkerError("install_stop_handlers: signal " + std::to_string(s) + " cannot be caught");
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (::sigaction(s, &sa, nullptr) != 0)
      throw WorkerError("install_stop_handlers: sigaction(" + std::to_string(s) + "): " + std::strerror(errno));
  }
}

bool stop_requested() noexcept { return g_stop.load(std::memory_order_relaxed) != 0; }

int stop_signal() noexcept {
  const int v = g_stop.load(std::memory_order_relaxed);
  return v > 0 ? v : 0;
}

void request_stop() noexcept {
  int none = 0;
  g_stop.compare_exchange_strong(none, -1, std::memory_order_relaxed);
}

int32_t Communicator::allreduce_max_host(int32_t value) {
  if (stream_ordered())
    throw WorkerError(std::string("allreduce_max_host: the ") + backend() +
                      " communicator reduces device memory and does not override allreduce_max_host");
  allreduce(&value, 1, DType::I32, ReduceOp::Max);
  return value;
}

bool announce_preemption(const std::string& checkpoint) {
  const char* path = std::getenv("DDPRUN_PREEMPT_FILE");
  if (!path || !*path) return false;
  std::FILE* f = std::fopen(path, "w");
  if (!f) return false;
  bool ok = std::fputs("preempted\n", f) >= 0;
  if (!checkpoint.empty()) ok = ok && std::fprintf(f, "checkpoint %s\n", checkpoint.c_str()) >= 0;
  return (std::fclose(f) == 0) && ok;
}

bool agree_stop(Communicator& comm) {
  // Read once: a signal arriving during the collective counts at the next step, on every rank.
  return comm.allreduce_max_host(stop_requested() ? 1 : 0) != 0;
}

}  // namespace ddprun::worker
