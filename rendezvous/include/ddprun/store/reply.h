// Stored values shared with the replies that carry them, replies as scatter-gather lists, and
// the per-connection queue of bytes to send. Pure: no sockets; the server hands the pieces to
// writev/async_write.
//
// Why: a MULTI_GET naming one 8 MiB value 100 times used to copy it 100 times into the reply
// (800 MiB of memory for a 1 KiB request). Now a reply holds a reference per occurrence, so its
// memory is O(keys) while its wire bytes stay exactly what PyTorch's clients read.
//
// Thread-safety: none; a Value may be shared across threads (it is immutable).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::store {

// A stored value: immutable once stored, shared by the store and every reply that carries it.
// Writing a key (SET, COMPARE_SET, APPEND, ADD, ...) replaces the pointer, so a reply in
// flight keeps the bytes it was built with and never sees a half-written value.
using Value = std::shared_ptr<const std::string>;
// The string itself is not const: the store may grow a value that nothing else holds
// (grow_in_place), which is how APPEND stays O(appended bytes).
inline Value make_value(std::string bytes) { return std::make_shared<std::string>(std::move(bytes)); }
// Appends to `v` in place when the caller's reference is the only one (no reply in flight and
// no event holds it) and returns true; else changes nothing. The caller holds the lock under
// which new references are made, so a count of one cannot grow meanwhile.
inline bool grow_in_place(const Value& v, std::string_view more) {
  if (!v || v.use_count() != 1) return false;
  // The last other holder (an outbox on another thread) let go with a release decrement; this
  // makes its reads of the bytes happen before the write below.
  std::atomic_thread_fence(std::memory_order_acquire);
  const_cast<std::string&>(*v).append(more);  // made by make_value: a non-const string
  return true;
}

// Values up to this size are copied into a reply: a reference costs about as much.
inline constexpr size_t kInlineValueBytes = 64;

// One reply (or event) as the wire carries it: bytes the reply owns (status bytes, integers,
// length prefixes, short values, keys) interleaved with references to stored values.
class Reply {
 public:
  Reply& u8(uint8_t v);
  Reply& u32(uint32_t v);
  Reply& u64(uint64_t v);
  Reply& i64(int64_t v) { return u64(static_cast<uint64_t>(v)); }
  Reply& blob(std::string_view b);  // length prefix and bytes, copied
  Reply& blob(const Value& v);      // length prefix and a reference (a copy when short); null = empty
  Reply& raw(const Value& v);       // a reference to bytes already in wire form (no prefix)
  // Room for `bytes` more owned bytes (a reply whose size is known before it is built).
  void reserve(size_t bytes) { own_.reserve(own_.size() + bytes); }

  bool empty() const { return own_.empty() && refs_.empty(); }
  // Bytes on the wire.
  uint64_t wire_size() const { return own_.size() + ref_bytes_; }
  // Memory the reply holds itself: its buffer and its reference table, not the values.
  uint64_t owned_bytes() const { return own_.capacity() + refs_.capacity() * sizeof(Ref); }
  // Bytes of the distinct values referenced, each counted once however often it occurs.
  uint64_t shared_bytes() const;
  size_t num_refs() const { return refs_.size(); }
  // Empties it, keeping the buffer's capacity (a server reuses one per thread).
  void clear() {
    own_.clear();
    refs_.clear();
    ref_bytes_ = 0;
  }
  // The wire bytes in one string (tests, small replies).
  std::string flatten() const;
  // f(std::string_view) for each contiguous piece, in wire order.
  template <class F>
  void for_each_piece(F&& f) const {
    size_t at = 0;
    for (const auto& r : refs_) {
      if (r.at > at) f(std::string_view(own_).substr(at, r.at - at));
      f(std::string_view(*r.value));
      at = r.at;
    }
    if (own_.size() > at) f(std::string_view(own_).substr(at));
  }

 private:
  friend class Outbox;
  struct Ref {
    size_t at;  // the value goes on the wire after own_[0, at)
    Value value;
  };
  std::string own_;
  std::vector<Ref> refs_;
  uint64_t ref_bytes_ = 0;
};

// The bytes queued for one connection, in order: copied bytes and references to values.
// wire_bytes() is what a per-connection limit bounds (a slow reader cannot queue unbounded
// work); memory is the copied bytes, one small record per piece, and the distinct values
// referenced (each once, and each at most wire_bytes()).
class Outbox {
 public:
  void append(std::string_view bytes);
  void append(const Reply& r);
  uint64_t wire_bytes() const { return wire_bytes_; }
  bool empty() const { return wire_bytes_ == 0; }
  // f(const char* data, size_t size) for each of the first pieces, at most max_pieces (one
  // writev's worth); returns how many.
  template <class F>
  size_t front_pieces(size_t max_pieces, F&& f) const {
    size_t n = 0;
    for (size_t i = head_; i < segs_.size() && n < max_pieces; ++i, ++n)
      f((segs_[i].value ? segs_[i].value->data() : own_.data()) + segs_[i].begin, segs_[i].len);
    return n;
  }
  // The first n bytes were sent (n <= wire_bytes()).
  void consume(size_t n);
  // Drops everything and releases its memory.
  void clear();
  void swap(Outbox& o) noexcept;

 private:
  struct Seg {
    Value value;  // null: own_[begin, begin + len)
    size_t begin = 0;
    size_t len = 0;
  };
  void append_own(std::string_view b);
  // Both only grow until everything queued was sent, then start over: a connection's outbox is
  // drained whole by each write (the server swaps a fresh one in), so neither grows without end.
  // An empty one allocates nothing (thousands of idle connections).
  std::string own_;        // copied bytes
  std::vector<Seg> segs_;  // [head_, end) still to send
  size_t head_ = 0;
  uint64_t wire_bytes_ = 0;
};

}  // namespace ddprun::store
