#include "connection.h"

#include "ddprun/wire/mux.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

namespace ddprun::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {
// Bytes for at most this many other threads' connections, produced by one batch of requests,
// are sent by the producing thread itself; more are handed to the connections' threads.
constexpr size_t kMaxDirectSends = 16;
// Pieces of an outbox handed to one async_write (a MULTI_GET of many keys is written in several
// rounds rather than with one buffer table of its whole length), and to one sendmsg.
constexpr size_t kWritePieces = 1024;
constexpr size_t kSendPieces = 64;
// An input buffer of at least this size is mapped memory (InputBuffer).
constexpr size_t kMappedInput = 1 << 20;
}  // namespace

void InputBuffer::resize(size_t n, size_t keep) {
  keep = std::min({keep, n, size_});
  if (n == size_) return;
  if (mapped_ && n >= kMappedInput) {  // the kernel moves the pages: no copy
    void* p = ::mremap(data_, size_, n, MREMAP_MAYMOVE);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<uint8_t*>(p);
    size_ = n;
    return;
  }
  void* p = nullptr;
  if (n >= kMappedInput) {
    p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
  } else if (n > 0 && !(p = std::malloc(n))) {
    throw std::bad_alloc();
  }
  if (keep > 0) std::memcpy(p, data_, keep);
  reset();
  data_ = static_cast<uint8_t*>(p);
  size_ = n;
  mapped_ = n >= kMappedInput;
}

void InputBuffer::reset() {
  if (mapped_) ::munmap(data_, size_);
  else std::free(data_);
  data_ = nullptr;
  size_ = 0;
  mapped_ = false;
}

void ConnectionIo::on_exception(const ConnPtr& c, const std::exception& e) {
  try {
    warns_.warn(Warn::Exception, [&] { return fmt::format("connection {}: {}; closing it", c->id, e.what()); });
    close(c, "", false);
  } catch (...) {
    // Out of memory while closing: the socket closes with its last reference.
  }
}

void ConnectionIo::start(const ConnPtr& c) {
  c->chunk = kSmallReadChunk;
  guarded(c, [&] { read_some(c); });
}

// Grows c's input buffer to hold `want` more bytes, within --max-buffered-bytes. What is
// counted is all it holds: an InputBuffer is allocated to the byte, and read_some() asks for
// doubling what is buffered, so a long request is copied O(its size) in all (above 1 MiB it is
// mapped memory, grown by mremap without a copy).
bool ConnectionIo::grow_input(const ConnPtr& c, size_t want) {
  const size_t grow = c->in_size + want - c->in.size();
  if (counters_.buffered.fetch_add(grow) + grow > options_.max_buffered_bytes) {
    counters_.buffered -= grow;
    close_for_limit(
        c, Warn::BufferLimit,
        fmt::format("partly received requests of all connections would pass {} bytes (--max-buffered-bytes)",
                    options_.max_buffered_bytes));
    return false;
  }
  if (!budget_.try_charge(grow, c->in_size + want <= MemoryBudget::kModestBytes)) {
    counters_.buffered -= grow;
    close_for_limit(c, Warn::MemoryLimit, "its request: " + budget_.refusal(grow));
    return false;
  }
  c->in.resize(c->in_size + want, c->in_size);
  return true;
}

void ConnectionIo::read_some(const ConnPtr& c) {
  if (c->closed) return;
  if (c->is_channel()) {  // its bytes come from its relay connection, which reads for it
    events_.on_channel_resumed(c);
    return;
  }
  // A request announces its length before its bytes: grow towards it only as bytes arrive
  // (doubling what is buffered), so announced-but-unsent megabytes cost nothing.
  const size_t missing = c->need_total > c->in_size ? c->need_total - c->in_size : 0;
  const size_t want = std::max(c->chunk, std::min(missing, std::max(c->in_size, kReadChunk)));
  if (!reserve_input(c, want)) return;
  c->socket.async_read_some(asio::buffer(c->in.data() + c->in_size, want),
                            [this, c](boost::system::error_code ec, size_t n) {
                              if (c->closed) return;
                              if (ec) {
                                close(c, "", false);
                                return;
                              }
                              c->in_size += n;
                              if (n == c->in.size() - (c->in_size - n) && c->chunk < kReadChunk) c->chunk *= 2;
                              guarded(c, [&] {
                                events_.on_input(c);
                                if (!c->input_paused) read_some(c);
                              });
                            });
}

void ConnectionIo::pause_input(const ConnPtr& c) {
  c->input_paused = true;
  asio::post(c->thread->io, [this, c] {
    if (c->closed) return;
    guarded(c, [&] {
      c->input_paused = false;
      events_.on_input(c);
      if (!c->input_paused) read_some(c);
    });
  });
}

void ConnectionIo::shrink_input(const ConnPtr& c) {
  counters_.buffered -= c->in.size() - kReadChunk;
  budget_.release(c->in.size() - kReadChunk);
  c->in.resize(kReadChunk, c->in_size);
}

// ---- the outbox (under a keyspace lock or the rounds lock) ----
// Whether `size` more wire bytes fit target's outbox (out_mu held); else drops it and posts
// its close: its peer does not read what it asks for.
void ConnectionIo::drop_outbox(const ConnPtr& c) {
  budget_.release(c->out.wire_bytes());
  c->out.clear();
}

bool ConnectionIo::admit_bytes(const ConnPtr& target, uint64_t size, bool budgeted) {
  if (target->overflowed || target->fd_closed) return false;
  // Wire bytes, not memory: the limit is back-pressure on a peer that does not read.
  const bool fits = target->out.wire_bytes() + size <= options_.max_connection_buffered_bytes;
  if (fits && !budgeted) {
    budget_.charge(size);
    return true;
  }
  if (fits && budget_.try_charge(size, target->out.wire_bytes() + size <= MemoryBudget::kModestBytes)) return true;
  target->overflowed = true;
  drop_outbox(target);
  std::string why = fits ? "a reply of " + std::to_string(size) + " bytes: " + budget_.refusal(size)
                         : fmt::format("more than {} bytes queued for a peer that does not read them "
                                       "(--max-connection-buffered-bytes)",
                                       options_.max_connection_buffered_bytes);
  asio::post(target->thread->io, [this, target, fits, why = std::move(why)] {
    guarded(target, [&] { close_for_limit(target, fits ? Warn::MemoryLimit : Warn::BufferLimit, why); });
  });
  return false;
}

void ConnectionIo::append(IoThread& self, const ConnPtr& target, std::string_view bytes, bool close_after) {
  {
    std::lock_guard out_lock(target->out_mu);
    if (!admit_bytes(target, bytes.size(), false)) return;
    target->out.append(bytes);
    if (close_after) target->close_when_flushed = true;
  }
  wake(self, target);
}

void ConnectionIo::append(IoThread& self, const ConnPtr& target, const store::Reply& bytes) {
  {
    std::lock_guard out_lock(target->out_mu);
    if (!admit_bytes(target, bytes.wire_size(), true)) return;
    target->out.append(bytes);
  }
  wake(self, target);
}

// Written by `self` if `target` lives there, else sent from `self` right away when nobody is
// writing it (a wake-up must not wait for another thread to wake), or handed to its thread.
void ConnectionIo::wake(IoThread& self, const ConnPtr& target) {
  if (target->flush_posted.exchange(true)) return;  // queued already, not flushed yet
  (target->thread == &self ? self.to_flush : self.remote).push_back(target);
}

void ConnectionIo::flush_pending(IoThread& t) {
  // Each list is swapped out (handling it may queue more) and handed back emptied, so its
  // capacity is reused instead of reallocated on every batch of requests.
  auto take = [](std::vector<ConnPtr>& list, auto&& each) {
    std::vector<ConnPtr> batch;
    batch.swap(list);
    for (auto& c : batch) {
      c->flush_posted = false;
      each(c, batch.size());
    }
    batch.clear();
    if (list.empty()) list.swap(batch);
  };
  // A few wake-ups (a WAIT released, a ROUND) go out from here at once; a broadcast (a
  // join storm's release) is spread over the connections' own threads.
  if (!t.remote.empty()) {
    take(t.remote, [this](const ConnPtr& c, size_t n) {
      if (n <= kMaxDirectSends) send_from_here(c);
      else asio::post(c->thread->io, [this, c] { guarded(c, [&] { flush(c); }); });
    });
  }
  if (!t.to_flush.empty()) take(t.to_flush, [this](const ConnPtr& c, size_t) { flush(c); });
}

// On a thread that is not c's: one non-blocking send of c's outbox while nobody else writes
// it (out_mu held, so c's thread neither writes nor closes the descriptor meanwhile). What
// does not go now, a close after the flush, or an error, is left to c's thread.
void ConnectionIo::send_from_here(const ConnPtr& c) {
  if (c->is_channel()) {  // framed into its relay connection's outbox by its own thread
    asio::post(c->thread->io, [this, c] { guarded(c, [&] { flush(c); }); });
    return;
  }
  {
    std::lock_guard out_lock(c->out_mu);
    if (c->fd_closed || c->out.empty() || c->writer_busy) return;  // a busy writer flushes again
    if (!c->close_when_flushed) {
      iovec iov[kSendPieces];
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = c->out.front_pieces(kSendPieces, [&, i = size_t{0}](const char* p, size_t n) mutable {
        iov[i++] = {const_cast<char*>(p), n};
      });
      const ssize_t n = ::sendmsg(c->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        c->out.consume(static_cast<size_t>(n));
        budget_.release(static_cast<uint64_t>(n));
      }
      if (c->out.empty()) return;
    }
  }
  asio::post(c->thread->io, [this, c] { guarded(c, [&] { flush(c); }); });
}

// ---- writing and closing (the connection's thread) ----
void ConnectionIo::flush(const ConnPtr& c) {
  if (c->closed) return;
  if (c->is_channel()) {
    flush_channel(c);
    return;
  }
  bool close_now = false;
  {
    std::lock_guard out_lock(c->out_mu);
    if (c->writer_busy) return;  // its completion flushes again
    if (c->out.empty()) {
      close_now = c->close_when_flushed;
    } else {
      c->writing.swap(c->out);  // `writing` was drained by the last write: `out` gets its buffers
      c->writer_busy = true;
    }
  }
  if (c->writing.empty()) {
    if (close_now) close(c, "", false);
    return;
  }
  write_some(c);
}

// The completion of a write of c->writing: on to the next pieces, or to `out` again.
void ConnectionIo::on_written(const ConnPtr& c, boost::system::error_code ec, size_t n) {
  if (!ec && !c->closed) {
    c->writing.consume(n);
    budget_.release(n);
    if (!c->writing.empty()) {
      guarded(c, [&] { write_some(c); });
      return;
    }
  }
  {
    std::lock_guard out_lock(c->out_mu);
    c->writer_busy = false;
  }
  if (c->closed || ec) {
    budget_.release(c->writing.wire_bytes());
    c->writing.clear();  // what was not sent goes, with the values it held
    if (!c->closed) close(c, "", false);
    return;
  }
  guarded(c, [&] { flush(c); });
}

// Writes the next pieces of c->writing (a gather write straight from the stored values),
// then the next, until it is empty; then looks at `out` again.
void ConnectionIo::write_some(const ConnPtr& c) {
  c->iov.clear();
  c->writing.front_pieces(kWritePieces, [&](const char* p, size_t n) { c->iov.emplace_back(p, n); });
  auto done = [this, c](boost::system::error_code ec, size_t n) { on_written(c, ec, n); };
  // One piece (small replies, the common case) is written as one buffer: a buffer sequence
  // is copied into the write operation, an allocation per write.
  if (c->iov.size() == 1) asio::async_write(c->socket, c->iov.front(), std::move(done));
  else asio::async_write(c->socket, c->iov, std::move(done));
}

void ConnectionIo::close(const ConnPtr& c, const std::string& why, bool bad_input) {
  if (c->closed) return;
  c->closed = true;
  if (bad_input) {
    ++counters_.closed_bad;
    warns_.warn(Warn::BadInput, [&] {
      return fmt::format("closing connection {} from {}:{}: {}", c->id, c->session.peer.to_string(),
                         c->session.peer_port, why);
    });
  }
  {
    std::lock_guard out_lock(c->out_mu);  // no other thread is sending on it past this point
    c->fd_closed = true;
    drop_outbox(c);  // nothing more goes out: let go of the values it references
  }
  if (c->deadline) c->deadline->cancel();
  if (!c->is_channel()) {
    boost::system::error_code ignored;
    c->socket.shutdown(tcp::socket::shutdown_both, ignored);
    c->socket.close(ignored);
  }
  counters_.buffered -= c->in.size();
  budget_.release(c->in.size() + (c->budgeted ? kConnectionBytes : 0));
  c->in.reset();
  --(c->is_channel() ? counters_.channels : counters_.open);
  if (c->session.agent) --counters_.agents;
  events_.on_closed(c);
  flush_pending(*c->thread);
  budget_.trim_if_due();
}

// ---- relay channels (wire/mux.h), on the relay connection's thread ----
bool ConnectionIo::feed(const ConnPtr& c, std::span<const uint8_t> bytes) {
  if (c->closed) return false;
  // Grows by doubling what is buffered, as read_some does: a long request is copied O(its size).
  const size_t want = std::max({bytes.size(), c->in_size, kSmallReadChunk});
  if (c->in.size() < c->in_size + bytes.size() && !grow_input(c, want)) return false;
  std::memcpy(c->in.data() + c->in_size, bytes.data(), bytes.size());
  c->in_size += bytes.size();
  return true;
}

void ConnectionIo::flush_channel(const ConnPtr& c) {
  store::Outbox taken;
  bool close_now = false;
  {
    std::lock_guard out_lock(c->out_mu);
    taken.swap(c->out);
    close_now = c->close_when_flushed;
  }
  const uint64_t size = taken.wire_bytes();
  std::string bytes;
  bytes.reserve(size);
  while (!taken.empty()) {
    size_t n = 0;
    taken.front_pieces(kWritePieces, [&](const char* p, size_t len) {
      bytes.append(p, len);
      n += len;
    });
    taken.consume(n);
  }
  budget_.release(size);  // charged again as the relay connection's
  const ConnPtr relay = c->mux_parent.lock();
  if (!bytes.empty() && relay) {
    std::string frames;
    wire::mux::append_data(frames, c->mux_channel, bytes);
    send_frames(relay, frames);
  }
  if (close_now || !relay || relay->closed) close(c, "", false);
}

void ConnectionIo::send_frames(const ConnPtr& relay, const std::string& frames) {
  if (relay->closed) return;
  {
    std::lock_guard out_lock(relay->out_mu);
    if (!admit_bytes(relay, frames.size(), false)) return;
    relay->out.append(frames);
  }
  flush(relay);
}

void ConnectionIo::close_for_limit(const ConnPtr& c, Warn kind, const std::string& why) {
  ++counters_.closed_bad;
  ++(kind == Warn::MemoryLimit ? counters_.closed_memory : counters_.closed_buffers);
  warns_.warn(kind, [&] { return fmt::format("closing connection {}: {}", c->id, why); });
  close(c, "", false);
}

void ConnectionIo::post_close(const ConnPtr& c) {
  asio::post(c->thread->io, [this, c] { guarded(c, [&] { close(c, "", false); }); });
}

}  // namespace ddprun::server
