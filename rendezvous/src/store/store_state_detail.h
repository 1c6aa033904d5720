// Helpers that the parts of StoreState share (store_state.cpp, store_queues.cpp,
// store_slices.cpp); private.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "ddprun/store/store_state.h"

namespace ddprun::store {

namespace detail {

// C `stoll` rules, as PyTorch's servers parse an ADD target: leading whitespace and a sign
// are allowed, trailing garbage is ignored; no digits or overflow is an error.
inline bool parse_integer(const std::string& text, int64_t& out) {
  errno = 0;
  const char* begin = text.c_str();
  char* end = nullptr;
  long long v = std::strtoll(begin, &end, 10);
  if (end == begin || errno == ERANGE) return false;
  out = v;
  return true;
}

// Memory of a key named in a waiter or watch table: its copies and the entries, about.
inline uint64_t entry_bytes(const std::string& key) { return 2 * key.size() + 64; }

inline void erase_conn(std::vector<ConnId>& v, ConnId c) { v.erase(std::remove(v.begin(), v.end(), c), v.end()); }

inline ApplyResult refuse(const std::string& why) { return ApplyResult{true, why}; }

// Where the slice of `keys` that begins at `from` ends: after kWaitSlice keys, or sooner once
// it holds kSliceBytes of keys (each is hashed about once per lookup).
inline size_t slice_end(const std::vector<std::string>& keys, size_t from) {
  const size_t last = std::min(keys.size(), from + kWaitSlice);
  size_t bytes = 0;
  for (size_t i = from; i < last; ++i) {
    bytes += keys[i].size();
    if (bytes >= kSliceBytes) return i + 1;
  }
  return last;
}

inline Reply status(uint8_t byte) {
  Reply r;
  r.u8(byte);
  return r;
}

}  // namespace detail

}  // namespace ddprun::store
