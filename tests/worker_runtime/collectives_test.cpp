// Every collective of the Communicator interface, for every DType and reduce op, over real
// Gloo communicators (ranks = threads, each with its own connection to a real StoreServer;
// with and without the shared-memory all-reduce) at 1, 2 and 3 ranks, and over the 1-rank
// communicator init() builds. Inputs are small integers (and halves of them), so every
// expected result is exact in every dtype and compared bit for bit.
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "ddprun/server/store_server.h"
#include "ddprun/worker/checkpoint.h"
#include "ddprun/worker/checks.h"
#include "ddprun/worker/communicator.h"
#include "ddprun/worker/runtime.h"
#include "ddprun/worker/store.h"
#include "gloo_ranks.h"
#include "fake_communicator.h"
#include "half.h"

using namespace ddprun::worker;

extern char** environ;

namespace {

const DType kDTypes[] = {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max};
const char* op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : op == ReduceOp::Avg ? "avg" : "max"; }

// A typed buffer of `count` elements stored as raw bytes, read and written as doubles (every
// value used here is exact in every dtype).
struct Buf {
  DType dtype;
  std::vector<unsigned char> bytes;
  Buf(DType d, size_t count) : dtype(d), bytes(count * dtype_size(d)) {}
  size_t count() const { return bytes.size() / dtype_size(dtype); }
  void* data() { return bytes.data(); }
  void set(size_t i, double v) {
    unsigned char* p = bytes.data() + i * dtype_size(dtype);
    switch (dtype) {
      case DType::F32: {
        const float f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::F64: std::memcpy(p, &v, 8); break;
      case DType::I32: {
        const int32_t x = static_cast<int32_t>(v);
        std::memcpy(p, &x, 4);
        break;
      }
      case DType::I64: {
        const int64_t x = static_cast<int64_t>(v);
        std::memcpy(p, &x, 8);
        break;
      }
      case DType::F16: {
        const uint16_t h = float_to_half(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::BF16: {
        const uint16_t h = float_to_bf16(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        break;
      }
    }
  }
  // The bytes `v` has in this dtype: what a correct result holds, bit for bit.
  std::vector<unsigned char> encoded(double v) const {
    Buf one(dtype, 1);
    one.set(0, v);
    return one.bytes;
  }
  bool holds(size_t i, double v) const {
    const auto want = encoded(v);
    return std::memcmp(bytes.data() + i * dtype_size(dtype), want.data(), want.size()) == 0;
  }
};

bool is_int(DType d) { return d == DType::I32 || d == DType::I64; }

// Element i of rank r's input: small signed integers (|v| <= 5 * (r + 1)).
double input(int r, size_t i) {
  const double k = static_cast<double>(i % 5 + 1) * (r + 1);
  return i % 2 ? -k : k;
}
double expected(ReduceOp op, DType d, int size, size_t i) {
  double sum = 0, mx = input(0, i);
  for (int r = 0; r < size; ++r) {
    sum += input(r, i);
    mx = std::max(mx, input(r, i));
  }
  if (op == ReduceOp::Sum) return sum;
  if (op == ReduceOp::Max) return mx;
  // Avg: sum = +-k * size(size+1)/2, so sum / size = +-k (size+1)/2, exact in binary for any
  // size; integers truncate toward zero.
  return is_int(d) ? std::trunc(sum / size) : sum / size;
}

// Runs every collective for every dtype (and op) on one rank; returns what went wrong.
std::string exercise(Communicator& c) {
  std::ostringstream err;
  const int n = c.size(), me = c.rank();
  auto fail = [&](const char* what, DType d, const char* op, size_t i) {
    err << "rank " << me << "/" << n << " " << what << " " << dtype_name(d) << " " << op << " wrong at element " << i
        << "; ";
  };
  for (DType d : kDTypes) {
    // allreduce; 1031 elements: odd, larger than one slice per rank.
    for (ReduceOp op : kOps) {
      Buf b(d, 1031);
      for (size_t i = 0; i < b.count(); ++i) b.set(i, input(me, i));
      c.allreduce(b.data(), b.count(), d, op);
      for (size_t i = 0; i < b.count(); ++i)
        if (!b.holds(i, expected(op, d, n, i))) {
          fail("allreduce", d, op_name(op), i);
          break;
        }
    }
    // broadcast from the last rank
    {
      Buf b(d, 77);
      for (size_t i = 0; i < b.count(); ++i) b.set(i, input(me, i));
      c.broadcast(b.data(), b.bytes.size(), n - 1);
      for (size_t i = 0; i < b.count(); ++i)
        if (!b.holds(i, input(n - 1, i))) {
          fail("broadcast", d, "-", i);
          break;
        }
    }
    // allgather, out of place and in place
    for (bool in_place : {false, true}) {
      const size_t count = 19;
      Buf in(d, count), out(d, count * static_cast<size_t>(n));
      for (size_t i = 0; i < count; ++i) in.set(i, input(me, i));
      const void* src = in.data();
      if (in_place) {
        std::memcpy(out.bytes.data() + static_cast<size_t>(me) * in.bytes.size(), in.bytes.data(), in.bytes.size());
        src = out.bytes.data() + static_cast<size_t>(me) * in.bytes.size();
      }
      c.allgather(src, out.data(), count, d);
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i)
          if (!out.holds(static_cast<size_t>(r) * count + i, input(r, i))) {
            fail(in_place ? "allgather(in place)" : "allgather", d, "-", static_cast<size_t>(r) * count + i);
            r = n;
            break;
          }
    }
    // reduce_scatter, out of place and in place: block q of every rank's input is input(., i)
    // shifted by q, so each rank's result differs.
    for (ReduceOp op : kOps)
      for (bool in_place : {false, true}) {
        const size_t count = 13;
        Buf in(d, count * static_cast<size_t>(n)), out(d, count);
        for (size_t j = 0; j < in.count(); ++j) in.set(j, input(me, j));
        void* dst = out.data();
        if (in_place) dst = in.bytes.data() + static_cast<size_t>(me) * out.bytes.size();
        c.reduce_scatter(in.data(), dst, count, d, op);
        if (in_place) std::memcpy(out.data(), dst, out.bytes.size());
        for (size_t i = 0; i < count; ++i)
          if (!out.holds(i, expected(op, d, n, static_cast<size_t>(me) * count + i))) {
            fail(in_place ? "reduce_scatter(in place)" : "reduce_scatter", d, op_name(op), i);
            break;
          }
      }
  }
  return err.str();
}

}  // namespace

TEST_CASE("Collectives: every op and dtype over Gloo, bit-exact, at 1, 2 and 3 ranks", "[collectives]") {
  const int world = GENERATE(1, 2, 3);
  const bool shm = GENERATE(true, false);
  INFO("world " << world << ", shared memory " << shm);
  std::atomic<int> arrived{0};
  std::vector<std::string> findings(static_cast<size_t>(world));
  const auto errors = testing::on_gloo_ranks(world, shm, std::chrono::seconds(60), [&](int r, Communicator& comm) {
    // (no Catch assertions in these threads: Catch is not thread-safe)
    std::string& e = findings[static_cast<size_t>(r)];
    if (comm.size() != world || comm.rank() != r) e += "wrong rank/size; ";
    e += exercise(comm);
    // barrier: nobody leaves before everyone arrived
    arrived.fetch_add(1);
    comm.barrier();
    if (arrived.load() != world) e += "barrier returned before every rank arrived; ";
    comm.barrier();  // nobody destroys the mesh while a peer still reads `arrived`
  });
  for (const auto& e : errors) CHECK(e == "");
  for (const auto& e : findings) CHECK(e == "");
}

TEST_CASE("Collectives: the 1-rank communicator of init() is the identity, a copy where in != out", "[collectives]") {
  RuntimeOptions ro;
  ro.apply_env_overrides = false;
  auto rt = init(ro);
  REQUIRE(rt->world_size() == 1);
  REQUIRE(std::string(rt->comm().backend()) == "self");
  REQUIRE(rt->comm().fused_step() == nullptr);
  REQUIRE(exercise(rt->comm()).empty());
  float x = 1;
  REQUIRE_THROWS_AS(rt->comm().broadcast(&x, sizeof x, 1), WorkerError);
  rt->comm().abort();
  REQUIRE_THROWS_AS(rt->comm().allreduce(&x, 1, DType::F32, ReduceOp::Sum), CommError);

  SECTION("real_communicator_at_world_size_1 gives a 1-rank Gloo communicator (no launcher, no store)") {
    ro.real_communicator_at_world_size_1 = true;
    auto rt1 = init(ro);
    REQUIRE(std::string(rt1->comm().backend()) == "gloo");
    REQUIRE(rt1->comm().fused_step() == nullptr);  // no shared-memory path for one rank
    REQUIRE(rt1->store() == nullptr);
    REQUIRE(exercise(rt1->comm()).empty());
  }
}

TEST_CASE("Collectives: f16/bf16 conversions round to nearest even and round-trip every value", "[collectives]") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const auto v = static_cast<uint16_t>(h);
    const bool f16_nan = (v & 0x7c00) == 0x7c00 && (v & 0x3ff);
    if (!f16_nan && float_to_half(half_to_float(v)) != v) FAIL("f16 " << h << " does not round-trip");
    const bool bf_nan = (v & 0x7f80) == 0x7f80 && (v & 0x7f);
    if (!bf_nan && float_to_bf16(bf16_to_float(v)) != v) FAIL("bf16 " << h << " does not round-trip");
  }
  REQUIRE(half_to_float(0x3c00) == 1.0f);
  REQUIRE(half_to_float(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  REQUIRE(float_to_half(65504.f) == 0x7bff);
  REQUIRE(float_to_half(65520.f) == 0x7c00);                           // halfway to 2^16: ties to even = inf
  REQUIRE(float_to_half(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);      // tie between 1 and 1+2^-10: even
  REQUIRE(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // tie: up to even
  REQUIRE(float_to_half(std::ldexp(1.0f, -25)) == 0x0000);             // tie between 0 and the smallest: even
  REQUIRE(float_to_half(std::ldexp(3.0f, -25)) == 0x0002);             // tie between 1 and 2 units: even
  REQUIRE(float_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);       // tie: even
  REQUIRE(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);
  REQUIRE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
  REQUIRE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
}

TEST_CASE("Collectives: the test fake's allgather and reduce_scatter keep the interface's contract", "[collectives]") {
  const int world = 3;
  testing::FakeGroup g(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      testing::FakeCommunicator c(g, r);
      std::string& e = errors[static_cast<size_t>(r)];
      double mine[2] = {1.0 * r, -2.0 * r}, all[6] = {};
      c.allgather(mine, all, 2, DType::F64);
      for (int q = 0; q < world; ++q)
        if (all[2 * q] != q || all[2 * q + 1] != -2.0 * q) e += "allgather; ";
      for (ReduceOp op : kOps) {
        std::vector<float> in(2 * world), out(2);
        for (size_t j = 0; j < in.size(); ++j) in[j] = static_cast<float>(input(r, j));
        c.reduce_scatter(in.data(), out.data(), 2, DType::F32, op);
        for (size_t i = 0; i < 2; ++i)
          if (out[i] != static_cast<float>(expected(op, DType::F32, world, static_cast<size_t>(r) * 2 + i)))
            e += std::string("reduce_scatter ") + op_name(op) + "; ";
      }
    });
  for (auto& t : ts) t.join();
  for (const auto& e : errors) CHECK(e == "");
}

// The non-blocking phase 1 of the split fused step (the Reducer's inline progress): a rank
// that started it is never held up by a peer that has not (test(false) answers false at once,
// as often as asked), and once every rank started it the result is reduce_for_step()'s, bit
// for bit: each rank's slice holds the average in rank order, with one division. The peer
// starts only after rank 0 saw `false` (an atomic handshake, no sleeps). Odd sizes put a
// scalar tail after the four-lane SSE loop.
TEST_CASE("Collectives: start/test_reduce_for_step never waits for a peer, then equals reduce_for_step",
          "[collectives]") {
  const int world = 2;
  for (size_t n : {size_t{4099}, size_t{70001}}) {
    INFO("count " << n);
    std::atomic<int> phase{0};
    std::vector<std::string> errors(world);
    std::vector<std::vector<float>> split(world), blocking(world);
    auto value = [](int r, size_t i) { return std::sin(0.001f * static_cast<float>(i) + static_cast<float>(r)) * 3.f; };
    const auto err = testing::on_gloo_ranks(world, true, std::chrono::seconds(60), [&](int r, Communicator& c) {
      FusedStep& f = testing::shm_path(c);
      auto* g = static_cast<float*>(f.alloc_shared(n * sizeof(float)));
      if (!g) throw std::runtime_error("no shared memory");
      std::string& e = errors[static_cast<size_t>(r)];
      for (size_t i = 0; i < n; ++i) g[i] = value(r, i);
      if (r == 0) {
        f.start_reduce_for_step(g, n);
        for (int k = 0; k < 3; ++k)
          if (f.test_reduce_for_step(false)) e += "finished before the peer started; ";
        phase.store(1);
        while (!f.test_reduce_for_step(false)) std::this_thread::yield();
      } else {
        while (phase.load() == 0) std::this_thread::yield();
        f.start_reduce_for_step(g, n);
        if (!f.test_reduce_for_step(true)) e += "blocking test returned false; ";
      }
      split[static_cast<size_t>(r)].assign(g, g + n);
      for (size_t i = 0; i < n; ++i) g[i] = value(r, i);
      f.reduce_for_step(g, n);
      blocking[static_cast<size_t>(r)].assign(g, g + n);
    });
    for (const auto& e : err) REQUIRE(e == "");
    for (const auto& e : errors) CHECK(e == "");
    for (int r = 0; r < world; ++r) {
      const size_t lo = n * static_cast<size_t>(r) / world, hi = n * static_cast<size_t>(r + 1) / world;
      size_t bad = 0;
      for (size_t i = lo; i < hi; ++i) {
        const float want = (value(0, i) + value(1, i)) / 2.f;
        if (split[static_cast<size_t>(r)][i] != want || blocking[static_cast<size_t>(r)][i] != want) ++bad;
      }
      CHECK(bad == 0);
    }
  }
}

// The fused-step capability is there exactly where the shared-memory path is: Gloo with every
// rank on this host and shared memory on; not over TCP alone.
TEST_CASE("Collectives: fused_step() is offered by Gloo's shared-memory path only", "[collectives]") {
  for (const bool shm : {true, false}) {
    INFO("shared memory " << shm);
    std::vector<int> offered(2, -1);
    const auto err = testing::on_gloo_ranks(2, shm, std::chrono::seconds(60), [&](int r, Communicator& c) {
      offered[static_cast<size_t>(r)] = c.fused_step() != nullptr ? 1 : 0;
    });
    for (const auto& e : err) REQUIRE(e == "");
    REQUIRE(offered == std::vector<int>(2, shm ? 1 : 0));
  }
}

// alloc_shared_single(): one copy that every rank maps (the one copy of parameters and
// optimizer state that the fused step writes in place). A store by rank 0 is what every rank reads after a barrier over
// Gloo TCP, with no shared-memory collective in between (in alloc_shared() memory each rank reads its own part: still
// zero); broadcast over it gives root's bytes everywhere without a rank writing them; all-reduce sums the size() equal
// contributions; outputs of allgather / reduce_scatter there are refused on every rank. At 2 and 3 ranks (3: slices of
// unequal length).
TEST_CASE("Collectives: alloc_shared_single is one copy every rank sees; broadcast and all-reduce over it",
          "[collectives]") {
  for (const int world : {2, 3}) {
    INFO("world " << world);
    const size_t n = 1001;
    std::vector<std::string> errors(static_cast<size_t>(world));
    const auto err = testing::on_gloo_ranks(world, true, std::chrono::seconds(60), [&](int r, Communicator& c) {
      std::string& e = errors[static_cast<size_t>(r)];
      FusedStep& f = testing::shm_path(c);
      auto* one = static_cast<float*>(f.alloc_shared_single(n * sizeof(float)));
      auto* per = static_cast<float*>(f.alloc_shared(n * sizeof(float)));
      if (!one || !per) throw std::runtime_error("no shared memory");
      if (!f.is_single_copy(one, n * sizeof(float))) e += "is_single_copy(one copy) is false; ";
      if (f.is_single_copy(per, n * sizeof(float))) e += "is_single_copy(per-rank memory) is true; ";
      if (f.is_single_copy(one + 1, n * sizeof(float))) e += "is_single_copy past the end is true; ";
      if (r == 0)
        for (size_t i = 0; i < n; ++i) one[i] = per[i] = static_cast<float>(i) + 0.5f;
      c.barrier();  // Gloo over TCP: orders rank 0's stores before the reads below
      size_t unseen = 0, leaked = 0;
      for (size_t i = 0; i < n; ++i) {
        if (one[i] != static_cast<float>(i) + 0.5f) ++unseen;
        if (r != 0 && per[i] != 0.f) ++leaked;
      }
      if (unseen) e += std::to_string(unseen) + " of rank 0's stores unseen; ";
      if (leaked) e += "rank 0's stores reached this rank's alloc_shared part; ";
      c.barrier();  // everyone read before the root writes again
      const int root = world - 1;
      if (r == root)
        for (size_t i = 0; i < n; ++i) one[i] = static_cast<float>(7 * i);
      c.broadcast(one, n * sizeof(float), root);
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i)
        if (one[i] != static_cast<float>(7 * i)) ++bad;
      if (bad) e += "broadcast: " + std::to_string(bad) + " elements differ from root's; ";
      c.allreduce(one, n, DType::F32, ReduceOp::Sum);  // world equal contributions
      bad = 0;
      for (size_t i = 0; i < n; ++i)
        if (one[i] != static_cast<float>(7 * i * static_cast<size_t>(world))) ++bad;
      if (bad) e += "allreduce: " + std::to_string(bad) + " elements are not world x the value; ";
      std::vector<float> in(4, 1.f), big(4 * static_cast<size_t>(world), 1.f);
      for (const char* op : {"allgather", "reduce_scatter"}) {
        try {
          if (op[0] == 'a') c.allgather(in.data(), one, 4, DType::F32);
          else c.reduce_scatter(big.data(), one, 4, DType::F32, ReduceOp::Sum);
          e += std::string(op) + " into one-copy memory did not throw; ";
        } catch (const WorkerError& x) {
          if (std::string(x.what()).find("alloc_shared_single") == std::string::npos)
            e += std::string("unclear: ") + x.what();
        }
      }
      c.barrier();  // the communicator still works after the refusals
    });
    for (const auto& e : err) REQUIRE(e == "");
    for (const auto& e : errors) CHECK(e == "");
  }
}

TEST_CASE(
    "Collectives: a peer that closes its communicator fails the other's collective with that cause, not a timeout",
    "[collectives]") {
  // SIGPIPE at its default, as in a C++ program: a send to the closed peer must not end the
  // process (the communicator ignores it unless the program has a handler).
  ::signal(SIGPIPE, SIG_DFL);
  ddprun::server::StoreServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  ddprun::server::StoreServer server(so);
  server.start();
  const auto timeout = std::chrono::milliseconds(30000);
  std::string error0;
  std::atomic<bool> closed{false};
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      try {
        StoreOptions co;
        co.host = "127.0.0.1";
        co.port = server.port();
        co.connect_timeout = timeout;
        auto store = connect_store(co);
        GlooOptions go;
        go.hostname = "127.0.0.1";
        go.timeout = timeout;
        go.shared_memory = false;
        auto comm = make_gloo_communicator(*store, r, 2, go);
        comm->barrier();  // both connected
        if (r == 1) {
          comm.reset();  // closes its connections, as an exiting process would
          closed = true;
          return;
        }
        while (!closed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::vector<float> x(1024, 1.0f);
        comm->allreduce(x.data(), x.size(), DType::F32, ReduceOp::Sum);
      } catch (const CommError& e) {
        if (r == 0) error0 = e.what();
      } catch (const std::exception& e) {
        if (r == 0) error0 = std::string("not a CommError: ") + e.what();
      }
    });
  for (auto& t : ts) t.join();
  INFO(error0);
  REQUIRE_FALSE(error0.empty());
  CHECK(error0.find("not a CommError") == std::string::npos);
  CHECK(error0.find("gloo allreduce failed on rank 0") != std::string::npos);
  CHECK(error0.find("closed its connection") != std::string::npos);
  CHECK(error0.find("timeout") == std::string::npos);
  struct sigaction now {};
  REQUIRE(::sigaction(SIGPIPE, nullptr, &now) == 0);
  CHECK(now.sa_handler == SIG_IGN);
  // The other direction, made certain: writing to a connection whose reader has gone fails the
  // write (EPIPE) and leaves this process running.
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  ::close(sv[1]);
  const char byte = 1;
  CHECK(::write(sv[0], &byte, 1) == -1);
  CHECK(errno == EPIPE);
  ::close(sv[0]);
}

TEST_CASE("Collectives: ranks agree on the newest checkpoint every one of them can read", "[collectives]") {
  char tmpl[] = "/tmp/ddprun-agreed-ckpt-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string base = tmpl;
  auto dir_of = [&](const std::string& name, int rank) { return base + "/" + name + "/r" + std::to_string(rank); };
  auto write = [&](const std::string& dir, uint64_t step) {
    Checkpoint c;
    c.step = step;
    c.put_u64("step_again", step);
    save_checkpoint(dir, c, /*keep_last=*/0);
  };
  // Each rank's own directory (as on nodes that do not share one); what each rank loaded.
  auto agree = [&](const std::string& name, std::vector<int64_t>& loaded) {
    loaded.assign(2, -2);
    return testing::on_gloo_ranks(2, /*shared_memory=*/false, std::chrono::milliseconds(20000),
                                  [&](int rank, Communicator& comm) {
                                    auto c = load_agreed_checkpoint(dir_of(name, rank), comm);
                                    loaded[static_cast<size_t>(rank)] =
                                        c ? static_cast<int64_t>(c->get_u64("step_again")) : -1;
                                  });
  };
  std::vector<int64_t> loaded;

  // Rank 1 lags one checkpoint behind: both resume from step 8, not 12 and 8.
  for (uint64_t s : {4, 8, 12}) write(dir_of("lag", 0), s);
  for (uint64_t s : {4, 8}) write(dir_of("lag", 1), s);
  auto errors = agree("lag", loaded);
  CHECK(errors == std::vector<std::string>{"", ""});
  CHECK(loaded == std::vector<int64_t>{8, 8});

  // Rank 1's step 8 is torn: both go back to 4.
  for (uint64_t s : {4, 8}) write(dir_of("torn", 0), s), write(dir_of("torn", 1), s);
  ::truncate(checkpoint_path(dir_of("torn", 1), 8).c_str(), 20);
  errors = agree("torn", loaded);
  CHECK(errors == std::vector<std::string>{"", ""});
  CHECK(loaded == std::vector<int64_t>{4, 4});

  // Nothing in common: an error on every rank, never two ranks at different steps.
  write(dir_of("apart", 0), 4);
  write(dir_of("apart", 1), 8);
  errors = agree("apart", loaded);
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("can be read on every rank"));

  // No checkpoint anywhere: both start fresh.
  errors = agree("none", loaded);
  CHECK(errors == std::vector<std::string>{"", ""});
  CHECK(loaded == std::vector<int64_t>{-1, -1});
  std::filesystem::remove_all(base);
}

// Gloo throws in its own network thread when a peer's message does not fit (ranks issued
// collectives of different sizes); the process must end as a failed collective (exit 75,
// the cause on stderr and in the error file), not in std::terminate's SIGABRT. In a child
// process (this binary again, running the hidden case below): the test's own process must
// survive it.
TEST_CASE("gloo enforce child: ranks issue all-reduces of different counts over TCP", "[.gloo_enforce_child]") {
  testing::on_gloo_ranks(2, /*shared_memory=*/false, std::chrono::seconds(20), [](int r, Communicator& c) {
    std::vector<float> a(64, 1.f);
    c.allreduce(a.data(), r == 0 ? 4 : 64, DType::F32, ReduceOp::Sum);
  });
}

TEST_CASE("Collectives: Gloo over TCP with different counts ends the rank as a failed collective, not SIGABRT",
          "[collectives]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("ddprun-enforce-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string error_file = (dir / "error.json").string();
  int out[2];
  REQUIRE(::pipe(out) == 0);
  // The child's environment is built before fork: only async-signal-safe calls after it.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "TORCHELASTIC_ERROR_FILE=", 24) != 0) env_strings.emplace_back(*e);
  env_strings.push_back("TORCHELASTIC_ERROR_FILE=" + error_file);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  char self[] = "/proc/self/exe", tag[] = "[.gloo_enforce_child]";
  char* argv[] = {self, tag, nullptr};
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(out[1], 2);
    ::close(out[0]);
    ::execve(self, argv, envp.data());
    ::_exit(127);
  }
  ::close(out[1]);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) err.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  INFO(err);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == kExitCommFailure);
  REQUIRE(err.find("CommError: gloo collective failed on rank") != std::string::npos);
  REQUIRE(err.find("does not fit the collective this rank issued") != std::string::npos);
  REQUIRE(err.find("DDPRUN_DEBUG_COLLECTIVES=1") != std::string::npos);
  std::ifstream f(error_file);
  const std::string json((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  REQUIRE(json.find("does not fit the collective this rank issued") != std::string::npos);
  fs::remove_all(dir);
}

// Over Gloo's TCP pairs (no shared memory), a collective one rank never joins (it is alive,
// elsewhere) fails the others after the communicator's timeout, saying where every rank is
// (each rank publishes its last issued collective in the store).
TEST_CASE("Collectives: a Gloo collective a peer never joins fails after the timeout, saying where each rank is",
          "[collectives]") {
  const auto t0 = std::chrono::steady_clock::now();
  const auto errors =
      testing::on_gloo_ranks(2, /*shared_memory=*/false, std::chrono::seconds(2), [&](int r, Communicator& comm) {
        std::vector<float> a(8, 1.f);
        comm.allreduce(a.data(), a.size(), DType::F32, ReduceOp::Sum);
        std::vector<uint16_t> h(3, 0);
        comm.allreduce(h.data(), h.size(), DType::F16, ReduceOp::Sum);
        if (r == 0) comm.broadcast(a.data(), 32, 1);  // rank 1 never comes
      });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string& e = errors[0];
  INFO(e);
  CHECK_THAT(e, Catch::Contains("gloo broadcast failed on rank 0 (no progress within the timeout of 2000 ms)"));
  CHECK_THAT(e, Catch::Contains("rank 0 (this one) last issued #3 broadcast(32 bytes, root 1)"));
  CHECK_THAT(e, Catch::Contains("rank 1 last issued #2 allreduce(fp16, 3 elements, sum)"));
  CHECK(errors[1].empty());
  CHECK(took < 30);
}
