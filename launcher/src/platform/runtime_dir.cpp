#include "ddprun/launcher/runtime_dir.h"

#include <sys/stat.h>

#include <cstdio>

namespace ddprun::launcher {

namespace {

std::string uid_text(uid_t uid) { return "uid " + std::to_string(uid); }

std::string kind_of(const PathFacts& f) {
  if (f.is_link) return "a symbolic link";
  if (f.is_regular) return "a file";
  return "not a directory";
}

bool root_or(uid_t uid, uid_t me) { return uid == 0 || uid == me; }

}  // namespace

std::string octal_mode(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

std::string runtime_dir_path(const std::string& xdg, const PathFacts& xdg_facts, uid_t me) {
  const bool usable = !xdg.empty() && xdg[0] == '/' && xdg_facts.exists && xdg_facts.is_dir && !xdg_facts.is_link &&
                      xdg_facts.uid == me && (xdg_facts.mode & 022) == 0;
  if (usable) return (xdg.size() > 1 && xdg.back() == '/' ? xdg.substr(0, xdg.size() - 1) : xdg) + "/ddprun";
  return "/tmp/ddprun-" + std::to_string(me);
}

std::string private_dir_problem(const std::string& path, const PathFacts& f, uid_t me) {
  if (!f.exists) return "";
  if (!f.is_dir || f.is_link)
    return path + " is " + kind_of(f) + ", not a directory of this user: remove it (rm " + path +
           (f.uid != me ? ", as root: another user made it" : "") + ")";
  if (f.uid != me)
    return path + " belongs to " + uid_text(f.uid) + ", not to this user (" + uid_text(me) +
           "), and is not used: another user may have made it to plant a fake job; remove it (rm -rf " + path +
           (me != 0 ? ", as root" : "") + ")";
  if ((f.mode & 077) != 0)
    return path + " has mode " + octal_mode(f.mode) + ", open to other users: chmod 700 " + path;
  return "";
}

std::string ancestor_problem(const std::string& path, const PathFacts& f, uid_t me) {
  if (!f.exists || !f.is_dir || f.is_link) return path + " is not a directory";
  if (!root_or(f.uid, me))
    return path + " belongs to " + uid_text(f.uid) + " (neither root nor this user, " + uid_text(me) +
           "), who could replace what is below it: use a directory only root and you can change";
  if ((f.mode & 022) != 0 && (f.mode & S_ISVTX) == 0)
    return path + " (mode " + octal_mode(f.mode) +
           ") can be changed by other users and has no sticky bit: use a directory only root and you can change";
  return "";
}

std::string own_dir_problem(const std::string& path, const PathFacts& f, uid_t me) {
  if (!f.exists) return path + " does not exist";
  if (!f.is_dir || f.is_link) return path + " is " + kind_of(f) + ", not a directory: not read";
  if (f.uid != me)
    return path + " belongs to " + uid_text(f.uid) + ", not to this user (" + uid_text(me) + "): not read";
  return "";
}

std::string own_file_problem(const std::string& path, const PathFacts& f, uid_t me) {
  if (!f.exists) return path + " does not exist";
  if (!f.is_regular || f.is_link) return path + " is not a regular file: not read";
  if (f.uid != me)
    return path + " belongs to " + uid_text(f.uid) + ", not to this user (" + uid_text(me) + "): not read";
  if ((f.mode & 022) != 0)
    return path + " has mode " + octal_mode(f.mode) + ", writable by other users: not read (chmod go-w " + path + ")";
  return "";
}

std::string trusted_program_problem(const std::string& path, const PathFacts& f, const std::string& dir,
                                    const PathFacts& dir_f, uid_t me) {
  if (!f.exists || !f.is_regular || f.is_link) return path + " is not a regular file";
  if ((f.mode & 0111) == 0) return path + " is not executable";
  if (!root_or(f.uid, me)) return path + " belongs to " + uid_text(f.uid) + " (neither root nor this user)";
  if ((f.mode & 022) != 0) return path + " (mode " + octal_mode(f.mode) + ") can be changed by other users";
  if (!dir_f.exists || !dir_f.is_dir || dir_f.is_link) return dir + " is not a directory";
  if (!root_or(dir_f.uid, me)) return dir + " belongs to " + uid_text(dir_f.uid) + " (neither root nor this user)";
  if ((dir_f.mode & 022) != 0) return dir + " (mode " + octal_mode(dir_f.mode) + ") can be changed by other users";
  return "";
}

}  // namespace ddprun::launcher
