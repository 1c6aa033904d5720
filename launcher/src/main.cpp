// ddprun: wires the command line (options.h) to the agent (agent.h).
#include <cstdio>

#include "ddprun/launcher/agent.h"
#include "ddprun/launcher/options.h"

int main(int argc, char** argv) {
  using namespace ddprun::launcher;
  const EnvMap env = current_environment();
  ParseOutcome parsed = parse_command_line(std::vector<std::string>(argv, argv + argc), env,
                                           probe_system(env));
  if (!parsed.options) {
    if (parsed.exit_code == 0) {
      std::fputs(parsed.message.c_str(), stdout);
    } else {
      std::fprintf(stderr, "ddprun: error: %s\n", parsed.message.c_str());
    }
    return parsed.exit_code;
  }
  return run(*parsed.options, env);
}
