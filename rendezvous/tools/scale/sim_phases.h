// The simulator's phases after the first round (scale_sim_main.cpp runs them): one node dies
// (--kill-one), nodes leave and join (--churn), the server restarts (--expect-restart).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sim.h"

namespace ddprun::scale {

using Deadline = Clock::time_point;

// --kill-one: the middle agent's node dies once every worker is through; the survivors get a
// RESTART, JOIN again, and their workers go through the new round's store. Returns the time of
// the death; ok when that happened before the deadline.
int64_t failure_phase(Shared& s, std::vector<std::unique_ptr<Loop>>& loops, Deadline deadline, bool& ok);

// --churn: how many agents leave (and join); which ones leave (Shared::leavers).
int64_t churn_count(const Options& o);
void pick_leavers(Shared& s);

// What --churn measured: the round every agent ended in (-1: none), counted from the churn.
struct ChurnResult {
  int64_t t_churn = 0, round = -1, rounds = 0;
  RoundTally last;
};
// --churn: the leavers go and as many new agents join at once; the job re-forms (one round or
// more) until a round holds every agent (the survivors and the new ones) and its workers are
// through. ok when that happened before the deadline with a full world of unique ranks.
ChurnResult churn_phase(Shared& s, std::vector<std::unique_ptr<Loop>>& loops, Deadline deadline, bool& ok);

// --expect-restart: writes `ready_file` (every worker is through: kill the server now), then
// waits until every agent lost its connection, re-joined its round and got its JOB_DONE, and
// every worker read the NCCL id again on its store connection of before.
void restart_phase(Shared& s, std::vector<std::unique_ptr<Loop>>& loops, const std::string& ready_file,
                   Deadline deadline, bool& ok);

// The phases' RESULT fields (" key=value ...").
std::string churn_fields(const Shared& s, const ChurnResult& c);
std::string restart_fields(const Shared& s);

}  // namespace ddprun::scale
