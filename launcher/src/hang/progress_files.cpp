#include "hang/progress_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <system_error>

#include <fmt/format.h>

#include "ddprun/launcher/worker_files.h"

#include "progress_module.h"  // generated: kProgressModuleSource

namespace ddprun::launcher {
namespace fs = std::filesystem;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// "16:58:02" (UTC) of a point `ago_s` seconds before now.
std::string wall_hms(double ago_s) {
  const auto t = std::chrono::system_clock::now() - std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                                        std::chrono::duration<double>(ago_s));
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  ::gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%H:%M:%S UTC", &tm);
  return buf;
}

}  // namespace

void create_progress_file(const std::string& path) {
  const int fd = create_worker_file(path, O_RDWR, 0600);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "cannot create the progress file " + path);
  unsigned char page[kProgressFileBytes] = {};
  std::memcpy(page, &kProgressMagic, sizeof kProgressMagic);
  const ssize_t n = ::write(fd, page, sizeof page);
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(sizeof page))
    throw std::system_error(n < 0 ? err : EIO, std::generic_category(), "cannot write the progress file " + path);
}

ProgressReader::ProgressReader(const std::string& path) : fd_(open_worker_file(path, O_RDONLY)) {}

ProgressReader::~ProgressReader() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<uint64_t> ProgressReader::ticks() {
  if (fd_ < 0) return std::nullopt;
  // The worker adds to one aligned 64-bit word of its shared mapping; pread copies it from the
  // same page of the page cache. A torn copy would only look like one more move.
  unsigned char word[8];
  ssize_t n;
  do {
    n = ::pread(fd_, word, sizeof word, kProgressCounterOffset);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof word)) return last_.value_or(0);  // cut short: no move
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | word[i];
  last_ = v;
  return v;
}

std::optional<StepStats> read_step_stats(const std::string& path) {
  const auto head = read_worker_file(path, kStepStatsEnd);
  if (!head) return std::nullopt;
  return parse_step_stats(reinterpret_cast<const unsigned char*>(head->data()), head->size());
}

void add_progress_env(EnvMap& env, const std::string& error_file, const std::string& module_dir) {
  if (!error_file.empty()) {  // empty: a warm spare's environment, which gets the rank's at launch
    const std::string path = (fs::path(error_file).parent_path() / kProgressFileName).string();
    create_progress_file(path);
    env[kProgressFileEnv] = path;
  }
  if (module_dir.empty()) return;
  auto it = env.find("PYTHONPATH");
  if (it == env.end() || it->second.empty()) env["PYTHONPATH"] = module_dir;
  else it->second += ":" + module_dir;
}

std::string write_progress_module(const fs::path& dir) {
  fs::create_directories(dir / "ddprun");
  const fs::path file = dir / "ddprun" / "__init__.py";
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << kProgressModuleSource;
  out.close();
  if (!out) throw std::system_error(EIO, std::generic_category(), "cannot write " + file.string());
  return dir.string();
}

void HangMonitor::attempt_started(int attempt, const std::vector<WatchedRank>& ranks) {
  attempt_ = attempt;
  ranks_ = ranks;
  readers_.clear();
  for (const auto& r : ranks_) readers_.push_back(std::make_unique<ProgressReader>(r.progress_file));
  watch_.start_attempt(now_s(), static_cast<int>(ranks_.size()));
}

HangVerdict HangMonitor::poll(const std::vector<bool>& alive) {
  std::vector<std::optional<uint64_t>> ticks(readers_.size());
  for (size_t i = 0; i < readers_.size(); ++i) {
    if (i < alive.size() && alive[i]) ticks[i] = readers_[i]->ticks();
  }
  return watch_.observe(now_s(), ticks);
}

std::vector<RankIdentity> HangMonitor::identities(const HangVerdict& v) const {
  std::vector<RankIdentity> ids(ranks_.size());
  for (size_t i = 0; i < ranks_.size(); ++i) {
    ids[i].global_rank = ranks_[i].global_rank;
    ids[i].pid = ranks_[i].pid;
  }
  for (const auto& r : v.ranks) {
    const auto i = static_cast<size_t>(r.local_rank);
    if (i < ids.size()) ids[i].since = wall_hms(r.stalled_s);
  }
  return ids;
}

}  // namespace ddprun::launcher
