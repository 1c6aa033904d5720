// progress.h: ticks land in the progress file ddprun creates (its layout: launcher's hang.h),
// and nothing is written to a file without the magic or when the variable is missing; the
// Reducer's step statistics land in the words after the counter. Each case
// runs in a child process: the mapping is made once per process.
#include <catch2/catch.hpp>

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/worker/progress.h"
#include "ddprun/worker/reducer.h"
#include "fake_communicator.h"
#include "stream_timing.h"

namespace {

constexpr uint64_t kMagic = 0x3147525052504444ULL;  // "DDPRPRG1"

std::string make_file(uint64_t magic) {
  char path[] = "/tmp/ddprun-progress-test-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  std::vector<unsigned char> page(4096, 0);
  std::memcpy(page.data(), &magic, sizeof magic);
  REQUIRE(::write(fd, page.data(), page.size()) == 4096);
  ::close(fd);
  return path;
}

uint64_t word(const std::string& path, int i) {
  std::ifstream in(path, std::ios::binary);
  uint64_t w[7] = {};
  in.read(reinterpret_cast<char*>(w), sizeof w);
  return w[i];
}

// Runs `ticks` progress() calls in a child with DDPRUN_PROGRESS_FILE=`path` (unset when empty);
// returns what the child's progress_ticks() said.
int child_ticks(const std::string& path, int ticks) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (path.empty()) ::unsetenv("DDPRUN_PROGRESS_FILE");
    else ::setenv("DDPRUN_PROGRESS_FILE", path.c_str(), 1);
    for (int i = 0; i < ticks; ++i) ddprun::worker::progress();
    ::_exit(static_cast<int>(ddprun::worker::progress_ticks() & 0x7f));
  }
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  REQUIRE(WIFEXITED(st));
  return WEXITSTATUS(st);
}

// A one-rank stream-ordered communicator (as NCCL is) with device timing: what the Reducer
// asks of it, in order, and per finished pass 2 ms of collectives, 0.5 ms of them exposed. A
// pass counts as finished one timing_take() after it ended, as events complete later.
class TimedStreamComm final : public ddprun::worker::Communicator, public ddprun::worker::detail::StreamTiming {
 public:
  std::string calls;
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "timed-stream"; }
  bool stream_ordered() const override { return true; }
  void allreduce(void*, size_t, ddprun::worker::DType, ddprun::worker::ReduceOp) override { calls += "a"; }
  void broadcast(void*, size_t, int) override {}
  void allgather(const void*, void*, size_t, ddprun::worker::DType) override {}
  void reduce_scatter(const void*, void*, size_t, ddprun::worker::DType, ddprun::worker::ReduceOp) override {}
  void barrier() override {}
  void abort() noexcept override {}
  void timing_begin_pass() override { calls += "["; }
  void timing_mark_backward_end() override { calls += "|"; }
  void timing_end_pass() override {
    calls += "]";
    ++ended_;
  }
  void timing_take(double& comm_ms, double& exposed_ms) override {
    calls += "t";
    for (; finished_ < ready_; ++finished_) comm_ms += 2.0, exposed_ms += 0.5;
    ready_ = ended_;
  }

 private:
  int ended_ = 0, ready_ = 0, finished_ = 0;
};

}  // namespace

TEST_CASE("progress() counts in the progress file", "[progress]") {
  const std::string f = make_file(kMagic);
  CHECK(child_ticks(f, 5) == 5);
  CHECK(word(f, 0) == kMagic);
  CHECK(word(f, 1) == 5);
  CHECK(child_ticks(f, 2) == 7);  // another process adds to the same counter
  CHECK(word(f, 1) == 7);
  ::unlink(f.c_str());
}

TEST_CASE("progress() leaves a file that is not a progress file alone, and does nothing without one",
          "[progress]") {
  const std::string f = make_file(0x1234);
  CHECK(child_ticks(f, 3) == 0);
  CHECK(word(f, 0) == 0x1234);
  CHECK(word(f, 1) == 0);
  ::unlink(f.c_str());
  CHECK(child_ticks("", 3) == 0);
  CHECK(child_ticks("/nonexistent/progress", 3) == 0);
}

TEST_CASE("the Reducer adds its synchronised steps to the statistics words of the page", "[progress]") {
  const std::string f = make_file(kMagic);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // One rank through a real collective (force_collective), the communication thread hiding it
    // or not; passes: synchronised, accumulating (no_sync), synchronised, synchronised.
    ::setenv("DDPRUN_PROGRESS_FILE", f.c_str(), 1);
    namespace dw = ddprun::worker;
    dw::testing::FakeGroup g(1);
    dw::testing::FakeCommunicator c(g, 0);
    std::vector<float> grad(4096, 1.0f);
    dw::ReducerOptions o;
    o.force_collective = true;
    o.progress = dw::ReducerOptions::Progress::Thread;
    dw::Reducer r(c, {{grad.data(), grad.size()}}, dw::DType::F32, o);
    for (int pass = 0; pass < 4; ++pass) {
      r.set_sync(pass != 1);
      r.prepare_for_backward();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      r.mark_ready(0);
      r.finalize();
    }
    ::_exit(0);
  }
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  CHECK(word(f, 1) == 4);  // a tick per pass
  CHECK(word(f, 2) == 1);  // the statistics' version
  CHECK(word(f, 3) == 2);  // steps: from the end of the first synchronised pass to the third's
  CHECK(word(f, 4) >= 15'000'000u);  // their wall time: three passes of at least 5 ms
  CHECK(word(f, 4) < 10'000'000'000u);
  CHECK(word(f, 5) > 0);               // the collectives' time
  CHECK(word(f, 5) <= word(f, 4));     // within the steps
  CHECK(word(f, 6) <= word(f, 5));     // exposed: at most all of it
  ::unlink(f.c_str());
}

TEST_CASE("a lone rank without collectives writes no statistics", "[progress]") {
  const std::string f = make_file(kMagic);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::setenv("DDPRUN_PROGRESS_FILE", f.c_str(), 1);
    namespace dw = ddprun::worker;
    dw::testing::FakeGroup g(1);
    dw::testing::FakeCommunicator c(g, 0);
    std::vector<float> grad(16, 1.0f);
    dw::Reducer r(c, {{grad.data(), grad.size()}}, dw::DType::F32);
    for (int pass = 0; pass < 3; ++pass) {
      r.prepare_for_backward();
      r.mark_ready(0);
      r.finalize();
    }
    ::_exit(0);
  }
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  CHECK(word(f, 1) == 3);
  for (int i = 2; i < 7; ++i) CHECK(word(f, i) == 0);
  ::unlink(f.c_str());
}

TEST_CASE("a stream-ordered communicator's device timing reaches the statistics words", "[progress]") {
  const std::string f = make_file(kMagic);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::setenv("DDPRUN_PROGRESS_FILE", f.c_str(), 1);
    namespace dw = ddprun::worker;
    TimedStreamComm c;
    std::vector<float> grad(64, 1.0f);
    dw::ReducerOptions o;
    o.force_collective = true;
    o.bucket_cap_bytes = o.first_bucket_cap_bytes = 128;  // a bucket per gradient
    dw::Reducer r(c, {{grad.data(), 32}, {grad.data() + 32, 32}}, dw::DType::F32, o);
    for (int pass = 0; pass < 4; ++pass) {  // synchronised, no_sync, synchronised, synchronised
      r.set_sync(pass != 1);
      r.prepare_for_backward();
      r.mark_ready(1);
      r.mark_ready(0);
      r.finalize();
    }
    // Each synchronised pass: opened, its collectives timed, backward's end marked, closed; the
    // figures taken at every synchronised pass after the first.
    ::_exit(c.calls == "[aa|][aa|]t[aa|]t" ? 0 : 1);
  }
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  CHECK(word(f, 3) == 2);          // steps after the first synchronised pass
  CHECK(word(f, 5) == 4'000'000);  // two passes' 2 ms, taken a pass late
  CHECK(word(f, 6) == 1'000'000);  // and their exposed 0.5 ms
  ::unlink(f.c_str());
}
