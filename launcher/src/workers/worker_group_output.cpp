// WorkerGroup's output half: each worker's log files and pipes, the console lines with their
// prefixes, the filtered logs, and what a full disk or a gone console does to them.
#include "workers/worker_group.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "ddprun/launcher/worker_files.h"
#include "platform/sys_util.h"
#include "spares/spares.h"

namespace ddprun::launcher {
namespace {

namespace fs = std::filesystem;

constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kMaxDrainBytes = 16 * 1024 * 1024;  // per stream, when a worker has exited

// Writes all of `data`; returns 0, or the errno of the write that failed (with `data` left
// holding what was not written).
int write_all(int fd, std::string_view& data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;  // cannot happen for a regular file or pipe; never loop on it
    data.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

void write_console(int fd, std::string_view data) {
  write_all(fd, data);  // the console gone (EPIPE): drop, the run goes on
}

}  // namespace

// The rank's directory under the attempt's, its error file's path (the old one removed), and
// its streams' log and filtered files.
void WorkerGroup::open_logs(Worker& w, const fs::path& attempt_dir) {
  const int lr = w.local_rank;
  const fs::path dir = attempt_dir / std::to_string(lr);
  std::error_code dir_ec;
  fs::create_directories(dir, dir_ec);
  if (dir_ec)
    spdlog::warn("cannot create {} ({}): local rank {} runs without its log files and error file", dir.string(),
                 dir_ec.message(), lr);
  w.error_file = (dir / "error.json").string();
  std::error_code ec;
  fs::remove(w.error_file, ec);
  fs::remove(preempt_file_for(w.error_file), ec);
  open_stream(w.out, kStreamOut, lr, dir, dir_ec.value(), attempt_dir);
  open_stream(w.err, kStreamErr, lr, dir, dir_ec.value(), attempt_dir);
}

void WorkerGroup::open_stream(Stream& s, int bit, int lr, const fs::path& dir, int dir_errno,
                              const fs::path& attempt_dir) {
  const bool dir_ok = dir_errno == 0;
  const int redirect = output_.redirects.for_rank(lr);
  const int tee = output_.tee.for_rank(lr);
  const bool console_allowed = !output_.local_ranks_filter || output_.local_ranks_filter->count(lr);
  if ((redirect | tee) & bit) {
    // A file that cannot be made (a full disk) is a loss like a failed write, not the run's
    // end: the console gets the stream (below) and the summary names the file.
    s.log_path = (dir / (bit == kStreamOut ? "stdout.log" : "stderr.log")).string();
    // Made anew: whatever a worker left at this path (a FIFO, a link) is removed, not opened.
    s.log_fd = dir_ok ? create_worker_file(s.log_path, O_WRONLY) : -1;
    if (s.log_fd < 0)
      log_failed(s.log_path, dir_ok ? errno : dir_errno, 0,
                 {console_allowed ? LogWriteFailures::Console::Kind::Every : LogWriteFailures::Console::Kind::None});
  }
  s.console_allowed = console_allowed;
  s.console_id = next_console_id_++;
  s.console = console_allowed && (!(redirect & bit) || (tee & bit) || s.log_fd < 0);
  s.filter = DuplicateFilter(bit == kStreamOut ? output_.duplicate_stdout_filters : output_.duplicate_stderr_filters);
  if (s.filter.enabled()) {  // the file exists with filters given, as torchrun makes it
    s.filtered_path = (attempt_dir / (bit == kStreamOut ? "filtered_stdout.log" : "filtered_stderr.log")).string();
    s.filtered_fd = open_worker_file(s.filtered_path, O_WRONLY | O_CREAT | O_APPEND);  // shared by the ranks
    if (s.filtered_fd < 0) log_failed(s.filtered_path, errno, 0);
    if (!s.filter.applies_to(tee, bit, console_allowed) && s.filtered_fd >= 0) {
      ::close(s.filtered_fd);
      s.filtered_fd = -1;
    }
  }
}

void WorkerGroup::on_pipe(int fd) {
  if (spares_->owns_fd(fd)) return spares_->on_fd(fd);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return;
  auto [w, is_err] = it->second;
  read_stream(*w, is_err ? w->err : w->out, is_err, kReadChunk);
}

// Reads up to `budget` bytes; returns false at end of stream (and closes it).
bool WorkerGroup::read_stream(Worker& w, Stream& s, bool is_err, size_t budget) {
  char buf[kReadChunk];
  size_t total = 0;
  while (s.fd >= 0 && total < budget) {
    ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n > 0) {
      total += static_cast<size_t>(n);
      emit_lines(w, s, is_err, std::string_view(buf, static_cast<size_t>(n)), false);
      if (static_cast<size_t>(n) < sizeof buf) return true;  // nothing more right now
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    emit_lines(w, s, is_err, {}, true);
    close_stream(s);
    return false;
  }
  return s.fd >= 0;
}

void WorkerGroup::emit_lines(Worker& w, Stream& s, bool is_err, std::string_view data, bool eof) {
  // A redirected stream whose file fails goes to the console from then on (this chunk's
  // lines included, the one it completes in full), so the failure loses nothing; the lines
  // before it are in the file only, and the summary says which.
  // The console's first bytes then are the start of the line this chunk completes (held by
  // the splitter), so that line reaches it whole.
  std::string line_start;
  if (s.log_fd >= 0 && !data.empty()) {
    std::string_view unwritten = data;
    if (const int err = write_all(s.log_fd, unwritten); err != 0) {
      using Kind = LogWriteFailures::Console::Kind;
      const Kind kind = s.console ? Kind::Every : s.console_allowed ? Kind::From : Kind::None;
      log_failed(s.log_path, err, unwritten.size(), {kind, s.lines});
      if (s.console_allowed && !s.console) {
        s.console = true;
        line_start = s.splitter.pending();
      }
    }
  }
  std::vector<std::string> lines;
  s.splitter.feed(data, lines);
  std::string rest;
  if (eof && s.splitter.flush(rest)) lines.push_back(std::move(rest));
  s.lines += lines.size();
  if (s.console) {
    std::vector<ConsoleMux::Write> writes;
    const auto now = Clock::now();
    const std::string prefix = output_.no_prefix ? "" : w.prefix;
    if (!line_start.empty())
      console_.feed(s.console_id, is_err ? 2 : 1, prefix, line_start, now, writes, w.interactive);
    console_.feed(s.console_id, is_err ? 2 : 1, prefix, data, now, writes, w.interactive);
    if (eof) console_.close(s.console_id, now, writes);
    to_console(writes);
  }
  if (lines.empty()) return;
  std::string filtered;
  const std::string& prefix = w.prefix;
  for (const auto& line : lines) {
    if (is_err) w.tail.push(ConsoleMux::visible(line));
    if (s.filtered_fd >= 0 && s.filter.matches(line)) filtered += prefix + line + '\n';
  }
  if (!filtered.empty()) write_log(s.filtered_fd, s.filtered_path, filtered);
}

void WorkerGroup::to_console(std::vector<ConsoleMux::Write>& writes) {
  for (auto& wr : writes) write_console(wr.fd, wr.bytes);
  writes.clear();
  const auto next = console_.next_due();
  // At least 1 ns: a time already passed fires at once (0 would disarm).
  arm_timerfd(console_timer_fd_,
              next ? std::max(1e-9, std::chrono::duration<double>(*next - Clock::now()).count()) : 0.0);
}

void WorkerGroup::on_console_timer() {
  uint64_t expirations = 0;
  if (::read(console_timer_fd_, &expirations, sizeof expirations) != sizeof expirations) return;
  std::vector<ConsoleMux::Write> writes;
  console_.flush_due(Clock::now(), writes);
  to_console(writes);
}

bool WorkerGroup::write_log(int fd, const std::string& path, std::string_view data) {
  const int err = write_all(fd, data);
  if (err != 0) log_failed(path, err, data.size());
  return err == 0;
}

void WorkerGroup::log_failed(const std::string& path, int err, uint64_t bytes_lost, LogWriteFailures::Console console) {
  if (std::string line = log_failures_.record(path, err, bytes_lost, console); !line.empty()) spdlog::warn("{}", line);
}

void WorkerGroup::close_stream(Stream& s) {
  if (s.console_id != 0) {  // a line left open ends with '\n' (a no-op after the end of stream)
    std::vector<ConsoleMux::Write> writes;
    console_.close(s.console_id, Clock::now(), writes);
    if (!writes.empty()) to_console(writes);
  }
  if (s.fd >= 0) {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, s.fd, nullptr);
    by_fd_.erase(s.fd);
    ::close(s.fd);
    s.fd = -1;
  }
  if (s.log_fd >= 0) {
    ::close(s.log_fd);
    s.log_fd = -1;
  }
  if (s.filtered_fd >= 0) {
    ::close(s.filtered_fd);
    s.filtered_fd = -1;
  }
}

void WorkerGroup::drain(Worker& w) {
  // Non-blocking: a grandchild may hold the pipe open; take what is there, bounded.
  read_stream(w, w.out, false, kMaxDrainBytes);
  read_stream(w, w.err, true, kMaxDrainBytes);
}

}  // namespace ddprun::launcher
