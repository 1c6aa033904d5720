// Progress ticks for ddprun's hang detection (`ddprun --hang_timeout=S`).
//
// ddprun gives each worker the path of a small shared file in DDPRUN_PROGRESS_FILE (with or
// without --hang_timeout); progress() adds one to the counter in it, and with --hang_timeout
// ddprun names a rank whose counter stood still for S seconds, saves the stacks of its workers
// and restarts the group. The Reducer ticks by itself
// at the start of every synchronised pass (prepare_for_backward()), so a program that trains
// with it needs nothing more; a program with another step loop calls progress() once per step.
//
// The same page carries the Reducer's step statistics (steps, their wall time, the time in
// gradient collectives and how much of it backward did not hide), which ddprun reads when the
// worker exits for its end-of-run table; the layout is in launcher/include/ddprun/launcher/hang.h.
//
// Cost: the first call maps the file (open + mmap, once per process); every later call is one
// relaxed atomic add to that page, no system call. Without the variable (not started by
// ddprun), or with a file that is not a progress file, progress() does nothing. Thread-safe;
// never throws.
#pragma once

#include <cstdint>

#include "ddprun/worker/export.h"

namespace ddprun::worker {

DDPRUN_WORKER_API void progress() noexcept;

// The counter's value as this process sees it (0 when there is no progress file). For tests.
DDPRUN_WORKER_API uint64_t progress_ticks() noexcept;

}  // namespace ddprun::worker
