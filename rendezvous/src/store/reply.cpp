#include "ddprun/store/reply.h"

#include <algorithm>
#include <utility>

#include "ddprun/wire/codec.h"

namespace ddprun::store {

namespace {
constexpr size_t kKeptOutboxBytes = 256 * 1024;
}  // namespace

Reply& Reply::u8(uint8_t v) {
  wire::Writer(own_).u8(v);
  return *this;
}
Reply& Reply::u32(uint32_t v) {
  wire::Writer(own_).u32(v);
  return *this;
}
Reply& Reply::u64(uint64_t v) {
  wire::Writer(own_).u64(v);
  return *this;
}
Reply& Reply::blob(std::string_view b) {
  wire::Writer(own_).blob(b);
  return *this;
}
Reply& Reply::blob(const Value& v) {
  if (!v || v->size() <= kInlineValueBytes) return blob(v ? std::string_view(*v) : std::string_view());
  wire::Writer(own_).u64(v->size());
  refs_.push_back({own_.size(), v});
  ref_bytes_ += v->size();
  return *this;
}

Reply& Reply::raw(const Value& v) {
  if (!v || v->empty()) return *this;
  refs_.push_back({own_.size(), v});
  ref_bytes_ += v->size();
  return *this;
}

uint64_t Reply::shared_bytes() const {
  std::vector<const std::string*> seen;
  seen.reserve(refs_.size());
  for (const auto& r : refs_) seen.push_back(r.value.get());
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  uint64_t n = 0;
  for (const auto* s : seen) n += s->size();
  return n;
}

std::string Reply::flatten() const {
  std::string out;
  out.reserve(wire_size());
  for_each_piece([&](std::string_view p) { out.append(p); });
  return out;
}

void Outbox::append_own(std::string_view b) {
  if (b.empty()) return;
  if (segs_.size() > head_ && !segs_.back().value && segs_.back().begin + segs_.back().len == own_.size()) {
    segs_.back().len += b.size();
  } else {
    segs_.push_back({nullptr, own_.size(), b.size()});
  }
  own_.append(b);
  wire_bytes_ += b.size();
}

void Outbox::append(std::string_view bytes) { append_own(bytes); }

void Outbox::append(const Reply& r) {
  size_t at = 0;
  for (const auto& ref : r.refs_) {
    append_own(std::string_view(r.own_).substr(at, ref.at - at));
    segs_.push_back({ref.value, 0, ref.value->size()});
    wire_bytes_ += ref.value->size();
    at = ref.at;
  }
  append_own(std::string_view(r.own_).substr(at));
}

void Outbox::consume(size_t n) {
  wire_bytes_ -= std::min<uint64_t>(n, wire_bytes_);
  while (n > 0 && head_ < segs_.size()) {
    Seg& s = segs_[head_];
    const size_t take = std::min(n, s.len);
    s.begin += take;
    s.len -= take;
    n -= take;
    if (s.len == 0) {
      s.value.reset();  // a value sent is no longer held
      ++head_;
    }
  }
  // Copied bytes are only ever appended: start over once all were sent, so a connection that
  // drains its outbox now and then holds no more than one batch of them (and keeps the memory
  // of a small one for the next).
  if (head_ == segs_.size()) {
    head_ = 0;
    if (segs_.capacity() * sizeof(Seg) > kKeptOutboxBytes) std::vector<Seg>().swap(segs_);
    else segs_.clear();
    if (own_.capacity() > kKeptOutboxBytes) std::string().swap(own_);
    else own_.clear();
  }
}

void Outbox::clear() {
  std::string().swap(own_);
  std::vector<Seg>().swap(segs_);
  head_ = 0;
  wire_bytes_ = 0;
}

void Outbox::swap(Outbox& o) noexcept {
  own_.swap(o.own_);
  segs_.swap(o.segs_);
  std::swap(head_, o.head_);
  std::swap(wire_bytes_, o.wire_bytes_);
}

}  // namespace ddprun::store
