// Internal: how long a stream-ordered communicator's (NCCL's) gradient collectives took on the
// device, for the progress page's step statistics (progress_page.h). The Reducer opens a pass
// when backward starts, marks the compute stream where backward's work ends, and closes the
// pass once every bucket is launched; the communicator brackets each collective of an open pass
// with timing events on its stream. take() reads the passes whose events have completed,
// without blocking, so the figures of a pass arrive a step or two later.
#pragma once

namespace ddprun::worker::detail {

class StreamTiming {
 public:
  // Collectives from now on are timed.
  virtual void timing_begin_pass() = 0;
  // The compute stream's work so far is backward's: what the collectives take past this mark is
  // exposed (not hidden behind backward).
  virtual void timing_mark_backward_end() = 0;
  // No more collectives of this pass.
  virtual void timing_end_pass() = 0;
  // Adds the device time of the finished passes' collectives and its exposed part, in ms.
  virtual void timing_take(double& comm_ms, double& exposed_ms) = 0;

 protected:
  ~StreamTiming() = default;
};

}  // namespace ddprun::worker::detail
