// Prometheus text exposition for ddprund and the ddprun agent, on prometheus-cpp.
//
// Builders: metric families made from plain numbers at scrape time (a Collectable's Collect()),
// so nothing of prometheus-cpp runs on a request or an event path. Pure; unit-tested with
// prometheus::TextSerializer.
//
// MetricsEndpoint: prometheus-cpp's HTTP exposer on host:port serving /metrics. Loopback unless
// an address is given; port 0 picks a free one (port() tells which).
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace prometheus {
class Exposer;
}

namespace ddprun::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

prometheus::MetricFamily family(std::string name, std::string help, prometheus::MetricType type);
void add_counter(prometheus::MetricFamily& f, double value, const Labels& labels = {});
void add_gauge(prometheus::MetricFamily& f, double value, const Labels& labels = {});
// `bounds` ascending; `counts` one per bound plus one past the last (not cumulative).
void add_histogram(prometheus::MetricFamily& f, const std::vector<double>& bounds, const std::vector<uint64_t>& counts,
                   double sum, const Labels& labels = {});

// A Collectable that calls `fn` at each scrape.
class FunctionCollectable final : public prometheus::Collectable {
 public:
  explicit FunctionCollectable(std::function<std::vector<prometheus::MetricFamily>()> fn) : fn_(std::move(fn)) {}
  std::vector<prometheus::MetricFamily> Collect() const override { return fn_(); }

 private:
  std::function<std::vector<prometheus::MetricFamily>()> fn_;
};

// civetweb's listening address for host:port ("127.0.0.1:9100", "[::1]:0"). "" = loopback.
std::string listen_address(const std::string& host, uint16_t port);

// Thrown by MetricsEndpoint::start(): what failed and what to do (`flag` names the option).
class MetricsEndpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class MetricsEndpoint {
 public:
  // Serves `source` at http://host:port/metrics on 1 background thread. `flag_prefix`: the
  // program's spelling of its options ("--metrics_" or "--metrics-") for the error message.
  static std::unique_ptr<MetricsEndpoint> start(const std::string& host, uint16_t port,
                                                std::shared_ptr<prometheus::Collectable> source,
                                                const std::string& flag_prefix);
  ~MetricsEndpoint();
  uint16_t port() const { return port_; }
  // "http://127.0.0.1:9100/metrics", for the log line tests parse.
  std::string url() const;

 private:
  MetricsEndpoint() = default;
  std::string host_;
  uint16_t port_ = 0;
  std::shared_ptr<prometheus::Collectable> source_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace ddprun::metrics
