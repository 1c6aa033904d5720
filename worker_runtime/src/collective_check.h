// Debug-mode check that every rank issues the same collective, for transports that have no
// check of their own (Gloo over TCP, NCCL; the shm path checks every collective always, see
// shm_allreduce.h). With DDPRUN_DEBUG_COLLECTIVES=1 a communicator calls
// CollectiveChecker::check() before each collective: every rank all-gathers a 32-byte
// signature (sequence number, op, dtype, count, reduce op or root) over the same transport
// and compares all of them, so ranks that diverged (a skipped step, a rank-dependent branch)
// get a CommError naming the ranks, the ops and what was expected, instead of a hang or
// silently mixed data. It costs one small all-gather per collective: a debugging aid, off by
// default.
//
// Header-only (inline), so the communicators can use it without new library symbols:
//   if (checker_) checker_->check(CollectiveOp::AllReduce, dtype, count, int(op), all_gather_bytes);
// where all_gather_bytes(const void* mine, void* all, size_t bytes) gathers `bytes` from every
// rank into all[rank * bytes] (e.g. gloo::allgather on the communicator's context); or next()
// and verify() around an all-gather of one's own (the NCCL communicator: through device memory,
// on its stream, then a host wait — the check blocks the host once per collective, which is
// why it is a debugging aid).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ddprun/worker/checks.h"
#include "ddprun/worker/communicator.h"
#include "ddprun/worker/dtype.h"
#include "knob_flag.h"

namespace ddprun::worker {

enum class CollectiveOp : uint32_t { AllReduce = 1, Broadcast, AllGather, ReduceScatter, Barrier };

struct CollectiveSignature {
  uint64_t seq = 0;
  uint64_t count = 0;  // elements (bytes for broadcast)
  uint32_t op = 0;     // CollectiveOp
  uint32_t dtype = 0;  // DType
  int32_t arg = 0;     // ReduceOp for reductions, the root for broadcast, else 0
  uint32_t pad = 0;
  bool operator==(const CollectiveSignature&) const = default;
};
static_assert(sizeof(CollectiveSignature) == 32);

// DDPRUN_DEBUG_COLLECTIVES=1 (read once; a value other than 0/1 throws WorkerError, and is
// read again on the next call, so every caller sees the error).
inline bool debug_collectives_enabled() {
  static const bool on = knob_flag(knobs::kDebugCollectives);
  return on;
}

inline std::string describe_collective(const CollectiveSignature& s) {
  auto dt = [&] {
    return s.dtype <= static_cast<uint32_t>(DType::I64) ? dtype_name(static_cast<DType>(s.dtype)) : "?";
  };
  auto red = [&] {
    switch (static_cast<ReduceOp>(s.arg)) {
      case ReduceOp::Sum: return "sum";
      case ReduceOp::Avg: return "avg";
      case ReduceOp::Max: return "max";
    }
    return "?";
  };
  const std::string n = std::to_string(s.count);
  switch (static_cast<CollectiveOp>(s.op)) {
    case CollectiveOp::AllReduce: return std::string("allreduce(") + dt() + ", " + n + " elements, " + red() + ")";
    case CollectiveOp::ReduceScatter:
      return std::string("reduce_scatter(") + dt() + ", " + n + " elements, " + red() + ")";
    case CollectiveOp::AllGather: return std::string("all_gather(") + dt() + ", " + n + " elements)";
    case CollectiveOp::Broadcast: return "broadcast(" + n + " bytes, root " + std::to_string(s.arg) + ")";
    case CollectiveOp::Barrier: return "barrier()";
  }
  return "an unknown collective";
}

class CollectiveChecker {
 public:
  CollectiveChecker(int rank, int size) : rank_(rank), size_(size) {}

  // Collective: call on every rank before the collective it describes. Throws CommError when
  // any rank's signature differs (every rank sees the same table, so every rank throws).
  template <class AllGather>
  void check(CollectiveOp op, DType dtype, size_t count, int arg, AllGather&& all_gather_bytes) {
    const CollectiveSignature mine = next(op, dtype, count, arg);
    std::vector<CollectiveSignature> all(static_cast<size_t>(size_));
    all_gather_bytes(static_cast<const void*>(&mine), static_cast<void*>(all.data()), sizeof mine);
    verify(mine, all.data());
  }

  // The two halves of check(), for transports whose all-gather needs buffers of their own
  // (NCCL: device memory and pinned staging): the signature of the next collective (advances
  // the sequence number), then the comparison of the gathered table (all[r] = rank r's; size()
  // entries), which throws CommError naming every rank that differs, its op and this rank's.
  CollectiveSignature next(CollectiveOp op, DType dtype, size_t count, int arg) {
    CollectiveSignature mine;
    mine.seq = ++seq_;
    mine.count = count;
    mine.op = static_cast<uint32_t>(op);
    mine.dtype = static_cast<uint32_t>(dtype);
    mine.arg = arg;
    return mine;
  }
  void verify(const CollectiveSignature& mine, const CollectiveSignature* all) const {
    std::string diff;
    for (int r = 0; r < size_; ++r) {
      const CollectiveSignature& o = all[static_cast<size_t>(r)];
      if (o == mine) continue;
      if (diff.size() < 600)
        diff += "; rank " + std::to_string(r) + " issued #" + std::to_string(o.seq) + " " + describe_collective(o);
    }
    if (diff.empty()) return;
    throw CommError("collective mismatch (DDPRUN_DEBUG_COLLECTIVES) seen by rank " + std::to_string(rank_) + ": rank " +
                    std::to_string(rank_) + " (this one) issued #" + std::to_string(mine.seq) + " " +
                    describe_collective(mine) + diff +
                    ". Expected every rank to issue the same collectives in the same order; ranks diverged "
                    "(e.g. a skipped step or a rank-dependent branch)");
  }
  int size() const { return size_; }

 private:
  int rank_, size_;
  uint64_t seq_ = 0;
};

}  // namespace ddprun::worker
