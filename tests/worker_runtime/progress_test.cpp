// progress.h: ticks land in the progress file ddprun creates (its layout: launcher's hang.h),
// and nothing is written to a file without the magic or when the variable is missing. Each case
// runs in a child process: the mapping is made once per process.
#include <catch2/catch.hpp>

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "ddprun/worker/progress.h"

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
  uint64_t w[2] = {0, 0};
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
