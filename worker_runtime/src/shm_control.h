// The shared segment's control block (ShmGroup::Control) and header size: shm_allreduce.cpp's
// collectives and shm_segment.cpp's set-up of the segment share them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "shm_allreduce.h"

namespace ddprun::worker {

struct ShmGroup::Control {
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> generation;
  std::atomic<int32_t> pids[kMaxRanks];
  // Written by its rank before a collective's first barrier, read by all after it (the
  // barrier's release/acquire orders them). Two sets, by the parity of the sequence number: a
  // rank can be one collective ahead (reduce_for_step has a single barrier), writing the next
  // entry while a slower peer still checks this one; it cannot be two ahead, since that needs
  // the next barrier, which the slow peer reaches only after its check.
  OpSig sigs[2][kMaxRanks];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex needs lock-free 32-bit atomics");

// The control block's page(s) before the ranks' chunks.
inline constexpr size_t kShmHeaderBytes = 16384;

}  // namespace ddprun::worker
