#include "position_board.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <stdexcept>

namespace ddprun::worker {

PositionBoard::PositionBoard(Store& store, std::string key_prefix, int rank, int size,
                             std::chrono::milliseconds timeout)
    : store_(store), prefix_(std::move(key_prefix)), rank_(rank), size_(size) {
  publish(position_);
  const auto period = std::clamp(timeout / 4, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
  // What the store holds now, as of this constructor: the thread may start after the first
  // collectives were noted, and must publish them then.
  publisher_ = std::thread([this, period, published = position_.seq]() mutable {
    std::unique_lock lk(mu_);
    while (!cv_.wait_for(lk, period, [&] { return stop_; })) {
      if (position_.seq == published) continue;
      const CollectiveSignature now = position_;
      lk.unlock();
      if (!publish(now)) return;  // the store is gone: the job is ending anyway
      published = now.seq;
      lk.lock();
    }
  });
}

PositionBoard::~PositionBoard() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  publisher_.join();
}

void PositionBoard::note(CollectiveOp op, DType dtype, size_t count, int arg) {
  std::lock_guard lk(mu_);
  position_ = CollectiveSignature{.seq = position_.seq + 1,
                                  .count = count,
                                  .op = static_cast<uint32_t>(op),
                                  .dtype = static_cast<uint32_t>(dtype),
                                  .arg = arg};
}

bool PositionBoard::publish(const CollectiveSignature& s) noexcept {
  try {
    store_.set(key(rank_), std::string(reinterpret_cast<const char*>(&s), sizeof s));
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

std::string PositionBoard::describe(const CollectiveSignature& s) {
  return s.seq == 0 ? std::string(" has issued no collective yet")
                    : " last issued #" + std::to_string(s.seq) + " " + describe_collective(s);
}

std::string PositionBoard::where_ranks_are() const {
  CollectiveSignature mine;
  {
    std::lock_guard lk(mu_);
    mine = position_;
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  std::string out;
  for (int r = 0; r < size_; ++r) {
    out += "; rank " + std::to_string(r);
    if (r == rank_) {
      out += " (this one)" + describe(mine);
      continue;
    }
    try {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      const std::string v = store_.get(key(r), std::max(left, std::chrono::milliseconds(1)));
      CollectiveSignature s;
      if (v.size() != sizeof s) throw std::runtime_error("malformed");
      std::memcpy(&s, v.data(), sizeof s);
      out += describe(s);
    } catch (const std::exception&) {
      out += ": where it is is unknown (it published nothing readable)";
    }
  }
  return out;
}

}  // namespace ddprun::worker
