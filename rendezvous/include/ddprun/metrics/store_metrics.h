// ddprund's metrics (docs/PROTOCOL.md "Metrics"): StoreServer::metrics() as Prometheus metric
// families. Pure.
#pragma once

#include <prometheus/metric_family.h>

#include <vector>

#include "ddprun/server/store_server.h"

namespace ddprun::metrics {

std::vector<prometheus::MetricFamily> store_metric_families(const server::StoreServerMetrics& m);

}  // namespace ddprun::metrics
