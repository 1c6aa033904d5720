#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <string>

#include "ddprun/worker/checkpoint.h"
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
