#include "ddprun/launcher/log_paths.h"

#include <stdlib.h>

#include <cerrno>
#include <system_error>
#include <vector>

namespace fs = std::filesystem;

namespace ddprun::launcher {

std::string run_log_dir_template(const std::string& log_dir, const std::string& run_id) {
  std::string name = run_id.empty() ? "none" : run_id;
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  return (fs::path(log_dir) / (name + "_XXXXXX")).string();
}

fs::path make_run_log_dir(const std::string& log_dir, const std::string& run_id) {
  std::error_code ec;
  fs::create_directories(log_dir, ec);
  if (ec) throw std::system_error(ec, "--log_dir " + log_dir + ": cannot create it");
  if (!fs::is_directory(log_dir)) {
    throw std::system_error(std::make_error_code(std::errc::not_a_directory),
                            "--log_dir " + log_dir + " is not a directory");
  }
  const std::string templ = run_log_dir_template(log_dir, run_id);
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    throw std::system_error(errno, std::generic_category(), "--log_dir: mkdtemp " + templ);
  }
  // 0700, as torchrun's tempfile.mkdtemp leaves it: the logs are the job owner's.
  return fs::path(buf.data());
}

fs::path attempt_log_dir(const fs::path& run_dir, int attempt) {
  return run_dir / ("attempt_" + std::to_string(attempt));
}

fs::path fresh_attempt_log_dir(const fs::path& run_dir, int attempt) {
  const fs::path first = attempt_log_dir(run_dir, attempt);
  std::error_code ec;
  if (!fs::exists(first, ec)) return first;
  for (int k = 1;; ++k) {
    fs::path later = first;
    later += "." + std::to_string(k);
    if (!fs::exists(later, ec)) return later;
  }
}

}  // namespace ddprun::launcher
