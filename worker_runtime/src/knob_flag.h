// The worker's on/off knobs (DDPRUN_SHM, DDPRUN_DEBUG_COLLECTIVES): "0" or "1" only. Anything
// else ("yes", "true", "2") is an error naming the variable, not a silent "off": a typo must not
// quietly turn a safety check or a transport off. Unset or empty means the knob's default.
#pragma once

#include <optional>
#include <string>

#include "ddprun/common/knobs.h"
#include "ddprun/worker/checks.h"

namespace ddprun::worker {

// Pure: the value as given (nullopt = unset) -> on/off, or WorkerError.
inline bool parse_knob_flag(const knobs::Knob& knob, const std::optional<std::string>& value) {
  const std::string v = value ? *value : std::string(knob.default_value);
  if (v == "1") return true;
  if (v == "0") return false;
  throw WorkerError(std::string(knob.name) + "='" + v + "': expected 0 or 1 (" + knob.meaning + ")");
}

inline bool knob_flag(const knobs::Knob& knob) { return parse_knob_flag(knob, knobs::get(knob)); }

}  // namespace ddprun::worker
