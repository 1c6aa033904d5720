// The system calls behind runtime_dir.h: this user's runtime directory for an environment, the
// checks of a private directory and of every directory above it, and opening a directory or a
// file of this user without following a link (internal to launcher/src). The agent (writer) and
// `ddprun status` and `ddprun dump` (readers) use the same functions, so they meet in the same
// place and trust only what this user made.
#pragma once

#include <unistd.h>

#include <optional>
#include <string>
#include <utility>

#include "ddprun/launcher/env_map.h"
#include "ddprun/launcher/runtime_dir.h"

namespace ddprun::launcher {

// A descriptor closed when it goes out of scope; -1 when none.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

PathFacts lstat_facts(const std::string& path);
PathFacts fstat_facts(int fd);

// $XDG_RUNTIME_DIR/ddprun or /tmp/ddprun-<euid> (runtime_dir_path, XDG_RUNTIME_DIR looked at
// with lstat). Not created.
std::string runtime_dir(const EnvMap& env);

enum class DirState { ok, missing, refused };

// For readers: whether `dir` is a private directory of this user under directories only root or
// this user can change. ok: *real is its path with every link above it resolved (use that one).
// refused: *why says what is wrong and what to do. missing: it (or a directory above it) does
// not exist.
DirState check_private_dir(const std::string& dir, std::string* real, std::string* why);

// For writers: makes `dir` with mode 0700 when missing (with make_parents, the missing
// directories above it too, 0700 each), then the checks of check_private_dir. True and *real, or
// false and *why.
bool ensure_private_dir(const std::string& dir, bool make_parents, std::string* real, std::string* why);

// Opens the directory `name` in `dirfd` (or the path `name`, with AT_FDCWD) without following
// a link; it must be a directory of this user (own_dir_problem). `shown` names it in *why.
UniqueFd open_own_dir_at(int dirfd, const std::string& name, const std::string& shown, std::string* why);

// Reads the file `name` in `dirfd`: opened O_NOFOLLOW|O_NONBLOCK, a regular file of this user
// that no one else may write (own_file_problem), at most `max_bytes` (a longer one is refused).
// nullopt and *why otherwise; *missing when it does not exist.
std::optional<std::string> read_own_file_at(int dirfd, const std::string& name, const std::string& shown,
                                            size_t max_bytes, std::string* why, bool* missing);

// Makes a new directory in `dirfd` (mode 0700): `base`, else `base`-2, -3, ... when taken.
// Returns it opened, and its name in *name; throws std::system_error when none can be made.
UniqueFd make_fresh_dir_at(int dirfd, const std::string& base, std::string* name);

// The directory `name` in `dirfd`, made (0700) when missing, opened as by open_own_dir_at.
UniqueFd make_own_dir_at(int dirfd, const std::string& name, const std::string& shown, std::string* why);

// The program `name` in the directory `dir`, when it may be run (trusted_program_problem, and
// every directory above `dir` passes ancestor_problem): its path with links resolved. nullopt
// and *why otherwise (*why empty when there is no such file).
std::optional<std::string> trusted_program(const std::string& dir, const std::string& name, std::string* why);

}  // namespace ddprun::launcher
