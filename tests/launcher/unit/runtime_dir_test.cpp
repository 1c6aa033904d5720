// The private runtime directory's rules (runtime_dir.h) over what lstat/fstat said: which
// directory, and when a directory, a file or a program there is trusted.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include "ddprun/launcher/runtime_dir.h"

using namespace ddprun::launcher;

namespace {

PathFacts dir(uid_t uid, mode_t mode) {
  PathFacts f;
  f.exists = f.is_dir = true;
  f.uid = uid;
  f.mode = mode;
  return f;
}

PathFacts file(uid_t uid, mode_t mode) {
  PathFacts f;
  f.exists = f.is_regular = true;
  f.uid = uid;
  f.mode = mode;
  return f;
}

PathFacts link(uid_t uid) {
  PathFacts f;
  f.exists = f.is_link = true;
  f.uid = uid;
  f.mode = 0777;
  return f;
}

}  // namespace

TEST_CASE("the runtime directory: XDG_RUNTIME_DIR/ddprun when it is this user's and private, else /tmp/ddprun-<uid>",
          "[runtimedir]") {
  CHECK(runtime_dir_path("/run/user/1000", dir(1000, 0700), 1000) == "/run/user/1000/ddprun");
  CHECK(runtime_dir_path("/run/user/1000/", dir(1000, 0700), 1000) == "/run/user/1000/ddprun");
  CHECK(runtime_dir_path("/run/user/1000", dir(1000, 0700), 0) == "/tmp/ddprun-0");  // another user's (after su)
  CHECK(runtime_dir_path("", PathFacts{}, 1000) == "/tmp/ddprun-1000");
  CHECK(runtime_dir_path("relative", dir(0, 0700), 0) == "/tmp/ddprun-0");        // not absolute
  CHECK(runtime_dir_path("/run/user/7", PathFacts{}, 7) == "/tmp/ddprun-7");      // missing
  CHECK(runtime_dir_path("/tmp/x", dir(7, 0777), 7) == "/tmp/ddprun-7");          // others may write it
  CHECK(runtime_dir_path("/tmp/x", dir(7, 0720), 7) == "/tmp/ddprun-7");          // the group may write it
  CHECK(runtime_dir_path("/tmp/x", link(7), 7) == "/tmp/ddprun-7");               // a link
  CHECK(runtime_dir_path("/home/u/rt", dir(7, 0755), 7) == "/home/u/rt/ddprun");  // readable is fine
}

TEST_CASE("a private directory: this user's, a directory and not a link, mode 0700", "[runtimedir]") {
  CHECK(private_dir_problem("/tmp/ddprun-0", dir(0, 0700), 0).empty());
  CHECK(private_dir_problem("/tmp/ddprun-0", PathFacts{}, 0).empty());  // missing: the caller decides
  // Made first by another user (uid 65534) for root: refused, with the path and the fix.
  const std::string other = private_dir_problem("/tmp/ddprun-0", dir(65534, 0700), 0);
  CHECK(other.find("/tmp/ddprun-0 belongs to uid 65534, not to this user (uid 0)") == 0);
  CHECK(other.find("remove it (rm -rf /tmp/ddprun-0)") != std::string::npos);
  const std::string for_user = private_dir_problem("/tmp/ddprun-1000", dir(65534, 0700), 1000);
  CHECK(for_user.find("rm -rf /tmp/ddprun-1000, as root") != std::string::npos);
  CHECK(private_dir_problem("/tmp/ddprun-0", link(65534), 0).find("is a symbolic link") != std::string::npos);
  CHECK(private_dir_problem("/tmp/ddprun-0", link(0), 0).find("is a symbolic link") != std::string::npos);
  CHECK(private_dir_problem("/tmp/ddprun-0", file(0, 0600), 0).find("is a file") != std::string::npos);
  CHECK(private_dir_problem("/tmp/ddprun-0", dir(0, 0755), 0) ==
        "/tmp/ddprun-0 has mode 0755, open to other users: chmod 700 /tmp/ddprun-0");
  CHECK_FALSE(private_dir_problem("/tmp/ddprun-0", dir(0, 0701), 0).empty());
  CHECK_FALSE(private_dir_problem("/tmp/ddprun-0", dir(0, 0710), 0).empty());
}

TEST_CASE("the directories above: root's or this user's, writable by others only when sticky", "[runtimedir]") {
  CHECK(ancestor_problem("/", dir(0, 0755), 1000).empty());
  CHECK(ancestor_problem("/tmp", dir(0, 01777), 1000).empty());  // sticky: nobody renames what is ours
  CHECK(ancestor_problem("/home/u", dir(1000, 0750), 1000).empty());
  CHECK(ancestor_problem("/run/user/1000", dir(1000, 0700), 1000).empty());
  CHECK(ancestor_problem("/shared", dir(0, 0777), 1000).find("no sticky bit") != std::string::npos);
  CHECK(ancestor_problem("/shared", dir(0, 0775), 1000).find("no sticky bit") != std::string::npos);
  CHECK(ancestor_problem("/tmp/evil", dir(65534, 0755), 1000).find("belongs to uid 65534") != std::string::npos);
  CHECK(ancestor_problem("/tmp/evil", dir(65534, 01777), 0).find("belongs to uid 65534") != std::string::npos);
  CHECK_FALSE(ancestor_problem("/x", link(0), 0).empty());
  CHECK_FALSE(ancestor_problem("/x", PathFacts{}, 0).empty());
}

TEST_CASE("a run directory and its workers file are read only when they are this user's", "[runtimedir]") {
  CHECK(own_dir_problem("/logs/job_1", dir(1000, 0755), 1000).empty());
  CHECK(own_dir_problem("/logs/job_1", dir(65534, 0700), 1000).find("belongs to uid 65534") != std::string::npos);
  CHECK(own_dir_problem("/logs/job_1", link(1000), 1000).find("symbolic link") != std::string::npos);
  CHECK(own_dir_problem("/logs/job_1", PathFacts{}, 1000).find("does not exist") != std::string::npos);
  CHECK(own_file_problem("/logs/job_1/workers", file(1000, 0600), 1000).empty());
  CHECK(own_file_problem("/logs/job_1/workers", file(1000, 0644), 1000).empty());
  CHECK(own_file_problem("/logs/job_1/workers", file(65534, 0600), 0).find("belongs to uid 65534") !=
        std::string::npos);
  CHECK(own_file_problem("/logs/job_1/workers", file(0, 0666), 0).find("writable by other users") != std::string::npos);
  CHECK(own_file_problem("/logs/job_1/workers", link(0), 0).find("not a regular file") != std::string::npos);
  PathFacts fifo;
  fifo.exists = true;
  fifo.uid = 0;
  fifo.mode = 0600;
  CHECK(own_file_problem("/logs/job_1/workers", fifo, 0).find("not a regular file") != std::string::npos);
}

TEST_CASE("a program beside the interpreter runs only when root or this user owns it and its directory",
          "[runtimedir]") {
  CHECK(trusted_program_problem("/venv/bin/py-spy", file(1000, 0755), "/venv/bin", dir(1000, 0755), 1000).empty());
  CHECK(trusted_program_problem("/usr/bin/py-spy", file(0, 0755), "/usr/bin", dir(0, 0755), 1000).empty());
  // Another user's venv, as root: not run.
  CHECK(trusted_program_problem("/tmp/evil/bin/py-spy", file(65534, 0755), "/tmp/evil/bin", dir(65534, 0755), 0)
            .find("belongs to uid 65534") != std::string::npos);
  CHECK(trusted_program_problem("/tmp/evil/bin/py-spy", file(0, 0755), "/tmp/evil/bin", dir(65534, 0755), 0)
            .find("/tmp/evil/bin belongs to uid 65534") != std::string::npos);
  CHECK_FALSE(trusted_program_problem("/v/bin/py-spy", file(0, 0757), "/v/bin", dir(0, 0755), 0).empty());
  CHECK_FALSE(trusted_program_problem("/v/bin/py-spy", file(0, 0755), "/v/bin", dir(0, 01777), 0).empty());
  CHECK_FALSE(trusted_program_problem("/v/bin/py-spy", file(0, 0644), "/v/bin", dir(0, 0755), 0).empty());
  CHECK_FALSE(trusted_program_problem("/v/bin/py-spy", link(0), "/v/bin", dir(0, 0755), 0).empty());
}

TEST_CASE("modes are written as chmod takes them", "[runtimedir]") {
  CHECK(octal_mode(0700) == "0700");
  CHECK(octal_mode(S_IFDIR | 01777) == "1777");
}
