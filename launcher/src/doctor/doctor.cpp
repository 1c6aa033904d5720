// The doctor's verdicts: facts in, check results out (doctor.h). No system calls here.
#include "ddprun/launcher/doctor.h"

#include <cstdio>
#include <set>

#include "ddprun/launcher/json.h"
#include "ddprun/launcher/spare_plan.h"
#include "ddprun/launcher/worker_env.h"

namespace ddprun::launcher::doctor {

namespace {

constexpr int kExclusiveThread = 1;
constexpr int kProhibited = 2;
constexpr int kExclusiveProcess = 3;
constexpr uint64_t kMiB = 1ull << 20;
// worker_runtime's ShmGroup: a 16 KiB header and one 8 MiB chunk per rank plus one.
constexpr uint64_t kShmHeaderBytes = 16384;
constexpr uint64_t kShmChunkBytes = 8ull << 20;

std::string mib(uint64_t bytes) { return std::to_string((bytes + kMiB - 1) / kMiB) + " MiB"; }

CheckResult ok(std::string item, std::string found) {
  return {std::move(item), Status::Ok, std::move(found), "", false};
}
CheckResult warn(std::string item, std::string found, std::string fix) {
  return {std::move(item), Status::Warn, std::move(found), std::move(fix), false};
}
CheckResult fail(std::string item, std::string found, std::string fix) {
  return {std::move(item), Status::Fail, std::move(found), std::move(fix), true};
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t c = s.find(',', start);
    if (c == std::string::npos) c = s.size();
    std::string part = s.substr(start, c - start);
    while (!part.empty() && part.front() == ' ') part.erase(part.begin());
    while (!part.empty() && part.back() == ' ') part.pop_back();
    out.push_back(part);
    start = c + 1;
  }
  return out;
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

std::string cvd_text(const Facts& f) { return "CUDA_VISIBLE_DEVICES=" + f.cuda_visible_devices.value_or(""); }

// What CUDA makes of CUDA_VISIBLE_DEVICES against `count` GPUs (uuids known when given): the
// device indices visible, in order, up to the first entry that names no GPU (CUDA ignores the
// rest), and that entry.
struct VisibleGpus {
  std::vector<int> indices;
  std::string bad_entry;  // empty: every entry names a GPU
};

VisibleGpus visible_gpus(const Facts& f, int count, const std::vector<GpuDeviceFacts>* devices) {
  VisibleGpus v;
  if (!f.cuda_visible_devices) {
    for (int i = 0; i < count; ++i) v.indices.push_back(i);
    return v;
  }
  if (f.cuda_visible_devices->empty()) return v;
  for (const std::string& e : split_commas(*f.cuda_visible_devices)) {
    int index = -1;
    if (all_digits(e) && e.size() < 6) {
      index = std::stoi(e);
      if (index >= count) index = -1;
    } else if (devices && (e.rfind("GPU-", 0) == 0 || e.rfind("MIG-", 0) == 0)) {
      for (size_t i = 0; i < devices->size(); ++i) {
        if ((*devices)[i].uuid.rfind(e, 0) == 0) index = static_cast<int>(i);
      }
    } else if (!devices && (e.rfind("GPU-", 0) == 0 || e.rfind("MIG-", 0) == 0)) {
      index = static_cast<int>(v.indices.size());  // a UUID: cannot be checked without NVML
    }
    if (index < 0) {
      v.bad_entry = e;
      return v;
    }
    v.indices.push_back(index);
  }
  return v;
}

std::string gpu_range(int count) {
  if (count == 0) return "none";
  if (count == 1) return "GPU 0";
  return "GPUs 0-" + std::to_string(count - 1);
}

std::string nproc_fix(int visible) {
  return "run with --nproc_per_node=" + std::to_string(visible) +
         " (or --nproc_per_node=gpu), or make more GPUs visible in CUDA_VISIBLE_DEVICES";
}

bool gpus_in_use(const Facts& f) {
  return f.gpus_requested || (f.gpus.driver && !f.gpus.devices.empty()) || (!f.gpus_probed && f.dev_nvidia_nodes > 0);
}

int cuda_version_code(const std::string& text) {  // "12.1" -> 12010; 0 when not a version
  int major = 0, minor = 0;
  if (std::sscanf(text.c_str(), "%d.%d", &major, &minor) < 1) return 0;
  return major * 1000 + minor * 10;
}

std::string cuda_version_text(int code) {
  return std::to_string(code / 1000) + "." + std::to_string((code % 1000) / 10);
}

// ---- The checks ----

void check_gpus(const Facts& f, std::vector<CheckResult>& out) {
  if (!f.gpus.driver) {
    if (f.gpus_requested) {
      const std::string why = f.cuda_visible_devices ? cvd_text(f) + " asks for GPUs" : "--numa_binding asks for GPUs";
      out.push_back(fail("gpus", "no NVIDIA driver found (" + f.gpus.driver_error + "), but " + why,
                         "run on a node with the NVIDIA driver, or unset CUDA_VISIBLE_DEVICES (and --numa_binding) "
                         "for a CPU-only job"));
    } else {
      out.push_back(ok("gpus", "no NVIDIA driver found: GPU checks skipped"));
    }
    return;
  }
  const int count = static_cast<int>(f.gpus.devices.size());
  const VisibleGpus v = visible_gpus(f, count, &f.gpus.devices);
  if (!v.bad_entry.empty()) {
    out.push_back(fail("gpus",
                       cvd_text(f) + " names GPU '" + v.bad_entry + "', which this node does not have (it has " +
                           gpu_range(count) + ")",
                       "set CUDA_VISIBLE_DEVICES to indices below " + std::to_string(count) +
                           " or to UUIDs that `nvidia-smi -L` lists"));
    return;
  }
  const int visible = static_cast<int>(v.indices.size());
  if (visible < f.nproc_per_node) {
    out.push_back(fail("gpus",
                       std::to_string(visible) + " GPU" + (visible == 1 ? "" : "s") + " visible" +
                           (f.cuda_visible_devices ? " (" + cvd_text(f) + ")" : "") +
                           " for --nproc_per_node=" + std::to_string(f.nproc_per_node),
                       nproc_fix(visible)));
  } else {
    out.push_back(ok("gpus", std::to_string(visible) + " GPU" + (visible == 1 ? "" : "s") +
                                 " visible for --nproc_per_node=" + std::to_string(f.nproc_per_node)));
  }
  // Compute mode and other processes, on the GPUs the local ranks use.
  std::vector<std::string> exclusive, prohibited, busy;
  for (int r = 0; r < visible && r < f.nproc_per_node; ++r) {
    const GpuDeviceFacts& d = f.gpus.devices[static_cast<size_t>(v.indices[static_cast<size_t>(r)])];
    const std::string name = "GPU " + std::to_string(v.indices[static_cast<size_t>(r)]);
    if (d.compute_mode == kExclusiveProcess || d.compute_mode == kExclusiveThread) exclusive.push_back(name);
    if (d.compute_mode == kProhibited) prohibited.push_back(name);
    for (const auto& p : d.processes)
      busy.push_back(name + ": pid " + std::to_string(p.pid) + " holds " + mib(p.used_bytes));
  }
  auto join = [](const std::vector<std::string>& parts, const char* sep) {
    std::string s;
    for (const auto& x : parts) s += (s.empty() ? "" : sep) + x;
    return s;
  };
  if (!prohibited.empty()) {
    out.push_back(fail("compute_mode", join(prohibited, ", ") + " in PROHIBITED compute mode: no process may use it",
                       "nvidia-smi -i <gpu> -c DEFAULT (as root), or pick other GPUs with CUDA_VISIBLE_DEVICES"));
  } else if (!exclusive.empty() && f.max_restarts > 0 && f.overlap_restart) {
    // CPU-warm spares hold no context: they fit an exclusive GPU (the old worker is gone first).
    out.push_back(fail("compute_mode",
                       join(exclusive, ", ") + " in EXCLUSIVE_PROCESS compute mode: a restart's workers cannot open it "
                                               "while the previous attempt's still hold it",
                       "run with --overlap_restart=0, or nvidia-smi -c DEFAULT (as root)"));
  } else if (!exclusive.empty() && f.max_restarts > 0 && f.warm_spares && f.spare_cuda) {
    out.push_back(warn("compute_mode",
                       join(exclusive, ", ") + " in EXCLUSIVE_PROCESS compute mode: --spare_cuda=1 cannot warm it (a "
                                               "spare's context would keep the worker out); the spares stay CPU-warm",
                       "run with --spare_cuda=0 to say so, or nvidia-smi -c DEFAULT (as root)"));
  } else {
    out.push_back(ok("compute_mode",
                     exclusive.empty() ? "DEFAULT" : join(exclusive, ", ") + " exclusive; no overlap on restart"));
  }
  if (!busy.empty()) {
    out.push_back(warn("gpu_processes", "other processes hold memory on the job's GPUs: " + join(busy, "; "),
                       "stop them (nvidia-smi lists them), or pick other GPUs with CUDA_VISIBLE_DEVICES"));
  } else {
    out.push_back(ok("gpu_processes", "no other process on the job's GPUs"));
  }
}

// The runtime's CUDA version against the driver's: a lower driver major cannot run it (CUDA
// fails to initialise, NCCL later says "handshake failed" or "unhandled cuda error"); a lower
// minor runs under minor version compatibility.
void compare_cuda(const Facts& f, std::string found, const std::string& runtime_text, const std::string& fix_runtime,
                  std::vector<CheckResult>& out) {
  const int runtime = cuda_version_code(runtime_text);
  const int driver = f.gpus.driver_cuda_version;
  if (!f.gpus.driver || !runtime) {
    out.push_back(ok("versions", found + (f.gpus.driver ? "" : "; no driver to compare with")));
    return;
  }
  found += ", driver supports CUDA " + (driver ? cuda_version_text(driver) : std::string("?"));
  if (driver && driver / 1000 < runtime / 1000) {
    out.push_back(
        fail("versions",
             found + ": the driver is too old for this CUDA runtime (CUDA fails to initialise; NCCL " + "cannot start)",
             "upgrade the NVIDIA driver to one for CUDA " + runtime_text + ", or " + fix_runtime + " " +
                 cuda_version_text(driver) + " or older"));
  } else if (driver && driver < runtime) {
    out.push_back(warn("versions", found + ": runs under CUDA's minor version compatibility (no PTX JIT of newer code)",
                       "upgrade the NVIDIA driver to one for CUDA " + runtime_text));
  } else {
    out.push_back(ok("versions", found));
  }
}

void check_program_versions(const Facts& f, std::vector<CheckResult>& out) {
  const ProgramFacts& p = f.program;
  if (p.program.empty()) return;
  if (!p.ran) {
    out.push_back(warn("versions", p.program + ": its CUDA runtime and NCCL could not be read (" + p.error + ")",
                       "ldd " + p.program + " | grep -E 'cudart|nccl' shows the libraries it loads"));
    return;
  }
  if (p.cudart == "not found" || p.nccl == "not found") {
    out.push_back(fail("versions",
                       p.program + " links " + (p.cudart == "not found" ? "libcudart" : "libnccl") +
                           ", which the dynamic loader cannot find",
                       "add its directory to LD_LIBRARY_PATH (ldd " + p.program + " shows what is missing)"));
    return;
  }
  if (p.cudart.empty()) {
    // ddprun's own GPU programs link the CUDA runtime statically and load NCCL when a GPU path
    // asks for it, so ldd shows neither: only a shared runtime can be compared with the driver.
    out.push_back(ok("versions", p.program + " loads no shared CUDA runtime (CPU-only, or linked in statically)" +
                                     (p.nccl.empty() ? "" : " (NCCL " + p.nccl + ")")));
    return;
  }
  compare_cuda(f, p.program + " loads CUDA runtime " + p.cudart + ", NCCL " + (p.nccl.empty() ? "none" : p.nccl),
               p.cudart, "rebuild it against CUDA", out);
}

void check_versions(const Facts& f, std::vector<CheckResult>& out) {
  const PythonFacts& p = f.python;
  if (!p.needed) {
    check_program_versions(f, out);
    return;
  }
  if (!p.torch) return;  // the python check says why
  std::string found = "torch " + p.torch_version + " (CUDA " +
                      (p.torch_cuda.empty() ? "none: a CPU build" : p.torch_cuda) + ", NCCL " +
                      (p.nccl.empty() ? "none" : p.nccl) + ")";
  if (p.torch_cuda.empty()) {
    out.push_back(ok("versions", found));
    return;
  }
  compare_cuda(f, found, p.torch_cuda, "install a torch built for CUDA", out);
}

void check_python(const Facts& f, std::vector<CheckResult>& out) {
  const PythonFacts& p = f.python;
  if (!p.needed) return;
  const std::string fix =
      "install torch into it (" + p.python + " -m pip install torch), or set PYTHON_EXEC to a Python that has it";
  if (!p.ran) {
    out.push_back(fail("python", "the workers' Python " + p.python + " cannot be run: " + p.error,
                       "set PYTHON_EXEC=/path/to/python (the interpreter of your environment)"));
  } else if (!p.torch) {
    out.push_back(fail("python", "the workers' Python " + p.python + " cannot import torch (" + p.error + ")", fix));
  } else {
    out.push_back(ok("python", "the workers' Python " + p.python + " imports torch " + p.torch_version));
  }
}

void check_shm(const Facts& f, std::vector<CheckResult>& out) {
  const bool gpus = gpus_in_use(f);
  const uint64_t ours = ddprun_shm_bytes(f.nproc_per_node);
  const uint64_t nccl = gpus ? nccl_shm_bytes(f.nproc_per_node) : 0;
  const std::string fix = "give it " + mib(ours + nccl) +
                          " or more: a container with docker run --shm-size=1g (or --ipc=host); on a host, mount -o "
                          "remount,size=1g /dev/shm";
  if (!f.shm.present) {
    const std::string found = "no /dev/shm (" + f.shm.error + ")";
    out.push_back(gpus ? fail("shm", found + ": NCCL needs it", fix) : warn("shm", found, fix));
    return;
  }
  const std::string found = "/dev/shm has " + mib(f.shm.avail_bytes) + " free of " + mib(f.shm.total_bytes);
  const std::string nproc = std::to_string(f.nproc_per_node) + (f.nproc_per_node == 1 ? " local rank" : " local ranks");
  if (gpus && f.shm.avail_bytes < nccl) {
    out.push_back(fail("shm", found + "; NCCL needs about " + mib(nccl) + " for " + nproc, fix));
  } else if (f.shm.avail_bytes < ours + nccl) {
    out.push_back(warn("shm",
                       found + "; " + mib(ours + nccl) + " wanted for " + nproc +
                           ": ddprun's shared-memory all-reduce falls back to Gloo over TCP",
                       fix));
  } else {
    out.push_back(ok("shm", ours + nccl == 0 ? found : found + "; " + mib(ours + nccl) + " wanted for " + nproc));
  }
}

void check_limits(const Facts& f, std::vector<CheckResult>& out) {
  if (!f.limits.rdma) return;
  if (f.limits.memlock_unlimited) {
    out.push_back(ok("memlock", "RDMA device present; memlock ulimit unlimited"));
  } else {
    out.push_back(warn("memlock",
                       "RDMA device present; memlock ulimit " + mib(f.limits.memlock_bytes) +
                           ": NCCL's InfiniBand transport cannot register its buffers",
                       "ulimit -l unlimited before ddprun (a container: docker run --ulimit memlock=-1)"));
  }
}

CheckResult loopback_check(const Facts& f) {
  const NetworkFacts& n = f.network;
  if (!n.resolve_error.empty()) {
    return fail("rdzv_host", "the rendezvous host " + n.host + " does not resolve: " + n.resolve_error,
                "fix its DNS or /etc/hosts entry, or give the rendezvous host as an address");
  }
  if (n.loopback && !n.addresses.empty() && n.addresses.front() == n.host) {
    // Given as a loopback address: every node on this host (a test), or a mistake.
    return warn("rdzv_host",
                "the rendezvous host is " + n.host + ", a loopback address: only nodes on this host can reach it",
                "give the rendezvous host as this node's network address (--rdzv_endpoint or --master_addr)");
  }
  if (n.loopback) {
    return fail("rdzv_host",
                "the rendezvous host " + n.host + " resolves to " + n.addresses.front() +
                    ", a loopback address: the other nodes cannot reach it there",
                "map " + n.host +
                    " to this node's network address in /etc/hosts (not 127.x), or give the rendezvous "
                    "host as that address (--rdzv_endpoint or --master_addr)");
  }
  std::string addrs;
  for (const auto& a : n.addresses) addrs += (addrs.empty() ? "" : ", ") + a;
  return ok("rdzv_host", "the rendezvous host " + n.host + " resolves to " + addrs);
}

void check_network(const Facts& f, std::vector<CheckResult>& out) {
  const NetworkFacts& n = f.network;
  if (!f.multi_node) return;
  out.push_back(loopback_check(f));
  const std::string ep = n.host + ":" + std::to_string(n.port);
  using R = NetworkFacts::Reach;
  if (n.local) {
    if (n.reach == R::Listening) {
      out.push_back(warn("rdzv_endpoint", ep + " is this node and something already listens there",
                         "fine when it is a standing ddprund; otherwise stop the other job or pick another port"));
    } else if (n.port_taken) {
      out.push_back(fail("rdzv_endpoint", ep + " is this node and port " + std::to_string(n.port) + " is taken",
                         "pick a free port in the endpoint, or stop what holds it (ss -ltnp)"));
    } else {
      out.push_back(ok("rdzv_endpoint", ep + " is this node; port " + std::to_string(n.port) + " is free"));
    }
  } else if (n.reach == R::Listening) {
    out.push_back(ok("rdzv_endpoint", ep + " accepts connections from this node"));
  } else if (n.reach == R::Refused) {
    out.push_back(warn("rdzv_endpoint", ep + " refuses connections: nothing listens there yet",
                       "start the job on the node that hosts the rendezvous (or a standing ddprund) too"));
  } else if (n.reach == R::Unreachable) {
    out.push_back(fail("rdzv_endpoint", ep + " cannot be reached from this node: " + n.reach_error,
                       "check the route and the firewall between the nodes (port " + std::to_string(n.port) + "/tcp)"));
  }
  std::set<int> mtus;
  for (const InterfaceFacts& i : n.interfaces) {
    const std::string who =
        i.source == "route" ? "Gloo and NCCL (no *_SOCKET_IFNAME set) use" : i.source + "=" + i.name + ":";
    if (!i.exists) {
      out.push_back(fail("interface",
                         who + (i.source == "route" ? " no interface: " + i.name : " no such interface on this node"),
                         i.source == "route" ? "check this node's route to the rendezvous host"
                                             : "set " + i.source + " to an interface that `ip -brief addr` lists"));
      continue;
    }
    if (i.mtu > 0) mtus.insert(i.mtu);
    out.push_back(ok("interface", who + " " + i.name + " (" + i.address + ", MTU " + std::to_string(i.mtu) + ")"));
  }
  if (mtus.size() > 1) {
    out.push_back(warn("mtu", "the interfaces Gloo and NCCL use have different MTUs",
                       "give every interface of the job's network the same MTU (ip link set <if> mtu <n>)"));
  }
}

CheckResult token_check(const TokenFacts& t) {
  const std::string fix_mode = "chmod 600 " + t.file;
  if (!t.exists)
    return fail("token", "--rdzv_token_file " + t.file + ": cannot open it (" + t.error + ")",
                "create it with a secret of 16+ bytes: head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE");
  if (!t.regular)
    return fail("token", "--rdzv_token_file " + t.file + ": not a regular file", "put the token in a file of its own");
  if (!t.own)
    return fail("token", "--rdzv_token_file " + t.file + ": owned by another user", "use a token file of your own");
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", t.mode & 07777);
  if ((t.mode & 077) != 0) {
    return fail("token",
                "--rdzv_token_file " + t.file + " has mode " + mode +
                    ": other users can read it, and the launch refuses it",
                fix_mode);
  }
  return ok("token", "--rdzv_token_file " + t.file + ": mode " + mode + ", yours");
}

}  // namespace

const char* status_mark(Status s) {
  switch (s) {
    case Status::Ok: return "\u2713";
    case Status::Warn: return "!";
    case Status::Fail: return "\u2717";
  }
  return "?";
}

const char* status_name(Status s) {
  switch (s) {
    case Status::Ok: return "ok";
    case Status::Warn: return "warning";
    case Status::Fail: return "fail";
  }
  return "?";
}

uint64_t ddprun_shm_bytes(int nproc) {
  if (nproc < 2) return 0;  // a single rank makes no group
  return kShmHeaderBytes + (static_cast<uint64_t>(nproc) + 1) * kShmChunkBytes;
}

uint64_t nccl_shm_bytes(int nproc) {
  if (nproc < 2) return 0;
  return static_cast<uint64_t>(nproc) * static_cast<uint64_t>(nproc - 1) * kNcclShmPerPairBytes;
}

std::vector<CheckResult> evaluate(const Facts& f) {
  std::vector<CheckResult> out;
  check_gpus(f, out);
  check_python(f, out);
  check_versions(f, out);
  check_shm(f, out);
  check_limits(f, out);
  check_network(f, out);
  if (!f.token.file.empty()) out.push_back(token_check(f.token));
  return out;
}

std::vector<CheckResult> evaluate_preflight(const Facts& f) {
  std::vector<CheckResult> out;
  if (f.cuda_visible_devices && !f.cuda_visible_devices->empty()) {
    if (f.dev_nvidia_nodes == 0) {
      out.push_back(fail("gpus", cvd_text(f) + " asks for GPUs, but this node has no NVIDIA GPU device (/dev/nvidia*)",
                         "unset CUDA_VISIBLE_DEVICES for a CPU-only job, or run on a GPU node"));
    } else {
      const VisibleGpus v = visible_gpus(f, f.dev_nvidia_nodes, nullptr);
      if (!v.bad_entry.empty()) {
        out.push_back(fail("gpus",
                           cvd_text(f) + " names GPU '" + v.bad_entry + "', which this node does not have (it has " +
                               gpu_range(f.dev_nvidia_nodes) + ")",
                           "set CUDA_VISIBLE_DEVICES to indices below " + std::to_string(f.dev_nvidia_nodes)));
      } else if (static_cast<int>(v.indices.size()) < f.nproc_per_node) {
        out.push_back(fail("gpus",
                           cvd_text(f) + " shows " + std::to_string(v.indices.size()) +
                               " GPUs for --nproc_per_node=" + std::to_string(f.nproc_per_node),
                           nproc_fix(static_cast<int>(v.indices.size()))));
      }
    }
  }
  std::vector<CheckResult> shm;
  check_shm(f, shm);
  for (auto& r : shm) {
    if (r.status != Status::Ok) out.push_back(std::move(r));
  }
  if (f.multi_node) {
    CheckResult r = loopback_check(f);
    if (r.status == Status::Fail) out.push_back(std::move(r));  // a loopback literal was typed on purpose
  }
  if (!f.token.file.empty()) {
    CheckResult r = token_check(f.token);
    if (r.status != Status::Ok) out.push_back(std::move(r));
  }
  return out;
}

int exit_code(const std::vector<CheckResult>& results) {
  for (const auto& r : results) {
    if (r.blocking) return 1;
  }
  return 0;
}

std::string format_text(const std::vector<CheckResult>& results) {
  std::string s;
  int fails = 0, warns = 0;
  for (const auto& r : results) {
    s += std::string(status_mark(r.status)) + " " + r.item + ": " + r.found + "\n";
    if (!r.fix.empty()) s += "    fix: " + r.fix + "\n";
    fails += r.blocking ? 1 : 0;
    warns += r.status == Status::Warn ? 1 : 0;
  }
  s += "doctor: " + std::to_string(results.size()) + " checks, " + std::to_string(fails) + " blocking, " +
       std::to_string(warns) + " warning" + (warns == 1 ? "" : "s") + "\n";
  return s;
}

std::string format_json(const std::vector<CheckResult>& results) {
  const int code = exit_code(results);
  nlohmann::ordered_json checks = nlohmann::ordered_json::array();
  for (const auto& r : results) {
    checks.push_back(nlohmann::ordered_json{{"item", r.item},
                                            {"status", status_name(r.status)},
                                            {"blocking", r.blocking},
                                            {"found", r.found},
                                            {"fix", r.fix}});
  }
  const nlohmann::ordered_json doc = {{"ok", code == 0}, {"exit_code", code}, {"checks", std::move(checks)}};
  return dump_json(doc) + "\n";
}

Facts facts_from_options(const LaunchOptions& o, const EnvMap& env) {
  Facts f;
  f.nproc_per_node = o.nodes.nproc_per_node;
  f.multi_node = o.nodes.multi_node();
  f.max_restarts = o.faults.max_restarts;
  f.overlap_restart = o.faults.overlap_restart;
  const std::string& ep = o.workers.entrypoint;
  const bool python = !o.workers.no_python && (o.workers.module || o.workers.run_path || ep.empty() ||
                                               (ep.size() > 3 && ep.compare(ep.size() - 3, 3, ".py") == 0));
  f.warm_spares = spares_enabled(o.spares, o.faults.max_restarts, python);
  f.spare_cuda = f.warm_spares && o.spares.cuda;
  if (auto it = env.find("CUDA_VISIBLE_DEVICES"); it != env.end()) f.cuda_visible_devices = it->second;
  f.gpus_requested =
      (f.cuda_visible_devices && !f.cuda_visible_devices->empty()) || o.platform.numa_binding.has_value();
  f.python.needed = python;
  if (python) {
    WorkerOptions w = o.workers;
    if (w.entrypoint.empty()) w.entrypoint = "x.py";
    f.python.python = build_worker_argv(w, env, true).front();
  }
  f.network.multi_node = f.multi_node;
  if (!o.rendezvous.endpoint.empty()) {
    f.network.host = o.rendezvous.host;
    f.network.port = o.rendezvous.port;
  } else {
    f.network.host = o.rendezvous.master_addr;
    f.network.port = o.rendezvous.master_port.value_or(29500);
  }
  f.token.file = o.rendezvous.token_file;
  return f;
}

}  // namespace ddprun::launcher::doctor
