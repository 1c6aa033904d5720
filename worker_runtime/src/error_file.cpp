#include "ddprun/worker/error_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include <nlohmann/json.hpp>

namespace ddprun::worker {
std::string error_file_json(const std::string& message, const std::string& callstack, long long unix_seconds) {
  // PyTorch's members, in its order; text that is not UTF-8 gets U+FFFD, so Python reads it.
  const nlohmann::ordered_json record = {
      {"message",
       {{"message", message},
        {"extraInfo", {{"py_callstack", callstack}, {"timestamp", std::to_string(unix_seconds)}}}}}};
  return record.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

bool write_error_file(const std::string& path, const std::string& message, const std::string& callstack) {
  if (path.empty()) return true;
  try {
    const auto now =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    const std::string text = error_file_json(message, callstack, now);
    // torchelastic's own handler refuses to overwrite an existing file; we follow it: the
    // first error of this attempt is the root cause.
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    size_t off = 0;
    while (off < text.size()) {
      ssize_t n = ::write(fd, text.data() + off, text.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        ::close(fd);
        return false;
      }
      off += static_cast<size_t>(n);
    }
    ::fsync(fd);
    ::close(fd);
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace ddprun::worker
