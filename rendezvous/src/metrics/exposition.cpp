#include "ddprun/metrics/exposition.h"

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

}  // namespace ddprun::metrics
