// The files a worker controls, read and written by the agent (worker_files.h): no symbolic link
// followed, no FIFO blocked on, nothing but regular files, every read bounded. And the readers
// built on it: the preemption announcement, the progress counter and its step statistics.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "ddprun/launcher/hang.h"
#include "ddprun/launcher/worker_env.h"
#include "ddprun/launcher/worker_files.h"
#include "hang/progress_files.h"

using namespace ddprun::launcher;
namespace fs = std::filesystem;

namespace {

class TempDir {
 public:
  TempDir() {
    std::string templ = (fs::temp_directory_path() / "ddprun-files-XXXXXX").string();
    REQUIRE(::mkdtemp(templ.data()) != nullptr);
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The kinds of path a worker can leave where the agent expects its regular file.
enum class Trap { Fifo, DevZero, LinkToFile, Directory };

void plant(Trap t, const std::string& path, const std::string& other_file) {
  switch (t) {
    case Trap::Fifo: REQUIRE(::mkfifo(path.c_str(), 0600) == 0); break;
    case Trap::DevZero: fs::create_symlink("/dev/zero", path); break;
    case Trap::LinkToFile: fs::create_symlink(other_file, path); break;
    case Trap::Directory: fs::create_directory(path); break;
  }
}

const char* name(Trap t) {
  switch (t) {
    case Trap::Fifo: return "a FIFO";
    case Trap::DevZero: return "a link to /dev/zero";
    case Trap::LinkToFile: return "a link to a regular file";
    case Trap::Directory: return "a directory";
  }
  return "?";
}

}  // namespace

TEST_CASE("read_worker_file: a regular file, at most N bytes of it", "[workerfiles]") {
  TempDir d;
  write(d / "f", "hello world");
  CHECK(read_worker_file(d / "f", 100) == std::optional<std::string>("hello world"));
  CHECK(read_worker_file(d / "f", 5) == std::optional<std::string>("hello"));
  CHECK(read_worker_file(d / "f", 0) == std::optional<std::string>(""));
  write(d / "empty", "");
  CHECK(read_worker_file(d / "empty", 10) == std::optional<std::string>(""));
  CHECK_FALSE(read_worker_file(d / "missing", 10));
}

TEST_CASE("read_worker_file: FIFOs, links and directories are refused, without blocking", "[workerfiles]") {
  for (Trap t : {Trap::Fifo, Trap::DevZero, Trap::LinkToFile, Trap::Directory}) {
    INFO(name(t));
    TempDir d;
    write(d / "target", "secret");
    plant(t, d / "f", d / "target");
    CHECK_FALSE(read_worker_file(d / "f", 1 << 20));
    const int fd = open_worker_file(d / "f", O_RDONLY);
    const int err = errno;
    CHECK(fd == -1);
    CHECK(describe_worker_file_error(err) ==
          (t == Trap::Fifo || t == Trap::Directory ? "is not a regular file" : "is a symbolic link (not followed)"));
  }
}

TEST_CASE("open_worker_file for writing: a FIFO without a reader is refused at once", "[workerfiles]") {
  TempDir d;
  REQUIRE(::mkfifo((d / "log").c_str(), 0600) == 0);
  CHECK(open_worker_file(d / "log", O_WRONLY | O_CREAT | O_APPEND) == -1);
  CHECK(describe_worker_file_error(errno) == "is not a regular file");
  // A regular file opens, and the descriptor blocks as usual (O_NONBLOCK cleared).
  const int fd = open_worker_file(d / "new", O_WRONLY | O_CREAT | O_APPEND);
  REQUIRE(fd >= 0);
  CHECK((::fcntl(fd, F_GETFL) & O_NONBLOCK) == 0);
  ::close(fd);
}

TEST_CASE("create_worker_file replaces what is there and never writes through it", "[workerfiles]") {
  for (Trap t : {Trap::Fifo, Trap::DevZero, Trap::LinkToFile}) {
    INFO(name(t));
    TempDir d;
    write(d / "target", "keep me");
    plant(t, d / "f", d / "target");
    const int fd = create_worker_file(d / "f", O_WRONLY);
    REQUIRE(fd >= 0);
    CHECK(::write(fd, "new", 3) == 3);
    ::close(fd);
    struct stat st {};
    REQUIRE(::lstat((d / "f").c_str(), &st) == 0);
    CHECK(S_ISREG(st.st_mode));
    CHECK(slurp(d / "f") == "new");
    CHECK(slurp(d / "target") == "keep me");
  }
  TempDir d;
  fs::create_directory(d / "dir");
  CHECK(create_worker_file(d / "dir", O_WRONLY) == -1);  // not removed: an error for the caller
  CHECK(fs::is_directory(d / "dir"));
}

TEST_CASE("pread_bounded: a file cut short yields what is left", "[workerfiles]") {
  TempDir d;
  write(d / "f", std::string(100, 'x'));
  const int fd = open_worker_file(d / "f", O_RDONLY);
  REQUIRE(fd >= 0);
  CHECK(pread_bounded(fd, 10, 95) == std::optional<std::string>("xxxxx"));
  REQUIRE(::truncate((d / "f").c_str(), 0) == 0);
  CHECK(pread_bounded(fd, 10, 0) == std::optional<std::string>(""));
  ::close(fd);
}

TEST_CASE("the preemption announcement: read when regular, bounded, never blocked on", "[workerfiles]") {
  TempDir d;
  const std::string error_file = d / "error.json";
  CHECK_FALSE(read_preempt_announcement(error_file));
  write(preempt_file_for(error_file), "preempted\ncheckpoint /ckpt/step_100\n");
  auto a = read_preempt_announcement(error_file);
  REQUIRE(a);
  CHECK(a->checkpoint);
  CHECK(a->what == "/ckpt/step_100");
  // A huge file: only its start is read.
  write(preempt_file_for(error_file),
        "preempted\n" + std::string(4 * kMaxPreemptFileBytes, 'y') + "\ncheckpoint late\n");
  a = read_preempt_announcement(error_file);
  REQUIRE(a);
  CHECK_FALSE(a->checkpoint);
  for (Trap t : {Trap::Fifo, Trap::DevZero, Trap::LinkToFile, Trap::Directory}) {
    INFO(name(t));
    TempDir e;
    write(e / "target", "preempted\ncheckpoint x\n");
    plant(t, preempt_file_for(e / "error.json"), e / "target");
    CHECK_FALSE(read_preempt_announcement(e / "error.json"));
  }
}

TEST_CASE("the progress counter survives its file being truncated, and then stands still", "[workerfiles]") {
  TempDir d;
  const std::string path = d / "progress";
  create_progress_file(path);
  ProgressReader r(path);
  CHECK(r.ticks() == std::optional<uint64_t>(0));
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t v = 41;
    f.seekp(kProgressCounterOffset);
    f.write(reinterpret_cast<const char*>(&v), sizeof v);
  }
  CHECK(r.ticks() == std::optional<uint64_t>(41));
  REQUIRE(::truncate(path.c_str(), 0) == 0);
  CHECK(r.ticks() == std::optional<uint64_t>(41));  // no crash, no move
  REQUIRE(::truncate(path.c_str(), 4) == 0);
  CHECK(r.ticks() == std::optional<uint64_t>(41));
  // Cut short before the first read: the counter as the agent made it.
  create_progress_file(d / "other");
  ProgressReader early(d / "other");
  REQUIRE(::truncate((d / "other").c_str(), 0) == 0);
  CHECK(early.ticks() == std::optional<uint64_t>(0));
}

TEST_CASE("the progress reader and the step statistics refuse what is not a regular file", "[workerfiles]") {
  for (Trap t : {Trap::Fifo, Trap::DevZero, Trap::LinkToFile, Trap::Directory}) {
    INFO(name(t));
    TempDir d;
    create_progress_file(d / "target");
    plant(t, d / "progress", d / "target");
    ProgressReader r(d / "progress");
    CHECK_FALSE(r.ticks());
    CHECK_FALSE(read_step_stats(d / "progress"));
  }
}

TEST_CASE("create_progress_file makes a new file where a worker left a link", "[workerfiles]") {
  TempDir d;
  write(d / "target", "keep me");
  fs::create_symlink(d / "target", d / "progress");
  create_progress_file(d / "progress");
  CHECK(slurp(d / "target") == "keep me");
  CHECK(fs::file_size(d / "progress") == kProgressFileBytes);
  CHECK_FALSE(fs::is_symlink(d / "progress"));
}
