// stop.h in one process: the handler only sets the flag (the process survives the signal), the
// first signal is the one remembered, uncatchable signals are refused, and agree_stop() is a MAX
// over the ranks (threads with real Gloo communicators, shared memory on and off: the flag is per
// process, so the other rank's vote is its raw all-reduce of a 0, as the collective sees it); a
// device-memory communicator must override allreduce_max_host (NCCL's: run on the H200).
// The agreement across real processes under ddprun: preempt_ddprun.py.
#include <catch2/catch.hpp>

#include <stdlib.h>
#include <unistd.h>

#include <csignal>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ddprun/worker/stop.h"
#include "gloo_ranks.h"

namespace dw = ddprun::worker;

namespace {

// A communicator that says its memory is the device's (NCCL's contract).
class StreamOrdered final : public dw::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "nccl-like"; }
  void allreduce(void*, size_t, dw::DType, dw::ReduceOp) override { ++calls; }
  void broadcast(void*, size_t, int) override {}
  void allgather(const void*, void*, size_t, dw::DType) override {}
  void reduce_scatter(const void*, void*, size_t, dw::DType, dw::ReduceOp) override {}
  void barrier() override {}
  void abort() noexcept override {}
  bool stream_ordered() const override { return true; }
  int calls = 0;
};

}  // namespace

// One test case, in order: the flag is process-wide and never cleared (ctest runs this tag in a
// process of its own).
TEST_CASE("stop flag: handlers, first signal wins, agreement is a MAX, device memory not handed to the host default",
          "[stop]") {
  REQUIRE_FALSE(dw::stop_requested());
  REQUIRE(dw::stop_signal() == 0);

  const auto timeout = std::chrono::seconds(60);
  // Two ranks, nobody asked: false on both, and the same collective as the next one (a vote of 0).
  for (bool shm : {false, true}) {
    bool agreed[2] = {true, true};
    int32_t raw = -1;
    const auto errors = dw::testing::on_gloo_ranks(2, shm, timeout, [&](int r, dw::Communicator& c) {
      agreed[r] = dw::agree_stop(c);
      if (r == 1) {
        int32_t v = 0;
        c.allreduce(&v, 1, dw::DType::I32, dw::ReduceOp::Max);
        raw = v;
      } else {
        (void)dw::agree_stop(c);
      }
    });
    INFO("shared memory " << shm);
    CHECK(errors == std::vector<std::string>{"", ""});
    CHECK_FALSE(agreed[0]);
    CHECK_FALSE(agreed[1]);
    CHECK(raw == 0);
  }

  CHECK_THROWS_WITH(dw::install_stop_handlers({SIGKILL}), Catch::Contains("cannot be caught"));
  dw::install_stop_handlers();  // SIGUSR1, SIGTERM
  std::raise(SIGUSR1);          // the default action would end this process
  CHECK(dw::stop_requested());
  CHECK(dw::stop_signal() == SIGUSR1);
  std::raise(SIGTERM);
  CHECK(dw::stop_signal() == SIGUSR1);  // the first one is kept
  dw::request_stop();
  CHECK(dw::stop_signal() == SIGUSR1);

  // Rank 0 asked (the flag is set); rank 1 votes 0 through the same collective: both learn it.
  for (bool shm : {false, true}) {
    bool agreed0 = false;
    int32_t vote1 = 0;
    const auto errors = dw::testing::on_gloo_ranks(2, shm, timeout, [&](int r, dw::Communicator& c) {
      if (r == 0) agreed0 = dw::agree_stop(c);
      else c.allreduce(&vote1, 1, dw::DType::I32, dw::ReduceOp::Max);
    });
    INFO("shared memory " << shm);
    CHECK(errors == std::vector<std::string>{"", ""});
    CHECK(agreed0);
    CHECK(vote1 == 1);
  }

  // A stream-ordered communicator must stage the vote itself (NCCL does: a device all-reduce);
  // the host default refuses to hand it host memory.
  StreamOrdered nccl;
  CHECK_THROWS_WITH(dw::agree_stop(nccl), Catch::Contains("does not override allreduce_max_host"));
  CHECK(nccl.calls == 0);
}

TEST_CASE("announce_preemption writes DDPRUN_PREEMPT_FILE for ddprun, and only there", "[stop]") {
  char dir[] = "/tmp/ddprun-announce-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string file = std::string(dir) + "/preempted";
  ::unsetenv("DDPRUN_PREEMPT_FILE");
  CHECK_FALSE(ddprun::worker::announce_preemption("/ck/step-12"));  // not under ddprun
  ::setenv("DDPRUN_PREEMPT_FILE", file.c_str(), 1);
  CHECK(ddprun::worker::announce_preemption("/ck/step-12"));
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "preempted\ncheckpoint /ck/step-12\n");
  CHECK(ddprun::worker::announce_preemption());
  std::ifstream again(file);
  std::string plain((std::istreambuf_iterator<char>(again)), std::istreambuf_iterator<char>());
  CHECK(plain == "preempted\n");
  ::setenv("DDPRUN_PREEMPT_FILE", (std::string(dir) + "/missing/preempted").c_str(), 1);
  CHECK_FALSE(ddprun::worker::announce_preemption());  // cannot be written: false, no throw
  ::unsetenv("DDPRUN_PREEMPT_FILE");
  std::remove(file.c_str());
  ::rmdir(dir);
}
