// store_interop_probe: runs ddprun's StoreClient through the whole operation suite against a
// store at host:port (PyTorch's own TCPStore server in the interop tests), then exchanges keys
// with a Python peer. Prints one "ok: ..." line per check; exit 0 = all passed, 1 = a check
// failed (the line says which and what came back), 2 = bad usage.
//
// usage: store_interop_probe --port P [--host H] [--dialect D0|D1|D2] [--no-ping] [--queues]
//                            [--peer] [--tag T]
//   --queues  the server implements QUEUE_*/LIST_KEYS (PyTorch 2.11's libuv backend)
//   --peer    after the suite: SET from_cpp, then GET from_py (blocks until the peer sets it),
//             check it, SET cpp_done
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "ddprun/client/store_client.h"

namespace {

using ddprun::client::StoreClient;
using ddprun::client::StoreClientOptions;
using ddprun::client::StoreTimeout;
using ddprun::wire::Dialect;
using namespace std::chrono_literals;

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string show(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s.substr(0, 64)) {
    if (c >= 32 && c < 127 && c != '"') out += static_cast<char>(c);
    else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    }
  }
  if (s.size() > 64) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out + "\"";
}
std::string show(int64_t v) { return std::to_string(v); }
std::string show(bool v) { return v ? "true" : "false"; }

template <typename T>
void eq(const T& got, const T& want, const std::string& what) {
  if (!(got == want)) throw Failure(what + ": got " + show(got) + ", want " + show(want));
  std::printf("ok: %s\n", what.c_str());
}
void eq(const std::string& got, const char* want, const std::string& what) { eq(got, std::string(want), what); }

template <typename F>
void throws_timeout(F&& f, const std::string& what) {
  try {
    f();
  } catch (const StoreTimeout& e) {
    std::printf("ok: %s (StoreTimeout: %s)\n", what.c_str(), e.what());
    return;
  }
  throw Failure(what + ": no StoreTimeout");
}

struct Args {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  Dialect dialect = Dialect::D2;
  bool ping = true, queues = false, peer = false;
  std::string tag = "probe";
};

StoreClientOptions options(const Args& a) {
  StoreClientOptions o;
  o.host = a.host;
  o.port = a.port;
  o.dialect = a.dialect;
  o.ping_on_connect = a.ping;
  o.connect_timeout = 30s;
  o.timeout = 30s;  // hang guard only
  return o;
}

void suite(const Args& a) {
  StoreClient c(options(a));
  const std::string t = a.tag + "/";
  const bool d2 = a.dialect == Dialect::D2;

  // set / get
  c.set(t + "k", "v1");
  eq(c.get(t + "k"), "v1", "set then get");
  c.set(t + "k", std::string("\0\xff" "bin", 5));
  eq(c.get(t + "k"), std::string("\0\xff" "bin", 5), "overwrite with binary");
  c.set(t + "empty", "");
  eq(c.get(t + "empty"), "", "empty value");

  // add
  eq(c.add(t + "ctr", 5), int64_t(5), "add on a missing key");
  eq(c.add(t + "ctr", -7), int64_t(-2), "add negative delta");
  eq(c.get(t + "ctr"), "-2", "ADD stored as decimal text");

  // compare_set matrix
  const int64_t n0 = c.num_keys();
  eq(c.compare_set(t + "cas", "", "first"), "first", "compare_set missing+empty expected: stored");
  eq(c.compare_set(t + "cas_none", "x", "y"), "x", "compare_set missing+non-empty expected: returns expected");
  eq(c.num_keys() - n0, int64_t(1), "compare_set stored nothing for missing+non-empty");
  eq(c.compare_set(t + "cas", "first", "second"), "second", "compare_set match: stored");
  eq(c.compare_set(t + "cas", "nope", "third"), "second", "compare_set mismatch: current value");
  eq(c.get(t + "cas"), "second", "value after compare_set mismatch");

  // check
  eq(c.check({t + "k", t + "cas"}), true, "check of present keys");
  eq(c.check({t + "k", t + "missing"}), false, "check with a missing key");

  // wait
  c.wait({t + "k", t + "ctr"});
  std::printf("ok: wait on present keys\n");
  if (d2) {
    throws_timeout([&] { c.wait({t + "never"}, 300ms); }, "wait on a missing key times out (CANCEL_WAIT)");
    eq(c.get(t + "k"), std::string("\0\xff" "bin", 5), "client usable after the timed-out wait");
    c.set(t + "never", "late");
    eq(c.add(t + "ctr", 0), int64_t(-2), "no stray WAIT reply after the key arrives");
  } else {
    StoreClient tmp(options(a));
    throws_timeout([&] { tmp.wait({t + "never"}, 300ms); }, "D0 wait times out (connection dropped)");
    eq(c.get(t + "k"), std::string("\0\xff" "bin", 5), "other connection unaffected");
  }

  // num_keys / delete_key
  const int64_t n1 = c.num_keys();
  c.set(t + "del", "x");
  eq(c.num_keys() - n1, int64_t(1), "num_keys counts a new key");
  eq(c.delete_key(t + "del"), true, "delete_key existing");
  eq(c.delete_key(t + "del"), false, "delete_key missing");
  eq(c.num_keys() - n1, int64_t(0), "num_keys after delete");

  // large value and many keys
  std::string big(1 << 20, '\0');
  std::mt19937_64 rng(42);
  for (auto& ch : big) ch = static_cast<char>(rng());
  c.set(t + "big", big);
  eq(c.get(t + "big") == big, true, "1 MiB value round trip");
  const int64_t n2 = c.num_keys();
  for (int i = 0; i < 1000; ++i) c.set(t + "many/" + std::to_string(i), std::to_string(i));
  eq(c.num_keys() - n2, int64_t(1000), "1000 keys counted");
  eq(c.get(t + "many/999"), "999", "last of 1000 keys");

  if (d2) {
    c.append(t + "ap", "a");
    c.append(t + "ap", "bc");
    eq(c.get(t + "ap"), "abc", "append creates then concatenates");
    c.multi_set({t + "m1", t + "m2", t + "m3"}, {"x", "", "z"});
    auto v = c.multi_get({t + "m3", t + "m1", t + "m2"});
    eq(v == std::vector<std::string>{"z", "x", ""}, true, "multi_set + multi_get in request order");
    if (a.ping) {
      auto rtt = c.ping();
      std::printf("ok: ping round trip %lld us\n", static_cast<long long>(rtt.count() / 1000));
    }
  }
  if (a.queues) {
    eq(c.queue_len(t + "q"), int64_t(0), "queue_len of an unknown queue");
    c.queue_push(t + "q", "one");
    c.queue_push(t + "q", "two");
    eq(c.queue_len(t + "q"), int64_t(2), "queue_len after 2 pushes");
    eq(c.queue_pop(t + "q", 5s), "one", "FIFO pop 1");
    eq(c.queue_pop(t + "q", 5s), "two", "FIFO pop 2");
    throws_timeout([&] { c.queue_pop(t + "q", 300ms); }, "pop of an empty queue times out");
    eq(c.queue_len(t + "q"), int64_t(0), "queue empty");
    auto keys = c.list_keys();
    std::set<std::string> ks(keys.begin(), keys.end());
    eq(ks.count(t + "k") == 1 && ks.count(t + "many/999") == 1 && ks.count(t + "q") == 0, true,
       "list_keys: our keys, prefix stripped, no queues");
  }
}

void peer(const Args& a) {
  StoreClient c(options(a));
  c.set("from_cpp", "hello from C++");
  std::printf("ok: set from_cpp\n");
  std::fflush(stdout);
  eq(c.get("from_py"), "hello from python", "get from_py (woken by the Python peer's set)");
  eq(c.add("shared_ctr", 1), int64_t(2), "shared counter: python added 1, we add 1");
  c.set("cpp_done", "1");
}

int usage(const char* why) {
  std::fprintf(stderr, "store_interop_probe: %s\nusage: store_interop_probe --port P [--host H] "
                       "[--dialect D0|D1|D2] [--no-ping] [--queues] [--peer] [--tag T]\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--host") a.host = next();
    else if (arg == "--port") a.port = static_cast<uint16_t>(std::atoi(next().c_str()));
    else if (arg == "--dialect") {
      auto d = next();
      if (d == "D0") a.dialect = Dialect::D0;
      else if (d == "D1") a.dialect = Dialect::D1;
      else if (d == "D2") a.dialect = Dialect::D2;
      else return usage("--dialect must be D0, D1 or D2");
    } else if (arg == "--no-ping") a.ping = false;
    else if (arg == "--queues") a.queues = true;
    else if (arg == "--peer") a.peer = true;
    else if (arg == "--tag") a.tag = next();
    else return usage(("unknown argument " + arg).c_str());
  }
  if (a.port == 0) return usage("--port is required");
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    suite(a);
    if (a.peer) peer(a);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("PROBE PASS\n");
  return 0;
}
