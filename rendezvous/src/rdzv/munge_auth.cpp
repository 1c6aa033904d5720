#include "ddprun/rdzv/munge_auth.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <type_traits>
#include <vector>

#include "ddprun/rdzv/agent_auth.h"

#if __has_include(<munge.h>)
#include <munge.h>
#define DDPRUN_HAVE_MUNGE_H 1
#endif

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

#ifdef DDPRUN_HAVE_MUNGE_H
struct MungeClient::Api {
  decltype(&::munge_ctx_create) ctx_create;
  decltype(&::munge_ctx_destroy) ctx_destroy;
  decltype(&::munge_ctx_set) ctx_set;
  decltype(&::munge_ctx_strerror) ctx_strerror;
  decltype(&::munge_encode) encode;
  decltype(&::munge_decode) decode;
  decltype(&::munge_strerror) strerror;
};

namespace {
// A context per call, with the socket set; destroyed on scope exit.
struct Ctx {
  const MungeClient::Api& api;
  munge_ctx_t ctx;
  Ctx(const MungeClient::Api& a, const std::string& socket) : api(a), ctx(a.ctx_create()) {
    if (ctx == nullptr) throw std::runtime_error("munge: cannot create a context (out of memory)");
    if (!socket.empty()) api.ctx_set(ctx, MUNGE_OPT_SOCKET, socket.c_str());
  }
  ~Ctx() { api.ctx_destroy(ctx); }
  Ctx(const Ctx&) = delete;
  Ctx& operator=(const Ctx&) = delete;
  std::string error(munge_err_t e) const {
    const char* s = api.ctx_strerror(ctx);
    return s ? s : api.strerror(e);
  }
};
}  // namespace

std::shared_ptr<MungeClient> MungeClient::open(const std::string& socket, std::string& why) {
  void* lib = ::dlopen("libmunge.so.2", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    why = "libmunge.so.2 cannot be loaded (install munge)";
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  bool ok = true;
  auto sym = [&](auto& f, const char* name) {
    f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(::dlsym(lib, name));
    ok = ok && f != nullptr;
  };
  sym(api->ctx_create, "munge_ctx_create");
  sym(api->ctx_destroy, "munge_ctx_destroy");
  sym(api->ctx_set, "munge_ctx_set");
  sym(api->ctx_strerror, "munge_ctx_strerror");
  sym(api->encode, "munge_encode");
  sym(api->decode, "munge_decode");
  sym(api->strerror, "munge_strerror");
  if (!ok) {
    ::dlclose(lib);
    why = "libmunge.so.2 lacks a function ddprun needs";
    return nullptr;
  }
  std::shared_ptr<MungeClient> m(new MungeClient(lib, std::move(api), socket));
  // munged must answer: one credential, made and decoded.
  try {
    const auto back = m->decode(m->encode("ddprun probe", static_cast<uint32_t>(::geteuid())));
    if (back.payload != "ddprun probe") throw std::runtime_error("munged returned another payload");
  } catch (const std::exception& e) {
    why = std::string("munged does not answer") + (socket.empty() ? "" : " on " + socket) + " (" + e.what() + ")";
    return nullptr;
  }
  return m;
}

MungeClient::MungeClient(void* lib, std::unique_ptr<Api> api, std::string socket)
    : lib_(lib), api_(std::move(api)), socket_(std::move(socket)) {}

MungeClient::~MungeClient() { ::dlclose(lib_); }

std::string MungeClient::encode(const std::string& payload, uint32_t decoder_uid) const {
  Ctx c(*api_, socket_);
  api_->ctx_set(c.ctx, MUNGE_OPT_UID_RESTRICTION, static_cast<uid_t>(decoder_uid));
  char* cred = nullptr;
  const munge_err_t e = api_->encode(&cred, c.ctx, payload.data(), static_cast<int>(payload.size()));
  if (e != EMUNGE_SUCCESS) {
    std::free(cred);
    throw std::runtime_error("munge_encode: " + c.error(e));
  }
  std::string out(cred);
  std::free(cred);
  return out;
}

MungeDecoded MungeClient::decode(const std::string& credential) const {
  Ctx c(*api_, socket_);
  void* buf = nullptr;
  int len = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  const munge_err_t e = api_->decode(credential.c_str(), c.ctx, &buf, &len, &uid, &gid);
  MungeDecoded d;
  if (buf != nullptr && len > 0) d.payload.assign(static_cast<const char*>(buf), static_cast<size_t>(len));
  std::free(buf);
  if (e != EMUNGE_SUCCESS) throw MungeRefused("munge refused its credential: " + c.error(e));
  d.uid = uid;
  d.gid = gid;
  return d;
}
#else
struct MungeClient::Api {};
std::shared_ptr<MungeClient> MungeClient::open(const std::string&, std::string& why) {
  why = "this ddprun was built without munge.h (libmunge-dev)";
  return nullptr;
}
MungeClient::MungeClient(void* lib, std::unique_ptr<Api> api, std::string socket)
    : lib_(lib), api_(std::move(api)), socket_(std::move(socket)) {}
MungeClient::~MungeClient() = default;
std::string MungeClient::encode(const std::string&, uint32_t) const { throw std::runtime_error("no munge"); }
MungeDecoded MungeClient::decode(const std::string&) const { throw MungeRefused("no munge"); }
#endif

MungeCredentialMaker munge_credential_maker(std::shared_ptr<const MungeClient> munge, MungeScope scope) {
  return [munge = std::move(munge), scope = std::move(scope)](const std::string& client_nonce) {
    std::string secret = random_nonce();
    std::string cred = munge->encode(munge_payload(scope, client_nonce, secret), static_cast<uint32_t>(::geteuid()));
    return std::make_pair(std::move(cred), std::move(secret));
  };
}

MungeCredentialCheck munge_credential_check(std::shared_ptr<const MungeClient> munge, MungeScope scope) {
  return [munge = std::move(munge), scope = std::move(scope)](const std::string& credential,
                                                              const std::string& client_nonce) {
    return check_munge_credential(munge->decode(credential), static_cast<uint32_t>(::geteuid()), scope, client_nonce);
  };
}

}  // namespace ddprun::rdzv
