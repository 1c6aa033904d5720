#include "ddprun/launcher/subcommand_args.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>

#include "ddprun/launcher/options.h"

namespace ddprun::launcher {

const char* const kDumpUsage =
    "usage: ddprun dump [RUN]\n"
    "  prints the stack of every worker of a running ddprun job on this host and saves them in\n"
    "  <run dir>/stacks/dump_<time>/ (py-spy for Python workers when installed, else eu-stack or gdb);\n"
    "  nothing is stopped. RUN: the run's log directory (<log_dir>/<run_id>_<unique>), its name, or\n"
    "  its run id; none: the newest running job of this user on this host. Only what this user\n"
    "  owns is read: the runs directory (0700), the run directory and its 'workers' file.\n"
    "  -h, --help      this text\n";

namespace {

const char* const kStatusHelp =
    "ddprun status: the running ddprun jobs of this user on this host, one row per worker.\n"
    "  ddprun status [--json] [--watch [--interval S]] [--rdzv_id ID]\n"
    "  ddprun status --rdzv_endpoint HOST[:PORT] --rdzv_id ID [--rdzv_token_file F] [...]\n"
    "                  the whole job, every node, from its rendezvous server\n"
    "\n"
    "Columns: node, rank, pid, state; attempt, and restarts used and left; uptime; CPU % (of\n"
    "one core, since the previous look; the first: since the worker started) and RSS; on\n"
    "machines with an NVIDIA driver, the GPU index, its utilisation % and the GPU memory of\n"
    "the worker's processes; the last failure.\n"
    "\n"
    "Options (each also as --dash-ed):\n"
    "  --json          one JSON document instead of the table (schema: launcher/README.md,\n"
    "                  \"ddprun status\"); with --watch, one document per line\n"
    "  --watch         redraw the table in place every --interval seconds (Ctrl-C ends it)\n"
    "  --interval S    seconds between redraws (default 1, at least 0.1)\n"
    "  --rdzv_id ID    only the job with this run id\n"
    "  --rdzv_endpoint HOST[:PORT]\n"
    "                  ask the job's rendezvous server (a multi-node job's endpoint, or its\n"
    "                  --master_addr:--master_port when static; port 29400 when not given) for\n"
    "                  the status every agent sent it (every 2 s); needs --rdzv_id\n"
    "  --rdzv_token_file F\n"
    "                  the job's token (else DDPRUN_RDZV_TOKEN), as the agents were given it\n"
    "  -h, --help      this text\n"
    "\n"
    "Each agent answers on an owner-only unix socket in $XDG_RUNTIME_DIR/ddprun/, or in\n"
    "/tmp/ddprun-<uid>/ when XDG_RUNTIME_DIR is unset or another user's (directory 0700,\n"
    "socket 0600; the agent also checks the caller's uid): no other user can read it. A\n"
    "directory another user made (or open to others) is not read: the error says how to fix it.\n"
    "Exit codes: 0 a job was shown, 1 none runs (or the directory is refused), 2 bad command line.\n";

// CLI11 takes `--flag=` as "take the next argument": given as `--flag ""` it is the empty value
// it says. Reversed, as CLI11 consumes from the back.
std::vector<std::string> for_cli11(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const auto& a : args) {
    if (a.size() > 3 && a.rfind("--", 0) == 0 && a.back() == '=' && a.find('=') == a.size() - 1) {
      out.push_back(a.substr(0, a.size() - 1));
      out.emplace_back();
    } else {
      out.push_back(a);
    }
  }
  std::reverse(out.begin(), out.end());
  return out;
}

// One line, no control bytes: errors quote what the user typed.
std::string one_line(std::string s) {
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = c == '\n' ? ' ' : '?';
  }
  return s;
}

template <class Args>
SubcommandParse<Args> run_parser(CLI::App& app, const std::vector<std::string>& args, const char* help,
                                 const std::string& hint, const std::function<Args()>& finish) {
  SubcommandParse<Args> out;
  try {
    std::vector<std::string> reversed = for_cli11(args);
    app.parse(reversed);
    out.args = finish();
  } catch (const CLI::CallForHelp&) {
    out.message = help;
  } catch (const CLI::ParseError& e) {
    out.exit_code = kUsageExitCode;
    out.message = one_line(e.what() + hint);
  } catch (const UsageError& e) {
    out.exit_code = kUsageExitCode;
    out.message = one_line(e.what());
  }
  return out;
}

double interval_seconds(const std::string& v) {
  char* end = nullptr;
  const double s = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(s) || s < 0.1)
    throw UsageError("--interval " + v + ": give seconds, at least 0.1 (e.g. --interval 2)");
  return s;
}

}  // namespace

SubcommandParse<StatusArgs> parse_status_args(const std::vector<std::string>& args) {
  CLI::App app{"ddprun status", "ddprun status"};
  app.set_help_flag("-h,--help");
  app.allow_extras();  // named in our own words below
  bool json = false, watch = false;
  std::string interval, run_id, endpoint, token_file;
  app.add_flag("--json", json);
  app.add_flag("--watch", watch);
  auto* interval_opt = app.add_option("--interval", interval)->type_name("S");
  auto* id_opt = app.add_option("--rdzv_id,--rdzv-id", run_id)->type_name("ID");
  auto* endpoint_opt = app.add_option("--rdzv_endpoint,--rdzv-endpoint", endpoint)->type_name("HOST[:PORT]");
  app.add_option("--rdzv_token_file,--rdzv-token-file", token_file)->type_name("F");
  for (const auto& arg : args) {
    for (const char* flag : {"--json=", "--watch="}) {
      if (arg.rfind(flag, 0) == 0) {
        const std::string name(flag, std::char_traits<char>::length(flag) - 1);
        return {std::nullopt, kUsageExitCode, name + " takes no value (give " + name + " alone)"};
      }
    }
    if (arg == "--") break;
  }
  const std::string hint = " (ddprun status --help lists the options)";
  return run_parser<StatusArgs>(app, args, kStatusHelp, hint, [&] {
    if (!app.remaining().empty()) throw UsageError("unknown argument " + app.remaining().front() + hint);
    StatusArgs a;
    a.json = json;
    a.watch = watch;
    if (*interval_opt) a.interval_s = interval_seconds(interval);
    if (*id_opt) a.run_id = run_id;
    if (*endpoint_opt) a.endpoint = endpoint;
    a.token_file = token_file;
    if (a.endpoint && !a.run_id) throw UsageError("--rdzv_endpoint needs --rdzv_id (the server may hold several jobs)");
    if (!a.token_file.empty() && !a.endpoint) throw UsageError("--rdzv_token_file goes with --rdzv_endpoint");
    return a;
  });
}

SubcommandParse<DumpArgs> parse_dump_args(const std::vector<std::string>& args) {
  CLI::App app{"ddprun dump", "ddprun dump"};
  app.set_help_flag("-h,--help");
  app.allow_extras();
  std::string run;
  auto* run_opt = app.add_option("RUN", run);
  return run_parser<DumpArgs>(app, args, kDumpUsage, "", [&] {  // its errors are followed by the usage
    DumpArgs a;
    if (*run_opt) a.run = run;
    bool after_dashes = false;  // CLI11 leaves `--` and what follows it to us
    for (const auto& extra : app.remaining()) {
      if (extra == "--" && !after_dashes) {
        after_dashes = true;
        continue;
      }
      if (!after_dashes && !extra.empty() && extra[0] == '-') throw UsageError("unknown option " + extra);
      if (a.run) throw UsageError("one RUN at most (got " + *a.run + " and " + extra + ")");
      a.run = extra;
    }
    return a;
  });
}

}  // namespace ddprun::launcher
