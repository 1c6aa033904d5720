// The end-of-run resource table (with the all-reduce columns from the progress page's step
// statistics) and the low-GPU-utilisation warning.
#include <catch2/catch.hpp>

#include <utility>
#include <vector>

#include "ddprun/launcher/usage_report.h"

using namespace ddprun::launcher;

TEST_CASE("Without GPU samples the table has wall, CPU, CPU/wall and peak RSS per rank, in rank order", "[usage]") {
  UsageReport r;
  r.host = "n1";
  r.ranks = {
      {.global_rank = 5, .local_rank = 1, .attempt = 2, .wall_s = 100, .cpu_s = 95.5, .peak_rss_bytes = 3ull << 30},
      {.global_rank = 4, .local_rank = 0, .attempt = 2, .wall_s = 100, .cpu_s = 12, .peak_rss_bytes = 412ull << 20}};
  r.earlier_workers = 3;
  r.earlier_cpu_s = 7.25;
  CHECK(format_usage_table(r) == "resource use of attempt 2 on n1 (2 workers; no GPU sampled):\n"
                                 "    rank  wall     CPU     CPU/wall  peak RSS\n"
                                 "    r4    100.0 s  12.0 s  12%       412 MiB\n"
                                 "    r5    100.0 s  95.5 s  96%       3.0 GiB\n"
                                 "    earlier attempts: 3 workers, 7.25 s of CPU");
  CHECK(low_gpu_utilisation_warning(r).empty());  // nothing sampled: nothing to say
}

TEST_CASE("GPU columns appear when a rank was sampled; ranks below the threshold are named", "[usage]") {
  UsageReport r;
  r.host = "g";
  r.ranks = {{.global_rank = 0,
              .wall_s = 10,
              .cpu_s = 10,
              .peak_rss_bytes = 2048,
              .gpu_index = 0,
              .gpu_seconds = 9.2,
              .gpu_util_mean = 0.92,
              .gpu_sampled_s = 60},
             {.global_rank = 1,
              .wall_s = 10,
              .cpu_s = 10,
              .peak_rss_bytes = 2048,
              .gpu_index = 1,
              .gpu_seconds = 4.1,
              .gpu_util_mean = 0.41,
              .gpu_sampled_s = 60},
             {.global_rank = 3,
              .wall_s = 10,
              .cpu_s = 10,
              .peak_rss_bytes = 100,
              .gpu_index = 3,
              .gpu_seconds = 6.0,
              .gpu_util_mean = 0.6,
              .gpu_sampled_s = 60}};
  const std::string t = format_usage_table(r);
  CHECK(t.find("rank  wall    CPU     CPU/wall  peak RSS  GPU  GPU-s   GPU util") != std::string::npos);
  CHECK(t.find("r1    10.0 s  10.0 s  100%      2.0 KiB   1    4.10 s  41%") != std::string::npos);
  CHECK(t.find("r3    10.0 s  10.0 s  100%      100 B     3    6.00 s  60%") != std::string::npos);
  const std::string w = low_gpu_utilisation_warning(r);
  CHECK(w.rfind("mean GPU utilisation below 85% (--gpu_util_warn=0.85): r1 41%, r3 60%;", 0) == 0);
  r.gpu_util_warn = 0.5;
  CHECK(low_gpu_utilisation_warning(r).rfind("mean GPU utilisation below 50% (--gpu_util_warn=0.5): r1 41%;", 0) == 0);
  r.gpu_util_warn = 0;
  CHECK(low_gpu_utilisation_warning(r).empty());
}

TEST_CASE("The failed rank's row is marked; a worker never reaped shows dashes", "[usage]") {
  UsageReport r;
  r.host = "n1";
  r.ranks = {
      {.global_rank = 1, .attempt = 0, .wall_s = 2, .cpu_s = 1, .peak_rss_bytes = 2048, .failure = "exit code 1"},
      {.global_rank = 0, .attempt = 0, .measured = false}};
  CHECK(format_usage_table(r) == "resource use of attempt 0 on n1 (2 workers; no GPU sampled):\n"
                                 "    rank  wall    CPU     CPU/wall  peak RSS\n"
                                 "    r0    -       -       -         -\n"
                                 "    r1    2.00 s  1.00 s  50%       2.0 KiB   <- failed: exit code 1");
}

TEST_CASE("No GPU warning for a run too short to judge", "[usage]") {
  UsageReport r;
  r.host = "g";
  // An 8-second job: its GPU sampled for 7 s, mostly start-up.
  r.ranks = {{.global_rank = 0,
              .wall_s = 8,
              .cpu_s = 8,
              .gpu_index = 0,
              .gpu_seconds = 1.4,
              .gpu_util_mean = 0.2,
              .gpu_sampled_s = 7}};
  CHECK(low_gpu_utilisation_warning(r).empty());
  r.ranks[0].gpu_sampled_s = kMinGpuJudgeS - 1;
  CHECK(low_gpu_utilisation_warning(r).empty());
  r.ranks[0].gpu_sampled_s.reset();  // not known: not judged
  CHECK(low_gpu_utilisation_warning(r).empty());
  r.ranks[0].gpu_sampled_s = kMinGpuJudgeS;
  CHECK(low_gpu_utilisation_warning(r).rfind("mean GPU utilisation below 85% (--gpu_util_warn=0.85): r0 20%;", 0) == 0);
}

TEST_CASE("No worker, no table; human-readable sizes", "[usage]") {
  CHECK(format_usage_table(UsageReport{}).empty());
  CHECK(human_bytes(0) == "0 B");
  CHECK(human_bytes(1536) == "1.5 KiB");
  CHECK(human_bytes(412ull << 20) == "412 MiB");
  CHECK(human_bytes(5ull << 40) == "5.0 TiB");
}

namespace {
// A progress page as a worker leaves it: little-endian words at their offsets (hang.h).
std::vector<unsigned char> page_with(std::vector<std::pair<size_t, uint64_t>> words) {
  std::vector<unsigned char> p(kProgressFileBytes, 0);
  for (const auto& [off, v] : words)
    for (size_t i = 0; i < 8; ++i) p[off + i] = static_cast<unsigned char>(v >> (8 * i));
  return p;
}
}  // namespace

TEST_CASE("The step statistics are read from their words of the progress page", "[usage]") {
  CHECK(kStepStatsOffset == 16);
  CHECK(kStepStatsEnd == 56);
  const auto p = page_with(
      {{0, kProgressMagic}, {8, 41}, {16, 1}, {24, 40}, {32, 4'000'000'000}, {40, 1'000'000'000}, {48, 250'000'000}});
  const auto s = parse_step_stats(p.data(), p.size());
  REQUIRE(s);
  CHECK(s->steps == 40);
  CHECK(s->step_ns == 4'000'000'000u);
  CHECK(s->comm_ns == 1'000'000'000u);
  CHECK(s->exposed_ns == 250'000'000u);
  CHECK(parse_step_stats(p.data(), kStepStatsEnd));  // the words up to the last one suffice
  CHECK_FALSE(parse_step_stats(p.data(), kStepStatsEnd - 1));
  CHECK_FALSE(parse_step_stats(nullptr, 0));
  // Ticks but no statistics (a Python worker, the NCCL path): none.
  const auto ticks_only = page_with({{0, kProgressMagic}, {8, 41}});
  CHECK_FALSE(parse_step_stats(ticks_only.data(), ticks_only.size()));
  // Not a progress file, or statistics of a version this agent does not know: none.
  const auto no_magic = page_with({{0, 7}, {16, 1}, {24, 40}, {32, 4}});
  CHECK_FALSE(parse_step_stats(no_magic.data(), no_magic.size()));
  const auto v2 = page_with({{0, kProgressMagic}, {16, 2}, {24, 40}, {32, 4}});
  CHECK_FALSE(parse_step_stats(v2.data(), v2.size()));
}

TEST_CASE("Step statistics become the all-reduce's share of the step and the part of it hidden", "[usage]") {
  RankUsage u;
  add_step_stats(u, {.steps = 40, .step_ns = 4'000'000'000, .comm_ns = 1'000'000'000, .exposed_ns = 250'000'000});
  REQUIRE(u.allreduce_share);
  REQUIRE(u.allreduce_hidden);
  CHECK(*u.allreduce_share == Approx(0.25));
  CHECK(*u.allreduce_hidden == Approx(0.75));
  RankUsage none;
  add_step_stats(none, {.steps = 0, .step_ns = 0, .comm_ns = 0, .exposed_ns = 0});
  CHECK_FALSE(none.allreduce_share);
  CHECK_FALSE(none.allreduce_hidden);
  // No collective time measured: a share of 0 and nothing to say about hiding it.
  RankUsage idle;
  add_step_stats(idle, {.steps = 3, .step_ns = 3000, .comm_ns = 0, .exposed_ns = 0});
  CHECK(idle.allreduce_share == 0.0);
  CHECK_FALSE(idle.allreduce_hidden);
  // Out of range totals are clamped: never above 100%, never below 0%.
  RankUsage odd;
  add_step_stats(odd, {.steps = 1, .step_ns = 100, .comm_ns = 200, .exposed_ns = 300});
  CHECK(*odd.allreduce_share == 1.0);
  CHECK(*odd.allreduce_hidden == 0.0);
}

TEST_CASE("The all-reduce columns appear when a rank reported, '-' for the ranks that did not", "[usage]") {
  UsageReport r;
  r.host = "n1";
  r.ranks = {{.global_rank = 0,
              .wall_s = 10,
              .cpu_s = 9,
              .peak_rss_bytes = 2048,
              .allreduce_share = 0.25,
              .allreduce_hidden = 0.75},
             {.global_rank = 1, .wall_s = 10, .cpu_s = 1, .peak_rss_bytes = 2048},
             {.global_rank = 2,
              .wall_s = 10,
              .cpu_s = 9,
              .peak_rss_bytes = 2048,
              .allreduce_share = 0.003,
              .allreduce_hidden = 0.997},
             {.global_rank = 3, .wall_s = 10, .cpu_s = 9, .peak_rss_bytes = 2048, .allreduce_share = 0.0}};
  CHECK(format_usage_table(r) == "resource use of attempt 0 on n1 (4 workers; no GPU sampled):\n"
                                 "    rank  wall    CPU     CPU/wall  peak RSS  all-reduce/step  hidden\n"
                                 "    r0    10.0 s  9.00 s  90%       2.0 KiB   25%              75%\n"
                                 "    r1    10.0 s  1.00 s  10%       2.0 KiB   -                -\n"
                                 "    r2    10.0 s  9.00 s  90%       2.0 KiB   <1%              >99%\n"
                                 "    r3    10.0 s  9.00 s  90%       2.0 KiB   0%               -");
  // With the GPU columns: after them.
  r.ranks[1].gpu_index = 0;
  r.ranks[1].gpu_seconds = 5;
  r.ranks[1].gpu_util_mean = 0.5;
  const std::string t = format_usage_table(r);
  CHECK(t.find("rank  wall    CPU     CPU/wall  peak RSS  GPU  GPU-s   GPU util  all-reduce/step  hidden") !=
        std::string::npos);
  CHECK(t.find("r0    10.0 s  9.00 s  90%       2.0 KiB   -    -       -         25%              75%") !=
        std::string::npos);
  CHECK(t.find("r1    10.0 s  1.00 s  10%       2.0 KiB   0    5.00 s  50%       -                -") !=
        std::string::npos);
}
