// Network helpers for the agents, beside the clients that use them: which addresses are this
// host's, which interface carries an address, what a connected socket's local address is, and
// a TCP connect that can be abandoned.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ddprun::client {

// Whether `host` names an address of this machine (it can be bound here). "localhost" is. The
// name lookup is bounded (5 s; no answer: not this machine).
bool is_local_address(const std::string& host);

// This host's name (gethostname), and the numeric addresses a name resolves to, in the
// resolver's order, without repeats (bounded like is_local_address; none when it fails).
std::string hostname();
std::vector<std::string> resolve_all(const std::string& host);

// The interface that carries `addr` (e.g. "eth0"), or "" when none does.
std::string interface_of(const std::string& addr);
// Every address of this host's interfaces (IPv4 and IPv6, numeric).
std::vector<std::string> local_addresses();

// The local address of a connected socket (IPv4-mapped IPv6 shown as IPv4), or "".
std::string local_address_of(int fd);

// Why connect_until gave up.
enum class ConnectOutcome { Connected, TimedOut, Interrupted };

// Connects to host:port, retrying refused or unreachable attempts with backoff (20 ms up to
// 500 ms) until `deadline`. Each attempt is a non-blocking connect, so neither a SYN into a
// black hole nor the backoff blocks for long, and each name lookup runs apart and is waited for
// at most 5 s per attempt (a name service that does not answer is walked away from):
// `interrupted` is asked at least every 100 ms and a true answer gives up at once. Returns the connected fd (CLOEXEC,
// blocking, TCP_NODELAY) or -1 with `outcome` and `error` (the last attempt's reason) saying why.
int connect_until(const std::string& host, uint16_t port, std::chrono::steady_clock::time_point deadline,
                  const std::function<bool()>& interrupted, ConnectOutcome& outcome, std::string& error);

}  // namespace ddprun::client
