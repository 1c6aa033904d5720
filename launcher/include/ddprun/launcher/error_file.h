// Reading a worker's TORCHELASTIC_ERROR_FILE. PyTorch's @record writes
//   {"message": {"message": "<exc type>: <text>", "extraInfo": {"py_callstack": "<traceback>",
//    "timestamp": "<unix s>"}}}
// Older or other writers put a string in "message", or any JSON at all. Pure: text in,
// report out; never throws on bad input.
#pragma once

#include <string>

namespace ddprun::launcher {

struct ErrorFileReport {
  bool valid_json = false;
  std::string message;    // the error message, when one was found
  std::string traceback;  // extraInfo.py_callstack, when present
  std::string timestamp;  // extraInfo.timestamp, when present
  std::string raw;        // the content (trimmed to a bounded size) when no message was found
};

ErrorFileReport parse_error_file(const std::string& content);

// Lines for the failure summary (no trailing newline).
std::string format_error_file(const ErrorFileReport& report);

// Exit code 78 (EX_CONFIG) with an error file whose message begins with "ConfigError": the
// worker says a restart cannot fix its failure (libddprun_worker's ConfigError; a Python
// script can write the same file and exit 78). Either alone is an ordinary failure.
inline constexpr int kConfigErrorExitCode = 78;
bool says_config_error(int exit_code, bool signaled, const std::string* error_file_content);

}  // namespace ddprun::launcher
