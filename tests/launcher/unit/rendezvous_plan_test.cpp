// The rendezvous plan: how each combination of flags takes part in a job, resolved once.
#include <catch2/catch.hpp>

#include "ddprun/launcher/rendezvous_plan.h"

using namespace ddprun::launcher;

namespace {

LaunchOptions opts(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  args.push_back("train.py");
  auto r = parse_command_line(args, {}, SystemInfo{.cpu_count = 8, .gpu_count = 0});
  INFO(r.message);
  REQUIRE(r.options);
  return *r.options;
}

RendezvousPlan plan(std::vector<std::string> args, bool endpoint_is_here = false, EnvMap env = {}) {
  const LaunchOptions o = opts(std::move(args));
  return resolve_plan(o.nodes, o.rendezvous, o.faults.max_restarts, env,
                      [&](const std::string&) { return endpoint_is_here; });
}

}  // namespace

TEST_CASE("one node: a local round on our own store, port as torchrun picks it", "[plan]") {
  auto p = plan({"--nproc_per_node=2", "--max_restarts=3"});
  CHECK(p.local);
  CHECK(p.host_server);
  CHECK(p.listen_port == 29500);
  CHECK(p.free_port_fallback);  // no port given: 29500 or a free one
  CHECK(p.server_io_threads == 1);
  CHECK(p.store_host == "127.0.0.1");
  CHECK(p.listen_host == "127.0.0.1");  // the workers come over loopback: nobody else may
  CHECK_FALSE(p.serve_rendezvous);      // the round runs in-process
  CHECK(p.join.fixed_store_port);
  CHECK(p.join.max_restarts == 3);
  CHECK(plan({"--master_addr=10.1.2.3"}).listen_host.empty());  // workers come from elsewhere
  CHECK(p.join.local_world_size == 2);
  CHECK(p.join.min_nodes == 1);
  CHECK(p.join.max_nodes == 1);

  auto given = plan({"--master_port=0"});
  CHECK(given.listen_port == 0);
  CHECK_FALSE(given.free_port_fallback);
  CHECK(plan({}, false, {{"DDPRUN_DEFAULT_STORE_PORT", "31000"}}).listen_port == 31000);
}

TEST_CASE("one node with c10d or --standalone: the endpoint's port, our store", "[plan]") {
  auto p = plan({"--rdzv_backend=c10d", "--rdzv_endpoint=otherhost:29411"});
  CHECK(p.local);
  CHECK(p.listen_port == 29411);
  CHECK_FALSE(p.free_port_fallback);
  CHECK(p.store_host == "127.0.0.1");  // one node: the store is ours, whatever host the endpoint names
  auto s = plan({"--standalone"});
  CHECK(s.local);
  CHECK(s.listen_port == 0);
}

TEST_CASE("one node with c10d joins a rendezvous served by someone else, as torchrun does", "[plan]") {
  const auto resolve = [](std::vector<std::string> args, bool here, bool served) {
    const LaunchOptions o = opts(std::move(args));
    return resolve_plan(
        o.nodes, o.rendezvous, o.faults.max_restarts, {}, [&](const std::string&) { return here; },
        [&](const std::string&, uint16_t) { return served; });
  };
  // A standing server answers on the endpoint's port of this host: join it as a client.
  auto standing = resolve({"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29411"}, true, true);
  CHECK_FALSE(standing.local);
  CHECK_FALSE(standing.host_server);
  CHECK(standing.endpoint_host == "127.0.0.1");
  CHECK(standing.endpoint_port == 29411);
  CHECK(standing.join.node_rank == -1);
  CHECK(standing.join.max_nodes == 1);
  // Nobody there: the store is ours, as before.
  auto free = resolve({"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29411"}, true, false);
  CHECK(free.local);
  CHECK(free.host_server);
  // is_host=false: a client even when nothing answers yet (it waits for the server).
  auto client =
      resolve({"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29411", "--rdzv_conf=is_host=false"}, true, false);
  CHECK_FALSE(client.local);
  CHECK_FALSE(client.host_server);
  // is_host=true insists on hosting: a taken port is then an error at bind time.
  auto host = resolve({"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29411", "--rdzv_conf=is_host=1"}, true, true);
  CHECK(host.local);
  CHECK(host.host_explicit);
  // Static rendezvous and --standalone never join anyone.
  CHECK(resolve({"--master_port=29411"}, true, true).local);
  CHECK(resolve({"--standalone"}, true, true).local);
}

TEST_CASE("static multi-node: node 0 hosts on --master_port, the workers' store keeps that port", "[plan]") {
  auto p0 = plan({"--nnodes=2", "--node_rank=0", "--master_addr=10.0.0.1", "--master_port=29555"});
  CHECK_FALSE(p0.local);
  CHECK(p0.host_server);
  CHECK(p0.host_explicit);
  CHECK(p0.endpoint_host == "10.0.0.1");
  CHECK(p0.endpoint_port == 29555);
  CHECK(p0.listen_port == 29555);
  CHECK(p0.join.fixed_store_port);
  CHECK(p0.join.node_rank == 0);
  CHECK(p0.join.last_call_ms == 0);
  CHECK(p0.server_io_threads == 0);
  CHECK(p0.serve_rendezvous);
  CHECK(p0.listen_host.empty());
  auto p1 = plan({"--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1", "--master_port=29555"});
  CHECK_FALSE(p1.host_server);
  CHECK(p1.join.node_rank == 1);
}

TEST_CASE("c10d multi-node: the endpoint's host hosts unless is_host says otherwise", "[plan]") {
  const std::vector<std::string> base{"--nnodes=1:3", "--rdzv_backend=c10d", "--rdzv_endpoint=node0:29400",
                                      "--rdzv_id=j"};
  auto here = plan(base, /*endpoint_is_here=*/true);
  CHECK(here.host_server);
  CHECK_FALSE(here.host_explicit);  // a taken port: join whoever serves it
  CHECK(here.join.prefer_rank0);
  CHECK_FALSE(here.join.fixed_store_port);
  CHECK(here.join.node_rank == -1);
  CHECK(here.join.last_call_ms == 30000);
  CHECK(here.join.min_nodes == 1);
  CHECK(here.join.max_nodes == 3);
  CHECK(here.store_host == "node0");
  auto elsewhere = plan(base, false);
  CHECK_FALSE(elsewhere.host_server);
  CHECK_FALSE(elsewhere.join.prefer_rank0);

  auto with = [&](std::string conf, bool is_here) {
    auto args = base;
    args.push_back("--rdzv_conf=" + conf);
    return plan(args, is_here);
  };
  auto forced = with("is_host=1", false);
  CHECK(forced.host_server);
  CHECK(forced.host_explicit);
  CHECK_FALSE(with("is_host=false", true).host_server);
  auto timeouts = with("join_timeout=7,last_call_timeout=0.5,heartbeat_timeout=2", false);
  CHECK(timeouts.join.join_timeout_ms == 7000);
  CHECK(timeouts.connect_timeout == std::chrono::milliseconds(7000));
  CHECK(timeouts.join.last_call_ms == 500);
  CHECK(timeouts.join.heartbeat_timeout_ms == 2000);
  CHECK(plan({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:29400"}).store_host == "127.0.0.1");
}

TEST_CASE("bad rendezvous input is a usage error that says what to write", "[plan]") {
  auto bad = [](std::vector<std::string> args) {
    try {
      plan(std::move(args));
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  CHECK_THAT(bad({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=::::garbage:::"}),
             Catch::Contains("expected HOST[:PORT]"));
  CHECK_THAT(bad({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=h:1", "--rdzv_conf=is_host=maybe"}),
             Catch::Contains("is_host=maybe"));
  // An IPv6 literal in brackets is fine.
  CHECK(plan({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=[::1]:29400"}, true).endpoint_host == "::1");
}

TEST_CASE("a port that cannot be bound: the plan says what to do and how to say it", "[plan]") {
  using K = BindFallback::Kind;
  const std::string why = "Address already in use";
  // One node, no port given: a free port instead.
  auto any = on_bind_failure(plan({"--nproc_per_node=2"}), why);
  CHECK(any.kind == K::UseFreePort);
  CHECK_THAT(any.message, Catch::Contains("port 29500 is taken (Address already in use)"));
  // One node, a port given: an error naming the flag that chose it.
  auto fixed = on_bind_failure(plan({"--master_port=29511"}), why);
  CHECK(fixed.kind == K::Fail);
  CHECK_THAT(fixed.message, Catch::Contains("cannot host the store on port 29511") &&
                                Catch::Contains("use another --master_port, or 0 for a free port"));
  auto endpoint = on_bind_failure(plan({"--rdzv_backend=c10d", "--rdzv_endpoint=otherhost:29411"}), why);
  CHECK(endpoint.kind == K::Fail);
  CHECK_THAT(endpoint.message, Catch::Contains("use another --rdzv_endpoint port"));
  // c10d, the endpoint on this host, hosting not asked for: join whoever serves there.
  const std::vector<std::string> c10d{"--nnodes=1:3", "--rdzv_backend=c10d", "--rdzv_endpoint=node0:29400"};
  auto join = on_bind_failure(plan(c10d, /*endpoint_is_here=*/true), why);
  CHECK(join.kind == K::JoinAsClient);
  CHECK_FALSE(join.plan.host_server);
  CHECK_FALSE(join.plan.join.prefer_rank0);
  CHECK_THAT(join.message, Catch::Contains("joining the rendezvous served there as a client"));
  // Hosting asked for (is_host=1, static node 0): an error with the remedy of its backend.
  auto forced_args = c10d;
  forced_args.push_back("--rdzv_conf=is_host=1");
  auto forced = on_bind_failure(plan(forced_args), why);
  CHECK(forced.kind == K::Fail);
  CHECK(forced.plan.host_server);
  CHECK_THAT(forced.message, Catch::Contains("this node hosts the rendezvous (node0:29400)") &&
                                 Catch::Contains("is another job using it?"));
  auto node0 =
      on_bind_failure(plan({"--nnodes=2", "--node_rank=0", "--master_addr=10.0.0.1", "--master_port=29555"}), why);
  CHECK(node0.kind == K::Fail);
  CHECK_THAT(node0.message, Catch::Contains("choose another --master_port"));
}
