// Where every rank is, for the error of a collective a peer never joined: each rank publishes
// the last collective it issued (sequence number and op signature, collective_check.h) under
// "<prefix>pos/<rank>" in the job's store, from a thread of its own, at most once per period
// (a quarter of the collective timeout, a second at most) and only when it changed, so a rank
// stuck in a collective has published it long before a peer's timeout fires. Used by the
// transports without a table of their own (Gloo over TCP, NCCL; the shared-memory path keeps
// one in its segment).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "collective_check.h"
#include "ddprun/worker/store.h"

namespace ddprun::worker {

class PositionBoard {
 public:
  // Publishes "no collective yet" at once (every live rank's key exists from the start), then
  // starts the thread. `store` must outlive the board.
  PositionBoard(Store& store, std::string key_prefix, int rank, int size, std::chrono::milliseconds timeout);
  ~PositionBoard();
  PositionBoard(const PositionBoard&) = delete;
  PositionBoard& operator=(const PositionBoard&) = delete;

  // This rank issues a collective (numbered from 1). Cheap: a lock and a copy.
  void note(CollectiveOp op, DType dtype, size_t count, int arg);
  // "; rank 0 (this one) last issued #2 allreduce(fp32, 8 elements, max); rank 1 ...", each
  // peer's read from the store (bounded: a second in all).
  std::string where_ranks_are() const;

 private:
  std::string key(int r) const { return prefix_ + "pos/" + std::to_string(r); }
  bool publish(const CollectiveSignature& s) noexcept;
  static std::string describe(const CollectiveSignature& s);

  Store& store_;
  const std::string prefix_;
  const int rank_, size_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  CollectiveSignature position_;  // seq 0: no collective yet
  bool stop_ = false;
  std::thread publisher_;  // last: started when the rest is ready
};

}  // namespace ddprun::worker
