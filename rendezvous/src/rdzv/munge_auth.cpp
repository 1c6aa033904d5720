#include "ddprun/rdzv/munge_auth.h"

#include <vector>

#include "ddprun/rdzv/agent_auth.h"

namespace ddprun::rdzv {

std::string munge_payload(const MungeScope& scope, const std::string& client_nonce, const std::string& secret) {
  return std::string(kMungeLabel) + "|" + scope.job_id + "|" + scope.step_id + "|" + client_nonce + "|" + secret;
}

namespace {
std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == sep) out.emplace_back();
    else out.back() += c;
  }
  return out;
}
bool is_hex(const std::string& s, size_t n) {
  if (s.size() != n) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}
}  // namespace

std::string check_munge_credential(const MungeDecoded& d, uint32_t my_uid, const MungeScope& scope,
                                   const std::string& client_nonce) {
  if (d.uid != my_uid)
    throw MungeRefused("its munge credential is of uid " + std::to_string(d.uid) +
                       ", and this rendezvous admits only uid " + std::to_string(my_uid) +
                       " (the user running Slurm job " + scope.job_id + ")");
  const auto f = split(d.payload, '|');
  if (f.size() != 5 || f[0] != kMungeLabel)
    throw MungeRefused("its munge credential is not a ddprun rendezvous credential of this version");
  if (f[1] != scope.job_id || f[2] != scope.step_id)
    throw MungeRefused("its munge credential is for Slurm job " + f[1].substr(0, 32) + " step " + f[2].substr(0, 32) +
                       ", and this rendezvous is job " + scope.job_id + " step " + scope.step_id +
                       "'s; every agent must run in the same srun step");
  if (f[3] != client_nonce) throw MungeRefused("its munge credential was made for another connection (a replay)");
  if (!is_hex(f[4], 2 * kNonceBytes)) throw MungeRefused("its munge credential carries no valid connection secret");
  return f[4];
}

}  // namespace ddprun::rdzv
