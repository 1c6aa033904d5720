#include "platform/private_files.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <vector>

namespace ddprun::launcher {

namespace {

PathFacts facts_of(const struct stat& st) {
  PathFacts f;
  f.exists = true;
  f.is_dir = S_ISDIR(st.st_mode);
  f.is_link = S_ISLNK(st.st_mode);
  f.is_regular = S_ISREG(st.st_mode);
  f.uid = st.st_uid;
  f.mode = st.st_mode & 07777;
  return f;
}

// "/a/b/c" -> "/a/b", "c"; "/a" -> "/", "a".
std::pair<std::string, std::string> split_last(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

// Every directory from / down to `real` (a path without links): each must pass ancestor_problem.
std::string chain_problem(const std::string& real, uid_t me) {
  std::vector<std::string> chain = {"/"};
  for (size_t at = 1; at <= real.size(); ++at) {
    if (at == real.size() || real[at] == '/') {
      if (at > 1) chain.push_back(real.substr(0, at));
    }
  }
  for (const auto& dir : chain) {
    std::string p = ancestor_problem(dir, lstat_facts(dir), me);
    if (!p.empty()) return p;
  }
  return "";
}

// The missing directories of `path` (an absolute or relative path), made 0700 from the top.
void make_parents(const std::string& path) {
  for (size_t at = 1; at < path.size(); ++at) {
    if (path[at] == '/') ::mkdir(path.substr(0, at).c_str(), 0700);
  }
}

}  // namespace

PathFacts lstat_facts(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return PathFacts{};
  return facts_of(st);
}

PathFacts fstat_facts(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return PathFacts{};
  return facts_of(st);
}

std::string runtime_dir(const EnvMap& env) {
  auto it = env.find("XDG_RUNTIME_DIR");
  const std::string xdg = it == env.end() ? "" : it->second;
  return runtime_dir_path(xdg, xdg.empty() ? PathFacts{} : lstat_facts(xdg), ::geteuid());
}

DirState check_private_dir(const std::string& dir, std::string* real, std::string* why) {
  const uid_t me = ::geteuid();
  const auto [parent, name] = split_last(dir);
  if (name.empty() || name == "." || name == "..") {
    *why = dir + ": give a directory by its name (not . or ..)";
    return DirState::refused;
  }
  char buf[PATH_MAX];
  if (::realpath(parent.c_str(), buf) == nullptr) {
    if (errno == ENOENT) return DirState::missing;
    *why = "cannot read " + parent + ": " + std::strerror(errno);
    return DirState::refused;
  }
  const std::string real_parent = buf;
  *why = chain_problem(real_parent, me);
  if (!why->empty()) return DirState::refused;
  *real = (real_parent == "/" ? "" : real_parent) + "/" + name;
  const PathFacts f = lstat_facts(*real);
  if (!f.exists) return DirState::missing;
  *why = private_dir_problem(*real, f, me);
  return why->empty() ? DirState::ok : DirState::refused;
}

bool ensure_private_dir(const std::string& dir, bool parents, std::string* real, std::string* why) {
  if (parents) make_parents(dir);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST && errno != ENOENT) {
    *why = "cannot create " + dir + ": " + std::strerror(errno);
    return false;
  }
  switch (check_private_dir(dir, real, why)) {
    case DirState::ok: return true;
    case DirState::missing: *why = "cannot create " + dir + ": a directory above it is missing"; return false;
    case DirState::refused: return false;
  }
  return false;
}

UniqueFd open_own_dir_at(int dirfd, const std::string& name, const std::string& shown, std::string* why) {
  UniqueFd fd(::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    const PathFacts f = lstat_facts(shown);
    *why = f.exists && (f.is_link || !f.is_dir) ? own_dir_problem(shown, f, ::geteuid())
                                                : "cannot open " + shown + ": " + std::strerror(err);
    return fd;
  }
  *why = own_dir_problem(shown, fstat_facts(fd.get()), ::geteuid());
  if (!why->empty()) fd.reset();
  return fd;
}

std::optional<std::string> read_own_file_at(int dirfd, const std::string& name, const std::string& shown,
                                            size_t max_bytes, std::string* why, bool* missing) {
  *missing = false;
  UniqueFd fd(::openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd) {
    *missing = errno == ENOENT;
    *why =
        errno == ELOOP ? shown + " is a symbolic link: not read" : "cannot open " + shown + ": " + std::strerror(errno);
    return std::nullopt;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    *why = "cannot read " + shown + ": " + std::strerror(errno);
    return std::nullopt;
  }
  *why = own_file_problem(shown, fstat_facts(fd.get()), ::geteuid());
  if (!why->empty()) return std::nullopt;
  if (static_cast<size_t>(st.st_size) > max_bytes) {
    *why = shown + " is larger than " + std::to_string(max_bytes) + " bytes: not read";
    return std::nullopt;
  }
  std::string text;
  char buf[4096];
  while (text.size() <= max_bytes) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *why = "cannot read " + shown + ": " + std::strerror(errno);
      return std::nullopt;
    }
    if (n == 0) return text;
    text.append(buf, static_cast<size_t>(n));
  }
  *why = shown + " is larger than " + std::to_string(max_bytes) + " bytes: not read";
  return std::nullopt;
}

UniqueFd make_fresh_dir_at(int dirfd, const std::string& base, std::string* name) {
  for (int i = 1; i <= 100; ++i) {
    *name = i == 1 ? base : base + "-" + std::to_string(i);
    if (::mkdirat(dirfd, name->c_str(), 0700) == 0) {
      UniqueFd fd(::openat(dirfd, name->c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!fd) throw std::system_error(errno, std::generic_category(), "cannot open " + *name);
      return fd;
    }
    if (errno != EEXIST) throw std::system_error(errno, std::generic_category(), "cannot create " + *name);
  }
  throw std::system_error(EEXIST, std::generic_category(), "cannot create " + base + " (100 of that name exist)");
}

UniqueFd make_own_dir_at(int dirfd, const std::string& name, const std::string& shown, std::string* why) {
  if (::mkdirat(dirfd, name.c_str(), 0700) != 0 && errno != EEXIST) {
    *why = "cannot create " + shown + ": " + std::strerror(errno);
    return UniqueFd();
  }
  return open_own_dir_at(dirfd, name, shown, why);
}

std::optional<std::string> trusted_program(const std::string& dir, const std::string& name, std::string* why) {
  why->clear();
  char buf[PATH_MAX];
  if (::realpath(dir.c_str(), buf) == nullptr) return std::nullopt;
  const std::string real_dir = buf;
  const std::string path = (real_dir == "/" ? "" : real_dir) + "/" + name;
  const PathFacts f = lstat_facts(path);
  if (!f.exists) return std::nullopt;
  const uid_t me = ::geteuid();
  *why = trusted_program_problem(path, f, real_dir, lstat_facts(real_dir), me);
  if (why->empty()) *why = chain_problem(real_dir, me);
  if (!why->empty()) return std::nullopt;
  return path;
}

}  // namespace ddprun::launcher
