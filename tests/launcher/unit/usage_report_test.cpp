// The end-of-run resource table and the low-GPU-utilisation warning.
#include <catch2/catch.hpp>

#include "ddprun/launcher/usage_report.h"

using namespace ddprun::launcher;

TEST_CASE("Without GPU samples the table has wall, CPU, CPU/wall and peak RSS per rank, in rank order", "[usage]") {
  UsageReport r;
  r.host = "n1";
  r.ranks = {{.global_rank = 5, .local_rank = 1, .attempt = 2, .wall_s = 100, .cpu_s = 95.5, .peak_rss_bytes = 3ull << 30},
             {.global_rank = 4, .local_rank = 0, .attempt = 2, .wall_s = 100, .cpu_s = 12, .peak_rss_bytes = 412ull << 20}};
  r.earlier_workers = 3;
  r.earlier_cpu_s = 7.25;
  CHECK(format_usage_table(r) ==
        "resource use of attempt 2 on n1 (2 workers; no GPU sampled):\n"
        "    rank  wall     CPU     CPU/wall  peak RSS\n"
        "    r4    100.0 s  12.0 s  12%       412 MiB\n"
        "    r5    100.0 s  95.5 s  96%       3.0 GiB\n"
        "    earlier attempts: 3 workers, 7.25 s of CPU");
  CHECK(low_gpu_utilisation_warning(r).empty());  // nothing sampled: nothing to say
}

TEST_CASE("GPU columns appear when a rank was sampled; ranks below the threshold are named", "[usage]") {
  UsageReport r;
  r.host = "g";
  r.ranks = {{.global_rank = 0, .wall_s = 10, .cpu_s = 10, .peak_rss_bytes = 2048, .gpu_index = 0, .gpu_seconds = 9.2, .gpu_util_mean = 0.92},
             {.global_rank = 1, .wall_s = 10, .cpu_s = 10, .peak_rss_bytes = 2048, .gpu_index = 1, .gpu_seconds = 4.1, .gpu_util_mean = 0.41},
             {.global_rank = 3, .wall_s = 10, .cpu_s = 10, .peak_rss_bytes = 100, .gpu_index = 3, .gpu_seconds = 6.0, .gpu_util_mean = 0.6}};
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

TEST_CASE("No worker, no table; human-readable sizes", "[usage]") {
  CHECK(format_usage_table(UsageReport{}).empty());
  CHECK(human_bytes(0) == "0 B");
  CHECK(human_bytes(1536) == "1.5 KiB");
  CHECK(human_bytes(412ull << 20) == "412 MiB");
  CHECK(human_bytes(5ull << 40) == "5.0 TiB");
}
