#include "ddprun/launcher/worker_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace ddprun::launcher {

int open_worker_file(const std::string& path, int flags, mode_t mode) {
  const int fd = ::open(path.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = S_ISREG(st.st_mode) ? errno : kNotRegular;
    ::close(fd);
    errno = err;
    return -1;
  }
  // Regular files ignore O_NONBLOCK; cleared so that the descriptor (a log file handed to a
  // stack tool as its stdout) looks like any other.
  if (const int fl = ::fcntl(fd, F_GETFL); fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

int create_worker_file(const std::string& path, int flags, mode_t mode) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT && errno != EISDIR && errno != EPERM) return -1;
  // O_EXCL also refuses a link made again in between; O_NONBLOCK is moot for a new file.
  return ::open(path.c_str(), flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
}

std::string describe_worker_file_error(int err) {
  if (err == ELOOP) return "is a symbolic link (not followed)";
  if (err == kNotRegular || err == ENXIO) return "is not a regular file";
  return std::strerror(err);
}

std::optional<std::string> pread_bounded(int fd, size_t max_bytes, off_t offset) {
  std::string out(max_bytes, '\0');
  size_t got = 0;
  while (got < max_bytes) {
    const ssize_t n = ::pread(fd, out.data() + got, max_bytes - got, offset + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

std::optional<std::string> read_worker_file(const std::string& path, size_t max_bytes) {
  const int fd = open_worker_file(path, O_RDONLY);
  if (fd < 0) return std::nullopt;
  auto out = pread_bounded(fd, max_bytes);
  ::close(fd);
  return out;
}

}  // namespace ddprun::launcher
