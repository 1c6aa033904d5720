// `ddprun doctor` and the preflight, as main() calls them: parse, probe, judge, print.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>

#include "ddprun/launcher/doctor.h"
#include "ddprun/launcher/log_events.h"
#include "options/flags.h"

namespace ddprun::launcher::doctor {

int run_doctor(const std::vector<std::string>& argv, const EnvMap& env) {
  // --json is the doctor's own flag, taken out before the launch flags are parsed; only
  // before the entry point (after it, it is the script's).
  std::vector<std::string> args;
  bool json = false;
  size_t i = 0;
  for (; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (i == 0) {
      args.push_back(a);
      continue;
    }
    if (a == "--json") {
      json = true;
      continue;
    }
    if (a == "--" || a.size() < 2 || a[0] != '-') break;  // the entry point
    args.push_back(a);
    if (a == "-r" || a == "-t") {  // short flags with a separate value
      if (i + 1 < argv.size()) args.push_back(argv[++i]);
      continue;
    }
    if (a[1] != '-' || a.find('=') != std::string::npos) continue;
    std::string name = a.substr(2);
    std::replace(name.begin(), name.end(), '-', '_');
    const opt::FlagSpec* f = opt::find_flag(name);
    if (f && f->takes_value && i + 1 < argv.size()) args.push_back(argv[++i]);
  }
  args.insert(args.end(), argv.begin() + static_cast<std::ptrdiff_t>(i), argv.end());
  ParseOutcome parsed = parse_command_line(args, env, probe_system(env));
  if (!parsed.options && parsed.exit_code == kUsageExitCode && parsed.message.rfind("missing entry point", 0) == 0) {
    // The doctor needs no entry point: without one, the workers are taken to run Python.
    args.push_back("--");
    args.push_back("");
    parsed = parse_command_line(args, env, probe_system(env));
  }
  if (!parsed.options) {
    if (parsed.exit_code == 0) {
      std::fputs(parsed.message.c_str(), stdout);
    } else {
      std::fprintf(stderr, "ddprun doctor: error: %s\n", parsed.message.c_str());
    }
    return parsed.exit_code;
  }
  Facts facts = facts_from_options(*parsed.options, env);
  probe_doctor_facts(facts, *parsed.options, env);
  const auto results = evaluate(facts);
  const std::string text = json ? format_json(results) : format_text(results);
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
  return exit_code(results);
}

void run_preflight(const LaunchOptions& opts, const EnvMap& env) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::clock_t cpu0 = std::clock();
  Facts facts = facts_from_options(opts, env);
  probe_preflight_facts(facts);
  for (const auto& r : evaluate_preflight(facts)) {
    const std::string msg = r.item + ": " + r.found + "; fix: " + r.fix + " (ddprun doctor checks more)";
    write_log_line("warning", "preflight", "ddprun: warning: " + msg + "\n", msg,
                   {{"check", r.item}, {"found", r.found}, {"fix", r.fix}});
  }
  if (opts.output.verbosity > 0) {  // what scripts/bench/bench_preflight.py reads
    const auto us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
    const auto cpu_us = static_cast<long long>((std::clock() - cpu0) * 1000000.0 / CLOCKS_PER_SEC);
    std::fprintf(stderr, "ddprun: debug: preflight checks took %lld us (CPU %lld us)\n", static_cast<long long>(us),
                 cpu_us);
  }
}

}  // namespace ddprun::launcher::doctor
