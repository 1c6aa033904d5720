#include "ddprun/worker/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <system_error>

#include "ddprun/worker/checks.h"
#include "ddprun/worker/communicator.h"
#include "ddprun/worker/hash.h"
#include "log.h"

namespace ddprun::worker {
namespace {

constexpr char kMagic[8] = {'D', 'D', 'P', 'R', 'C', 'K', 'P', '1'};
constexpr char kTrailer[8] = {'D', 'D', 'P', 'R', 'E', 'N', 'D', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 24;
constexpr const char* kPrefix = "ckpt-";
constexpr const char* kSuffix = ".ddpck";

template <class T>
void append_le(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // x86-64 and aarch64 hosts are little-endian
  out.append(b, sizeof(T));
}
template <class T>
bool read_le(std::string_view& in, T& v) {
  if (in.size() < sizeof(T)) return false;
  std::memcpy(&v, in.data(), sizeof(T));
  in.remove_prefix(sizeof(T));
  return true;
}

[[noreturn]] void throw_io(const std::string& what, const std::string& path, int err) {
  throw std::system_error(err, std::generic_category(), what + " " + path);
}

bool read_file(const std::string& path, std::string& out, std::string* why) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (why) *why = std::string("open: ") + std::strerror(errno);
    return false;
  }
  out.clear();
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (why) *why = std::string("read: ") + std::strerror(errno);
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return true;
}

// Steps of the checkpoint files in dir, newest first.
std::vector<uint64_t> list_steps(const std::string& dir) {
  std::vector<uint64_t> steps;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return steps;
  const std::string pre = kPrefix, suf = kSuffix;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n.size() <= pre.size() + suf.size() || n.compare(0, pre.size(), pre) != 0 ||
        n.compare(n.size() - suf.size(), suf.size(), suf) != 0)
      continue;
    std::string digits = n.substr(pre.size(), n.size() - pre.size() - suf.size());
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    steps.push_back(std::stoull(digits));
  }
  ::closedir(d);
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

constexpr const char* kTmpPrefix = ".ckpt-tmp.";

std::string this_host() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "unknown";
  return host;
}

// Buffered writes of the file, with the running CRC of everything after the magic.
class FileSink {
 public:
  FileSink(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  void put(const void* p, size_t n, bool checksummed = true) {
    if (checksummed) crc_ = crc32c(p, n, crc_);
    const auto* c = static_cast<const char*>(p);
    if (buf_.size() + n > kBuf) drain();
    if (n >= kBuf) return write_all(c, n);
    buf_.append(c, n);
  }
  template <class T>
  void put_le(T v) {
    put(&v, sizeof v);
  }
  void drain() {
    write_all(buf_.data(), buf_.size());
    buf_.clear();
  }
  uint32_t crc() const { return crc_; }

 private:
  static constexpr size_t kBuf = 1 << 20;
  void write_all(const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        throw_io("write", path_, errno);
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  int fd_;
  std::string path_;
  std::string buf_;
  uint32_t crc_ = 0;
};

bool pid_alive(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

void mkdirs(const std::string& dir) {
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    cur = dir.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) throw_io("mkdir", cur, errno);
  }
}

}  // namespace

const std::string& Checkpoint::section(const std::string& name) const {
  auto it = sections.find(name);
  if (it == sections.end()) throw WorkerError("checkpoint has no section '" + name + "'");
  return it->second;
}

void Checkpoint::get_into(const std::string& name, void* dst, size_t bytes) const {
  const std::string& s = section(name);
  if (s.size() != bytes)
    throw WorkerError("checkpoint section '" + name + "' has " + std::to_string(s.size()) + " bytes, expected " +
                      std::to_string(bytes));
  std::memcpy(dst, s.data(), bytes);
}

uint64_t Checkpoint::get_u64(const std::string& name) const {
  uint64_t v = 0;
  get_into(name, &v, sizeof v);
  return v;
}

std::string encode_checkpoint(const Checkpoint& ckpt) {
  Checkpoint c = ckpt;
  c.put_u64("__step", ckpt.step);
  std::string payload;
  for (const auto& [name, data] : c.sections) {
    append_le<uint32_t>(payload, static_cast<uint32_t>(name.size()));
    payload += name;
    append_le<uint64_t>(payload, data.size());
    payload += data;
  }
  std::string out(kMagic, sizeof kMagic);
  append_le<uint32_t>(out, kVersion);
  append_le<uint32_t>(out, static_cast<uint32_t>(c.sections.size()));
  append_le<uint64_t>(out, payload.size());
  out += payload;
  uint32_t crc = crc32c(out.data() + 8, out.size() - 8);
  append_le<uint32_t>(out, crc);
  out.append(kTrailer, sizeof kTrailer);
  return out;
}

std::optional<Checkpoint> decode_checkpoint(std::string_view bytes, std::string* why) {
  auto fail = [&](const std::string& m) -> std::optional<Checkpoint> {
    if (why) *why = m;
    return std::nullopt;
  };
  if (bytes.size() < kHeaderBytes + 4 + sizeof kTrailer)
    return fail("truncated: " + std::to_string(bytes.size()) + " bytes");
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) return fail("bad magic");
  std::string_view in = bytes.substr(8);
  uint32_t version = 0, count = 0;
  uint64_t payload_len = 0;
  read_le(in, version);
  read_le(in, count);
  read_le(in, payload_len);
  if (version != kVersion) return fail("unsupported version " + std::to_string(version));
  if (payload_len != bytes.size() - kHeaderBytes - 4 - sizeof kTrailer)
    return fail("torn: payload length " + std::to_string(payload_len) + " does not match file size " +
                std::to_string(bytes.size()));
  if (std::memcmp(bytes.data() + bytes.size() - sizeof kTrailer, kTrailer, sizeof kTrailer) != 0)
    return fail("torn: trailer missing");
  uint32_t stored = 0;
  std::memcpy(&stored, bytes.data() + kHeaderBytes + payload_len, 4);
  const uint32_t actual = crc32c(bytes.data() + 8, kHeaderBytes - 8 + payload_len);
  if (stored != actual) {
    char buf[80];
    std::snprintf(buf, sizeof buf, "checksum mismatch: stored %08x, computed %08x", stored, actual);
    return fail(buf);
  }
  Checkpoint c;
  std::string_view p = bytes.substr(kHeaderBytes, payload_len);
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t nlen = 0;
    uint64_t dlen = 0;
    if (!read_le(p, nlen) || p.size() < nlen) return fail("bad section name");
    std::string name(p.substr(0, nlen));
    p.remove_prefix(nlen);
    if (!read_le(p, dlen) || p.size() < dlen) return fail("bad section '" + name + "'");
    c.sections[name] = std::string(p.substr(0, dlen));
    p.remove_prefix(dlen);
  }
  if (!p.empty()) return fail("trailing bytes in payload");
  auto it = c.sections.find("__step");
  if (it == c.sections.end() || it->second.size() != 8) return fail("no step");
  std::memcpy(&c.step, it->second.data(), 8);
  c.sections.erase(it);
  return c;
}

std::string checkpoint_path(const std::string& dir, uint64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "%s%012llu%s", kPrefix, static_cast<unsigned long long>(step), kSuffix);
  return dir + "/" + name;
}

void save_checkpoint(const std::string& dir, const Checkpoint& ckpt, int keep_last) {
  mkdirs(dir);
  const std::string final_path = checkpoint_path(dir, ckpt.step);
  const std::string tmp =
      dir + "/" + kTmpPrefix + std::to_string(::getpid()) + "." + std::to_string(ckpt.step) + "." + this_host();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_io("open", tmp, errno);
  try {
    // The format of encode_checkpoint(), streamed: sections in name order with "__step" among them.
    const uint64_t step = ckpt.step;
    const std::string step_bytes(reinterpret_cast<const char*>(&step), sizeof step);
    std::vector<std::pair<const std::string*, const std::string*>> secs;
    const std::string step_name = "__step";
    for (const auto& [name, data] : ckpt.sections)
      if (name != step_name) secs.emplace_back(&name, &data);
    secs.emplace_back(&step_name, &step_bytes);
    std::sort(secs.begin(), secs.end(), [](const auto& a, const auto& b) { return *a.first < *b.first; });
    uint64_t payload = 0;
    for (const auto& [name, data] : secs) payload += 4 + name->size() + 8 + data->size();
    FileSink out(fd, tmp);
    out.put(kMagic, sizeof kMagic, false);
    out.put_le<uint32_t>(kVersion);
    out.put_le<uint32_t>(static_cast<uint32_t>(secs.size()));
    out.put_le<uint64_t>(payload);
    for (const auto& [name, data] : secs) {
      out.put_le<uint32_t>(static_cast<uint32_t>(name->size()));
      out.put(name->data(), name->size());
      out.put_le<uint64_t>(data->size());
      out.put(data->data(), data->size());
    }
    const uint32_t crc = out.crc();
    out.put(&crc, sizeof crc, false);
    out.put(kTrailer, sizeof kTrailer, false);
    out.drain();
    if (::fsync(fd) != 0) throw_io("fsync", tmp, errno);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw_io("close", tmp, e);
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw_io("rename", final_path, e);
  }
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) throw_io("open", dir, errno);
  if (::fsync(dfd) != 0) {
    int e = errno;
    ::close(dfd);
    throw_io("fsync", dir, e);
  }
  ::close(dfd);
  if (keep_last > 0) {
    auto steps = list_steps(dir);
    for (size_t i = static_cast<size_t>(keep_last); i < steps.size(); ++i)
      ::unlink(checkpoint_path(dir, steps[i]).c_str());
  }
}

size_t remove_orphaned_temp_files(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  const std::string host = this_host();
  std::vector<std::string> orphans;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    long pid = 0;
    std::string from;
    if (n.rfind(kTmpPrefix, 0) == 0) {  // .ckpt-tmp.<pid>.<step>.<host>
      const size_t a = std::strlen(kTmpPrefix);
      const size_t b = n.find('.', a);
      const size_t c = b == std::string::npos ? b : n.find('.', b + 1);
      if (c == std::string::npos) continue;
      pid = std::atol(n.substr(a, b - a).c_str());
      from = n.substr(c + 1);
    } else if (n.rfind(".tmp-", 0) == 0) {  // .tmp-<pid>-<step> of earlier versions (this host)
      pid = std::atol(n.c_str() + 5);
      from = host;
    } else {
      continue;
    }
    if (from != host || !pid_alive(pid)) orphans.push_back(n);
  }
  ::closedir(d);
  size_t removed = 0;
  for (const auto& n : orphans) {
    if (::unlink((dir + "/" + n).c_str()) == 0) {
      ++removed;
      detail::log().info("removed orphaned checkpoint temp file {}/{} (its writer is gone)", dir, n);
    }
  }
  return removed;
}

CheckpointWriter::CheckpointWriter(std::string dir, int keep_last) : dir_(std::move(dir)), keep_last_(keep_last) {
  mkdirs(dir_);
  orphans_removed_ = remove_orphaned_temp_files(dir_);
  thread_ = std::thread([this] { run(); });
}

CheckpointWriter::~CheckpointWriter() {
  try {
    close();
  } catch (const std::exception& e) {
    detail::log().error("checkpoint writer for {}: the last background write failed: {}", dir_, e.what());
  }
}

void CheckpointWriter::rethrow_error_locked() {
  if (!error_) return;
  auto e = error_;
  error_ = nullptr;
  std::rethrow_exception(e);
}

void CheckpointWriter::save(Checkpoint snapshot) {
  std::unique_lock<std::mutex> lk(mu_);
  if (closed_) throw WorkerError("CheckpointWriter::save after close() (" + dir_ + ")");
  rethrow_error_locked();
  if (pending_) ++superseded_;
  pending_ = std::move(snapshot);  // the one replaced (if any) is freed here, outside the writer
  lk.unlock();
  cv_.notify_all();
}

void CheckpointWriter::flush() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return (!pending_ && !busy_) || !thread_.joinable(); });
  rethrow_error_locked();
}

void CheckpointWriter::close() {
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (closed_ && !thread_.joinable()) {
      rethrow_error_locked();
      return;
    }
    closed_ = true;
  }
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !pending_ && !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lk(mu_);
  rethrow_error_locked();
}

uint64_t CheckpointWriter::written() const {
  std::lock_guard<std::mutex> lk(mu_);
  return written_;
}

bool CheckpointWriter::waiting() const {
  std::lock_guard<std::mutex> lk(mu_);
  return pending_.has_value();
}

uint64_t CheckpointWriter::superseded() const {
  std::lock_guard<std::mutex> lk(mu_);
  return superseded_;
}

void CheckpointWriter::run() {
  for (;;) {
    Checkpoint ck;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || pending_; });
      if (!pending_) return;  // stop_ and nothing left
      ck = std::move(*pending_);
      pending_.reset();
      busy_ = true;
    }
    std::exception_ptr err;
    try {
      save_checkpoint(dir_, ck, keep_last_);
    } catch (...) {
      err = std::current_exception();
    }
    ck = Checkpoint{};  // free the snapshot before reporting done
    {
      std::lock_guard<std::mutex> lk(mu_);
      busy_ = false;
      if (err) {
        if (!error_) error_ = err;  // the first failure is the one reported
      } else {
        ++written_;
      }
    }
    cv_.notify_all();
  }
}

namespace {

// The checkpoint of `step` in `dir`, checked whole (trailer, CRC, its step); nullopt and *why
// when it cannot be read.
std::optional<Checkpoint> read_checkpoint_at(const std::string& dir, uint64_t step, std::string* why) {
  const std::string path = checkpoint_path(dir, step);
  std::string bytes;
  if (!read_file(path, bytes, why)) return std::nullopt;
  auto c = decode_checkpoint(bytes, why);
  if (!c) return std::nullopt;
  if (c->step != step) {
    *why = "its step " + std::to_string(c->step) + " does not match its name";
    return std::nullopt;
  }
  return c;
}

}  // namespace

std::optional<Checkpoint> load_latest_checkpoint(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    detail::log().info("checkpoint dir {} does not exist: starting fresh", dir);
    return std::nullopt;
  }
  for (uint64_t step : list_steps(dir)) {
    std::string why;
    if (auto c = read_checkpoint_at(dir, step, &why)) return c;
    detail::log().warn("skipping checkpoint {}: {}", checkpoint_path(dir, step), why);
  }
  return std::nullopt;
}

std::optional<Checkpoint> load_agreed_checkpoint(const std::string& dir, Communicator& comm) {
  if (comm.size() == 1) return load_latest_checkpoint(dir);
  struct stat st {};
  std::vector<uint64_t> steps;  // newest first
  if (::stat(dir.c_str(), &st) == 0) steps = list_steps(dir);
  // The agreement runs on 32-bit host all-reduces (Communicator::allreduce_max_host).
  for (uint64_t s : steps)
    if (s > static_cast<uint64_t>(INT32_MAX))
      throw WorkerError("checkpoint " + checkpoint_path(dir, s) + ": steps above " + std::to_string(INT32_MAX) +
                        " cannot be agreed on; use load_latest_checkpoint");
  auto agreed_min = [&](int64_t v) {  // v in [-1, INT32_MAX]
    return -static_cast<int64_t>(comm.allreduce_max_host(static_cast<int32_t>(-v)));
  };
  if (comm.allreduce_max_host(steps.empty() ? 0 : 1) == 0) {
    detail::log().info("no checkpoint in {} on any rank: starting fresh", dir);
    return std::nullopt;
  }
  int64_t bound = INT32_MAX;
  for (;;) {
    // The newest step every rank has a file of is at most the smallest of their newest ones.
    int64_t mine = -1;
    for (uint64_t s : steps)
      if (static_cast<int64_t>(s) <= bound) {
        mine = static_cast<int64_t>(s);
        break;
      }
    const int64_t step = agreed_min(mine);
    if (step < 0) {
      std::string seen;
      for (size_t k = 0; k < steps.size() && k < 8; ++k) seen += (k ? ", " : "") + std::to_string(steps[k]);
      if (steps.size() > 8) seen += ", ...";
      throw WorkerError("no checkpoint in " + dir + " can be read on every rank (rank " + std::to_string(comm.rank()) +
                        " has " + (steps.empty() ? std::string("none") : "steps " + seen) +
                        "): the ranks would resume from different steps. Is the directory shared by every "
                        "node, and was the newest checkpoint copied whole?");
    }
    std::string why = "this rank has no file of it";
    std::optional<Checkpoint> ck;
    if (std::find(steps.begin(), steps.end(), static_cast<uint64_t>(step)) != steps.end())
      ck = read_checkpoint_at(dir, static_cast<uint64_t>(step), &why);
    if (comm.allreduce_max_host(ck ? 0 : 1) == 0) return ck;
    detail::log().warn("checkpoint of step {} in {} is not readable on every rank{}: trying an older one", step, dir,
                       ck ? std::string() : " (here: " + why + ")");
    bound = step - 1;
  }
}

}  // namespace ddprun::worker
