// The torchelastic error file (TORCHELASTIC_ERROR_FILE), in PyTorch's format:
//   {"message": {"message": "<msg>", "extraInfo": {"py_callstack": "<trace>",
//                                                  "timestamp": "<unix seconds>"}}}
#pragma once

#include <string>

#include "ddprun/worker/export.h"

namespace ddprun::worker {

// JSON text of the error record (exposed for tests).
DDPRUN_WORKER_API std::string error_file_json(const std::string& message, const std::string& callstack,
                                              long long unix_seconds);

// Writes the record to `path` (no-op when empty). Best effort: never throws, returns false on
// failure. Async-signal-unsafe (allocates); call from normal context.
DDPRUN_WORKER_API bool write_error_file(const std::string& path, const std::string& message,
                                        const std::string& callstack);

}  // namespace ddprun::worker
