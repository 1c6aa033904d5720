#include "ddprun/launcher/rendezvous_plan.h"

#include "ddprun/common/knobs.h"

#include <cstdlib>

namespace ddprun::launcher {
namespace {

// rdzv_conf values: seconds (torchrun's unit) as milliseconds; a bad value is a usage error.
std::chrono::milliseconds conf_seconds(const RendezvousOptions& o, const std::string& key, double fallback_s) {
  auto it = o.conf.find(key);
  if (it == o.conf.end()) return std::chrono::milliseconds(static_cast<long long>(fallback_s * 1000));
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (end == it->second.c_str() || *end != '\0' || v < 0)
    throw UsageError("--rdzv_conf " + key + "=" + it->second + ": expected a number of seconds");
  return std::chrono::milliseconds(static_cast<long long>(v * 1000));
}

std::optional<bool> conf_bool(const RendezvousOptions& o, const std::string& key) {
  auto it = o.conf.find(key);
  if (it == o.conf.end()) return std::nullopt;
  const std::string& v = it->second;
  if (v == "1" || v == "true" || v == "True") return true;
  if (v == "0" || v == "false" || v == "False") return false;
  throw UsageError("--rdzv_conf " + key + "=" + v + ": expected true or false (1 or 0)");
}

}  // namespace

RendezvousPlan resolve_plan(const NodeOptions& nodes, const RendezvousOptions& rendezvous, int max_restarts,
                            const EnvMap& env, const std::function<bool(const std::string&)>& is_local_host,
                            const std::function<bool(const std::string&, uint16_t)>& port_served) {
  RendezvousPlan p;
  const bool c10d = rendezvous.backend == RdzvBackend::C10d;
  p.port_from_endpoint = c10d;
  if (c10d && !rendezvous.standalone) check_endpoint_host("--rdzv_endpoint", rendezvous.endpoint, rendezvous.host);
  const auto join_timeout = conf_seconds(rendezvous, "join_timeout", 600);
  const auto heartbeat_timeout = conf_seconds(rendezvous, "heartbeat_timeout", 5);
  const auto last_call = conf_seconds(rendezvous, "last_call_timeout", c10d ? 30 : 0);
  const std::optional<bool> is_host = conf_bool(rendezvous, "is_host");

  rdzv::Join& j = p.join;
  j.run_id = rendezvous.id;
  j.local_world_size = nodes.nproc_per_node;
  j.min_nodes = nodes.min_nodes;
  j.max_nodes = nodes.max_nodes;
  j.max_restarts = max_restarts;
  j.last_call_ms = last_call.count();
  j.join_timeout_ms = join_timeout.count();
  j.heartbeat_timeout_ms = heartbeat_timeout.count();
  p.connect_timeout = join_timeout;
  p.heartbeat_interval = std::max(std::chrono::milliseconds(100), heartbeat_timeout / 5);

  // One node with c10d joins a rendezvous that someone else serves, as torchrun does: when
  // --rdzv_conf is_host=false says so, or when a standing server (ddprund) already answers on
  // the endpoint's port of this host. Otherwise the store is ours.
  const bool one_node_client =
      !nodes.multi_node() && c10d && !rendezvous.standalone &&
      (is_host == false || (!is_host.value_or(false) && rendezvous.port_given && port_served &&
                            is_local_host(rendezvous.host) && port_served(rendezvous.host, rendezvous.port)));
  if (!nodes.multi_node() && !one_node_client) {
    // One node: the store is ours, on --master_port exactly (static), the endpoint's port
    // (c10d; --standalone: a free one), else 29500 or a free port when that is taken. The
    // workers' store is the main keyspace, emptied for every attempt.
    p.local = true;
    p.host_server = true;
    p.host_explicit = true;
    p.server_io_threads = 1;
    const bool port_given = c10d ? rendezvous.port_given : rendezvous.master_port.has_value();
    uint16_t first_choice = c10d ? rendezvous.port : kDefaultMasterPort;
    if (auto v = knobs::get(knobs::kDefaultStorePort, env))
      first_choice = static_cast<uint16_t>(std::strtoul(v->c_str(), nullptr, 10));
    p.listen_port = !port_given ? first_choice : c10d ? rendezvous.port : *rendezvous.master_port;
    p.free_port_fallback = !port_given;
    p.store_host = !rendezvous.local_addr.empty() ? rendezvous.local_addr : c10d ? "127.0.0.1" : rendezvous.master_addr;
    if (p.store_host == "127.0.0.1" || p.store_host == "localhost") p.listen_host = "127.0.0.1";
    j.fixed_store_port = true;
    j.node_rank = 0;
    j.join_timeout_ms = 24LL * 3600 * 1000;  // nobody else is coming; the round fills at once
    return p;
  }

  p.local = false;
  p.server_io_threads = 0;  // the whole job's agents and workers connect to the host
  p.serve_rendezvous = true;
  p.endpoint_host = c10d ? rendezvous.host : rendezvous.master_addr;
  p.endpoint_port = c10d ? rendezvous.port : rendezvous.master_port.value_or(kDefaultMasterPort);
  if (c10d) {
    p.host_server = !one_node_client && is_host.value_or(is_local_host(p.endpoint_host));
    p.host_explicit = is_host.value_or(false);
    j.node_rank = -1;  // the server assigns ranks
  } else {
    // Static: node 0 hosts, and the workers' store of every round is the host's own port
    // (--master_port), as torchrun has it: sites open exactly that port.
    p.host_server = nodes.node_rank == 0;
    p.host_explicit = true;
    j.node_rank = nodes.node_rank;
    j.fixed_store_port = true;
  }
  p.listen_port = p.endpoint_port;
  j.prefer_rank0 = c10d && p.host_server;
  p.store_host = p.endpoint_host == "localhost" ? "127.0.0.1" : p.endpoint_host;
  return p;
}

BindFallback on_bind_failure(const RendezvousPlan& plan, const std::string& why) {
  BindFallback f;
  f.plan = plan;
  const std::string port = std::to_string(plan.listen_port);
  if (plan.free_port_fallback) {
    f.kind = BindFallback::Kind::UseFreePort;
    f.message = "port " + port + " is taken (" + why + "); the store uses a free port instead";
  } else if (!plan.host_explicit) {
    f.kind = BindFallback::Kind::JoinAsClient;
    f.message = "port " + port + " of this host is taken (" + why +
                "): joining the rendezvous served there as a client (--rdzv_conf is_host=1 would insist on hosting it)";
    f.plan.host_server = false;
    f.plan.join.prefer_rank0 = false;
  } else if (plan.local) {
    f.message = "cannot host the store on port " + port + ": " + why +
                (plan.port_from_endpoint ? " (use another --rdzv_endpoint port, or 0 for a free port)"
                                         : " (use another --master_port, or 0 for a free port)");
  } else {
    f.message = "this node hosts the rendezvous (" + plan.endpoint_host + ":" + port +
                ") but cannot listen there: " + why +
                (plan.port_from_endpoint ? "; is another job using it? (without --rdzv_conf is_host=1, ddprun joins it)"
                                         : "; choose another --master_port");
  }
  return f;
}

rdzv::AgentCredentials agent_credentials(const RendezvousCredential& c) {
  if (const auto* t = std::get_if<TokenCredential>(&c)) return t->token;
  if (const auto* m = std::get_if<MungeCredential>(&c)) return m->make;
  return {};
}

std::string server_token(const RendezvousCredential& c) {
  const auto* t = std::get_if<TokenCredential>(&c);
  return t ? t->token : "";
}

rdzv::MungeCredentialCheck server_munge_check(const RendezvousCredential& c) {
  const auto* m = std::get_if<MungeCredential>(&c);
  return m ? m->check : rdzv::MungeCredentialCheck{};
}

}  // namespace ddprun::launcher
