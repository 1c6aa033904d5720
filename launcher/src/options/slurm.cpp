#include "ddprun/launcher/slurm.h"

#include <charconv>
#include <cstdint>

#include "ddprun/launcher/hostlist.h"
#include "ddprun/launcher/options.h"

namespace ddprun::launcher {
namespace {

const std::string* lookup(const EnvMap& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

// The first of `names` that is set, with its name.
std::pair<const char*, const std::string*> first_of(const EnvMap& env, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (auto v = lookup(env, n)) return {n, v};
  }
  return {nullptr, nullptr};
}

[[noreturn]] void bad_var(const char* name, const std::string& value, const std::string& expected) {
  throw UsageError(std::string(name) + "='" + value + "' from Slurm is not " + expected +
                   "; fix the job's environment or pass --no_slurm and give the flags yourself");
}

int non_negative(const char* name, const std::string& value) {
  long long v = 0;
  auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || p != value.data() + value.size() || v < 0 || v > (1 << 20)) {
    bad_var(name, value, "an integer >= 0");
  }
  return static_cast<int>(v);
}

// "0,1,3" or "0-3,5" (GPU indexes) -> how many.
int count_index_list(const char* name, const std::string& value) {
  try {
    return static_cast<int>(expand_hostlist("[" + value + "]").size());
  } catch (const HostlistError&) {
    bad_var(name, value, "a list of GPU indexes like 0,1 or 0-3");
  }
}

int count_cuda_visible(const std::string& value) {
  int n = 0;
  size_t start = 0;
  while (start <= value.size()) {
    size_t comma = value.find(',', start);
    if (comma == std::string::npos) comma = value.size();
    if (comma > start) ++n;
    start = comma + 1;
  }
  return n;
}

}  // namespace

uint16_t slurm_step_port(const std::string& job_id, const std::string& step_id) {
  uint32_t h = 2166136261u;
  for (unsigned char c : job_id + "." + step_id) {
    h ^= c;
    h *= 16777619u;
  }
  return static_cast<uint16_t>(20000 + h % 10000);
}

namespace {

// Records a flag value derived from Slurm unless the flag was given, and where it came from.
struct Deriver {
  const std::map<std::string, std::string>& given;
  SlurmDerivation& d;
  std::vector<std::string> from;  // "--flag=value (SOURCE)" pieces of the summary
  void operator()(const std::string& flag, const std::string& value, const std::string& source) {
    if (given.count(flag)) return;
    d.flags[flag] = value;
    from.push_back("--" + flag + "=" + value + " (" + source + ")");
  }
};

// GPUs first: they answer --nproc_per_node whatever else happens.
void derive_gpus(const EnvMap& env, Deriver& derive) {
  auto [gpu_name, gpu] = first_of(env, {"SLURM_STEP_GPUS", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS"});
  if (!gpu) return;
  const bool is_count = std::string(gpu_name) == "SLURM_GPUS_ON_NODE";
  int count = is_count ? non_negative(gpu_name, *gpu) : count_index_list(gpu_name, *gpu);
  std::string source = gpu_name;
  if (auto cvd = lookup(env, "CUDA_VISIBLE_DEVICES")) {
    count = count_cuda_visible(*cvd);
    source = "CUDA_VISIBLE_DEVICES";
  }
  derive.d.gpu_count = count;
  if (count > 0) derive("nproc_per_node", std::to_string(count), source);
}

// Many nodes: the rendezvous host is the first of the node list, the port comes from the job
// and step ids; static gets --master_addr/--master_port/--node_rank, c10d --rdzv_endpoint.
void derive_rendezvous(const EnvMap& env, const std::string& job, const std::string& step, int min_nodes,
                       int max_nodes, Deriver& derive) {
  auto [nl_name, nl] = first_of(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  if (!nl) {
    throw UsageError("Slurm step " + job + "." + step +
                     " has no SLURM_STEP_NODELIST or SLURM_JOB_NODELIST to find the rendezvous host; "
                     "give --master_addr (static) or --rdzv_endpoint (c10d), or pass --no_slurm");
  }
  std::string host;
  try {
    host = first_host(*nl);
  } catch (const HostlistError& e) {
    throw UsageError(std::string(nl_name) + ": " + e.what());
  }
  const std::string port = std::to_string(slurm_step_port(job, step));
  const std::string host_source = std::string("first of ") + nl_name;
  auto backend_it = derive.given.find("rdzv_backend");
  std::string backend = backend_it != derive.given.end() ? backend_it->second : "static";
  if (backend_it == derive.given.end() && min_nodes != max_nodes) {
    backend = "c10d";
    derive("rdzv_backend", backend, "--nnodes=MIN:MAX");
  }
  if (backend == "c10d") {
    derive("rdzv_endpoint", host + ":" + port, host_source + ", port from the job id");
    // Which agent hosts the rendezvous is known from the node's name; asking whether the
    // endpoint is one of this host's addresses fails where several nodes share an address
    // or names resolve to loopback.
    if (auto me = lookup(env, "SLURMD_NODENAME"); me && !derive.given.count("rdzv_endpoint")) {
      const bool hosts = *me == host;
      derive("rdzv_conf", hosts ? "is_host=1" : "is_host=0",
             "SLURMD_NODENAME " + std::string(hosts ? "is" : "is not") + " the first host");
    }
  } else {
    if (auto nid = lookup(env, "SLURM_NODEID")) {
      derive("node_rank", std::to_string(non_negative("SLURM_NODEID", *nid)), "SLURM_NODEID");
    }
    derive("master_addr", host, host_source);
    derive("master_port", port, "from the job id");
  }
}

}  // namespace

SlurmDerivation derive_from_slurm(const EnvMap& env, const std::map<std::string, std::string>& given) {
  SlurmDerivation d;
  auto [job_name, job] = first_of(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
  if (!job) return d;
  auto [step_name, step] = first_of(env, {"SLURM_STEP_ID", "SLURM_STEPID"});
  auto [nn_name, nn] = first_of(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"});
  if (!step) {
    // A batch script or an salloc shell: ddprun runs here only, whatever the allocation.
    if (nn && !given.count("nnodes") && non_negative(nn_name, *nn) > 1) {
      d.warnings.push_back("running outside srun in Slurm job " + *job + " of " + *nn +
                           " nodes: only this node takes part; start ddprun with "
                           "`srun --ntasks-per-node=1 ddprun ...` to use every node");
    }
    return d;
  }
  d.in_step = true;
  const bool standalone = given.count("standalone") > 0;
  Deriver derive{given, d, {}};
  derive_gpus(env, derive);

  int nnodes = 1;
  if (nn) nnodes = std::max(1, non_negative(nn_name, *nn));
  if (!standalone && nnodes > 1) derive("nnodes", std::to_string(nnodes), nn_name);

  auto [nt_name, nt] = first_of(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"});
  if (nt && !given.count("nnodes") && !standalone && non_negative(nt_name, *nt) > nnodes) {
    throw UsageError("Slurm step " + *job + "." + *step + " runs " + *nt + " tasks on " +
                     std::to_string(nnodes) +
                     " node(s), but ddprun is one agent per node that starts --nproc_per_node workers: "
                     "use `srun --ntasks-per-node=1 ddprun ...` (or pass --no_slurm, or --nnodes and "
                     "--node_rank yourself)");
  }

  // --standalone draws its own run id, as in torchrun.
  if (!standalone) derive("rdzv_id", "slurm-" + *job + "." + *step, std::string(job_name) + "." + step_name);

  // The node range the launch will use: given or just derived.
  int max_nodes = 1;
  int min_nodes = 1;
  if (!standalone) {
    auto it = given.find("nnodes");
    const std::string text = it != given.end() ? it->second : std::to_string(nnodes);
    std::tie(min_nodes, max_nodes) = parse_nnodes(text);
  }
  if (max_nodes > 1) derive_rendezvous(env, *job, *step, min_nodes, max_nodes, derive);

  d.summary = "Slurm step " + *job + "." + *step + ": ";
  if (derive.from.empty()) {
    d.summary += "nothing derived (every setting given)";
  } else {
    for (size_t i = 0; i < derive.from.size(); ++i) d.summary += (i ? ", " : "") + derive.from[i];
  }
  d.summary += "; explicit flags win, --no_slurm turns this off";
  return d;
}

}  // namespace ddprun::launcher
