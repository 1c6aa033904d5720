// Safety of the shared-memory all-reduce through the public communicator (real Gloo mesh, real
// store, real /dev/shm): ranks that issue different collectives get an error naming the op
// instead of each other's data; every dtype reduces (f16/bf16 accumulated in float); and
// SIGKILLs of `train` ranks at random moments of start-up leave nothing in /dev/shm.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/worker/store.h"
#include "gloo_ranks.h"
#include "spawn_logged.h"
#include "ddprun/server/store_server.h"
#include "ddprun/worker/checks.h"
#include "ddprun/worker/communicator.h"

using namespace ddprun::worker;

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

// Every rank a thread with its own store connection and (by default shm-enabled) Gloo
// communicator; returns each rank's exception message ("" when none).
std::vector<std::string> on_ranks(int world, const std::function<void(int, Communicator&)>& body,
                                  bool shared_memory = true) {
  return testing::on_gloo_ranks(world, shared_memory, std::chrono::seconds(30), body);
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16_exact(float f) {  // only for values bf16 holds exactly
  uint32_t u;
  std::memcpy(&u, &f, 4);
  REQUIRE((u & 0xffffu) == 0);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace

TEST_CASE("shm: ranks issuing different collectives get an error naming the ranks and the ops", "[shm_safety]") {
  struct Case {
    const char* what;
    size_t count1;
    DType dtype1;
    ReduceOp op1;
    const char* expect;
  };
  const Case cases[] = {
      {"count", 20, DType::F32, ReduceOp::Sum, "allreduce(fp32, 20 elements, sum)"},
      {"dtype", 10, DType::I32, ReduceOp::Sum, "allreduce(int32, 10 elements, sum)"},
      {"op", 10, DType::F32, ReduceOp::Max, "allreduce(fp32, 10 elements, max)"},
  };
  for (const Case& c : cases) {
    INFO("mismatch in " << c.what);
    std::vector<std::vector<float>> after(2);
    const auto errors = on_ranks(2, [&](int r, Communicator& comm) {
      REQUIRE(testing::shm_path(comm).alloc_shared(64) != nullptr);  // the shm path is on
      std::vector<float> ok(8, 1.f);
      comm.allreduce(ok.data(), ok.size(), DType::F32, ReduceOp::Sum);  // #1 matches
      std::vector<float> buf(32, static_cast<float>(r + 1));
      if (r == 0) {
        comm.allreduce(buf.data(), 10, DType::F32, ReduceOp::Sum);
      } else {
        comm.allreduce(buf.data(), c.count1, c.dtype1, c.op1);
      }
    });
    for (int r = 0; r < 2; ++r) {
      const std::string& e = errors[static_cast<size_t>(r)];
      INFO("rank " << r << ": " << e);
      REQUIRE(has(e, "shm collective mismatch seen by rank " + std::to_string(r)));
      REQUIRE(has(e, "rank " + std::to_string(r) + " (this one) issued"));
      // #1: alloc_shared's barrier, #2: the matching all-reduce.
      REQUIRE(has(e, std::string("issued #3 ") + c.expect));           // rank 1's op
      REQUIRE(has(e, "issued #3 allreduce(fp32, 10 elements, sum)"));  // rank 0's op
      REQUIRE(has(e, "Expected every rank to issue the same collectives"));
    }
  }
}

TEST_CASE("shm: a shared buffer reduced at different places on different ranks is an error", "[shm_safety]") {
  const auto errors = on_ranks(2, [&](int r, Communicator& comm) {
    auto* p = static_cast<float*>(testing::shm_path(comm).alloc_shared(1024 * sizeof(float)));
    REQUIRE(p != nullptr);
    comm.allreduce(p + (r == 0 ? 0 : 16), 100, DType::F32, ReduceOp::Sum);
  });
  for (int r = 0; r < 2; ++r) {
    INFO(errors[static_cast<size_t>(r)]);
    REQUIRE(has(errors[static_cast<size_t>(r)], "shared buffer at region 0 offset 64"));
  }
}

TEST_CASE("shm: every dtype, staged and zero-copy; f16/bf16 accumulate in float", "[shm_safety]") {
  const int world = 3;
  std::vector<std::string> failures(world);
  const auto errors = on_ranks(world, [&](int r, Communicator& comm) {
    auto fail = [&](const std::string& m) {
      if (failures[static_cast<size_t>(r)].empty()) failures[static_cast<size_t>(r)] = m;
    };
    // 5 M elements: more than one 8 MiB chunk for every type on the staged path.
    const size_t big = 5u << 20;
    for (bool shared : {false, true}) {
      const size_t n = shared ? 4096 : big;
      auto buffer = [&](size_t bytes, std::vector<unsigned char>& own) -> void* {
        if (shared) return testing::shm_path(comm).alloc_shared(bytes);
        own.assign(bytes, 0);
        return own.data();
      };
      std::vector<unsigned char> s64, s32, s16a, s16b, sf64, si32;
      auto* f64 = static_cast<double*>(buffer(n * 8, sf64));
      auto* i64 = static_cast<int64_t*>(buffer(n * 8, s64));
      auto* i32 = static_cast<int32_t*>(buffer(n * 4, si32));
      auto* f32 = static_cast<float*>(buffer(n * 4, s32));
      auto* h = static_cast<_Float16*>(buffer(n * 2, s16a));
      auto* bf = static_cast<uint16_t*>(buffer(n * 2, s16b));
      if (!f64 || !i64 || !i32 || !f32 || !h || !bf) return fail("alloc_shared failed");
      for (size_t i = 0; i < n; ++i) {
        const auto v = static_cast<int64_t>((i % 1000) * 3 + static_cast<size_t>(r));
        f64[i] = static_cast<double>(v) * 0.25;
        i64[i] = v * 1000000007LL;
        i32[i] = static_cast<int32_t>(v);
        f32[i] = static_cast<float>(v) * 0.25f;
        // 2048 + 1 + 1: in f16 arithmetic each + 1 would round back to 2048 (spacing 2 there, ties
        // to even); accumulated in float the sum is 2050, which f16 holds. Likewise bf16 at 256.
        h[i] = static_cast<_Float16>(r == 0 ? 2048.f : 1.f);
        bf[i] = float_to_bf16_exact(i % 2 ? (r == 0 ? 256.f : 1.f) : static_cast<float>(r + 1));
      }
      comm.allreduce(f64, n, DType::F64, ReduceOp::Sum);
      comm.allreduce(i64, n, DType::I64, ReduceOp::Sum);
      comm.allreduce(i32, n, DType::I32, ReduceOp::Max);
      comm.allreduce(f32, n, DType::F32, ReduceOp::Avg);
      comm.allreduce(h, n, DType::F16, ReduceOp::Sum);
      comm.allreduce(bf, n, DType::BF16, ReduceOp::Sum);
      for (size_t i = 0; i < n; ++i) {
        const auto base = static_cast<int64_t>((i % 1000) * 3);
        const int64_t sum = 3 * base + 0 + 1 + 2;
        if (f64[i] != static_cast<double>(sum) * 0.25) return fail("f64 at " + std::to_string(i));
        if (i64[i] != sum * 1000000007LL) return fail("i64 at " + std::to_string(i));
        if (i32[i] != base + 2) return fail("i32 max at " + std::to_string(i));
        if (f32[i] != static_cast<float>(sum) * 0.25f / 3.f) return fail("f32 avg at " + std::to_string(i));
        if (static_cast<float>(h[i]) != 2050.f)
          return fail("f16 at " + std::to_string(i) + ": " + std::to_string(static_cast<float>(h[i])));
        const float want_bf = i % 2 ? 258.f : 6.f;
        if (bf16_to_float(bf[i]) != want_bf) return fail("bf16 avg at " + std::to_string(i));
      }
    }
  });
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[static_cast<size_t>(r)] == "");
    REQUIRE(failures[static_cast<size_t>(r)] == "");
  }
}

// ---- SIGKILL at random moments of start-up: nothing left in /dev/shm ----------------------------

namespace {

pid_t spawn_train(int rank, int world, uint16_t port, const std::string& log) {
  std::vector<std::string> args{TRAIN_EXE, "--profile", "--width", "64",       "--depth",
                                "2",       "--epochs",  "1",       "--device", "cpu"};
  return testing::spawn_logged(
      args,
      std::vector<std::string>{"RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(world),
                               "LOCAL_RANK=" + std::to_string(rank), "LOCAL_WORLD_SIZE=" + std::to_string(world),
                               std::string("MASTER_ADDR=127.0.0.1"), "MASTER_PORT=" + std::to_string(port),
                               std::string("DDPRUN_DEVICE=cpu"), std::string("TORCHELASTIC_USE_AGENT_STORE=True")},
      log);
}

// What /dev/shm holds: its entries and its used blocks. In the private tmpfs the test runs in
// (with_private_devshm.sh) nothing but this test's processes touches it, so after they are all
// dead both must be back where they started: a named leftover shows in the listing, and any
// file still holding memory (named, or unlinked but somehow kept) shows in the blocks.
struct DevShm {
  std::set<std::string> entries;
  unsigned long long used_bytes = 0;
};
DevShm devshm_now() {
  DevShm s;
  DIR* d = ::opendir("/dev/shm");
  REQUIRE(d != nullptr);
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") s.entries.insert(n);
  }
  ::closedir(d);
  struct statvfs vs {};
  REQUIRE(::statvfs("/dev/shm", &vs) == 0);
  s.used_bytes = static_cast<unsigned long long>(vs.f_blocks - vs.f_bfree) * vs.f_frsize;
  return s;
}

}  // namespace

TEST_CASE("shm: SIGKILL of a rank at random moments of start-up, 100 times, leaves nothing in /dev/shm", "[shm_kill]") {
  // On the host's /dev/shm other programs come and go, so no before/after comparison there
  // could be trusted; ctest runs this through with_private_devshm.sh.
  const char* priv = std::getenv("DDPRUN_TEST_PRIVATE_DEVSHM");
  INFO("run this test through tests/worker_runtime/with_private_devshm.sh (a private tmpfs on /dev/shm)");
  REQUIRE((priv != nullptr && std::string(priv) == "1"));
  const DevShm before = devshm_now();
  char tmpl[] = "/tmp/ddprun-shmkill-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  ddprun::server::StoreServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  ddprun::server::StoreServer server(so);
  server.start();
  auto reap = [](pid_t pid) {
    int st = 0;
    ::waitpid(pid, &st, 0);
    return st;
  };
  // One uninterrupted run sets the range of kill moments: start-up plus a bit of training.
  server.reset_keyspace();
  const auto t0 = Clock::now();
  pid_t a = spawn_train(0, 2, server.port(), dir + "/clean0.log");
  pid_t b = spawn_train(1, 2, server.port(), dir + "/clean1.log");
  const int sa = reap(a), sb = reap(b);
  REQUIRE(WIFEXITED(sa));
  REQUIRE(WEXITSTATUS(sa) == 0);
  REQUIRE(WIFEXITED(sb));
  REQUIRE(WEXITSTATUS(sb) == 0);
  {  // the runs below do use the shared-memory path (here, in the private tmpfs)
    std::ifstream in(dir + "/clean0.log");
    const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    INFO(log);
    REQUIRE(has(log, "step=fused(shm)"));
  }
  const auto span_us =
      std::max<int64_t>(1000, std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count());
  std::mt19937_64 rng(std::random_device{}());
  const auto deadline = Clock::now() + std::chrono::seconds(150);
  int trials = 0;
  for (; trials < 100 && Clock::now() < deadline; ++trials) {
    server.reset_keyspace();
    const pid_t p[2] = {spawn_train(0, 2, server.port(), dir + "/r0.log"),
                        spawn_train(1, 2, server.port(), dir + "/r1.log")};
    const int victim = static_cast<int>(rng() % 2);
    // The kill moments themselves are what is random; nothing waits on them for ordering.
    std::this_thread::sleep_for(
        std::chrono::microseconds(static_cast<int64_t>(rng() % static_cast<uint64_t>(span_us))));
    ::kill(p[victim], SIGKILL);
    // The launcher's teardown of the survivor, at another random moment.
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(rng() % 20000)));
    ::kill(p[1 - victim], SIGKILL);
    reap(p[0]);
    reap(p[1]);
  }
  INFO("trials " << trials << ", kill moments within " << span_us << " us of the start");
  REQUIRE(trials >= 30);  // bounded time on a loaded box; normally all 100 run
  // Every process is reaped: the kernel has dropped their descriptors and mappings.
  const DevShm after = devshm_now();
  std::vector<std::string> added;
  for (const auto& n : after.entries)
    if (!before.entries.count(n)) added.push_back(n);
  INFO("new entries in /dev/shm: " << added.size() << (added.empty() ? "" : " e.g. " + added.front()));
  INFO("/dev/shm used bytes before " << before.used_bytes << ", after " << after.used_bytes);
  CHECK(added.empty());
  CHECK(after.used_bytes == before.used_bytes);
  std::filesystem::remove_all(dir);
}

// ---- the debug-mode collective check for Gloo over TCP (collective_check.h) --------------------

#include <barrier>

#include "collective_check.h"

TEST_CASE("CollectiveChecker: matching collectives pass, different ones fail on every rank with both ops",
          "[collective_check]") {
  const int world = 3;
  std::vector<CollectiveSignature> board(world);
  std::barrier sync(world);
  // An all-gather over threads: everyone writes its slot, waits, reads all, waits.
  auto all_gather = [&](int r) {
    return [&, r](const void* mine, void* all, size_t bytes) {
      REQUIRE(bytes == sizeof(CollectiveSignature));
      std::memcpy(&board[static_cast<size_t>(r)], mine, bytes);
      sync.arrive_and_wait();
      std::memcpy(all, board.data(), bytes * world);
      sync.arrive_and_wait();
    };
  };
  std::vector<std::string> errors(world);
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      CollectiveChecker c(r, world);
      try {
        c.check(CollectiveOp::AllReduce, DType::F32, 100, static_cast<int>(ReduceOp::Sum), all_gather(r));
        c.check(CollectiveOp::Broadcast, DType::F32, 64, 0, all_gather(r));
        if (r == 2) {
          c.check(CollectiveOp::Broadcast, DType::F32, 64, 0, all_gather(r));  // rank 2 skipped an all-reduce
        } else {
          c.check(CollectiveOp::AllReduce, DType::BF16, 100, static_cast<int>(ReduceOp::Avg), all_gather(r));
        }
      } catch (const CommError& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < world; ++r) {
    const std::string& e = errors[static_cast<size_t>(r)];
    INFO("rank " << r << ": " << e);
    REQUIRE(has(e, "collective mismatch (DDPRUN_DEBUG_COLLECTIVES) seen by rank " + std::to_string(r)));
    REQUIRE(has(e, "issued #3 allreduce(bf16, 100 elements, avg)"));
    REQUIRE(has(e, "issued #3 broadcast(64 bytes, root 0)"));
    REQUIRE_FALSE(has(e, "#2"));
  }
}

TEST_CASE("collective check in two halves (the NCCL path): next() numbers signatures, verify() names who differs",
          "[collective_check]") {
  // The NCCL communicator gathers the table through device memory itself and hands it to
  // verify(); this is the part of that path that runs without a GPU.
  CollectiveChecker c(1, 3);
  const CollectiveSignature first = c.next(CollectiveOp::AllReduce, DType::BF16, 4096, static_cast<int>(ReduceOp::Sum));
  REQUIRE(first.seq == 1);
  std::vector<CollectiveSignature> table(3, first);
  REQUIRE_NOTHROW(c.verify(first, table.data()));  // all agree

  const CollectiveSignature second = c.next(CollectiveOp::Broadcast, DType::F32, 64, 0);
  REQUIRE(second.seq == 2);
  table.assign(3, second);
  // Rank 2 is one collective ahead with another op (it skipped this broadcast): an error on this
  // rank naming rank 2, its op and number, and what this rank expected.
  table[2] = CollectiveSignature{3,
                                 4096,
                                 static_cast<uint32_t>(CollectiveOp::AllReduce),
                                 static_cast<uint32_t>(DType::BF16),
                                 static_cast<int32_t>(ReduceOp::Sum),
                                 0};
  try {
    c.verify(second, table.data());
    FAIL("verify accepted a table in which rank 2 issued another collective");
  } catch (const CommError& e) {
    const std::string m = e.what();
    INFO(m);
    REQUIRE(has(m, "collective mismatch (DDPRUN_DEBUG_COLLECTIVES) seen by rank 1"));
    REQUIRE(has(m, "rank 1 (this one) issued #2 broadcast(64 bytes, root 0)"));
    REQUIRE(has(m, "rank 2 issued #3 allreduce(bf16, 4096 elements, sum)"));
    REQUIRE_FALSE(has(m, "rank 0 issued"));
  }
  // Same op, another count (a rank-dependent bucket layout): also an error.
  table.assign(3, second);
  table[0].count = 32;
  REQUIRE_THROWS_WITH(c.verify(second, table.data()), Catch::Contains("rank 0 issued #2 broadcast(32 bytes, root 0)"));
}

TEST_CASE("Gloo over TCP with DDPRUN_DEBUG_COLLECTIVES=1: ranks that issue different collectives fail naming both",
          "[collective_check]") {
  // Read once per process: ctest runs this tag in its own process, before any communicator.
  ::setenv("DDPRUN_DEBUG_COLLECTIVES", "1", 1);
  REQUIRE(debug_collectives_enabled());
  const auto errors = on_ranks(
      2,
      [](int r, Communicator& c) {
        std::vector<float> a(8, 1.f);
        c.allreduce(a.data(), a.size(), DType::F32, ReduceOp::Sum);  // matching: passes
        REQUIRE(a[0] == 2.f);
        if (r == 0) {
          c.allreduce(a.data(), 4, DType::F32, ReduceOp::Sum);
        } else {
          c.broadcast(a.data(), 4 * sizeof(float), 0);
        }
      },
      /*shared_memory=*/false);
  for (int r = 0; r < 2; ++r) {
    const std::string& e = errors[static_cast<size_t>(r)];
    INFO("rank " << r << ": " << e);
    REQUIRE(has(e, "collective mismatch (DDPRUN_DEBUG_COLLECTIVES) seen by rank " + std::to_string(r)));
    REQUIRE(has(e, "allreduce(fp32, 4 elements, sum)"));
    REQUIRE(has(e, "broadcast(16 bytes, root 0)"));
  }
}

// ---- the 0/1 knobs (knob_flag.h) ---------------------------------------------------------------

#include "knob_flag.h"

TEST_CASE("0/1 knobs: unset is the default, 0 and 1 are off and on, anything else names the variable",
          "[collective_check]") {
  namespace knobs = ddprun::knobs;
  REQUIRE(parse_knob_flag(knobs::kShm, std::nullopt));
  REQUIRE_FALSE(parse_knob_flag(knobs::kDebugCollectives, std::nullopt));
  REQUIRE(parse_knob_flag(knobs::kShm, "1"));
  REQUIRE_FALSE(parse_knob_flag(knobs::kShm, "0"));
  for (const char* bad : {"yes", "true", "on", "2", " 1", "01", "off"}) {
    INFO(bad);
    try {
      parse_knob_flag(knobs::kShm, std::string(bad));
      FAIL("accepted DDPRUN_SHM='" << bad << "'");
    } catch (const WorkerError& e) {
      REQUIRE(std::string(e.what()).rfind(std::string("DDPRUN_SHM='") + bad + "': expected 0 or 1", 0) == 0);
    }
  }
  REQUIRE_THROWS_WITH(parse_knob_flag(knobs::kDebugCollectives, std::string("true")),
                      Catch::Contains("DDPRUN_DEBUG_COLLECTIVES='true': expected 0 or 1"));
}

// broadcast over one-copy memory moves no bytes, but it is still a collective: ranks naming
// different places (or roots) get the mismatch error, not a silent barrier.
TEST_CASE("shm: broadcast over one-copy memory at different places on different ranks is an error", "[shm_safety]") {
  const auto errors = on_ranks(2, [&](int r, Communicator& comm) {
    auto* p = static_cast<float*>(testing::shm_path(comm).alloc_shared_single(1024 * sizeof(float)));
    if (!p) throw std::runtime_error("no one-copy memory");
    comm.broadcast(p + (r == 0 ? 0 : 16), 100 * sizeof(float), 0);
  });
  for (int r = 0; r < 2; ++r) {
    INFO(errors[static_cast<size_t>(r)]);
    REQUIRE(has(errors[static_cast<size_t>(r)], "shm collective mismatch"));
    REQUIRE(
        has(errors[static_cast<size_t>(r)], "broadcast(400 bytes from rank 0, one-copy buffer at region 0 offset 64)"));
    REQUIRE(
        has(errors[static_cast<size_t>(r)], "broadcast(400 bytes from rank 0, one-copy buffer at region 0 offset 0)"));
  }
}

// The collectives that go over Gloo take part in the shm path's op check: one rank in a shm
// all-reduce and the other in a Gloo broadcast (or barrier) fail at once naming both, instead
// of each waiting for the other until the timeout.
TEST_CASE("shm: a rank in a shm all-reduce and another in a Gloo collective fail naming both ops", "[shm_safety]") {
  struct Case {
    const char* what;
    std::function<void(Communicator&, std::vector<float>&)> other;
    const char* expect;
  };
  const Case cases[] = {
      {"broadcast", [](Communicator& c, std::vector<float>& a) { c.broadcast(a.data(), 16, 1); },
       "broadcast(16 bytes from rank 1, over Gloo)"},
      {"barrier", [](Communicator& c, std::vector<float>&) { c.barrier(); }, "barrier()"},
      {"allgather", [](Communicator& c, std::vector<float>& a) { c.allgather(a.data(), a.data(), 4, DType::F32); },
       "all_gather(fp32, 4 elements, over Gloo)"},
  };
  for (const Case& c : cases) {
    INFO("rank 1 in " << c.what);
    const auto t0 = std::chrono::steady_clock::now();
    const auto errors = testing::on_gloo_ranks(2, true, std::chrono::seconds(60), [&](int r, Communicator& comm) {
      std::vector<float> a(8, 1.f);
      comm.allreduce(a.data(), a.size(), DType::F32, ReduceOp::Sum);  // #1 matches
      comm.broadcast(a.data(), 8, 0);                                 // #2 matches (over Gloo)
      if (r == 0) {
        comm.allreduce(a.data(), 4, DType::F32, ReduceOp::Sum);
      } else {
        c.other(comm, a);
      }
    });
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int r = 0; r < 2; ++r) {
      const std::string& e = errors[static_cast<size_t>(r)];
      INFO("rank " << r << ": " << e);
      REQUIRE(has(e, "shm collective mismatch seen by rank " + std::to_string(r)));
      REQUIRE(has(e, "issued #3 allreduce(fp32, 4 elements, sum)"));
      REQUIRE(has(e, std::string("issued #3 ") + c.expect));
    }
    REQUIRE(took < 30);  // at once, not after the 60 s timeout
  }
}

// A rank that never joins the collective (alive, elsewhere) fails the others after the
// communicator's timeout, with where every rank is.
TEST_CASE("shm: a collective a peer never joins fails after the timeout, saying where each rank is", "[shm_safety]") {
  const auto errors = testing::on_gloo_ranks(2, true, std::chrono::seconds(2), [&](int r, Communicator& comm) {
    std::vector<float> a(8, 1.f);
    comm.allreduce(a.data(), a.size(), DType::F32, ReduceOp::Sum);
    if (r == 0) comm.allreduce(a.data(), a.size(), DType::F32, ReduceOp::Max);  // rank 1 never comes
  });
  const std::string& e = errors[0];
  INFO(e);
  REQUIRE(has(e, "shm collective on rank 0: peers did not arrive within the timeout of 2000 ms"));
  REQUIRE(has(e, "rank 0 (this one) last issued #2 allreduce(fp32, 8 elements, max)"));
  REQUIRE(has(e, "rank 1 last issued #1 allreduce(fp32, 8 elements, sum)"));
  REQUIRE(errors[1].empty());
}
