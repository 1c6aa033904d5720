#include "ddprun/worker/reducer.h"

#include <algorithm>
#include <cstring>

#include "ddprun/worker/checks.h"

namespace ddprun::worker {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "fp32";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    case DType::I32: return "int32";
  }
  return "?";
}

void Communicator::allreduce_step(float* grad, size_t count, const ElementwiseStep& step, float* const* arrays) {
  allreduce(grad, count, DType::F32, ReduceOp::Avg);
  step.apply(arrays, grad, count);
}

std::vector<std::vector<size_t>> plan_buckets(const std::vector<size_t>& param_bytes, size_t first_bucket_cap_bytes,
                                              size_t bucket_cap_bytes) {
  std::vector<std::vector<size_t>> plan;
  std::vector<size_t> cur;
  size_t cur_bytes = 0;
  for (size_t k = param_bytes.size(); k-- > 0;) {
    cur.push_back(k);
    cur_bytes += param_bytes[k];
    const size_t cap = plan.empty() ? first_bucket_cap_bytes : bucket_cap_bytes;
    if (cur_bytes >= cap) {
      plan.push_back(std::move(cur));
      cur.clear();
      cur_bytes = 0;
    }
  }
  if (!cur.empty()) plan.push_back(std::move(cur));
  return plan;
}

Reducer::Reducer(Communicator& comm, std::vector<GradView> grads, DType dtype, ReducerOptions options)
    : comm_(comm), grads_(std::move(grads)), dtype_(dtype), options_(options) {
  const size_t es = dtype_size(dtype_);
  std::vector<size_t> bytes;
  bytes.reserve(grads_.size());
  for (const auto& g : grads_) bytes.push_back(g.count * es);
  plan_ = plan_buckets(bytes, options_.first_bucket_cap_bytes, options_.bucket_cap_bytes);
  buckets_.resize(plan_.size());
  bucket_of_.assign(grads_.size(), 0);
  for (size_t b = 0; b < plan_.size(); ++b) {
    Bucket& bk = buckets_[b];
    bk.members = plan_[b];
    for (size_t i : bk.members) {
      bucket_of_[i] = b;
      bk.count += grads_[i].count;
    }
    // In place when the members tile one contiguous range.
    std::vector<size_t> by_addr = bk.members;
    std::sort(by_addr.begin(), by_addr.end(),
              [&](size_t a, size_t c) { return grads_[a].ptr < grads_[c].ptr; });
    bool contiguous = true;
    for (size_t j = 1; j < by_addr.size(); ++j) {
      const auto* prev_end = static_cast<unsigned char*>(grads_[by_addr[j - 1]].ptr) + grads_[by_addr[j - 1]].count * es;
      if (prev_end != grads_[by_addr[j]].ptr) contiguous = false;
    }
    if (contiguous) {
      bk.base = grads_[by_addr.front()].ptr;
    } else {
      if (comm_.stream_ordered())
        throw WorkerError("Reducer: gradients of a bucket must be contiguous in device memory; "
                          "allocate them in one flat buffer in registration order");
      bk.staging.resize(bk.count * es);
    }
  }
  if (comm_.size() > 1 && !comm_.stream_ordered()) thread_ = std::thread([this] { comm_thread_main(); });
}

Reducer::~Reducer() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
}

void Reducer::prepare_for_backward() {
  for (auto& bk : buckets_) {
    bk.pending = bk.members.size();
    bk.launched = false;
  }
  next_to_launch_ = 0;
  launched_early_ = 0;
  in_backward_ = true;
  std::lock_guard<std::mutex> lk(mu_);
  completed_ = 0;
}

void Reducer::mark_ready(size_t index) {
  DDPRUN_ENFORCE(index < grads_.size(), "mark_ready: index out of range");
  if (!sync_ || !in_backward_ || comm_.size() == 1) return;
  Bucket& bk = buckets_[bucket_of_[index]];
  DDPRUN_ENFORCE(bk.pending > 0, "mark_ready called twice for gradient " + std::to_string(index));
  --bk.pending;
  if (!options_.overlap) return;
  // Launch in bucket order so every rank issues the same sequence of collectives.
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    launch(next_to_launch_++);
    ++launched_early_;
  }
}

void Reducer::launch(size_t b) {
  Bucket& bk = buckets_[b];
  bk.launched = true;
  if (comm_.stream_ordered()) {
    comm_.comm_waits_for_compute();
    comm_.allreduce(bk.base, bk.count, dtype_, ReduceOp::Avg);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(b);
  }
  cv_.notify_all();
}

void Reducer::reduce_bucket(Bucket& bk) {
  const size_t es = dtype_size(dtype_);
  if (bk.base) {
    comm_.allreduce(bk.base, bk.count, dtype_, ReduceOp::Avg);
    return;
  }
  size_t off = 0;
  for (size_t i : bk.members) {
    std::memcpy(bk.staging.data() + off, grads_[i].ptr, grads_[i].count * es);
    off += grads_[i].count * es;
  }
  comm_.allreduce(bk.staging.data(), bk.count, dtype_, ReduceOp::Avg);
  off = 0;
  for (size_t i : bk.members) {
    std::memcpy(grads_[i].ptr, bk.staging.data() + off, grads_[i].count * es);
    off += grads_[i].count * es;
  }
}

void Reducer::comm_thread_main() {
  for (;;) {
    size_t b = 0;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      b = queue_.front();
      queue_.pop_front();
      if (error_) {  // after a failure, drain without communicating
        ++completed_;
        cv_.notify_all();
        continue;
      }
    }
    std::exception_ptr err;
    try {
      reduce_bucket(buckets_[b]);
    } catch (const CommError&) {
      err = std::current_exception();
    } catch (const std::exception& e) {
      err = std::make_exception_ptr(CommError(std::string("all-reduce of bucket ") + std::to_string(b) + " failed: " + e.what()));
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (err && !error_) error_ = err;
      ++completed_;
    }
    cv_.notify_all();
  }
}

void Reducer::finalize() {
  if (!in_backward_) return;
  in_backward_ = false;
  if (!sync_ || comm_.size() == 1) return;
  for (const auto& bk : buckets_)
    DDPRUN_ENFORCE(bk.pending == 0 || !options_.overlap, "finalize: a gradient was never marked ready");
  while (next_to_launch_ < buckets_.size()) launch(next_to_launch_++);
  if (comm_.stream_ordered()) {
    comm_.compute_waits_for_comm();
    return;
  }
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return completed_ == buckets_.size(); });
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace ddprun::worker
