// The fuzz entry points: one function per target, each taking arbitrary bytes. The same
// functions are called by the libFuzzer binaries (clang, DDPRUN_FUZZ=ON) and by the ordinary
// replay test (any compiler), which runs every seed and every kept crasher in each CI.
//
// Contract: for any input an entry returns normally. A broken invariant (a result the
// component's header rules out) aborts with a message on stderr, so libFuzzer records the
// input and the replay test fails. An exception escaping the component is not caught here:
// the code under test promises not to throw on network bytes or argv.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

// Aborts (a crash to libFuzzer, a failure to the replay test) when an invariant breaks.
#define FUZZ_CHECK(cond, what)                                                                            \
  do {                                                                                                    \
    if (!(cond)) {                                                                                        \
      std::fprintf(stderr, "fuzz invariant broken at %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond, what); \
      std::abort();                                                                                       \
    }                                                                                                     \
  } while (0)

namespace ddprun::fuzz {

// Wire codec: the first byte picks the dialect / frame kind and tight limits; the rest is
// parsed as a client would stream it (detect_dialect, parse_request or the agents'
// parse_message in a loop). Every Ok result is re-encoded and parsed again (idempotent).
void codec_entry(const uint8_t* data, size_t size);

// The server's request handling without sockets: the real StoreState and RoundState, fed
// from up to 8 simulated connections exactly as store_server.cpp's process() does (dialect
// detection, agent magic, parse loop, apply / on_message, close on Bad, disconnect).
// Input: a sequence of commands, see fuzz_entries.cpp.
void server_entry(const uint8_t* data, size_t size);

// The launcher's parse_command_line: byte 0 is the machine (cpu count, gpu count), the rest
// NUL-separated strings; one of the form `PET_NAME=value` or `SLURM...=value` (Slurm detection,
// slurm.h) goes to the environment map, every other one to argv (after argv[0] = "ddprun").
void options_entry(const uint8_t* data, size_t size);

// The token handshake and the sealed messages (agent_auth.h, session_mac.h): byte 0 picks the
// server's or the agent's side and whether the right proofs and seals are filled in (so the
// MAC checks after the handshake are reached); the rest is the peer's frames. See fuzz_auth.cpp.
void auth_entry(const uint8_t* data, size_t size);

using Entry = void (*)(const uint8_t*, size_t);
// nullptr for an unknown name; names: codec, server, options, auth.
Entry entry_by_name(std::string_view name);

}  // namespace ddprun::fuzz
