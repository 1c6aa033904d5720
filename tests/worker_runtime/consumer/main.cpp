// What a user of the installed library does: includes its headers, brings a Store of its own
// (ranks as threads over an in-memory store), builds Gloo communicators, runs collectives,
// catches the library's exception types, and starts a 1-rank runtime.
#include "all_headers.h"

#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

namespace dw = ddprun::worker;

namespace {

class MapStore final : public dw::Store {
 public:
  void set(const std::string& k, const std::string& v) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      kv_[k] = v;
    }
    cv_.notify_all();
  }
  std::string get(const std::string& k, std::chrono::milliseconds t) override {
    wait({k}, t);
    std::lock_guard<std::mutex> lk(mu_);
    return kv_[k];
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds t) override {
    std::unique_lock<std::mutex> lk(mu_);
    if (!cv_.wait_for(lk, t, [&] {
          for (const auto& k : keys)
            if (!kv_.count(k)) return false;
          return true;
        }))
      throw dw::CommError("MapStore: timeout");
  }
  int64_t add(const std::string& k, int64_t d) override {
    std::lock_guard<std::mutex> lk(mu_);
    const int64_t v = (kv_.count(k) ? std::stoll(kv_[k]) : 0) + d;
    kv_[k] = std::to_string(v);
    cv_.notify_all();
    return v;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
};

int fail(const char* what) {
  std::fprintf(stderr, "consumer: FAILED: %s\n", what);
  return 1;
}

}  // namespace

int main() {
  // Exceptions thrown inside the library are caught by their public types here.
  bool caught = false;
  try {
    dw::read_worker_env([](const char* k) -> const char* {
      return std::string(k) == "RANK" ? "5" : std::string(k) == "WORLD_SIZE" ? "2" : nullptr;
    });
  } catch (const dw::WorkerError&) {
    caught = true;
  }
  if (!caught) return fail("WorkerError from read_worker_env not caught by type");

  // Two ranks as threads: a Gloo mesh over our own Store, an all-reduce and an all-gather.
  MapStore store;
  const int world = 2;
  std::vector<std::string> errors(world);
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        dw::GlooOptions go;
        go.hostname = "127.0.0.1";
        go.timeout = std::chrono::seconds(60);
        auto comm = dw::make_gloo_communicator(store, r, world, go);
        std::vector<int64_t> v(1000, r + 1);
        comm->allreduce(v.data(), v.size(), dw::DType::I64, dw::ReduceOp::Sum);
        for (int64_t x : v)
          if (x != 3) errors[static_cast<size_t>(r)] = "allreduce";
        double mine = 10.0 * r, all[2] = {-1, -1};
        comm->allgather(&mine, all, 1, dw::DType::F64);
        if (all[0] != 0.0 || all[1] != 10.0) errors[static_cast<size_t>(r)] = "allgather";
        comm->barrier();
      } catch (const dw::CommError& e) {
        errors[static_cast<size_t>(r)] = std::string("CommError: ") + e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (const auto& e : errors)
    if (!e.empty()) return fail(e.c_str());

  // One rank, no launcher: init() and a collective.
  auto rt = dw::init();
  float x = 2.f;
  rt->comm().allreduce(&x, 1, dw::DType::F32, dw::ReduceOp::Avg);
  if (rt->world_size() != 1 || x != 2.f) return fail("1-rank runtime");
  std::printf("consumer: OK (backend of the 1-rank runtime: %s)\n", rt->comm().backend());
  return 0;
}
