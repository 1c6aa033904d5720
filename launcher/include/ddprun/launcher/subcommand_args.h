// The command lines of `ddprun status` and `ddprun dump`, read with CLI11, pure: the arguments
// after the subcommand's name in, the options (or the help text, or a one-line error) out.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ddprun::launcher {

struct StatusArgs {
  bool json = false;
  bool watch = false;
  double interval_s = 1.0;
  std::optional<std::string> run_id;
  std::optional<std::string> endpoint;
  std::string token_file;
};

struct DumpArgs {
  std::optional<std::string> run;  // RUN: a run's log directory, its name or its run id
};

// What a subcommand's command line asks for: `args`, or nothing more to do than print
// `message` and exit with `exit_code` (0: the help, on stdout; 2: the error, on stderr, one
// line without the "ddprun status: error: " prefix).
template <class Args>
struct SubcommandParse {
  std::optional<Args> args;
  int exit_code = 0;
  std::string message;
};

SubcommandParse<StatusArgs> parse_status_args(const std::vector<std::string>& args);
SubcommandParse<DumpArgs> parse_dump_args(const std::vector<std::string>& args);

// `ddprun dump`'s usage, which its errors repeat.
extern const char* const kDumpUsage;

}  // namespace ddprun::launcher
