#include <catch2/catch.hpp>

#include <csignal>

#include "ddprun/common/knobs.h"
#include "ddprun/launcher/options.h"

using namespace ddprun::launcher;

namespace {

const SystemInfo kSys{.cpu_count = 8, .gpu_count = 0};
const SystemInfo kGpuSys{.cpu_count = 16, .gpu_count = 4};

ParseOutcome parse(std::vector<std::string> args, const EnvMap& env = {}, SystemInfo sys = kSys) {
  args.insert(args.begin(), "ddprun");
  return parse_command_line(args, env, sys);
}

LaunchOptions ok(std::vector<std::string> args, const EnvMap& env = {}, SystemInfo sys = kSys) {
  auto r = parse(std::move(args), env, sys);
  INFO(r.message);
  REQUIRE(r.options);
  return *r.options;
}

std::string error_of(std::vector<std::string> args, const EnvMap& env = {}) {
  auto r = parse(std::move(args), env);
  REQUIRE_FALSE(r.options);
  CHECK(r.exit_code == kUsageExitCode);
  CHECK(r.message.find('\n') == std::string::npos);
  return r.message;
}

}  // namespace

TEST_CASE("defaults match torchrun", "[options]") {
  auto o = ok({"train.py"});
  CHECK(o.nodes.nproc_per_node == 1);
  CHECK(o.nodes.min_nodes == 1);
  CHECK(o.nodes.max_nodes == 1);
  CHECK(o.rendezvous.master_addr == "127.0.0.1");
  CHECK_FALSE(o.rendezvous.master_port);
  CHECK(o.rendezvous.backend == RdzvBackend::Static);
  CHECK(o.rendezvous.id == "none");
  CHECK(o.faults.max_restarts == 0);
  CHECK(o.workers.role == "default");
  CHECK(o.faults.shutdown_timeout_s == 30.0);
  CHECK(o.faults.signals_to_handle.size() == 4);
  CHECK(o.workers.entrypoint == "train.py");
  CHECK(o.workers.args.empty());
}

TEST_CASE("underscore and dash spellings are the same flag", "[options]") {
  for (const std::string flag : {"--nproc_per_node", "--nproc-per-node"}) {
    CHECK(ok({flag + "=3", "x"}).nodes.nproc_per_node == 3);
    CHECK(ok({flag, "3", "x"}).nodes.nproc_per_node == 3);
  }
  CHECK(ok({"--max-restarts=2", "x"}).faults.max_restarts == 2);
  CHECK(ok({"--max_restarts=2", "x"}).faults.max_restarts == 2);
  CHECK(ok({"--master-port=1234", "x"}).rendezvous.master_port == 1234);
  CHECK(ok({"--rdzv-id=job7", "x"}).rendezvous.id == "job7");
  CHECK(ok({"--no-python", "x"}).workers.no_python);
  CHECK(ok({"--no_python", "x"}).workers.no_python);
  CHECK(ok({"--local-ranks-filter=0,2", "x"}).output.local_ranks_filter == std::set<int>{0, 2});
  CHECK(ok({"--shutdown-timeout=2.5", "x"}).faults.shutdown_timeout_s == 2.5);
  CHECK(ok({"--virtual-local-rank", "x"}).workers.virtual_local_rank);
  CHECK(ok({"--log-dir", "/tmp/l", "x"}).output.log_dir == "/tmp/l");
}

TEST_CASE("short flags -m -r -t", "[options]") {
  auto o = ok({"-m", "-r", "3", "-t", "0:1,1:2", "pkg.mod", "--lr", "0.1"});
  CHECK(o.workers.module);
  CHECK(o.output.redirects.all == 3);
  CHECK(o.output.tee.for_rank(0) == 1);
  CHECK(o.output.tee.for_rank(1) == 2);
  CHECK(o.output.tee.for_rank(2) == 0);
  CHECK(o.workers.entrypoint == "pkg.mod");
  CHECK(o.workers.args == std::vector<std::string>{"--lr", "0.1"});
}

TEST_CASE("everything after the entry point belongs to it", "[options]") {
  auto o = ok({"--nproc_per_node=2", "train.py", "--nproc_per_node=5", "-m", "--help"});
  CHECK(o.nodes.nproc_per_node == 2);
  CHECK_FALSE(o.workers.module);
  CHECK(o.workers.args == std::vector<std::string>{"--nproc_per_node=5", "-m", "--help"});
}

TEST_CASE("PET_ environment variables fill flags; the command line wins", "[options]") {
  EnvMap env{{"PET_NPROC_PER_NODE", "4"},
             {"PET_MAX_RESTARTS", "3"},
             {"PET_STANDALONE", "0"},
             {"PET_NO_PYTHON", "1"},
             {"PET_RDZV_ID", "kubeflow"}};
  auto o = ok({"x"}, env);
  CHECK(o.nodes.nproc_per_node == 4);
  CHECK(o.faults.max_restarts == 3);
  CHECK_FALSE(o.rendezvous.standalone);
  CHECK(o.workers.no_python);
  CHECK(o.rendezvous.id == "kubeflow");
  auto o2 = ok({"--nproc_per_node=2", "x"}, env);
  CHECK(o2.nodes.nproc_per_node == 2);
  CHECK(o2.faults.max_restarts == 3);
}

TEST_CASE("bad PET_ values are reported against the flag", "[options]") {
  auto msg = error_of({"x"}, {{"PET_NPROC_PER_NODE", "lots"}});
  CHECK_THAT(msg, Catch::Contains("--nproc_per_node") && Catch::Contains("lots"));
}

TEST_CASE("nproc_per_node accepts int, cpu, gpu, auto", "[options][nproc]") {
  CHECK(parse_nproc_per_node("5", kSys) == 5);
  CHECK(parse_nproc_per_node("cpu", kSys) == 8);
  CHECK(parse_nproc_per_node("auto", kSys) == 8);
  CHECK(parse_nproc_per_node("auto", kGpuSys) == 4);
  CHECK(parse_nproc_per_node("gpu", kGpuSys) == 4);
  CHECK_THROWS_AS(parse_nproc_per_node("gpu", kSys), UsageError);
  for (const char* bad : {"abc", "0", "-1", "2.5", "", "3x"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_nproc_per_node(bad, kSys),
                      Catch::Contains("--nproc_per_node") && Catch::Contains("cpu, gpu or auto"));
  }
}

TEST_CASE("GPU count comes from CUDA_VISIBLE_DEVICES, else /dev/nvidiaN", "[options][nproc]") {
  CHECK(count_visible_gpus({}, 8) == 8);
  CHECK(count_visible_gpus({{"CUDA_VISIBLE_DEVICES", "0,3"}}, 8) == 2);
  CHECK(count_visible_gpus({{"CUDA_VISIBLE_DEVICES", ""}}, 8) == 0);
  CHECK(count_visible_gpus({{"CUDA_VISIBLE_DEVICES", "1,-1,2"}}, 8) == 1);
  CHECK(count_visible_gpus({{"CUDA_VISIBLE_DEVICES", "GPU-abc,GPU-def"}}, 0) == 2);
}

TEST_CASE("nnodes is N or MIN:MAX", "[options]") {
  CHECK(parse_nnodes("1") == std::pair{1, 1});
  CHECK(parse_nnodes("2:4") == std::pair{2, 4});
  CHECK_THROWS_WITH(parse_nnodes("3:2"), Catch::Contains("--nnodes") && Catch::Contains("MIN:MAX"));
  CHECK_THROWS_AS(parse_nnodes("0"), UsageError);
  CHECK_THROWS_AS(parse_nnodes("a:b"), UsageError);
  CHECK_THROWS_AS(parse_nnodes("1:2:3"), UsageError);
}

TEST_CASE("multi-node options are validated", "[options]") {
  auto st = ok({"--nnodes=2", "--node_rank=1", "--master_addr=10.1.2.3", "x"});
  CHECK(st.nodes.max_nodes == 2);
  CHECK(st.nodes.node_rank == 1);
  auto dyn = ok({"--nnodes=2:4", "--rdzv_backend=c10d", "--rdzv_endpoint=h:1", "x"});
  CHECK(dyn.nodes.min_nodes == 2);
  CHECK(dyn.nodes.max_nodes == 4);
  CHECK(dyn.rendezvous.port == 1);
  CHECK_THAT(error_of({"--nnodes=2", "--node_rank=2", "x"}), Catch::Contains("--node_rank"));
  CHECK_THAT(error_of({"--nnodes=2:3", "x"}), Catch::Contains("--rdzv_backend=c10d"));
  CHECK_THAT(error_of({"--nnodes=2", "--rdzv_backend=c10d", "x"}), Catch::Contains("--rdzv_endpoint"));
  CHECK_THAT(error_of({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=h", "--node_rank=1", "x"}),
             Catch::Contains("--node_rank applies to --rdzv_backend=static"));
  CHECK(ok({"--nnodes=1:1", "x"}).nodes.max_nodes == 1);
}

TEST_CASE("redirects and tee: 0-3 or per local rank", "[options][streams]") {
  CHECK(parse_std_streams("tee", "3").all == 3);
  CHECK(parse_std_streams("tee", "3").for_rank(7) == 3);
  auto per = parse_std_streams("redirects", "0:3,1:0,2:1");
  CHECK(per.for_rank(0) == 3);
  CHECK(per.for_rank(1) == 0);
  CHECK(per.for_rank(2) == 1);
  CHECK(per.for_rank(3) == 0);
  for (const char* bad : {"4", "-1", "x", "0:4", "0:", ":1", "0:1:2"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_std_streams("tee", bad), Catch::Contains("--tee"));
  }
}

TEST_CASE("rdzv_conf, endpoint, signals, filters", "[options]") {
  auto conf = parse_rdzv_conf("join_timeout=900, is_host=1,read_timeout=60");
  CHECK(conf.at("join_timeout") == "900");
  CHECK(conf.at("is_host") == "1");
  CHECK_THROWS_AS(parse_rdzv_conf("join_timeout"), UsageError);
  CHECK_THROWS_AS(parse_rdzv_conf("join_timeout=soon"), UsageError);
  auto o = ok({"--rdzv_backend=c10d", "--rdzv_endpoint=head:1234", "x"});
  CHECK(o.rendezvous.host == "head");
  CHECK(o.rendezvous.port == 1234);
  CHECK(o.rendezvous.port_given);
  CHECK(ok({"--rdzv_backend=c10d", "--rdzv_endpoint=head", "x"}).rendezvous.port == 29400);
  CHECK_FALSE(ok({"--rdzv_backend=c10d", "--rdzv_endpoint=head", "x"}).rendezvous.port_given);
  CHECK(ok({"--rdzv_endpoint=[::1]:99", "x"}).rendezvous.host == "::1");
  CHECK_THAT(error_of({"--rdzv_endpoint=head:99999", "x"}), Catch::Contains("--rdzv_endpoint"));
  CHECK_THAT(error_of({"--rdzv_backend=zk", "x"}), Catch::Contains("static or c10d"));
  CHECK(parse_signals("SIGTERM,INT,15") == std::vector<int>{15, 2, 15});
  CHECK_THROWS_WITH(parse_signals("SIGKILL"), Catch::Contains("--signals_to_handle"));
  CHECK_THROWS_AS(parse_signals("SIGNOPE"), UsageError);
  CHECK_THROWS_AS(parse_local_ranks_filter("a"), UsageError);
}

TEST_CASE("standalone: one node, free port, random run id", "[options]") {
  auto a = ok({"--standalone", "x"});
  auto b = ok({"--standalone", "x"});
  CHECK(a.rendezvous.backend == RdzvBackend::C10d);
  CHECK(a.rendezvous.port == 0);
  CHECK(a.rendezvous.id != "none");
  CHECK(a.rendezvous.id != b.rendezvous.id);
  CHECK_THAT(error_of({"--standalone", "--nnodes=2", "x"}), Catch::Contains("--standalone"));
}

TEST_CASE("bad input: one line naming the flag, exit 2", "[options]") {
  CHECK_THAT(error_of({"--nproc_per_node=abc", "x"}), Catch::Contains("--nproc_per_node"));
  CHECK_THAT(error_of({"--nnodes=3:2", "x"}), Catch::Contains("--nnodes"));
  CHECK_THAT(error_of({}), Catch::Contains("entry point"));
  CHECK_THAT(error_of({"--nproc_per_node=2"}), Catch::Contains("entry point"));
  CHECK_THAT(error_of({"--bogus", "x"}), Catch::Contains("--bogus"));
  CHECK_THAT(error_of({"--max_restarts=-1", "x"}), Catch::Contains("--max_restarts"));
  CHECK_THAT(error_of({"--master_port=70000", "x"}), Catch::Contains("--master_port"));
  CHECK_THAT(error_of({"--shutdown_timeout=soon", "x"}), Catch::Contains("--shutdown_timeout"));
  CHECK_THAT(error_of({"--module", "--no_python", "x"}), Catch::Contains("mutually exclusive"));
}

TEST_CASE("--help is not an error", "[options]") {
  auto r = parse({"--help"});
  CHECK_FALSE(r.options);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.message, Catch::Contains("--nproc_per_node") && Catch::Contains("PET_NPROC_PER_NODE"));
}

TEST_CASE("--version prints the version and is not an error; after the entry point it is the script's", "[options]") {
  auto r = parse({"--version"});
  CHECK_FALSE(r.options);
  CHECK(r.exit_code == 0);
  // X.Y.Z at a release, X.Y.Z.devN+g<hash> after it, 0.0.0+unknown without git (PEP 440).
  CHECK_THAT(r.message, Catch::Matches("ddprun [0-9]+\\.[0-9]+\\.[0-9]+(\\.dev[0-9]+)?(\\+[0-9a-z.]+)?\n"));
  CHECK(ok({"train.py", "--version"}).workers.args == std::vector<std::string>{"--version"});
}

TEST_CASE("--overlap_restart: on by default, 1/0/true/false, both spellings, PET_", "[options]") {
  CHECK(ok({"x"}).faults.overlap_restart);
  CHECK_FALSE(ok({"--overlap_restart=0", "x"}).faults.overlap_restart);
  CHECK_FALSE(ok({"--overlap-restart", "false", "x"}).faults.overlap_restart);
  CHECK_FALSE(ok({"--overlap_restart=FALSE", "x"}).faults.overlap_restart);
  CHECK(ok({"--overlap-restart=1", "x"}).faults.overlap_restart);
  CHECK(ok({"--overlap_restart=true", "x"}).faults.overlap_restart);
  CHECK_FALSE(ok({"x"}, {{"PET_OVERLAP_RESTART", "0"}}).faults.overlap_restart);
  CHECK(ok({"--overlap_restart=1", "x"}, {{"PET_OVERLAP_RESTART", "0"}}).faults.overlap_restart);  // command line wins
  CHECK_THAT(error_of({"--overlap_restart=maybe", "x"}), Catch::Contains("--overlap_restart") &&
                                                             Catch::Contains("'maybe'") &&
                                                             Catch::Contains("1/0 or true/false"));
  CHECK_THAT(error_of({"x"}, {{"PET_OVERLAP_RESTART", "yes please"}}), Catch::Contains("--overlap_restart"));
}

TEST_CASE("--early_exit_watch: on by default, 1/0, both spellings, PET_", "[options]") {
  CHECK(ok({"x"}).workers.early_exit_watch);
  CHECK_FALSE(ok({"--early_exit_watch=0", "x"}).workers.early_exit_watch);
  CHECK_FALSE(ok({"--early-exit-watch", "false", "x"}).workers.early_exit_watch);
  CHECK(ok({"--early-exit-watch=1", "x"}).workers.early_exit_watch);
  CHECK_FALSE(ok({"x"}, {{"PET_EARLY_EXIT_WATCH", "0"}}).workers.early_exit_watch);
  CHECK_THAT(error_of({"--early_exit_watch=sometimes", "x"}),
             Catch::Contains("--early_exit_watch") && Catch::Contains("'sometimes'"));
}

TEST_CASE("--help lists the environment knobs", "[options]") {
  auto r = parse({"--help"});
  CHECK_THAT(r.message, Catch::Contains("DDPRUN_DEFAULT_STORE_PORT") && Catch::Contains("PYTHON_EXEC") &&
                            Catch::Contains("DDPRUN_COLLECTIVE_TIMEOUT_S"));
}

TEST_CASE("--help leaves out the knobs for tests and benchmarks", "[options]") {
  auto r = parse({"--help"});
  CHECK_THAT(r.message, !Catch::Contains("DDPRUN_SYSFS_ROOT") && !Catch::Contains("DDPRUN_STORE_LOCK"));
  CHECK(ddprun::knobs::test_only(ddprun::knobs::kStoreLock));
  CHECK_FALSE(ddprun::knobs::test_only(ddprun::knobs::kRunsDir));
}

TEST_CASE("--help says when a worker's exit 99 means preempted", "[options]") {
  auto r = parse({"--help"});
  CHECK_THAT(r.message, !Catch::Contains("or a worker exited 99"));
  CHECK_THAT(r.message, Catch::Contains("DDPRUN_PREEMPT_FILE") &&
                            Catch::Contains("Any other worker exit 99 is an ordinary failure"));
}

TEST_CASE("torchrun 2.11's log filter flags: both spellings, ',,' escapes a comma, PET_", "[options]") {
  CHECK(ok({"x"}).output.duplicate_stdout_filters.empty());
  CHECK(ok({"--duplicate-stdout-filters", "apple,orange", "x"}).output.duplicate_stdout_filters ==
        std::vector<std::string>{"apple", "orange"});
  CHECK(ok({"--duplicate_stderr_filters=a,,b,c", "x"}).output.duplicate_stderr_filters ==
        std::vector<std::string>{"a,b", "c"});
  CHECK(ok({"--duplicate_stdout_filters", "", "x"}).output.duplicate_stdout_filters == std::vector<std::string>{""});
  CHECK(ok({"x"}, {{"PET_DUPLICATE_STDERR_FILTERS", "err"}}).output.duplicate_stderr_filters ==
        std::vector<std::string>{"err"});
  CHECK(parse_filter_list("a,,,b") == std::vector<std::string>{"a,", "b"});
  CHECK(parse_filter_list("x,") == std::vector<std::string>{"x", ""});
}

TEST_CASE("--numa-binding takes torchrun 2.11's modes", "[options]") {
  CHECK_FALSE(ok({"x"}).platform.numa_binding);
  for (const std::string m : {"node", "socket", "exclusive", "core-complex"}) {
    CHECK(ok({"--numa-binding=" + m, "x"}).platform.numa_binding == parse_numa_mode(m));
    CHECK(ok({"--numa_binding", m, "x"}).platform.numa_binding == parse_numa_mode(m));
  }
  CHECK(ok({"--numa-binding=core-complex", "x"}).platform.numa_binding == NumaMode::CoreComplex);
  CHECK_THAT(error_of({"--numa-binding=nodes", "x"}), Catch::Contains("--numa_binding") && Catch::Contains("'nodes'") &&
                                                          Catch::Contains("node, socket, exclusive or core-complex"));
}

TEST_CASE("--logs-specs and --event-log-handler are accepted, with what they mean here", "[options]") {
  auto o = ok({"--logs-specs=my_specs", "x"});
  CHECK(o.output.logs_specs == "my_specs");
  REQUIRE(o.warnings.size() == 1);
  CHECK_THAT(o.warnings[0], Catch::Contains("my_specs") && Catch::Contains("cannot load"));
  CHECK(ok({"x"}).warnings.empty());
  CHECK(ok({"x"}).output.event_log_handler == EventLogHandler::Null);
  CHECK(ok({"--event_log_handler=dynamic_rendezvous", "x"}).warnings.empty());
  CHECK(ok({"--event_log_handler=dynamic_rendezvous", "x"}).output.event_log_handler ==
        EventLogHandler::DynamicRendezvous);
  auto c = ok({"--event-log-handler", "console", "x"});
  CHECK(c.output.event_log_handler == EventLogHandler::Console);
  CHECK(c.warnings.size() == 1);
  CHECK_THAT(error_of({"--event-log-handler=kafka", "x"}),
             Catch::Contains("--event_log_handler") && Catch::Contains("null, console or dynamic_rendezvous"));
}

TEST_CASE("the knob registry: unique names, documented, read from a map", "[options]") {
  std::set<std::string> names;
  for (const auto& k : ddprun::knobs::kAll) {
    CHECK(names.insert(k.name).second);
    CHECK(std::string(k.meaning).size() > 10);
    CHECK(std::string(k.default_value).size() > 0);
  }
  CHECK(names.count("DDPRUN_STORE_LOCK"));
  const EnvMap env{{"DDPRUN_SYSFS_ROOT", "/fake"}, {"PYTHON_EXEC", ""}};
  CHECK(ddprun::knobs::get(ddprun::knobs::kSysfsRoot, env) == std::optional<std::string>("/fake"));
  CHECK_FALSE(ddprun::knobs::get(ddprun::knobs::kPythonExec, env));  // empty counts as unset
  CHECK_FALSE(ddprun::knobs::get(ddprun::knobs::kStoreLock, env));
}

TEST_CASE("--rdzv_token_file: both spellings and PET_RDZV_TOKEN_FILE; an empty path is refused", "[options]") {
  // The file itself is read and checked by the agent (rdzv::load_token), not by the parser.
  CHECK(ok({"--rdzv_token_file", "/etc/ddprun/token", "train.py"}).rendezvous.token_file == "/etc/ddprun/token");
  CHECK(ok({"--rdzv-token-file=/t", "train.py"}).rendezvous.token_file == "/t");
  CHECK(ok({"train.py"}, {{"PET_RDZV_TOKEN_FILE", "/from/env"}}).rendezvous.token_file == "/from/env");
  CHECK(ok({"train.py"}).rendezvous.token_file.empty());
  CHECK_THAT(error_of({"--rdzv_token_file", " ", "train.py"}), Catch::Contains("rdzv_token_file"));
  auto help = parse({"--help"});
  CHECK_THAT(help.message, Catch::Contains("--rdzv_token_file"));
  CHECK_THAT(help.message, Catch::Contains("DDPRUN_RDZV_TOKEN"));
}

TEST_CASE("--preempt_signals and --preempt_grace: defaults, both spellings, none, PET_, bad values", "[options]") {
  const auto d = ok({"x"});
  CHECK(d.faults.preempt_signals == std::vector<int>{SIGUSR1});
  CHECK(d.faults.preempt_grace_s == 90.0);
  CHECK(ok({"--preempt-signals=SIGUSR1,TERM", "x"}).faults.preempt_signals == std::vector<int>{SIGUSR1, SIGTERM});
  CHECK(ok({"--preempt_signals", "none", "x"}).faults.preempt_signals.empty());
  CHECK(ok({"--preempt-grace=2.5", "x"}).faults.preempt_grace_s == 2.5);
  CHECK(ok({"x"}, {{"PET_PREEMPT_GRACE", "7"}}).faults.preempt_grace_s == 7.0);
  CHECK(ok({"x"}, {{"PET_PREEMPT_SIGNALS", "SIGUSR2"}}).faults.preempt_signals == std::vector<int>{SIGUSR2});
  CHECK_THAT(error_of({"--preempt_signals=SIGKILL", "x"}),
             Catch::Contains("--preempt_signals") && Catch::Contains("none"));
  CHECK_THAT(error_of({"--preempt_grace=-1", "x"}), Catch::Contains("--preempt_grace") && Catch::Contains("seconds"));
}

TEST_CASE("--exit_barrier_timeout: off by default, seconds, from PET_ too", "[options]") {
  CHECK(ok({"x"}).faults.exit_barrier_timeout_s == 0);
  CHECK(ok({"--exit-barrier-timeout=2.5", "x"}).faults.exit_barrier_timeout_s == 2.5);
  CHECK(ok({"--exit_barrier_timeout", "60", "x"}).faults.exit_barrier_timeout_s == 60);
  CHECK(ok({"x"}, {{"PET_EXIT_BARRIER_TIMEOUT", "7"}}).faults.exit_barrier_timeout_s == 7);
  CHECK_THAT(error_of({"--exit_barrier_timeout=-1", "x"}), Catch::Contains("--exit_barrier_timeout"));
  CHECK_THAT(error_of({"--exit_barrier_timeout=soon", "x"}), Catch::Contains("a number of seconds"));
}

TEST_CASE("--flag= with an empty value is a usage error naming the flag, not a swallowed argument", "[options]") {
  // The flags torchrun 2.11 refuses empty (int(""), choices) or fails on (an empty backend,
  // host, handler or plugin name), and ddprun's own.
  for (const std::string flag :
       {"--rdzv_token_file=", "--master_port=", "--master-addr=", "--nnodes=", "--nproc_per_node=", "--node_rank=",
        "--rdzv_backend=", "--max_restarts=", "--monitor_interval=", "--start_method=", "--event_log_handler=",
        "--logs_specs=", "--redirects=", "--tee=", "--numa_binding=", "--hang_timeout=", "--preempt_signals=",
        "--stdin_rank="}) {
    INFO(flag);
    CHECK_THAT(error_of({flag, "--no_python", "x"}), Catch::Contains(flag) && Catch::Contains("empty value"));
    CHECK_THAT(error_of({flag, "x"}), Catch::Contains(flag));
  }
  // The duplicate filters' empty value means "every line" (torchrun's), the next argument stays.
  auto o = ok({"--duplicate_stdout_filters=", "--no_python", "x"});
  CHECK(o.output.duplicate_stdout_filters == std::vector<std::string>{""});
  CHECK(o.workers.no_python);
  CHECK(o.workers.entrypoint == "x");
  CHECK(ok({"--duplicate-stderr-filters=", "x"}).output.duplicate_stderr_filters == std::vector<std::string>{""});
  // A flag's value that looks like `--x=` is the value; the entry point's arguments are its own.
  CHECK(ok({"--role", "--log_dir=", "x"}).workers.role == "--log_dir=");
  CHECK(ok({"x", "--log_dir="}).workers.args == std::vector<std::string>{"--log_dir="});
  CHECK(ok({"-r", "3", "x", "--rdzv_id="}).workers.args == std::vector<std::string>{"--rdzv_id="});
}

TEST_CASE("--flag= empty where torchrun 2.11 runs with it: what torchrun makes of it", "[options]") {
  // The next argument is never the value.
  auto o = ok(
      {"--rdzv_endpoint=", "--rdzv_conf=", "--log_dir=", "--local_addr=", "--local_ranks_filter=", "--no_python", "x"});
  CHECK(o.workers.no_python);
  CHECK(o.workers.entrypoint == "x");
  CHECK(o.warnings.empty());
  // "" is torchrun's default for these, or means "not given" there.
  const auto d = ok({"x"});
  CHECK(o.rendezvous.endpoint == d.rendezvous.endpoint);
  CHECK(o.rendezvous.host == d.rendezvous.host);
  CHECK(o.rendezvous.conf.empty());
  CHECK(o.output.log_dir.empty());  // a temporary directory, as without the flag
  CHECK(o.rendezvous.local_addr.empty());
  CHECK_FALSE(o.output.local_ranks_filter);
  // The command line's empty value wins over PET_<FLAG>, as any value does.
  CHECK(ok({"--log-dir=", "x"}, {{"PET_LOG_DIR", "/elsewhere"}}).output.log_dir.empty());
  CHECK(ok({"x"}, {{"PET_LOCAL_RANKS_FILTER", ""}}).output.local_ranks_filter == std::nullopt);
  // --rdzv_id=: a random id (torchrun's default "none" is an id like any other).
  const auto a = ok({"--rdzv_id=", "x"}), b = ok({"--rdzv-id=", "x"});
  CHECK(a.rendezvous.id.size() == 36);
  CHECK(a.rendezvous.id != b.rendezvous.id);
  CHECK(a.warnings.empty());
  CHECK_THAT(ok({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=h:1", "--rdzv_id=", "x"}).warnings.at(0),
             Catch::Contains("--rdzv_id=") && Catch::Contains("same --rdzv_id"));
  CHECK(ok({"x"}, {{"PET_RDZV_ID", ""}}).rendezvous.id.size() == 36);
  // --role=: ROLE_NAME is empty.
  CHECK(ok({"--role=", "x"}).workers.role.empty());
  CHECK(ok({"--role", "", "x"}).workers.role.empty());
  // --signals_to_handle=: no signal handled, TORCHELASTIC_SIGNALS_TO_HANDLE empty; said.
  const auto n = ok({"--signals_to_handle=", "x"});
  CHECK(n.faults.signals_to_handle.empty());
  CHECK(n.faults.signals_to_handle_text.empty());
  CHECK_THAT(n.warnings.at(0), Catch::Contains("handles no signal"));
  CHECK(n.faults.preempt_signals == std::vector<int>{SIGUSR1});  // a preemption is still one
}

TEST_CASE("--rdzv_id: the rendezvous's rule, checked at parse time", "[options]") {
  CHECK(ok({"--rdzv_id=job 7.a/b", "x"}).rendezvous.id == "job 7.a/b");
  CHECK(ok({"--rdzv_id", std::string(128, 'j'), "x"}).rendezvous.id == std::string(128, 'j'));
  CHECK_THAT(error_of({"--rdzv_id", std::string(129, 'j'), "x"}),
             Catch::Contains("--rdzv_id") && Catch::Contains("printable"));
  CHECK_THAT(error_of({"--rdzv_id=a\tb", "x"}), Catch::Contains("--rdzv_id"));
  CHECK_THAT(error_of({"x"}, {{"PET_RDZV_ID", "caf\xc3\xa9"}}), Catch::Contains("--rdzv_id"));
}

TEST_CASE("parse_host_port: names, IPv4, bracketed and bare IPv6, bad ports", "[options]") {
  auto hp = parse_host_port("rdzv_endpoint", " head:1234 ");
  CHECK(hp.host == "head");
  CHECK(hp.port == 1234);
  CHECK_FALSE(parse_host_port("rdzv_endpoint", "head").port);
  CHECK(parse_host_port("rdzv_endpoint", "[::1]:29400").host == "::1");
  CHECK(parse_host_port("rdzv_endpoint", "[::1]:29400").port == 29400);
  CHECK(parse_host_port("rdzv_endpoint", "[fe80::1]").host == "fe80::1");
  CHECK(parse_host_port("rdzv_endpoint", "fe80::1").host == "fe80::1");  // bare IPv6: no port
  CHECK_FALSE(parse_host_port("rdzv_endpoint", "fe80::1").port);
  CHECK(parse_host_port("x", "10.0.0.1:0").port == 0);
  CHECK_THROWS_WITH(parse_host_port("rdzv_endpoint", "h:65536"),
                    Catch::Contains("--rdzv_endpoint") && Catch::Contains("0-65535"));
  CHECK_THROWS_WITH(parse_host_port("rdzv_endpoint", "[::1"), Catch::Contains("host[:port]"));
  CHECK_THROWS_WITH(parse_host_port("rdzv_endpoint", "[::1]x"), Catch::Contains("host[:port]"));
  CHECK_THROWS_AS(parse_host_port("rdzv_endpoint", "h:port"), UsageError);
}

TEST_CASE("--store_relay: auto from 64 nodes, on, off; never for one node", "[options]") {
  CHECK(ok({"x"}).rendezvous.store_relay == StoreRelayMode::Auto);
  CHECK(ok({"--store_relay=on", "x"}).rendezvous.store_relay == StoreRelayMode::On);
  CHECK(ok({"--store-relay", "off", "x"}).rendezvous.store_relay == StoreRelayMode::Off);
  CHECK(ok({"x"}, {{"PET_STORE_RELAY", "on"}}).rendezvous.store_relay == StoreRelayMode::On);
  const std::string e = error_of({"--store_relay=yes", "x"});
  CHECK(e.find("--store_relay") != std::string::npos);
  CHECK(e.find("auto, on or off") != std::string::npos);
  CHECK_FALSE(store_relay_for(StoreRelayMode::Auto, 63));
  CHECK(store_relay_for(StoreRelayMode::Auto, kStoreRelayAutoNodes));
  CHECK(store_relay_for(StoreRelayMode::Auto, 16000));
  CHECK(store_relay_for(StoreRelayMode::On, 2));
  CHECK_FALSE(store_relay_for(StoreRelayMode::On, 1));
  CHECK_FALSE(store_relay_for(StoreRelayMode::Off, 16000));
}
