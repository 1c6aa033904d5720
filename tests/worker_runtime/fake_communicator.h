// An in-process communicator for N threads: all-reduce sums in rank order (deterministic),
// so reducer logic is testable without sockets. Lives with the tests (a fake, not a backend).
#pragma once

#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <vector>

#include "ddprun/worker/checks.h"
#include "ddprun/worker/communicator.h"

namespace ddprun::worker::testing {

class FakeGroup {
 public:
  explicit FakeGroup(int size) : size_(size), slots_(static_cast<size_t>(size)) {}
  int size() const { return size_; }

  // Every rank deposits its buffer; the last one combines; all copy the result out. Ranks that
  // pass different sizes (a test whose fake peer does not match the real call) all get a
  // CommError instead of reading past the shorter buffer.
  void exchange(int rank, void* buf, size_t bytes, const std::function<void(std::vector<void*>&)>& combine) {
    std::unique_lock<std::mutex> lk(mu_);
    const uint64_t gen = gen_;
    slots_[static_cast<size_t>(rank)] = buf;
    sizes_[static_cast<size_t>(rank)] = bytes;
    if (++arrived_ == size_) {
      mismatch_ = false;
      for (size_t r = 1; r < sizes_.size(); ++r) mismatch_ = mismatch_ || sizes_[r] != sizes_[0];
      if (!mismatch_) combine(slots_);
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lk, [&] { return gen_ != gen || aborted_; });
      if (aborted_) throw CommError("fake group aborted");
    }
    // Still this generation's flag: the next one cannot complete before this rank joins it.
    if (mismatch_) throw CommError("fake group: the ranks passed different sizes to one collective");
  }
  void abort() {
    std::lock_guard<std::mutex> lk(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  int size_;
  std::vector<void*> slots_;
  std::vector<size_t> sizes_ = std::vector<size_t>(static_cast<size_t>(size_));
  bool mismatch_ = false;
  int arrived_ = 0;
  uint64_t gen_ = 0;
  bool aborted_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
};

class FakeCommunicator final : public Communicator, public FusedStep {
 public:
  FakeCommunicator(FakeGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.size(); }
  const char* backend() const override { return "fake"; }
  size_t allreduce_calls = 0;
  std::vector<size_t> allreduce_counts;
  // Claims a fused step (fuses_step) without having one, to test the Reducer's handling of
  // fusable buckets; allreduce_step is the unfused reference (all-reduce, then the step). It
  // has no shared memory (alloc_shared gives nullptr).
  bool claim_fused_step = false;
  std::vector<size_t> allreduce_step_counts;

  FusedStep* fused_step() override { return this; }
  void* alloc_shared(size_t) override { return nullptr; }
  bool fuses_step(const float*, size_t, float* const*, size_t) const override { return claim_fused_step; }
  void allreduce_step(float* grad, size_t count, const ElementwiseStep& step, float* const* arrays) override {
    allreduce_step_counts.push_back(count);
    allreduce_then_step(*this, grad, count, step, arrays);
  }

  void allreduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    DDPRUN_ENFORCE(dtype == DType::F32, "fake: fp32 only");
    ++allreduce_calls;
    allreduce_counts.push_back(count);
    const int n = g_.size();
    g_.exchange(rank_, buf, count * 4, [&](std::vector<void*>& bufs) {
      std::vector<float> acc(count, 0.f);
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) acc[i] += static_cast<float*>(bufs[static_cast<size_t>(r)])[i];
      if (op == ReduceOp::Avg)
        for (auto& v : acc) v /= static_cast<float>(n);
      for (int r = 0; r < n; ++r) std::memcpy(bufs[static_cast<size_t>(r)], acc.data(), count * 4);
    });
  }
  void broadcast(void* buf, size_t bytes, int root) override {
    g_.exchange(rank_, buf, bytes, [&](std::vector<void*>& bufs) {
      for (size_t r = 0; r < bufs.size(); ++r)
        if (static_cast<int>(r) != root) std::memcpy(bufs[r], bufs[static_cast<size_t>(root)], bytes);
    });
  }
  // Any dtype (it only moves bytes).
  void allgather(const void* in, void* out, size_t count, DType dtype) override {
    const size_t bytes = count * dtype_size(dtype);
    InOut io{in, out};
    g_.exchange(rank_, &io, bytes, [&](std::vector<void*>& ios) {
      std::vector<std::vector<unsigned char>> blocks;  // inputs first: in place aliases outputs
      for (void* p : ios) {
        const auto* b = static_cast<const unsigned char*>(static_cast<InOut*>(p)->in);
        blocks.emplace_back(b, b + bytes);
      }
      for (void* p : ios)
        for (size_t r = 0; r < blocks.size(); ++r)
          if (bytes)
            std::memcpy(static_cast<unsigned char*>(static_cast<InOut*>(p)->out) + r * bytes, blocks[r].data(), bytes);
    });
  }
  // fp32 only, like allreduce: sums (or maxes) in rank order.
  void reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    DDPRUN_ENFORCE(dtype == DType::F32, "fake: fp32 only");
    const int n = g_.size();
    InOut io{in, out};
    g_.exchange(rank_, &io, count * 4, [&](std::vector<void*>& ios) {
      std::vector<std::vector<float>> res(static_cast<size_t>(n), std::vector<float>(count));
      for (int dst = 0; dst < n; ++dst)
        for (size_t i = 0; i < count; ++i) {
          float acc = 0.f;
          for (int r = 0; r < n; ++r) {
            const float v = static_cast<const float*>(
                static_cast<InOut*>(ios[static_cast<size_t>(r)])->in)[static_cast<size_t>(dst) * count + i];
            acc = r == 0 ? v : op == ReduceOp::Max ? (v > acc ? v : acc) : acc + v;
          }
          res[static_cast<size_t>(dst)][i] = op == ReduceOp::Avg ? acc / static_cast<float>(n) : acc;
        }
      for (int r = 0; r < n; ++r)
        if (count)
          std::memcpy(static_cast<InOut*>(ios[static_cast<size_t>(r)])->out, res[static_cast<size_t>(r)].data(),
                      count * 4);
    });
  }
  void barrier() override {
    char c = 0;
    g_.exchange(rank_, &c, 1, [](std::vector<void*>&) {});
  }
  void abort() noexcept override { g_.abort(); }

 private:
  struct InOut {
    const void* in;
    void* out;
  };
  FakeGroup& g_;
  int rank_;
};

}  // namespace ddprun::worker::testing
