// ddprund's metrics: the exposition of a StoreServerMetrics (pure), then a real server's counts
// read through StoreServer::metrics() and the HTTP endpoint on loopback.
#include <catch2/catch.hpp>
#include <prometheus/text_serializer.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sstream>

#include "ddprun/client/store_client.h"
#include "ddprun/metrics/exposition.h"
#include "ddprun/metrics/store_metrics.h"

using namespace ddprun;
using M = server::StoreServerMetrics;

namespace {
std::string text_of(const std::vector<prometheus::MetricFamily>& f) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, f);
  return out.str();
}
bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos || text.rfind(line + "\n", 0) == 0;
}
// GET path from 127.0.0.1:port; the whole response.
std::string http_get(uint16_t port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: x\r\n\r\n";
  (void)!::write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}
}  // namespace

TEST_CASE("store metrics: requests by op, a duration histogram, stores, rejections", "[metrics]") {
  M m;
  m.collected = true;
  m.stats.connections_open = 3;
  m.stats.connections_accepted = 7;
  m.stats.agents_refused = 2;
  m.stats.connections_refused_over_limit = 4;
  m.requests_by_op[static_cast<size_t>(wire::Op::Wait)] = 5;
  m.requests_by_op[M::kAgentOp] = 6;
  m.duration_buckets[0] = 1;            // <= 1 us
  m.duration_buckets[3] = 2;            // <= 10 us
  m.duration_buckets[M::kBuckets - 1] = 1;  // past 1 s
  m.duration_sum_ns = 2'000'000'000;
  m.keys = 10;
  m.stored_bytes = 1234;
  m.jobs = 1;
  m.agents = 2;
  m.refused_jobs = 1;
  const std::string t = text_of(metrics::store_metric_families(m));
  CHECK(has_line(t, "ddprund_connections_open 3"));
  CHECK(has_line(t, "ddprund_connections_accepted_total 7"));
  CHECK(has_line(t, "ddprund_requests_total{op=\"wait\"} 5"));
  CHECK(has_line(t, "ddprund_requests_total{op=\"agent\"} 6"));
  CHECK(has_line(t, "ddprund_requests_total{op=\"get\"} 0"));
  CHECK(t.find("op=\"queue_push\"") == std::string::npos);  // never seen: left out
  CHECK(has_line(t, "# TYPE ddprund_request_duration_seconds histogram"));
  CHECK(has_line(t, "ddprund_request_duration_seconds_bucket{le=\"1e-06\"} 1"));
  CHECK(has_line(t, "ddprund_request_duration_seconds_bucket{le=\"1e-05\"} 3"));
  CHECK(has_line(t, "ddprund_request_duration_seconds_bucket{le=\"1\"} 3"));
  CHECK(has_line(t, "ddprund_request_duration_seconds_bucket{le=\"+Inf\"} 4"));
  CHECK(has_line(t, "ddprund_request_duration_seconds_count 4"));
  CHECK(has_line(t, "ddprund_request_duration_seconds_sum 2"));
  CHECK(has_line(t, "ddprund_stored_keys 10"));
  CHECK(has_line(t, "ddprund_stored_bytes 1234"));
  CHECK(has_line(t, "ddprund_rendezvous_jobs 1"));
  CHECK(has_line(t, "ddprund_rendezvous_agents 2"));
  CHECK(has_line(t, "ddprund_auth_failures_total{peer=\"agent\"} 2"));
  CHECK(has_line(t, "ddprund_rejections_total{limit=\"max_connections\"} 4"));
  CHECK(has_line(t, "ddprund_rejections_total{limit=\"max_jobs\"} 1"));
  // Not collected (no --metrics-port): no per-op counts or durations to show.
  m.collected = false;
  const std::string u = text_of(metrics::store_metric_families(m));
  CHECK(u.find("ddprund_requests_total") == std::string::npos);
  CHECK(u.find("ddprund_request_duration_seconds") == std::string::npos);
}

TEST_CASE("listen address: loopback by default, IPv6 in brackets", "[metrics]") {
  CHECK(metrics::listen_address("", 0) == "127.0.0.1:0");
  CHECK(metrics::listen_address("0.0.0.0", 9100) == "0.0.0.0:9100");
  CHECK(metrics::listen_address("::1", 9100) == "[::1]:9100");
}

TEST_CASE("a real server's counts reach /metrics; a taken port says what to do", "[metrics]") {
  server::StoreServerOptions so;
  so.port = 0;
  so.host = "127.0.0.1";
  so.collect_metrics = true;
  server::StoreServer srv(so);
  srv.start();
  {
    client::StoreClientOptions co;
    co.port = srv.port();
    client::StoreClient c(co);
    c.set("a", "hello");
    c.set("b", "x");
    CHECK(c.get("a") == "hello");
  }
  auto source = std::make_shared<metrics::FunctionCollectable>(
      [&srv] { return metrics::store_metric_families(srv.metrics()); });
  auto ep = metrics::MetricsEndpoint::start("127.0.0.1", 0, source, "--metrics-");
  REQUIRE(ep->port() != 0);
  CHECK(ep->url() == "http://127.0.0.1:" + std::to_string(ep->port()) + "/metrics");
  const std::string body = http_get(ep->port(), "/metrics");
  CHECK(has_line(body, "ddprund_requests_total{op=\"set\"} 2"));
  CHECK(has_line(body, "ddprund_requests_total{op=\"get\"} 1"));
  CHECK(has_line(body, "ddprund_stored_keys 2"));
  CHECK(body.find("ddprund_request_duration_seconds_count ") != std::string::npos);
  try {
    metrics::MetricsEndpoint::start("127.0.0.1", ep->port(), source, "--metrics-");
    FAIL("a second endpoint on a taken port started");
  } catch (const metrics::MetricsEndpointError& e) {
    const std::string what = e.what();
    CHECK(what.find("127.0.0.1:" + std::to_string(ep->port())) != std::string::npos);
    CHECK(what.find("--metrics-port") != std::string::npos);
  }
  ep.reset();
  srv.stop();
}
