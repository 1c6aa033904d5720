#include "ddprun/metrics/store_metrics.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "ddprun/metrics/exposition.h"
#include "ddprun/wire/codec.h"

namespace ddprun::metrics {

namespace {
using prometheus::MetricType;
using M = server::StoreServerMetrics;

std::string op_label(size_t i) {
  if (i == M::kAgentOp) return "agent";
  std::string s = wire::op_name(static_cast<wire::Op>(i));
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}
}  // namespace

std::vector<prometheus::MetricFamily> store_metric_families(const M& m) {
  const auto& st = m.stats;
  std::vector<prometheus::MetricFamily> out;
  auto gauge = [&](const char* name, const char* help, double v) {
    out.push_back(family(name, help, MetricType::Gauge));
    add_gauge(out.back(), v);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    out.push_back(family(name, help, MetricType::Counter));
    add_counter(out.back(), v);
  };
  gauge("ddprund_connections_open", "Open connections (TCPStore clients and agents).",
        static_cast<double>(st.connections_open));
  counter("ddprund_connections_accepted_total", "Connections accepted.", static_cast<double>(st.connections_accepted));
  if (m.collected) {
    out.push_back(family("ddprund_requests_total",
                         "Requests served, by operation (TCPStore ops; agent = a rendezvous message).",
                         MetricType::Counter));
    for (size_t i = 0; i < M::kOps; ++i) {
      if (m.requests_by_op[i] == 0 && i != static_cast<size_t>(wire::Op::Get) &&
          i != static_cast<size_t>(wire::Op::Set))
        continue;  // ops never seen are left out (GET and SET always shown)
      add_counter(out.back(), static_cast<double>(m.requests_by_op[i]), {{"op", op_label(i)}});
    }
    out.push_back(family("ddprund_request_duration_seconds",
                         "Server time of one request: from its parse to its reply queued, lock wait included "
                         "(not the time a WAIT waits for its keys).",
                         MetricType::Histogram));
    std::vector<double> bounds;
    for (uint64_t ns : M::kBucketNs) bounds.push_back(static_cast<double>(ns) / 1e9);
    add_histogram(out.back(), bounds,
                  std::vector<uint64_t>(std::begin(m.duration_buckets), std::end(m.duration_buckets)),
                  static_cast<double>(m.duration_sum_ns) / 1e9);
  }
  gauge("ddprund_stored_keys", "Keys held by every store (the main one and each round's).",
        static_cast<double>(m.keys));
  gauge("ddprund_stored_bytes", "Bytes of the keys and values every store holds (and the keys waiters name).",
        static_cast<double>(m.stored_bytes));
  gauge("ddprund_stores", "Stores: the main one and each round's workers' store (live or retiring).",
        static_cast<double>(m.keyspaces));
  gauge("ddprund_rendezvous_jobs", "Jobs whose agents rendezvous here.", static_cast<double>(m.jobs));
  gauge("ddprund_rendezvous_agents", "Agents connected to those jobs' rounds.", static_cast<double>(m.agents));

  out.push_back(family("ddprund_auth_failures_total",
                       "Peers refused for authentication: agents that failed the token (or munge) handshake; "
                       "TCPStore clients from addresses that are no admitted agent's.",
                       MetricType::Counter));
  add_counter(out.back(), static_cast<double>(st.agents_refused), {{"peer", "agent"}});
  add_counter(out.back(), static_cast<double>(st.store_clients_refused), {{"peer", "store_client"}});

  out.push_back(family("ddprund_rejections_total",
                       "Connections closed or refused for a limit, by the flag that sets it.", MetricType::Counter));
  const std::pair<const char*, uint64_t> limits[] = {
      {"max_connections", st.connections_refused_over_limit},
      {"max_stranger_connections", st.strangers_refused},
      {"max_jobs", m.refused_jobs},
      {"max_memory", m.closed_for_memory},
      {"max_buffered_bytes", m.closed_for_buffers},
      {"timeout", st.connections_closed_for_deadline},
  };
  for (const auto& [limit, n] : limits) add_counter(out.back(), static_cast<double>(n), {{"limit", limit}});
  counter("ddprund_accept_errors_total", "Accepts that failed (EMFILE and the like).",
          static_cast<double>(st.accept_errors));
  return out;
}

}  // namespace ddprun::metrics
