// Checkpoints: named byte sections in one checksummed file per step.
//
// File `<dir>/ckpt-<step, 12 digits>.ddpck`, little-endian:
//   "DDPRCKP1"                      8  magic
//   u32 version (1), u32 sections   8
//   u64 payload_bytes               8
//   payload: per section  u32 name_len, name, u64 data_len, data
//   u32 crc32c(header[8..24) + payload)
//   "DDPREND1"                      8  trailer magic (a truncated file never has it)
// Writing is atomic: a temp file `.ckpt-tmp.<pid>.<step>.<host>` in the same directory, fsync,
// rename, fsync of the directory, so a reader sees either the whole old set or the whole new
// file. The file is streamed from the sections (no encoded copy in memory). Only rank 0 writes;
// CheckpointWriter does it in the background so the training loop does not wait for the disk.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "ddprun/worker/export.h"

namespace ddprun::worker {

class Communicator;

class DDPRUN_WORKER_API Checkpoint {
 public:
  uint64_t step = 0;  // optimizer steps completed; also in the file name
  std::map<std::string, std::string> sections;

  void put(const std::string& name, const void* data, size_t bytes) {
    sections[name].assign(static_cast<const char*>(data), bytes);
  }
  template <class T>
  void put_vector(const std::string& name, const std::vector<T>& v) { put(name, v.data(), v.size() * sizeof(T)); }
  void put_u64(const std::string& name, uint64_t v) { put(name, &v, sizeof v); }
  // Extra named state of any component (a loss scaler, a scheduler): a trivially copyable value
  // (a number or a plain struct) under a name of the component's choosing, e.g.
  // "loss_scaler/scale". Read back with get_value / get_value_or (the latter for state that
  // older checkpoints lack).
  template <class T>
  void put_value(const std::string& name, const T& v) {
    static_assert(std::is_trivially_copyable_v<T>, "put_value stores raw bytes: trivially copyable types only");
    put(name, &v, sizeof v);
  }

  bool has(const std::string& name) const { return sections.count(name) != 0; }
  // Throws WorkerError when the section is missing or its size is not `bytes`.
  void get_into(const std::string& name, void* dst, size_t bytes) const;
  uint64_t get_u64(const std::string& name) const;
  template <class T>
  std::vector<T> get_vector(const std::string& name) const {
    const std::string& s = section(name);
    std::vector<T> v(s.size() / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), s.data(), v.size() * sizeof(T));
    return v;
  }
  template <class T>
  T get_value(const std::string& name) const {
    static_assert(std::is_trivially_copyable_v<T>);
    T v;
    get_into(name, &v, sizeof v);
    return v;
  }
  template <class T>
  T get_value_or(const std::string& name, const T& fallback) const {
    return has(name) ? get_value<T>(name) : fallback;
  }
  const std::string& section(const std::string& name) const;
};

DDPRUN_WORKER_API std::string encode_checkpoint(const Checkpoint& ckpt);
// Never throws on bad bytes: returns nullopt and sets *why.
DDPRUN_WORKER_API std::optional<Checkpoint> decode_checkpoint(std::string_view bytes, std::string* why = nullptr);

// Path of the checkpoint of `step` in `dir`.
DDPRUN_WORKER_API std::string checkpoint_path(const std::string& dir, uint64_t step);

// Atomically writes `ckpt` as <dir>/ckpt-<step>.ddpck (creating dir), then deletes all but the
// newest `keep_last` checkpoints (0 = keep all). Throws std::system_error with the path on
// I/O failure (the previous checkpoints stay valid).
DDPRUN_WORKER_API void save_checkpoint(const std::string& dir, const Checkpoint& ckpt, int keep_last = 3);

// The newest valid checkpoint in dir: files are tried newest step first; a truncated, torn or
// corrupt one is skipped with a warning (spdlog). A missing directory or no valid file
// returns nullopt (start fresh).
DDPRUN_WORKER_API std::optional<Checkpoint> load_latest_checkpoint(const std::string& dir);

// The same, agreed by every rank (collective: every rank calls it with its own view of `dir`):
// the newest checkpoint that every rank has and can read whole, so that all of them resume
// from the same step even when a node's directory lags (a file not yet copied or synced, a
// torn one). nullopt when no rank has any; WorkerError when some rank has checkpoints but none
// is readable everywhere (resuming would mix steps). One rank: load_latest_checkpoint.
DDPRUN_WORKER_API std::optional<Checkpoint> load_agreed_checkpoint(const std::string& dir, Communicator& comm);

// Removes temp files that writers killed mid-write left in dir: those of a dead process on
// this host, and those of another host (only rank 0 writes, and a new group starts only after
// the launcher stopped every worker of the old one, wherever it ran). A live process's temp
// file is kept. Returns how many were removed; a missing dir is not an error.
DDPRUN_WORKER_API size_t remove_orphaned_temp_files(const std::string& dir);

// Rank 0's checkpoints written in the background: save() takes a snapshot (moved in, so the
// caller's copy of the state is the only other one) and returns at once; a writer thread
// writes it atomically as save_checkpoint() does. At most one write is in flight: a snapshot
// saved meanwhile waits, and a newer one replaces it (the skipped step is never written: it
// was superseded). An error of a background write is never lost: the next save(), flush() or
// close() throws it (std::system_error with the path); the destructor, which cannot throw,
// logs it. close() (also from the destructor) waits for the last snapshot, so the final save
// before exit is on disk.
class DDPRUN_WORKER_API CheckpointWriter {
 public:
  // Creates dir and removes orphaned temp files in it (remove_orphaned_temp_files).
  explicit CheckpointWriter(std::string dir, int keep_last = 3);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  void save(Checkpoint snapshot);
  // Waits until every accepted snapshot is written (or superseded and dropped).
  void flush();
  // flush(), then stops the writer thread. Idempotent; save() after close() is an error.
  void close();

  const std::string& dir() const { return dir_; }
  uint64_t written() const;     // files written so far
  uint64_t superseded() const;  // snapshots replaced before their write started
  size_t orphans_removed() const { return orphans_removed_; }
  bool waiting() const;         // a snapshot waits for the write in flight (or for the thread)

 private:
  void run();
  void rethrow_error_locked();

  std::string dir_;
  int keep_last_;
  size_t orphans_removed_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Checkpoint> pending_;
  bool busy_ = false;
  bool stop_ = false;
  bool closed_ = false;
  uint64_t written_ = 0, superseded_ = 0;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace ddprun::worker
