// One TCP connect attempt shared by the store client and the rendezvous client.
#pragma once

#include <cstdint>
#include <string>

namespace ddprun::client {

// Resolves `host` (IPv6 and IPv4) and connects to the first address that accepts; the socket
// is CLOEXEC with TCP_NODELAY. Returns the fd, or -1 with `error` saying why (never throws).
// A socket that ended up connected to itself (no listener on a local ephemeral port, which the
// kernel also chose as the source port) counts as refused.
int connect_tcp(const std::string& host, uint16_t port, std::string& error);

// Whether the connected socket's local and peer addresses are the same (a TCP self-connect).
bool connected_to_itself(int fd);

}  // namespace ddprun::client
