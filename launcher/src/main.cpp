// ddprun: wires the command line (options.h) through the launch plan (launch_plan.h) to the
// agent (agent.h).
#include <cstdio>
#include <optional>
#include <string>

#include "ddprun/launcher/agent.h"
#include "ddprun/launcher/doctor.h"
#include "ddprun/launcher/hang.h"
#include "ddprun/launcher/launch_plan.h"
#include "ddprun/launcher/log_events.h"
#include "ddprun/launcher/numa.h"
#include "ddprun/launcher/options.h"
#include "ddprun/launcher/status_command.h"

int main(int argc, char** argv) {
  using namespace ddprun::launcher;
  const EnvMap env = current_environment();
  // `ddprun doctor [launch flags] [script args]`: check the machine for that launch, start nothing.
  if (argc > 1 && std::string(argv[1]) == "doctor") {
    std::vector<std::string> args(argv, argv + argc);
    args.erase(args.begin() + 1);
    return doctor::run_doctor(args, env);
  }
  // `ddprun status [--json] [--watch]`: the running jobs of this user on this host.
  if (argc > 1 && std::string(argv[1]) == "status")
    return run_status(std::vector<std::string>(argv + 2, argv + argc), env);
  // `ddprun dump [RUN]`: the stacks of a running job's workers, nothing stopped.
  if (argc > 1 && std::string(argv[1]) == "dump") return run_dump(std::vector<std::string>(argv + 2, argv + argc), env);
  ParseOutcome parsed = parse_command_line(std::vector<std::string>(argv, argv + argc), env, probe_system(env));
  if (!parsed.options) {
    if (parsed.exit_code == 0) {
      std::fputs(parsed.message.c_str(), stdout);
    } else {
      std::fprintf(stderr, "ddprun: error: %s\n", parsed.message.c_str());
    }
    return parsed.exit_code;
  }
  const LaunchOptions& opts = *parsed.options;
  configure_logging(opts.output.log_format, opts.output.verbosity, opts.output.log_timestamps);
  auto error = [](const char* what) {
    write_log_line("error", "launch_refused", std::string("ddprun: error: ") + what + "\n", what);
  };
  if (!opts.platform.slurm_summary.empty())
    write_log_line("info", "slurm", "ddprun: " + opts.platform.slurm_summary + "\n", opts.platform.slurm_summary);
  for (const auto& w : opts.warnings) write_log_line("warning", "option_warning", "ddprun: warning: " + w + "\n", w);
  if (!opts.platform.no_preflight) doctor::run_preflight(opts, env);
  std::optional<const LaunchPlan> plan;
  try {
    plan.emplace(make_launch_plan(std::move(*parsed.options), env));
  } catch (const UsageError& e) {  // nothing has been started
    error(e.what());
    return kUsageExitCode;
  } catch (const NumaError& e) {
    // torchrun fails the launch too (no worker starts) when it cannot bind.
    error(e.what());
    return 1;
  }
  return run(*plan, env);
}
