// MetricsEndpoint (exposition.h): prometheus-cpp's HTTP exposer, apart from the pure builders so
// that what links only the builders (the launcher's pure core) gets no server thread or socket.
#include "ddprun/metrics/exposition.h"

#include <prometheus/exposer.h>

#include <exception>

namespace ddprun::metrics {

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
