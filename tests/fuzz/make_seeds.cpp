// Writes the seed corpora (tests/fuzz/corpus/<target>/) from our own encoders, so every
// seed is a real frame: each TCPStore request in each dialect, the PyTorch handshakes of
// docs/TCPSTORE_PROTOCOL.md (2.6-2.11: VALIDATE + PING in one write; 2.2-2.4: VALIDATE;
// 1.13: no handshake), the agents' messages, and typical command lines.
//   ddprun_fuzz_make_seeds <corpus dir>     (run by hand when the formats change)
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ddprun/rdzv/agent_protocol.h"
#include "ddprun/wire/codec.h"

using namespace ddprun;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

std::string validate() {
  std::string s;
  wire::Writer(s).u8(0).u32(wire::kValidateMagic);
  return s;
}

std::vector<std::pair<std::string, wire::Request>> sample_requests() {
  using wire::Op;
  auto r = [](Op op, std::vector<std::string> k, std::vector<std::string> v = {}, int64_t n = 0) {
    wire::Request q;
    q.op = op;
    q.keys = std::move(k);
    q.values = std::move(v);
    q.number = n;
    return q;
  };
  wire::Request ping;
  ping.op = Op::Ping;
  ping.u32 = 4242;
  return {
      {"set", r(Op::Set, {"k"}, {"value"})},
      {"compare_set", r(Op::CompareSet, {"k"}, {"", "new"})},
      {"get", r(Op::Get, {"k"})},
      {"add", r(Op::Add, {"init/"}, {}, 1)},
      {"check", r(Op::Check, {"a", "b"})},
      {"wait", r(Op::Wait, {"k"})},
      {"get_num_keys", r(Op::GetNumKeys, {})},
      {"delete_key", r(Op::DeleteKey, {"k"})},
      {"append", r(Op::Append, {"k"}, {"tail"})},
      {"multi_get", r(Op::MultiGet, {"k", "k", "x"})},
      {"multi_set", r(Op::MultiSet, {"a", "b"}, {"1", "2"})},
      {"cancel_wait", r(Op::CancelWait, {})},
      {"ping", ping},
      {"queue_push", r(Op::QueuePush, {"q"}, {"item"})},
      {"queue_pop", r(Op::QueuePop, {"q"})},
      {"queue_len", r(Op::QueueLen, {"q"})},
      {"list_keys", r(Op::ListKeys, {})},
      {"barrier", r(Op::Barrier, {"bar"}, {}, 2)},
      {"watch_key", r(Op::WatchKey, {"k"})},
  };
}

// The store traffic of torchrun 1.13 / init_process_group (captures: COMPARE_SET, WAIT, GET,
// SET, ADD) and of a 2.11 client (VALIDATE + PING, then the same).
std::string pytorch_session(wire::Dialect d) {
  std::string s;
  wire::Request q;
  q.op = wire::Op::Add, q.keys = {"init/"}, q.number = 1;
  wire::encode_request(d, q, s);
  q = {}, q.op = wire::Op::CompareSet, q.keys = {"torchelastic/rendezvous"}, q.values = {"", "state"};
  wire::encode_request(d, q, s);
  q = {}, q.op = wire::Op::Set, q.keys = {"rank0/addr"}, q.values = {"127.0.0.1:29500"};
  wire::encode_request(d, q, s);
  q = {}, q.op = wire::Op::Wait, q.keys = {"rank0/addr"};
  wire::encode_request(d, q, s);
  q = {}, q.op = wire::Op::Get, q.keys = {"rank0/addr"};
  wire::encode_request(d, q, s);
  return s;
}

std::string agent_hello() {
  std::string s;
  wire::Writer(s).u8(0).u32(rdzv::kAgentMagic);
  return s;
}

rdzv::Join join(const std::string& node, int64_t nnodes, int64_t restarts = 1) {
  rdzv::Join j;
  j.run_id = "job";
  j.node_id = node;
  j.host = "127.0.0.1";
  j.local_world_size = 2;
  j.min_nodes = 1;
  j.max_nodes = nnodes;
  j.max_restarts = restarts;
  j.last_call_ms = 500;
  j.join_timeout_ms = 5000;
  j.heartbeat_timeout_ms = 1000;
  return j;
}

// server_entry's command framing: data on slot s.
std::string on_slot(unsigned slot, const std::string& bytes) {
  std::string s;
  s.push_back(static_cast<char>((slot & 7) << 3));
  s.push_back(static_cast<char>(bytes.size() & 0xff));
  s.push_back(static_cast<char>((bytes.size() >> 8) & 0xff));
  return s + bytes;
}
std::string hang_up(unsigned slot) { return std::string(1, static_cast<char>(0x40 | (slot << 3))); }
std::string tick(unsigned quarters) { return std::string(1, static_cast<char>(0x80 | (quarters & 0x7f))); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  const struct {
    wire::Dialect d;
    const char* name;
  } dialects[] = {{wire::Dialect::D0, "d0"}, {wire::Dialect::D1, "d1"}, {wire::Dialect::D2, "d2"}};

  // codec: byte 0 = mode (bit 0: legacy D1; (mode>>1)&3: 0 detect, 1 or 3 given dialect (bit 4:
  // D2), 2 agent frames), byte 1 = limits (0: defaults).
  const fs::path codec = root / "codec";
  for (auto [d, dn] : dialects) {
    for (auto& [name, req] : sample_requests()) {
      std::string frame;
      if (!wire::encode_request(d, req, frame)) continue;
      const uint8_t mode = d == wire::Dialect::D2 ? 0x12 : (d == wire::Dialect::D1 ? 0x03 : 0x02);
      write(codec, std::string(dn) + "_" + name, std::string{char(mode), 0} + frame);
      write(codec, std::string(dn) + "_" + name + "_tight", std::string{char(mode), char(0x85)} + frame);
    }
  }
  std::string ping;
  wire::Writer(ping).u8(0x0d).u32(4242);
  write(codec, "handshake_2_11", std::string{0, 0} + validate() + ping);
  write(codec, "handshake_2_2", std::string{0, 0} + validate());
  write(codec, "session_2_11", std::string{0, 0} + validate() + pytorch_session(wire::Dialect::D2));
  write(codec, "session_1_13", std::string{0, 0} + pytorch_session(wire::Dialect::D0));
  {
    std::string frames;
    rdzv::encode(join("n0", 2), frames);
    rdzv::Failure f;
    f.round = 0, f.global_rank = 1, f.exit_code = 1, f.stderr_tail = "Traceback";
    rdzv::encode(f, frames);
    rdzv::encode(rdzv::Succeeded{.round = 0}, frames);
    rdzv::JobFailed jf;
    jf.reason = "budget", jf.first_failure = f;
    rdzv::encode(jf, frames);
    rdzv::Round rd;
    rd.run_id = "job", rd.world_size = 4, rd.store_port = 29500;
    rdzv::encode(rd, frames);
    write(codec, "agent_frames", std::string{4, 0} + frames);
  }

  // server: sessions over simulated connections.
  const fs::path server = root / "server";
  write(server, "pytorch_2_11", on_slot(0, validate() + ping + pytorch_session(wire::Dialect::D2)));
  write(server, "pytorch_1_13", on_slot(0, pytorch_session(wire::Dialect::D0)));
  {
    std::string w1, w2, s;
    wire::Request q;
    q.op = wire::Op::Wait, q.keys = {"go"};
    wire::encode_request(wire::Dialect::D2, q, w1);
    q = {}, q.op = wire::Op::Set, q.keys = {"go"}, q.values = {"1"};
    wire::encode_request(wire::Dialect::D2, q, w2);
    s = on_slot(1, validate() + w1) + on_slot(2, validate() + w2) + hang_up(1);
    write(server, "wait_then_set", s);
    std::string b;
    q = {}, q.op = wire::Op::Barrier, q.keys = {"bar"}, q.number = 2;
    wire::encode_request(wire::Dialect::D2, q, b);
    write(server, "barrier", on_slot(3, validate() + b) + on_slot(4, validate() + b));
    std::string watch;
    q = {}, q.op = wire::Op::WatchKey, q.keys = {"go"};
    wire::encode_request(wire::Dialect::D0, q, watch);
    std::string set0;
    q = {}, q.op = wire::Op::Set, q.keys = {"go"}, q.values = {"2"};
    wire::encode_request(wire::Dialect::D0, q, set0);
    write(server, "watch_d0", on_slot(1, watch) + on_slot(2, set0) + hang_up(1));
  }
  {
    std::string j0, j1, fail, ok0, ok1, leave;
    rdzv::encode(join("n0", 2), j0);
    rdzv::encode(join("n1", 2), j1);
    rdzv::Failure f;
    f.round = 0, f.global_rank = 2, f.exit_code = 1;
    rdzv::encode(f, fail);
    rdzv::encode(rdzv::Succeeded{.round = 1}, ok0);
    rdzv::encode(rdzv::Leave{}, leave);
    // two agents, a round, a failure, a restart round, success; a worker on the round store
    std::string s = on_slot(0, agent_hello() + j0) + on_slot(1, agent_hello() + j1) +
                    on_slot(6, validate() + pytorch_session(wire::Dialect::D2)) + on_slot(0, fail) + on_slot(0, j0) +
                    on_slot(1, j1) + on_slot(0, ok0) + on_slot(1, ok0) + tick(4);
    write(server, "rdzv_two_nodes", s);
    write(server, "rdzv_timeout", on_slot(0, agent_hello() + j0) + tick(127) + tick(127) + tick(127));
    write(server, "rdzv_lost_node",
          on_slot(0, agent_hello() + j0) + on_slot(1, agent_hello() + j1) + hang_up(1) + tick(8) + on_slot(0, leave));
    rdzv::Join fixed = join("n0", 1);
    fixed.fixed_store_port = true;
    std::string jf;
    rdzv::encode(fixed, jf);
    write(server, "rdzv_fixed_port",
          on_slot(2, validate() + pytorch_session(wire::Dialect::D2)) + on_slot(0, agent_hello() + jf) +
              on_slot(3, pytorch_session(wire::Dialect::D0)));
  }

  // auth: byte 0 = the side and the help (fuzz_auth.cpp), then the peer's frames.
  const fs::path auth = root / "auth";
  {
    auto frames = [](uint8_t mode, const std::vector<rdzv::Message>& ms) {
      std::string s(1, static_cast<char>(mode));
      for (const auto& m : ms) rdzv::encode_message(m, s);
      return s;
    };
    const auto hello = rdzv::to_message(rdzv::Hello{.client_nonce = std::string(64, 'a')});
    const auto proof = rdzv::to_message(rdzv::Auth{.proof = std::string(64, '0')});
    const auto j = rdzv::to_message(join("n0", 1)), beat = rdzv::to_message(rdzv::Heartbeat{.status = "ok"});
    auto forged = j;
    forged.set("seq", "1").set("mac", std::string(64, 'f'));
    write(auth, "server_sealed", frames(2 | 4, {hello, proof, j, beat, rdzv::to_message(rdzv::Leave{})}));
    write(auth, "server_forged", frames(2, {hello, proof, forged, j}));
    write(auth, "server_wrong_proof", frames(0, {hello, proof, j}));
    write(auth, "server_open", frames(16 | 2, {hello, j, beat}));
    const auto challenge = rdzv::to_message(
        rdzv::Challenge{.token_required = true, .server_nonce = std::string(64, 'b'), .standing = true, .version = 3});
    const auto round = rdzv::to_message(rdzv::Round{.run_id = "job", .round = 1});
    write(auth, "agent_sealed",
          frames(1 | 2 | 4, {challenge, rdzv::to_message(rdzv::Welcome{}), round, rdzv::to_message(rdzv::Restart{})}));
    write(auth, "agent_forged", frames(1 | 2, {challenge, rdzv::to_message(rdzv::Welcome{}), round}));
    write(auth, "agent_refused", frames(1, {rdzv::to_message(rdzv::Error{.message = "no"})}));
  }

  // options: byte 0 = machine, then NUL-separated argv / PET_ and SLURM variables.
  const fs::path options = root / "options";
  auto cmd = [](std::vector<std::string> args) {
    std::string s(1, char(0x44));  // 5 cpus, 2 gpus
    for (auto& a : args) s += a + '\0';
    return s;
  };
  write(options, "standalone", cmd({"--standalone", "--nproc_per_node=2", "train.py", "--lr", "0.1"}));
  write(options, "multinode",
        cmd({"--nnodes=1:4", "--nproc_per_node=gpu", "--rdzv_backend=c10d", "--rdzv_endpoint=host:29400",
             "--rdzv_id=job", "--max_restarts=3", "--rdzv_conf=join_timeout=60,last_call_timeout=5", "-m", "pkg.mod"}));
  write(options, "static",
        cmd({"--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1", "--master_port=29500", "--redirects=3",
             "--tee=0:1,1:2", "--local_ranks_filter=0,1", "--log_dir=/tmp/x", "--no_python", "./bin"}));
  write(options, "env",
        cmd({"PET_NPROC_PER_NODE=4", "PET_NNODES=2", "PET_RDZV_ENDPOINT=[::1]:29400", "PET_MAX_RESTARTS=2",
             "train.py"}));
  write(options, "signals",
        cmd({"--signals_to_handle=SIGTERM,SIGINT,SIGUSR1", "--monitor_interval=0.5", "--start_method=spawn",
             "--run_path", "script.py"}));
  write(options, "help", cmd({"--help"}));
  // Inside an srun step: SLURM_* variables (slurm.h) derive the multi-node flags.
  write(options, "slurm_static",
        cmd({"SLURM_JOB_ID=41", "SLURM_STEP_ID=0", "SLURM_STEP_NUM_NODES=2", "SLURM_STEP_NUM_TASKS=2",
             "SLURM_STEP_NODELIST=gpu[07-08],a-[1-2]-b[3,5]", "SLURM_NODEID=1", "SLURM_GPUS_ON_NODE=4",
             "--nproc_per_node=gpu", "train.py"}));
  write(options, "slurm_elastic",
        cmd({"SLURM_JOB_ID=7", "SLURM_STEPID=3", "SLURM_NNODES=4", "SLURM_JOB_NODELIST=n[001-004]",
             "SLURMD_NODENAME=n001", "SLURM_STEP_GPUS=0,2-3", "--nnodes=2:4", "--max_restarts=3", "train"}));
  std::printf("seeds written under %s\n", root.c_str());
  return 0;
}
