// The files in a worker's run directory (<log_dir>/<run>/attempt_<n>/<local_rank>/: the error
// file, DDPRUN_PREEMPT_FILE, DDPRUN_PROGRESS_FILE, the log files; the run's stacks/ and
// python/) are the worker's to change: it may replace one with a FIFO (an open would block),
// a link to /dev/zero or another endless file (a read would never end), a directory, or
// truncate it. Every open here refuses to follow a final symbolic link and never blocks, and
// only a regular file is accepted; every read is bounded. A worker can still make its own
// file say anything: what is read is data, parsed as such.
#pragma once

#include <sys/types.h>

#include <cerrno>
#include <cstddef>
#include <optional>
#include <string>

namespace ddprun::launcher {

// Opens `path` with `flags` (O_RDONLY, O_WRONLY|O_CREAT|O_APPEND, ...) plus O_NOFOLLOW,
// O_NONBLOCK (cleared again on success) and O_CLOEXEC, and accepts only a regular file.
// Returns the descriptor, or -1 with errno: ELOOP for a symbolic link, EINVAL (kNotRegular)
// for anything else that is not a regular file, or the open's own error. O_TRUNC is ignored
// by the kernel for a FIFO or device, so it truncates only what is accepted.
int open_worker_file(const std::string& path, int flags, mode_t mode = 0644);

// A new, empty regular file at `path` (O_CREAT|O_EXCL after removing whatever was there: a
// link, a FIFO, a file still open in a worker of an earlier attempt), opened with `flags`
// (O_WRONLY, O_RDWR, optionally O_APPEND) and O_CLOEXEC. -1 with errno when it cannot be made
// (a directory in the way: EISDIR or EEXIST).
int create_worker_file(const std::string& path, int flags, mode_t mode = 0644);

// The errno open_worker_file sets for an existing path that is not a regular file.
inline constexpr int kNotRegular = EINVAL;

// What open_worker_file's or create_worker_file's errno means, for a message:
// "is a symbolic link (not followed)", "is not a regular file", else strerror.
std::string describe_worker_file_error(int err);

// At most `max_bytes` of the regular file at `path` from offset 0 (open_worker_file, O_RDONLY):
// nullopt when it is missing, a symbolic link, not a regular file or unreadable. A file that
// grows while it is read still yields at most `max_bytes`.
std::optional<std::string> read_worker_file(const std::string& path, size_t max_bytes);

// At most `max_bytes` of the open descriptor `fd` from `offset` (pread: the descriptor's offset
// is unchanged); fewer when the file ends first (or was truncated), "" at or past its end.
// nullopt on a read error.
std::optional<std::string> pread_bounded(int fd, size_t max_bytes, off_t offset = 0);

}  // namespace ddprun::launcher
