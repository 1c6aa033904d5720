// This user's private runtime directory, where a running agent leaves its status socket and the
// link `ddprun dump` finds it by, and the rules every reader and writer applies before trusting
// a path there. Pure: the verdicts are over what lstat/fstat said (PathFacts), so they are
// unit-tested without files; src/platform/private_files.h does the system calls. Platform layer.
//
// The directory: $XDG_RUNTIME_DIR/ddprun when XDG_RUNTIME_DIR is an absolute path to a directory
// (not a link) of this user that no one else may write, else /tmp/ddprun-<uid>. Anyone can make
// /tmp/ddprun-<uid> first (it is absent after a reboot until the user's first job), so a
// directory there is used only when it is this user's own (not a link, mode 0700) and every
// directory above it can be changed only by root or this user (or has the sticky bit, as /tmp).
#pragma once

#include <sys/types.h>

#include <string>

namespace ddprun::launcher {

// What lstat (or fstat) said of one path.
struct PathFacts {
  bool exists = false;
  bool is_dir = false;
  bool is_link = false;
  bool is_regular = false;
  uid_t uid = 0;
  mode_t mode = 0;  // the permission bits, with the sticky bit (st_mode & 07777)
};

// The runtime directory for a caller of uid `me` whose XDG_RUNTIME_DIR is `xdg` ("" when unset)
// with `xdg_facts` from lstat.
std::string runtime_dir_path(const std::string& xdg, const PathFacts& xdg_facts, uid_t me);

// "" when `f` (lstat of `path`) is a private directory of `me`: a directory, not a link, owned
// by `me`, no group or other permissions. Else one line: what is wrong and what to do. A path
// that does not exist is "" here (the caller decides: create it, or nothing runs).
std::string private_dir_problem(const std::string& path, const PathFacts& f, uid_t me);

// "" when the directory `path` above a private directory can be changed only by root or `me`:
// owned by one of them, and writable by no one else unless sticky (as /tmp). Else one line.
std::string ancestor_problem(const std::string& path, const PathFacts& f, uid_t me);

// "" when `f` is a directory (not a link) owned by `me` (a run's log directory a link points to,
// or one given on the command line). Else one line.
std::string own_dir_problem(const std::string& path, const PathFacts& f, uid_t me);

// "" when `f` is a regular file (not a link) owned by `me` that no one else may write. Else one line.
std::string own_file_problem(const std::string& path, const PathFacts& f, uid_t me);

// "" when the program `path` (with `f`) in the directory `dir` (with `dir_f`) may be run by
// `me`: a regular executable file, and it and its directory owned by root or `me` and writable
// by no one else. Else one line.
std::string trusted_program_problem(const std::string& path, const PathFacts& f, const std::string& dir,
                                    const PathFacts& dir_f, uid_t me);

// "0755": a mode as chmod takes it.
std::string octal_mode(mode_t mode);

}  // namespace ddprun::launcher
