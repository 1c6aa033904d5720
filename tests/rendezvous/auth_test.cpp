// The token handshake's pieces: SHA-256 and HMAC (libcrypto) against the published vectors
// (FIPS 180, RFC 4231) and Python's hashlib/hmac, the handshake both ways, and the token file
// checks.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <vector>

#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/auth_io.h"
#include "ddprun/rdzv/crypto.h"

using namespace ddprun::rdzv;

namespace {
std::string hex_of(std::string_view s) {
  static const char hex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) out += hex[c >> 4], out += hex[c & 15];
  return out;
}
const std::string kToken = "correct horse battery staple";
}  // namespace

TEST_CASE("Sha256MatchesFips180Vectors", "[auth]") {
  CHECK(to_hex(sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(to_hex(sha256("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(to_hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(to_hex(sha256(std::string(1000000, 'a'))) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("HmacSha256MatchesRfc4231Vectors", "[auth]") {
  CHECK(to_hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(to_hex(hmac_sha256(std::string(20, '\xaa'), std::string(50, '\xdd'))) ==
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4 += static_cast<char>(i);
  CHECK(to_hex(hmac_sha256(key4, std::string(50, '\xcd'))) ==
        "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  // Case 5: the MAC truncated to 128 bits.
  CHECK(to_hex(hmac_sha256(std::string(20, '\x0c'), "Test With Truncation")).substr(0, 32) ==
        "a3b6167473100ee06e0c796c2955552b");
  const std::string big_key(131, '\xaa');
  CHECK(to_hex(hmac_sha256(big_key, "Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  CHECK(to_hex(hmac_sha256(big_key, "This is a test using a larger than block-size key and a larger than block-size "
                                    "data. The key needs to be hashed before being used by the HMAC algorithm.")) ==
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST_CASE("HmacSha256KeyedOnceServesManyMessages", "[auth]") {
  // A session's key is prepared once and copied per message: the same MACs as one-shot HMAC,
  // in any order, from copies too, and with an empty key.
  const HmacSha256 jefe("Jefe");
  const HmacSha256 copy = jefe;
  for (int i = 0; i < 3; ++i) {
    CHECK(to_hex(jefe("what do ya want for nothing?")) ==
          "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    CHECK(to_hex(copy("")) == to_hex(hmac_sha256("Jefe", "")));
  }
  CHECK(to_hex(HmacSha256("")("")) == "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
}

TEST_CASE("HmacSha256AgreesWithPythonHmac", "[auth]") {
  // Random keys and messages of every length class (empty, < block, block, > block), checked
  // by Python's hmac in one run.
  std::mt19937 gen(12);
  std::string script = "import hmac,hashlib,sys\nfor line in sys.stdin:\n  k,m=line.split()\n"
                       "  print(hmac.new(bytes.fromhex(k[1:]),bytes.fromhex(m[1:]),hashlib.sha256).hexdigest())\n";
  const std::string path = "/tmp/ddprun_hmac_check_" + std::to_string(::getpid()) + ".py";
  std::ofstream(path) << script;
  std::vector<std::pair<std::string, std::string>> cases;
  for (size_t klen : {0, 1, 31, 32, 63, 64, 65, 200})
    for (size_t mlen : {0, 1, 55, 56, 63, 64, 65, 119, 120, 1000}) {
      std::string k(klen, '\0'), m(mlen, '\0');
      for (char& c : k) c = static_cast<char>(gen());
      for (char& c : m) c = static_cast<char>(gen());
      cases.emplace_back(k, m);
    }
  const std::string in_path = path + ".in";
  {
    std::ofstream in(in_path);
    for (const auto& [k, m] : cases) in << "x" << hex_of(k) << " x" << hex_of(m) << "\n";
  }
  FILE* p = ::popen((std::string(DDPRUN_PYTHON3) + " " + path + " < " + in_path).c_str(), "r");
  REQUIRE(p != nullptr);
  std::vector<std::string> theirs;
  char line[256];
  while (std::fgets(line, sizeof line, p)) theirs.emplace_back(std::string(line).substr(0, 64));
  CHECK(::pclose(p) == 0);
  ::unlink(path.c_str());
  ::unlink(in_path.c_str());
  REQUIRE(theirs.size() == cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO("key " << cases[i].first.size() << " bytes, message " << cases[i].second.size() << " bytes");
    CHECK(to_hex(hmac_sha256(cases[i].first, cases[i].second)) == theirs[i]);
  }
}

TEST_CASE("ConstantTimeEqual", "[auth]") {
  CHECK(constant_time_equal("abc", "abc"));
  CHECK_FALSE(constant_time_equal("abc", "abd"));
  CHECK_FALSE(constant_time_equal("abc", "ab"));
  CHECK(constant_time_equal("", ""));
}

namespace {
// Runs the handshake between the two pure sides; returns the agent's refusal text, or "".
struct Outcome {
  std::string agent_error;
  bool server_admitted = false;
  bool server_refused = false;
  std::string server_error;  // the ERROR it sent
};
Outcome run_handshake(const std::string& agent_token, const std::string& server_token) {
  Outcome o;
  ServerHandshake server(server_token, random_nonce());
  ClientHandshake agent(agent_token, random_nonce(), "test:1");
  std::optional<Message> to_server = agent.hello();
  try {
    while (to_server && !o.server_refused) {
      auto step = server.on_message(*to_server);
      o.server_admitted = step.admitted;
      o.server_refused = step.refused;
      if (step.refused) o.server_error = from_message<Error>(*step.reply).message;
      to_server.reset();
      if (step.reply) to_server = agent.on_reply(*step.reply);
    }
  } catch (const HandshakeRefused& e) {
    o.agent_error = e.what();
  }
  if (o.agent_error.empty() && !o.server_refused) CHECK(agent.done());
  return o;
}
}  // namespace

TEST_CASE("HandshakeAdmitsOnlyTheSameTokenBothWays", "[auth]") {
  auto same = run_handshake(kToken, kToken);
  CHECK(same.agent_error.empty());
  CHECK(same.server_admitted);

  auto open = run_handshake("", "");
  CHECK(open.agent_error.empty());
  CHECK(open.server_admitted);

  // The agent sees the server's proof first: a wrong token is caught before it proves anything.
  auto wrong = run_handshake("another token of 16+ bytes", kToken);
  CHECK_THAT(wrong.agent_error, Catch::Contains("rendezvous refused: token mismatch"));
  CHECK_THAT(wrong.agent_error, Catch::Contains("DDPRUN_RDZV_TOKEN or --rdzv_token_file the same on every node"));
  CHECK_FALSE(wrong.server_admitted);

  auto none = run_handshake("", kToken);
  CHECK_THAT(none.agent_error, Catch::Contains("requires a token and this agent has none"));
  CHECK_FALSE(none.server_admitted);

  // An agent with a token trusts no open server (it could be anyone's).
  auto impostor = run_handshake(kToken, "");
  CHECK_THAT(impostor.agent_error, Catch::Contains("requires no token but this agent has one"));
}

TEST_CASE("ServerRefusesAgentsThatSkipOrForgeTheProof", "[auth]") {
  const std::string ns = random_nonce(), nc = random_nonce();
  {
    // JOIN without HELLO: admitted by an open server (the old agents' way), refused with a token.
    ServerHandshake open("", ns);
    auto s = open.on_message(to_message(Join{}));
    CHECK(s.admitted);
    CHECK(s.forward);
    ServerHandshake closed(kToken, ns);
    auto r = closed.on_message(to_message(Join{}));
    CHECK(r.refused);
    CHECK_FALSE(closed.admitted());
    CHECK_THAT(from_message<Error>(*r.reply).message, Catch::Contains("JOIN before authentication"));
    // Nothing after a refusal gets through.
    CHECK(closed.on_message(to_message(Hello{.client_nonce = nc})).refused);
  }
  {
    // A FAILURE in place of AUTH.
    ServerHandshake s(kToken, ns);
    auto c = s.on_message(to_message(Hello{.client_nonce = nc}));
    REQUIRE(c.reply);
    CHECK(c.reply->type == MsgType::Challenge);
    CHECK(s.on_message(to_message(Failure{})).refused);
  }
  {
    // A proof for another connection's nonces (a replay) or with the server's label.
    ServerHandshake s(kToken, ns);
    s.on_message(to_message(Hello{.client_nonce = nc}));
    auto r = s.on_message(to_message(Auth{.proof = agent_proof(kToken, random_nonce(), nc)}));
    CHECK(r.refused);
    CHECK_THAT(from_message<Error>(*r.reply).message, Catch::Contains("rendezvous refused: token mismatch"));
    ServerHandshake s2(kToken, ns);
    s2.on_message(to_message(Hello{.client_nonce = nc}));
    CHECK(s2.on_message(to_message(Auth{.proof = server_proof(kToken, nc, ns)})).refused);
    ServerHandshake s3(kToken, ns);
    s3.on_message(to_message(Hello{.client_nonce = nc}));
    auto ok = s3.on_message(to_message(Auth{.proof = agent_proof(kToken, ns, nc)}));
    CHECK(ok.admitted);
    CHECK(ok.reply->type == MsgType::Welcome);
  }
  {
    ServerHandshake s(kToken, ns);
    CHECK(s.on_message(to_message(Hello{.client_nonce = "short"})).refused);
  }
  CHECK(random_nonce() != random_nonce());
  CHECK(random_nonce().size() == 2 * kNonceBytes);
}

TEST_CASE("LoadTokenChecksTheFile", "[auth]") {
  char dir_template[] = "/tmp/ddprun_token_XXXXXX";
  REQUIRE(::mkdtemp(dir_template));
  const std::string dir = dir_template;
  const std::string file = dir + "/token";
  std::ofstream(file) << "s3cret-token-of-enough-bytes\n";
  ::chmod(file.c_str(), 0644);
  try {
    load_token(file, nullptr);
    FAIL("a world-readable token file was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK_THAT(e.what(), Catch::Contains("chmod 600 " + file));
  }
  ::chmod(file.c_str(), 0600);
  CHECK(load_token(file, nullptr) == "s3cret-token-of-enough-bytes");
  CHECK(load_token(file, "the environment's token") == "s3cret-token-of-enough-bytes");  // the file wins
  ::chmod(file.c_str(), 0400);
  CHECK(load_token(file, nullptr) == "s3cret-token-of-enough-bytes");
  CHECK_THROWS_WITH(load_token(dir, nullptr), Catch::Contains("not a regular file"));
  CHECK_THROWS_WITH(load_token(dir + "/missing", nullptr), Catch::Contains("cannot open"));
  const std::string short_file = dir + "/short";
  std::ofstream(short_file) << "short\n";
  ::chmod(short_file.c_str(), 0600);
  CHECK_THROWS_WITH(load_token(short_file, nullptr), Catch::Contains("fewer than 16"));
  if (::geteuid() == 0) {
    // Another user's file (root can make one): refused though root could read it.
    REQUIRE(::chown(file.c_str(), 12345, 12345) == 0);
    CHECK_THROWS_WITH(load_token(file, nullptr), Catch::Contains("not by this user"));
  }
  CHECK(load_token("", nullptr).empty());
  CHECK(load_token("", "").empty());
  CHECK(load_token("", "environment-token-16+\n") == "environment-token-16+");
  CHECK_THROWS_WITH(load_token("", "tiny"), Catch::Contains("DDPRUN_RDZV_TOKEN"));
  for (const auto& f : {file, short_file}) ::unlink(f.c_str());
  ::rmdir(dir.c_str());
}

namespace {
// Both ends of one connection after a good token handshake: (agent's, server's) sessions.
std::pair<SessionMac, SessionMac> sessions(const std::string& token = kToken) {
  ServerHandshake server(token, random_nonce());
  ClientHandshake agent(token, random_nonce(), "test:1");
  auto challenge = server.on_message(agent.hello());
  auto auth = agent.on_reply(*challenge.reply);
  REQUIRE(auth);
  auto welcome = server.on_message(*auth);
  REQUIRE(welcome.admitted);
  REQUIRE(welcome.session);
  CHECK_FALSE(agent.on_reply(*welcome.reply));
  REQUIRE(agent.done());
  REQUIRE(agent.session());
  return {*agent.session(), *welcome.session};
}

Message failure_msg(int64_t code) {
  return to_message(Failure{.round = 0, .global_rank = 1, .local_rank = 1, .exit_code = code});
}
}  // namespace

TEST_CASE("SealedMessagesPassBothWaysUnchanged", "[auth]") {
  auto [agent, server] = sessions();
  for (int i = 0; i < 3; ++i) {
    Message m = failure_msg(7 + i);
    agent.seal(m);
    CHECK(m.get("seq") == std::to_string(i + 1));
    CHECK(m.get("mac").size() == 64);
    REQUIRE(server.open(m) == SessionMac::Verdict::Ok);
    CHECK(m.fields == failure_msg(7 + i).fields);  // seq and mac are gone, the rest as sent
  }
  Message r = to_message(JobFailed{.reason = "budget spent"});
  server.seal(r);
  CHECK(r.get("seq") == "1");  // each direction counts on its own
  REQUIRE(agent.open(r) == SessionMac::Verdict::Ok);
  CHECK(from_message<JobFailed>(r).reason == "budget spent");
  CHECK(agent.accepted() == 1);
  CHECK(server.accepted() == 3);
}

TEST_CASE("ARelayCannotInjectAlterReplayOrReflect", "[auth]") {
  auto [agent, server] = sessions();
  // Injected: unsealed, or sealed by a relay that guessed at a key (another token, another
  // connection's nonces).
  Message plain = to_message(JobFailed{.reason = "injected"});
  CHECK(agent.open(plain) == SessionMac::Verdict::Unsealed);
  SessionMac wrong_token("not the job's token at all", random_nonce(), random_nonce(), SessionMac::Side::Server);
  Message forged = to_message(JobFailed{.reason = "injected"});
  wrong_token.seal(forged);
  CHECK(agent.open(forged) == SessionMac::Verdict::BadMac);
  auto [other_agent, other_server] = sessions();  // the same token, another connection
  Message elsewhere = to_message(JobFailed{.reason = "from another connection"});
  other_server.seal(elsewhere);
  CHECK(agent.open(elsewhere) == SessionMac::Verdict::BadMac);
  // A forged message with a huge sequence number must not move the counter.
  Message high = to_message(JobFailed{.reason = "injected"});
  high.set("seq", "999999").set("mac", std::string(64, '0'));
  CHECK(agent.open(high) == SessionMac::Verdict::BadMac);
  CHECK(agent.accepted() == 0);

  // Altered: one field changed, or the type, after sealing.
  Message f = failure_msg(0);
  agent.seal(f);
  Message altered = f;
  altered.set("exit_code", "1");
  CHECK(server.open(altered) == SessionMac::Verdict::BadMac);
  Message retyped = f;
  retyped.type = MsgType::Succeeded;
  CHECK(server.open(retyped) == SessionMac::Verdict::BadMac);
  Message dropped_field = f;
  dropped_field.fields.erase("exit_code");
  CHECK(server.open(dropped_field) == SessionMac::Verdict::BadMac);
  // Reflected: the agent's own message sent back to it.
  Message reflected = f;
  CHECK(agent.open(reflected) == SessionMac::Verdict::BadMac);
  // The genuine one still passes after all that, once; its replay does not.
  Message replay = f;
  CHECK(server.open(f) == SessionMac::Verdict::Ok);
  CHECK(server.open(replay) == SessionMac::Verdict::Replayed);
  // A relay that withholds one message cannot pass the next: only the very next number is
  // accepted (a withheld FAILURE would otherwise vanish unnoticed behind later heartbeats).
  Message m2 = failure_msg(2), m3 = failure_msg(3);
  agent.seal(m2);
  agent.seal(m3);
  Message m3_first = m3;
  CHECK(server.open(m3_first) == SessionMac::Verdict::OutOfSequence);
  CHECK(server.accepted() == 1);
  Message m2_copy = m2, m3_copy = m3;
  CHECK(server.open(m2) == SessionMac::Verdict::Ok);
  CHECK(server.open(m3) == SessionMac::Verdict::Ok);
  // An older message after a newer one (reordered) is a replay.
  CHECK(server.open(m2_copy) == SessionMac::Verdict::Replayed);
  CHECK(server.open(m3_copy) == SessionMac::Verdict::Replayed);
  for (auto v : {SessionMac::Verdict::Unsealed, SessionMac::Verdict::BadMac, SessionMac::Verdict::Replayed,
                 SessionMac::Verdict::OutOfSequence})
    CHECK(std::string(SessionMac::describe(v)).size() > 10);
}

TEST_CASE("WithATokenBothSidesRefuseAPeerThatDoesNotSeal", "[auth]") {
  const std::string nc = random_nonce(), ns = random_nonce();
  // An older agent (HELLO version 1) is refused by a server with a token ...
  ServerHandshake closed(kToken, ns);
  auto r = closed.on_message(to_message(Hello{.version = 1, .client_nonce = nc}));
  CHECK(r.refused);
  CHECK_THAT(from_message<Error>(*r.reply).message,
             Catch::Contains("older ddprun") && Catch::Contains("same ddprun version"));
  // ... and taken by an open one, which seals nothing.
  ServerHandshake open("", ns);
  auto o = open.on_message(to_message(Hello{.version = 1, .client_nonce = nc}));
  CHECK(o.admitted);
  CHECK_FALSE(o.session);
  // An agent with a token refuses an older server (CHALLENGE without version 2), even with the
  // right proof: a relay that rewrote the version gets a refusal, never unsealed messages.
  ClientHandshake agent(kToken, nc, "test:1");
  Challenge c{.token_required = true, .server_nonce = ns, .server_proof = server_proof(kToken, nc, ns)};
  CHECK_THROWS_WITH(agent.on_reply(to_message(c)), Catch::Contains("older ddprun"));
  // A server of version 2 (no binding of its CHALLENGE's fields) is older too.
  ClientHandshake agent2(kToken, nc, "test:1");
  c.version = 2;
  CHECK_THROWS_WITH(agent2.on_reply(to_message(c)), Catch::Contains("older ddprun"));
  ClientHandshake agent3(kToken, nc, "test:1");
  c.version = 3;
  c.binding = challenge_binding(kToken, nc, ns, false, 3);
  CHECK(agent3.on_reply(to_message(c)));
  // Without a token neither side has a session.
  ClientHandshake open_agent("", nc, "test:1");
  open_agent.on_reply(to_message(Challenge{.token_required = false, .version = 2}));
  CHECK(open_agent.done());
  CHECK_FALSE(open_agent.session());
}

// The CHALLENGE's fields besides the proof are bound to the token: a relay that says a standing
// server is not one (or the reverse: then the agent would reconnect to it and offer it its
// store), or rewrites the version, is refused; the genuine CHALLENGE passes.
TEST_CASE("ARelayCannotRewriteTheChallengesFields", "[auth]") {
  const std::string nc = random_nonce(), ns = random_nonce();
  for (bool standing : {false, true}) {
    ServerHandshake server(kToken, ns, standing);
    auto step = server.on_message(to_message(Hello{.version = 2, .client_nonce = nc}));
    REQUIRE(step.reply);
    const Challenge genuine = from_message<Challenge>(*step.reply);
    CHECK(genuine.standing == standing);
    Challenge flipped = genuine;
    flipped.standing = !standing;
    ClientHandshake a1(kToken, nc, "test:1");
    CHECK_THROWS_WITH(a1.on_reply(to_message(flipped)), Catch::Contains("altered"));
    Challenge newer = genuine;
    newer.version = genuine.version + 1;
    ClientHandshake a2(kToken, nc, "test:1");
    CHECK_THROWS_WITH(a2.on_reply(to_message(newer)), Catch::Contains("altered"));
    ClientHandshake a3(kToken, nc, "test:1");
    CHECK(a3.on_reply(to_message(genuine)));
    CHECK(a3.server_standing() == standing);
  }
}

TEST_CASE("MungeCredentialsAdmitOnlyThisUserThisStepThisConnection", "[auth][munge]") {
  const MungeScope scope{"4242", "0"};
  const std::string nc = random_nonce(), secret = random_nonce();
  const MungeDecoded good{.uid = 1000, .gid = 1000, .payload = munge_payload(scope, nc, secret)};
  CHECK(check_munge_credential(good, 1000, scope, nc) == secret);
  // Another user's credential (munge vouches for its uid) ...
  CHECK_THROWS_WITH(check_munge_credential(MungeDecoded{.uid = 1001, .payload = good.payload}, 1000, scope, nc),
                    Catch::Contains("uid 1001") && Catch::Contains("admits only uid 1000"));
  // ... another job's, another step's ...
  CHECK_THROWS_WITH(check_munge_credential(MungeDecoded{.uid = 1000,
                                                        .payload = munge_payload({"4243", "0"}, nc, secret)},
                                           1000, scope, nc),
                    Catch::Contains("Slurm job 4243 step 0") && Catch::Contains("job 4242 step 0's"));
  CHECK_THROWS_AS(check_munge_credential(MungeDecoded{.uid = 1000, .payload = munge_payload({"4242", "1"}, nc, secret)},
                                         1000, scope, nc),
                  MungeRefused);
  // ... one made for another connection (a replay), and payloads that are not ours.
  CHECK_THROWS_WITH(check_munge_credential(good, 1000, scope, random_nonce()), Catch::Contains("replay"));
  for (const std::string& payload : std::vector<std::string>{"hello", munge_payload(scope, nc, "short"),
                                                             "ddprun-rdzv-munge-v0|4242|0|" + nc + "|" + secret,
                                                             munge_payload(scope, nc, secret) + "|extra"})
    CHECK_THROWS_AS(check_munge_credential(MungeDecoded{.uid = 1000, .payload = payload}, 1000, scope, nc),
                    MungeRefused);
}

TEST_CASE("TheMungeHandshakeMakesTheCredentialsSecretTheConnectionsToken", "[auth][munge]") {
  // munged stands in as a table: what each credential decodes to.
  std::map<std::string, MungeDecoded> munged;
  const uint32_t me = 1000;
  auto maker = [&](const MungeScope& scope, uint32_t uid) {
    return MungeCredentialMaker([&munged, scope, uid](const std::string& nc) {
      const std::string secret = random_nonce(), cred = "cred-" + std::to_string(munged.size());
      munged[cred] = MungeDecoded{.uid = uid, .payload = munge_payload(scope, nc, secret)};
      return std::make_pair(cred, secret);
    });
  };
  const MungeScope step{"77", "0"};
  MungeCredentialCheck check = [&](const std::string& cred, const std::string& nc) {
    auto it = munged.find(cred);
    if (it == munged.end()) throw MungeRefused("munge refused its credential: invalid credential");
    return check_munge_credential(it->second, me, step, nc);
  };
  auto run = [&](const AgentCredentials& creds) {
    ServerHandshake server("", random_nonce(), false, check);
    ClientHandshake agent(creds, random_nonce(), "test:1");
    auto hello = agent.hello();
    auto c = server.on_message(hello);
    if (c.refused) return from_message<Error>(*c.reply).message;
    auto auth = agent.on_reply(*c.reply);
    REQUIRE(auth);
    auto w = server.on_message(*auth);
    REQUIRE(w.admitted);
    REQUIRE(w.session);
    agent.on_reply(*w.reply);
    REQUIRE(agent.session());
    // The sessions agree: the credential's secret is the connection's token on both sides.
    Message m = to_message(Succeeded{.round = 3});
    agent.session()->seal(m);
    CHECK(w.session->open(m) == SessionMac::Verdict::Ok);
    return std::string("admitted");
  };
  CHECK(run(maker(step, me)) == "admitted");
  CHECK_THAT(run(maker({"78", "0"}, me)), Catch::Contains("rendezvous refused") && Catch::Contains("Slurm job 78"));
  CHECK_THAT(run(maker(step, 0)), Catch::Contains("rendezvous refused") && Catch::Contains("uid 0"));
  CHECK_THAT(run(AgentCredentials{}), Catch::Contains("sent none") && Catch::Contains("srun step"));
  // A munge agent trusts no open server: anything that took the rendezvous port first could
  // answer CHALLENGE with token_required=false.
  {
    ServerHandshake open("", random_nonce());
    ClientHandshake agent(maker(step, me), random_nonce(), "test:1");
    auto c = open.on_message(agent.hello());
    REQUIRE(c.reply);
    CHECK_THROWS_WITH(agent.on_reply(*c.reply), Catch::Contains("asks for no credential") &&
                                                    Catch::Contains("cannot tell that server from an impostor"));
    CHECK_FALSE(agent.done());
    CHECK_FALSE(agent.session());
  }
  // A recorded HELLO replayed on another connection: its credential names the old nonce.
  ClientHandshake agent(maker(step, me), random_nonce(), "test:1");
  Message replay = agent.hello();
  replay.set("client_nonce", random_nonce());
  ServerHandshake server("", random_nonce(), false, check);
  auto r = server.on_message(replay);
  CHECK(r.refused);
  CHECK_THAT(from_message<Error>(*r.reply).message, Catch::Contains("another connection"));
}
