#include <algorithm>
#include <catch2/catch.hpp>
#include <set>

#include "ddprun/worker/checks.h"
#include "ddprun/worker/sampler.h"

using namespace ddprun::worker;

namespace {
std::vector<size_t> all_ranks(size_t n, int R, bool shuffle, bool drop_last, uint64_t epoch, uint64_t seed = 0) {
  std::vector<size_t> out;
  for (int r = 0; r < R; ++r) {
    DistributedSampler s({n, R, r, shuffle, seed, drop_last});
    s.set_epoch(epoch);
    out.insert(out.end(), s.indices().begin(), s.indices().end());
  }
  return out;
}
}  // namespace

TEST_CASE("Sampler: shards are disjoint and cover the dataset when it divides evenly", "[sampler]") {
  auto all = all_ranks(100, 4, true, false, 0);
  REQUIRE(all.size() == 100);
  std::set<size_t> uniq(all.begin(), all.end());
  REQUIRE(uniq.size() == 100);
  REQUIRE(*uniq.rbegin() == 99);
}

TEST_CASE("Sampler: padding repeats the head like PyTorch (drop_last=false)", "[sampler]") {
  DistributedSampler s0({10, 4, 0, false, 0, false});
  REQUIRE(s0.num_samples() == 3);
  REQUIRE(s0.total_size() == 12);
  // unshuffled: 0..9 + [0,1]; rank r takes r, r+4, r+8
  REQUIRE(s0.indices() == std::vector<size_t>{0, 4, 8});
  DistributedSampler s3({10, 4, 3, false, 0, false});
  REQUIRE(s3.indices() == std::vector<size_t>{3, 7, 1});
  auto all = all_ranks(10, 4, true, false, 2);
  std::set<size_t> uniq(all.begin(), all.end());
  REQUIRE(uniq.size() == 10);  // every sample seen, two twice
}

TEST_CASE("Sampler: padding larger than the dataset wraps several times", "[sampler]") {
  DistributedSampler s({2, 5, 4, false, 0, false});
  REQUIRE(s.num_samples() == 1);
  REQUIRE(s.indices() == std::vector<size_t>{0});  // [0,1,0,1,0] -> rank 4 gets index 4 -> 0
}

TEST_CASE("Sampler: drop_last truncates to a multiple of the replicas", "[sampler]") {
  DistributedSampler s({10, 4, 1, false, 0, true});
  REQUIRE(s.num_samples() == 2);
  REQUIRE(s.indices() == std::vector<size_t>{1, 5});
  auto all = all_ranks(10, 4, true, true, 0);
  std::set<size_t> uniq(all.begin(), all.end());
  REQUIRE(all.size() == 8);
  REQUIRE(uniq.size() == 8);
}

TEST_CASE("Sampler: set_epoch reshuffles deterministically; ranks agree", "[sampler]") {
  auto e0 = all_ranks(64, 2, true, false, 0, 7);
  auto e0b = all_ranks(64, 2, true, false, 0, 7);
  auto e1 = all_ranks(64, 2, true, false, 1, 7);
  REQUIRE(e0 == e0b);
  REQUIRE(e0 != e1);
  auto s0 = e0;
  std::sort(s0.begin(), s0.end());
  auto s1 = e1;
  std::sort(s1.begin(), s1.end());
  REQUIRE(s0 == s1);
  REQUIRE(all_ranks(64, 2, true, false, 0, 8) != e0);  // seed matters
}

TEST_CASE("Sampler: batch(step) resumes mid-epoch at the same indices", "[sampler]") {
  DistributedSampler s({100, 2, 1, true, 3, false});
  s.set_epoch(4);
  REQUIRE(s.num_batches(20) == 3);
  std::vector<size_t> joined;
  for (size_t b = 0; b < s.num_batches(20); ++b) {
    auto v = s.batch(b, 20);
    joined.insert(joined.end(), v.begin(), v.end());
  }
  REQUIRE(joined == s.indices());
  REQUIRE(s.batch(2, 20).size() == 10);
  DistributedSampler fresh({100, 2, 1, true, 3, false});
  fresh.set_epoch(4);
  REQUIRE(fresh.batch(1, 20) == s.batch(1, 20));
}

TEST_CASE("Sampler: bad rank is rejected", "[sampler]") {
  REQUIRE_THROWS_AS(DistributedSampler({10, 2, 2, true, 0, false}), WorkerError);
  REQUIRE_THROWS_AS(DistributedSampler({0, 2, 0, true, 0, false}), WorkerError);
}

TEST_CASE("Sampler: a given permutation replaces the shuffle, gets seed + epoch, and is checked", "[sampler]") {
  std::vector<uint64_t> seeds;
  SamplerOptions o{.dataset_size = 5, .num_replicas = 2, .rank = 1, .shuffle = true, .seed = 10};
  o.permutation = [&](size_t n, uint64_t seed) {
    seeds.push_back(seed);
    std::vector<size_t> p(n);
    for (size_t i = 0; i < n; ++i) p[i] = n - 1 - i;  // 4 3 2 1 0
    return p;
  };
  DistributedSampler s(o);
  // 4 3 2 1 0, padded with its head to 6: 4 3 2 1 0 4; rank 1 takes 3 1 4.
  CHECK(s.indices() == std::vector<size_t>{3, 1, 4});
  s.set_epoch(2);
  CHECK(seeds == std::vector<uint64_t>{10, 12});
  o.permutation = [](size_t n, uint64_t) { return std::vector<size_t>(n, 0); };  // not a permutation
  CHECK_THROWS_AS(DistributedSampler(o), WorkerError);
  o.shuffle = false;  // no shuffle: the permutation is not asked
  CHECK(DistributedSampler(o).indices() == std::vector<size_t>{1, 3, 0});
}
