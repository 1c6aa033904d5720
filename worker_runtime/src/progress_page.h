// The step statistics in ddprun's progress page (layout: launcher/include/ddprun/launcher/hang.h),
// which the agent reads when the worker has exited for its end-of-run table. Written by the
// Reducer at the end of each synchronised pass; internal to libddprun_worker.
#pragma once

#include <cstdint>

namespace ddprun::worker::detail {

// Adds one step to this process's totals: its wall time, the time in its gradient collectives
// and the part of that time that was exposed (not hidden behind backward), in ns. Nothing
// without a progress file (progress.h). After the page is mapped (the first call, or the first
// progress()): four relaxed atomic adds, no system call. Thread-safe; never throws.
void record_step_stats(uint64_t step_ns, uint64_t comm_ns, uint64_t exposed_ns) noexcept;

}  // namespace ddprun::worker::detail
