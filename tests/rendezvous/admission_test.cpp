// Admission without sockets: connections are objects with a peer address, never connected.
#include <catch2/catch.hpp>

#include "../../rendezvous/src/server/admission.h"

using namespace ddprun;
using namespace ddprun::server;
namespace asio = boost::asio;

namespace {
struct Peers {
  asio::io_context io;
  std::vector<ConnPtr> conns;
  ConnPtr from(const std::string& addr) {
    auto c = std::make_shared<Connection>(asio::ip::tcp::socket(io), nullptr, nullptr);
    c->session.peer = asio::ip::make_address(addr);
    c->id = conns.size() + 1;
    conns.push_back(c);
    return c;
  }
};
}  // namespace

// An agent that connected as a stranger and was admitted is a member: its slot no longer
// counts against --max-stranger-connections, so a job with more hosts than that limit gets
// every agent in, and strangers keep their own slots.
TEST_CASE("AnAdmittedAgentNoLongerCountsAgainstTheStrangersLimit", "[server][admission]") {
  StoreServerOptions o;
  o.max_connections = 100;
  o.max_stranger_connections = 2;
  WarnLimiter warns;
  Admission a(o, warns);
  a.size_to_descriptors();
  REQUIRE(a.max_strangers() == 2);
  Peers p;
  auto agent = p.from("192.0.2.1");
  auto other = p.from("192.0.2.2");
  REQUIRE(a.may_connect_locked(0, *agent));
  REQUIRE(a.may_connect_locked(0, *other));
  CHECK_FALSE(a.may_connect_locked(0, *p.from("192.0.2.3")));  // two strangers: the limit
  CHECK(a.strangers_refused() == 1);

  a.begin_agent(*agent);
  rdzv::Message join;
  join.type = rdzv::MsgType::Join;
  auto step = a.handshake_step(*agent, join);  // an open rendezvous admits at JOIN
  a.on_handshake_locked(*agent, step);
  REQUIRE(step.admitted);
  CHECK_FALSE(agent->session.counted_stranger);
  CHECK(a.may_connect_locked(0, *p.from("192.0.2.4")));  // the member's slot is free again
  CHECK_FALSE(a.may_connect_locked(0, *p.from("192.0.2.5")));
  // The member's host is trusted: its further connections are not strangers.
  CHECK(a.may_connect_locked(0, *p.from("192.0.2.1")));
  a.closed_locked(*agent);  // closing a member gives back no stranger's slot it did not hold
  CHECK_FALSE(a.may_connect_locked(0, *p.from("192.0.2.6")));
}
