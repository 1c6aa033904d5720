// Test helper: `world` ranks as threads of this process, each with its own connection to a
// fresh in-process StoreServer and its own Gloo communicator (shared memory on or off).
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <latch>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/server/store_server.h"
#include "ddprun/worker/communicator.h"
#include "ddprun/worker/store.h"

namespace ddprun::worker::testing {

// Runs body(rank, comm) on every rank and returns each rank's exception message ("" when it
// returned normally). No Catch assertions inside body: Catch is not thread-safe.
// Every rank keeps its communicator until every rank is done (body returned or threw): Gloo's
// connectFullMesh() can return on one rank while a peer still completes its side of a pair,
// and a communicator destroyed at that moment fails the peer with "connection closed by peer"
// (a worker that exits while its peers still connect fails them the same way in a real job).
inline std::vector<std::string> on_gloo_ranks(int world, bool shared_memory, std::chrono::milliseconds timeout,
                                              const std::function<void(int, Communicator&)>& body) {
  server::StoreServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  server::StoreServer server(so);
  server.start();
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> ts;
  std::latch done(world);
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      std::unique_ptr<Store> store;
      std::unique_ptr<Communicator> comm;
      try {
        StoreOptions co;
        co.host = "127.0.0.1";
        co.port = server.port();
        co.connect_timeout = timeout;
        store = connect_store(co);
        GlooOptions go;
        go.hostname = "127.0.0.1";
        go.timeout = timeout;
        go.shared_memory = shared_memory;
        comm = make_gloo_communicator(*store, r, world, go);
        body(r, *comm);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
      done.arrive_and_wait();
    });
  for (auto& t : ts) t.join();
  return errors;
}

// The communicator's fused-step capability, which a test of the shared-memory path needs (it
// throws inside body, so the rank reports it, when the path is off).
inline FusedStep& shm_path(Communicator& comm) {
  FusedStep* fs = comm.fused_step();
  if (!fs) throw std::runtime_error("the communicator has no shared-memory path (fused_step() is nullptr)");
  return *fs;
}

}  // namespace ddprun::worker::testing
