// The I/O of the rendezvous authentication, apart from its pure logic (agent_auth.h): the
// nonces (libcrypto's RAND_bytes), the token (a file or the environment), and munge
// (MungeClient, munge_auth.h). The launcher resolves an agent's credentials from these once, in
// its launch plan.
#pragma once

#include <string>

#include "ddprun/rdzv/agent_auth.h"

namespace ddprun::rdzv {

// Hex of kNonceBytes bytes from libcrypto's random generator (RAND_bytes). Throws
// std::runtime_error when it fails (no entropy source).
std::string random_nonce();

// The rendezvous token, read the same way by ddprun and ddprund: the contents of `file` when
// given (a regular file of this user, mode 0600 or stricter), else `env_value` (the
// DDPRUN_RDZV_TOKEN variable; nullptr or "" = none, and "" is returned). Trailing whitespace
// (a final newline) is no part of it. Throws std::invalid_argument saying what to fix (e.g.
// `chmod 600 PATH`) for a file that is missing, not regular, another user's or readable by
// others, and for a token shorter than kMinTokenBytes or longer than kMaxTokenBytes.
std::string load_token(const std::string& file, const char* env_value);

}  // namespace ddprun::rdzv
