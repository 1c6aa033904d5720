// Helpers that the parts of RoundState share (round_state.cpp, round_resume.cpp, round_tick.cpp).
#pragma once

#include <string>
#include <vector>

#include "ddprun/rdzv/agent_protocol.h"

namespace ddprun::rdzv {

namespace detail {
inline Message error_msg(const std::string& text) { return to_message(Error{.message = text}); }
inline std::string join_list(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}
}  // namespace detail

}  // namespace ddprun::rdzv
