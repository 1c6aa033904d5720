// Progress ticks for ddprun's hang detection (`ddprun --hang_timeout=S`).
//
// ddprun gives each worker the path of a small shared file in DDPRUN_PROGRESS_FILE; progress()
// adds one to the counter in it, and ddprun names a rank whose counter stood still for S
// seconds, saves the stacks of its workers and restarts the group. The Reducer ticks by itself
// at the start of every synchronised pass (prepare_for_backward()), so a program that trains
// with it needs nothing more; a program with another step loop calls progress() once per step.
//
// Cost: the first call maps the file (open + mmap, once per process); every later call is one
// relaxed atomic add to that page, no system call. Without the variable (not started by ddprun,
// or without --hang_timeout), or with a file that is not a progress file, progress() does
// nothing. Thread-safe; never throws.
#pragma once

#include <cstdint>

#include "ddprun/worker/export.h"

namespace ddprun::worker {

DDPRUN_WORKER_API void progress() noexcept;

// The counter's value as this process sees it (0 when there is no progress file). For tests.
DDPRUN_WORKER_API uint64_t progress_ticks() noexcept;

}  // namespace ddprun::worker
