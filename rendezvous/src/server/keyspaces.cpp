#include "keyspaces.h"

#include <spdlog/spdlog.h>

#include <stdexcept>

namespace ddprun::server {

Keyspaces::Keyspaces(const StoreServerOptions& options, KeyspaceHost& host, MemoryBudget& budget)
    : options_(options), host_(host), budget_(budget) {
  main_ = std::make_unique<Keyspace>(options.store, options.adaptive_lock);
  main_->name = "main";
}

void Keyspaces::reset_main_locked() {
  std::lock_guard lock(main_->mu);
  host_.revoke_locked(main_.get());
  main_->state.clear();
  budget_.settle(main_->charged, 0);
}

void Keyspaces::discard_all_locked() {
  main_->discarded = true;
  if (main_->listener) main_->listener->stop();
  for (auto& [_, ks] : rounds_) {
    ks->discarded = true;
    ks->listener->stop();
  }
}

void Keyspaces::destroy() {
  rounds_.clear();
  retired_.clear();
  main_.reset();
}

std::string Keyspaces::jobs_limit_message() const {
  return "the rendezvous server runs " + std::to_string(options_.max_jobs) +
         " jobs, its limit (ddprund --max-jobs); try again when one ends, or raise the limit";
}

uint16_t Keyspaces::open(const std::string& run_id, int64_t round, bool fixed_port) {
  return open_on(run_id, round, fixed_port, 0);
}

uint16_t Keyspaces::reopen(const std::string& run_id, int64_t round, bool fixed_port, uint16_t port) {
  return open_on(run_id, round, fixed_port, port);
}

void Keyspaces::resumed(const std::string& run_id, int64_t round, bool agent_hosted) {
  spdlog::info("{}job {}: round {} rebuilt from its agents' re-joins after a restart of this server{}",
               options_.log_prefix, run_id, round,
               agent_hosted ? " (its workers' store is on its node rank 0, untouched)"
                            : " (its workers' store reopened here, empty)");
}

// `want` 0: any free port; else that one when free (a rebuilt round's workers know it).
uint16_t Keyspaces::open_on(const std::string& run_id, int64_t round, bool fixed_port, uint16_t want) {
  if (fixed_port) {
    spdlog::debug("{}job {} round {}: workers' store is the main keyspace (port {}), emptied", options_.log_prefix,
                  run_id, round, main_view_.port());
    return main_rounds_.open(run_id, round);
  }
  if (host_.num_jobs_locked() > options_.max_jobs) throw std::runtime_error(jobs_limit_message());
  if (auto why = host_.no_descriptors_for(main_->listener->sockets()))
    throw std::runtime_error("cannot open the workers' store of job " + run_id + ": " + *why);
  auto ks = std::make_unique<Keyspace>(options_.store, options_.adaptive_lock);
  ks->name = run_id + "/round " + std::to_string(round);
  ks->run_id = run_id;
  ks->listener = host_.make_listener(ks->name);
  const int backlog = options_.backlog > 0 ? options_.backlog : 65535;
  // Same address as the main listener, any free port. Out of descriptors, this throws: the
  // joining agent gets an ERROR, the server goes on.
  try {
    try {
      ks->listener->bind(options_.host, want, backlog, true);
    } catch (const std::exception&) {
      if (want == 0) throw;
      ks->listener->bind(options_.host, 0, backlog, true);  // taken meanwhile: the rebuilt round's store moves
    }
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("cannot open the workers' store of job ") + run_id + ": " + e.what());
  }
  const uint16_t port = ks->listener->port();
  listener_fds_ += ks->listener->sockets();
  host_.start_accepting(ks.get());
  rounds_[{run_id, round}] = std::move(ks);
  spdlog::debug("{}job {} round {}: workers' store on port {}", options_.log_prefix, run_id, round, port);
  return port;
}

void Keyspaces::close(const std::string& run_id, int64_t round) {
  if (main_rounds_.close(run_id, round)) return;
  auto it = rounds_.find({run_id, round});
  if (it == rounds_.end()) return;
  std::unique_ptr<Keyspace> ks = std::move(it->second);
  rounds_.erase(it);
  ks->discarded = true;
  {
    std::lock_guard lock(ks->mu);
    host_.revoke_locked(ks.get());
    ks->state.clear();
    budget_.settle(ks->charged, 0);
  }
  ks->listener->stop();
  listener_fds_ -= ks->listener->sockets();
  retired_.push_back(std::move(ks));
  reap_retired_locked();
}

// A retired keyspace is freed once nothing names it: its listener quiet (no accept handler
// pending) and every connection it had closed (on_closed took it out of conns, the last use).
void Keyspaces::reap_retired_locked() {
  std::erase_if(retired_, [](const std::unique_ptr<Keyspace>& ks) {
    if (!ks->listener->quiet()) return false;
    std::lock_guard lock(ks->mu);
    return ks->conns.empty();
  });
  retained_.store(retired_.size(), std::memory_order_relaxed);
}

bool Keyspaces::progressed(const std::string& run_id, int64_t round, int64_t world_size) {
  if (auto fixed = main_rounds_.progressed(run_id, round, world_size)) return *fixed;
  auto it = rounds_.find({run_id, round});
  if (it == rounds_.end()) return false;
  std::lock_guard lock(it->second->mu);
  return rdzv::all_workers_joined(it->second->state.integer(rdzv::kWorkerJoinKey), world_size);
}

}  // namespace ddprun::server
