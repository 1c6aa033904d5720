// Test helper: `world` ranks as threads of this process, each with its own connection to a
// fresh in-process StoreServer and its own Gloo communicator (shared memory on or off).
#pragma once

#include <chrono>
#include <exception>
#include <functional>
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
inline std::vector<std::string> on_gloo_ranks(int world, bool shared_memory, std::chrono::milliseconds timeout,
                                              const std::function<void(int, Communicator&)>& body) {
  server::StoreServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  server::StoreServer server(so);
  server.start();
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        StoreOptions co;
        co.host = "127.0.0.1";
        co.port = server.port();
        co.connect_timeout = timeout;
        auto store = connect_store(co);
        GlooOptions go;
        go.hostname = "127.0.0.1";
        go.timeout = timeout;
        go.shared_memory = shared_memory;
        auto comm = make_gloo_communicator(*store, r, world, go);
        body(r, *comm);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
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
