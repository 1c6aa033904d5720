// Checkpoints: named byte sections in one checksummed file per step.
//
// File `<dir>/ckpt-<step, 12 digits>.ddpck`, little-endian:
//   "DDPRCKP1"                      8  magic
//   u32 version (1), u32 sections   8
//   u64 payload_bytes               8
//   payload: per section  u32 name_len, name, u64 data_len, data
//   u32 crc32c(header[8..24) + payload)
//   "DDPREND1"                      8  trailer magic (a truncated file never has it)
// Writing is atomic: a temp file in the same directory, fsync, rename, fsync of the directory,
// so a reader sees either the whole old set or the whole new file. Only rank 0 writes.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddprun/worker/export.h"

namespace ddprun::worker {

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

}  // namespace ddprun::worker
