// How the rendezvous names a node in its messages to users (restart and failure reasons).
#include <string>

#include "ddprun/rdzv/round_state.h"

namespace ddprun::rdzv {

std::string RoundState::host_name_of(const std::string& node_id, const std::string& host) {
  // ddprun's agents send "<hostname>_<host>_<pid>" (a standing server) or "<hostname>".
  const size_t pid_at = node_id.find_last_of('_');
  if (pid_at == std::string::npos || pid_at + 1 == node_id.size() ||
      node_id.find_first_not_of("0123456789", pid_at + 1) != std::string::npos)
    return node_id;
  const std::string tail = "_" + host;
  const std::string rest = node_id.substr(0, pid_at);
  if (rest == host) return host;
  if (rest.size() <= tail.size() || rest.compare(rest.size() - tail.size(), tail.size(), tail) != 0) return node_id;
  return rest.substr(0, rest.size() - tail.size());
}

std::string RoundState::describe(const Node& n) {
  const std::string name = host_name_of(n.node_id, n.host);
  const std::string where = name.empty() || name == n.host ? "host " + n.host : "host " + name + ", " + n.host;
  return (n.last_rank >= 0 ? "node " + std::to_string(n.last_rank) : std::string("a node")) + " (" + where + ")";
}

}  // namespace ddprun::rdzv
