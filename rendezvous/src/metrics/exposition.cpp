#include "ddprun/metrics/exposition.h"

#include <prometheus/exposer.h>

#include <exception>

namespace ddprun::metrics {

prometheus::MetricFamily family(std::string name, std::string help, prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

namespace {
prometheus::ClientMetric& add(prometheus::MetricFamily& f, const Labels& labels) {
  auto& m = f.metric.emplace_back();
  for (const auto& [k, v] : labels) m.label.push_back({k, v});
  return m;
}
}  // namespace

void add_counter(prometheus::MetricFamily& f, double value, const Labels& labels) {
  add(f, labels).counter.value = value;
}

void add_gauge(prometheus::MetricFamily& f, double value, const Labels& labels) { add(f, labels).gauge.value = value; }

void add_histogram(prometheus::MetricFamily& f, const std::vector<double>& bounds, const std::vector<uint64_t>& counts,
                   double sum, const Labels& labels) {
  auto& h = add(f, labels).histogram;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    cumulative += i < counts.size() ? counts[i] : 0;
    h.bucket.push_back({cumulative, bounds[i]});
  }
  for (size_t i = bounds.size(); i < counts.size(); ++i) cumulative += counts[i];
  // The text serializer writes the +Inf bucket itself from sample_count.
  h.sample_count = cumulative;
  h.sample_sum = sum;
}

std::string listen_address(const std::string& host, uint16_t port) {
  const std::string h = host.empty() ? "127.0.0.1" : host;
  const bool v6 = h.find(':') != std::string::npos && h.front() != '[';
  return (v6 ? "[" + h + "]" : h) + ":" + std::to_string(port);
}

std::unique_ptr<MetricsEndpoint> MetricsEndpoint::start(const std::string& host, uint16_t port,
                                                        std::shared_ptr<prometheus::Collectable> source,
                                                        const std::string& flag_prefix) {
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint());
  e->host_ = host.empty() ? "127.0.0.1" : host;
  e->source_ = std::move(source);
  const std::string addr = listen_address(e->host_, port);
  try {
    e->exposer_ = std::make_unique<prometheus::Exposer>(addr, 1);
  } catch (const std::exception&) {
    // civetweb says only "null context when constructing CivetServer"; the causes are these.
    throw MetricsEndpointError("cannot serve metrics on " + addr + ": the port is taken or the address is not one of " +
                               "this host's; give another " + flag_prefix + "port (0 picks a free one) or " +
                               flag_prefix + "host (an address of this host; default 127.0.0.1)");
  }
  e->exposer_->RegisterCollectable(e->source_);
  const auto ports = e->exposer_->GetListeningPorts();
  e->port_ = ports.empty() ? port : static_cast<uint16_t>(ports.front());
  return e;
}

MetricsEndpoint::~MetricsEndpoint() = default;

std::string MetricsEndpoint::url() const { return "http://" + listen_address(host_, port_) + "/metrics"; }

}  // namespace ddprun::metrics
