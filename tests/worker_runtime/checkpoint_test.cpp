#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <string>
#include <system_error>
#include <thread>

#include "ddprun/worker/checkpoint.h"
#include "ddprun/worker/checks.h"
#include "ddprun/worker/hash.h"

using namespace ddprun::worker;

namespace {
std::string temp_dir() {
  char tmpl[] = "/tmp/ddprun-ckpt-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  return tmpl;
}
Checkpoint sample(uint64_t step) {
  Checkpoint c;
  c.step = step;
  std::vector<float> p(1000);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>(i) * 0.5f + static_cast<float>(step);
  c.put_vector("params", p);
  c.put_u64("epoch", step / 10);
  return c;
}
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}
void spit(const std::string& path, const std::string& s) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << s;
}
}  // namespace

TEST_CASE("Crc32c: known answer", "[checkpoint]") {
  REQUIRE(crc32c("123456789", 9) == 0xE3069283u);
  REQUIRE(crc32c("", 0) == 0u);
}

TEST_CASE("Checkpoint: encode/decode roundtrip", "[checkpoint]") {
  auto c = sample(42);
  auto bytes = encode_checkpoint(c);
  std::string why;
  auto d = decode_checkpoint(bytes, &why);
  REQUIRE(d.has_value());
  REQUIRE(d->step == 42);
  REQUIRE(d->sections == c.sections);
  REQUIRE(d->get_u64("epoch") == 4);
  REQUIRE(d->get_vector<float>("params")[999] == Approx(999 * 0.5 + 42));
}

TEST_CASE("Checkpoint: save then load the newest", "[checkpoint]") {
  const auto dir = temp_dir() + "/nested/ck";
  save_checkpoint(dir, sample(5));
  save_checkpoint(dir, sample(10));
  auto c = load_latest_checkpoint(dir);
  REQUIRE(c.has_value());
  REQUIRE(c->step == 10);
  REQUIRE(c->sections == sample(10).sections);
}

TEST_CASE("Checkpoint: keep_last prunes old files", "[checkpoint]") {
  const auto dir = temp_dir();
  for (uint64_t s = 1; s <= 5; ++s) save_checkpoint(dir, sample(s), 2);
  struct stat st {};
  REQUIRE(::stat(checkpoint_path(dir, 5).c_str(), &st) == 0);
  REQUIRE(::stat(checkpoint_path(dir, 4).c_str(), &st) == 0);
  REQUIRE(::stat(checkpoint_path(dir, 3).c_str(), &st) != 0);
}

TEST_CASE("Checkpoint: TruncatedFileIsSkipped", "[checkpoint]") {
  const auto dir = temp_dir();
  save_checkpoint(dir, sample(5), 0);
  save_checkpoint(dir, sample(10), 0);
  const auto p = checkpoint_path(dir, 10);
  auto bytes = slurp(p);
  for (size_t cut : {bytes.size() - 1, bytes.size() / 2, size_t{10}, size_t{0}}) {
    spit(p, bytes.substr(0, cut));
    auto c = load_latest_checkpoint(dir);
    REQUIRE(c.has_value());
    REQUIRE(c->step == 5);
  }
}

TEST_CASE("Checkpoint: ChecksumMismatchIsSkipped", "[checkpoint]") {
  const auto dir = temp_dir();
  save_checkpoint(dir, sample(5), 0);
  save_checkpoint(dir, sample(10), 0);
  const auto p = checkpoint_path(dir, 10);
  auto bytes = slurp(p);
  bytes[bytes.size() / 2] ^= 0x01;  // one flipped bit in the payload
  spit(p, bytes);
  std::string why;
  REQUIRE_FALSE(decode_checkpoint(bytes, &why).has_value());
  REQUIRE(why.find("checksum") != std::string::npos);
  auto c = load_latest_checkpoint(dir);
  REQUIRE(c.has_value());
  REQUIRE(c->step == 5);
}

TEST_CASE("Checkpoint: MissingDirStartsFresh", "[checkpoint]") {
  REQUIRE_FALSE(load_latest_checkpoint("/tmp/ddprun-definitely-missing-dir-xyz/ck").has_value());
  const auto dir = temp_dir();
  REQUIRE_FALSE(load_latest_checkpoint(dir).has_value());  // empty dir
  spit(dir + "/ckpt-000000000007.ddpck", "garbage");
  REQUIRE_FALSE(load_latest_checkpoint(dir).has_value());  // only a corrupt file
}

TEST_CASE("Checkpoint: section accessors check sizes", "[checkpoint]") {
  auto c = sample(1);
  float f[3];
  REQUIRE_THROWS(c.get_into("params", f, sizeof f));
  REQUIRE_THROWS(c.get_u64("nope"));
}

// ---- background writer, orphaned temp files, extra named state --------------------------------

namespace {
std::string host_name() {
  char h[256] = {};
  REQUIRE(::gethostname(h, sizeof h - 1) == 0);
  return h;
}
// The temp file the writer of this process uses for `step` (see checkpoint.h).
std::string temp_path(const std::string& dir, uint64_t step) {
  return dir + "/.ckpt-tmp." + std::to_string(::getpid()) + "." + std::to_string(step) + "." + host_name();
}
// Reads a FIFO until its writer closes it.
void drain_fifo(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  char buf[1 << 16];
  while (::read(fd, buf, sizeof buf) > 0) {
  }
  ::close(fd);
}
bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}
}  // namespace

TEST_CASE("Checkpoint: the streamed file is byte for byte encode_checkpoint()", "[checkpoint_async]") {
  const auto dir = temp_dir();
  auto c = sample(77);
  c.put_value<float>("loss_scaler/scale", 1024.f);
  save_checkpoint(dir, c);
  REQUIRE(slurp(checkpoint_path(dir, 77)) == encode_checkpoint(c));
}

TEST_CASE("CheckpointWriter: saves in the background, one write in flight, newer snapshots replace waiting ones, "
          "errors come back", "[checkpoint_async]") {
  const auto dir = temp_dir();
  // A FIFO where the writer's temp file for step 1 goes: its open() blocks until we read, so
  // the write is held "in flight" for as long as the test wants, with no timing involved.
  REQUIRE(::mkfifo(temp_path(dir, 1).c_str(), 0644) == 0);
  CheckpointWriter w(dir, 0);
  w.save(sample(1));  // returns although the write cannot even open its file yet
  while (w.waiting()) std::this_thread::yield();  // the writer took snapshot 1 (and is stuck in open)
  w.save(sample(2));
  w.save(sample(3));  // replaces 2, which never started
  REQUIRE(w.superseded() == 1);
  REQUIRE(w.written() == 0);
  drain_fifo(temp_path(dir, 1));  // the write proceeds; fsync of a FIFO fails (EINVAL)
  try {
    w.flush();  // waits for 3 and reports 1's failure
    FAIL("the failed background write was not reported");
  } catch (const std::system_error& e) {
    INFO(e.what());
    REQUIRE(std::string(e.what()).find("fsync") != std::string::npos);
    REQUIRE(std::string(e.what()).find(temp_path(dir, 1)) != std::string::npos);
  }
  REQUIRE(w.written() == 1);
  w.save(sample(4));
  w.close();  // the final save is on disk when close returns
  REQUIRE(w.written() == 2);
  REQUIRE(exists(checkpoint_path(dir, 3)));
  REQUIRE_FALSE(exists(checkpoint_path(dir, 2)));
  auto c = load_latest_checkpoint(dir);
  REQUIRE(c.has_value());
  REQUIRE(c->step == 4);
  REQUIRE(c->sections == sample(4).sections);
  REQUIRE_FALSE(exists(temp_path(dir, 1)));
  REQUIRE_THROWS_AS(w.save(sample(5)), WorkerError);
}

TEST_CASE("CheckpointWriter: a failure of the last write is thrown by close()", "[checkpoint_async]") {
  const auto dir = temp_dir();
  REQUIRE(::mkfifo(temp_path(dir, 9).c_str(), 0644) == 0);
  CheckpointWriter w(dir);
  w.save(sample(9));
  drain_fifo(temp_path(dir, 9));
  REQUIRE_THROWS_AS(w.close(), std::system_error);
  w.close();  // reported once
}

TEST_CASE("CheckpointWriter: temp files of dead or foreign writers are removed at open, live ones kept",
          "[checkpoint_async]") {
  const auto dir = temp_dir();
  const pid_t dead = ::fork();
  REQUIRE(dead >= 0);
  if (dead == 0) ::_exit(0);
  int st = 0;
  REQUIRE(::waitpid(dead, &st, 0) == dead);
  const std::string h = host_name();
  const std::string dead_tmp = dir + "/.ckpt-tmp." + std::to_string(dead) + ".5." + h;
  const std::string live_tmp = dir + "/.ckpt-tmp." + std::to_string(::getppid()) + ".6." + h;
  const std::string foreign_tmp = dir + "/.ckpt-tmp.1.7.another-host-" + h;
  const std::string legacy_tmp = dir + "/.tmp-" + std::to_string(dead) + "-3";
  for (const auto& p : {dead_tmp, live_tmp, foreign_tmp, legacy_tmp}) spit(p, "partial");
  spit(checkpoint_path(dir, 2), encode_checkpoint(sample(2)));
  CheckpointWriter w(dir);
  REQUIRE(w.orphans_removed() == 3);
  REQUIRE_FALSE(exists(dead_tmp));
  REQUIRE_FALSE(exists(foreign_tmp));
  REQUIRE_FALSE(exists(legacy_tmp));
  REQUIRE(exists(live_tmp));
  REQUIRE(exists(checkpoint_path(dir, 2)));
}

TEST_CASE("Checkpoint: extra named state (e.g. a loss scaler) round-trips, with defaults for old files",
          "[checkpoint_async]") {
  Checkpoint c = sample(3);
  c.put_value<float>("loss_scaler/scale", 32768.f);
  c.put_value<int32_t>("loss_scaler/growth_tracker", 1234);
  auto d = decode_checkpoint(encode_checkpoint(c));
  REQUIRE(d.has_value());
  REQUIRE(d->get_value<float>("loss_scaler/scale") == 32768.f);
  REQUIRE(d->get_value_or<int32_t>("loss_scaler/growth_tracker", 0) == 1234);
  auto old = decode_checkpoint(encode_checkpoint(sample(3)));
  REQUIRE(old->get_value_or<float>("loss_scaler/scale", 65536.f) == 65536.f);
  REQUIRE_THROWS_AS(d->get_value<double>("loss_scaler/scale"), WorkerError);  // size mismatch
}
