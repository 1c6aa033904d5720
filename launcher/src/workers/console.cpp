#include "ddprun/launcher/console.h"

#include <algorithm>

namespace ddprun::launcher {

namespace {

// Characters of a UTF-8 string (bytes that do not continue a character).
size_t width_of(std::string_view s) {
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

// One byte into a line held as characters, at `col` (a terminal's overwrite semantics).
void put_byte(std::vector<std::string>& cells, size_t& col, char c) {
  if (c == '\b') {
    if (col > 0) --col;
    return;
  }
  if ((c & 0xC0) == 0x80 && col > 0) {  // continues the character just written
    cells[col - 1].push_back(c);
    return;
  }
  if (col < cells.size()) cells[col].assign(1, c);
  else cells.emplace_back(1, c);
  ++col;
}

}  // namespace

std::string ConsoleMux::visible(std::string_view line) {
  if (line.find('\r') == std::string_view::npos && line.find('\b') == std::string_view::npos) return std::string(line);
  std::vector<std::string> cells;
  size_t col = 0;
  for (char c : line) {
    if (c == '\r') col = 0;
    else put_byte(cells, col, c);
  }
  std::string out;
  for (const auto& c : cells) out += c;
  return out;
}

void ConsoleMux::put(Stream& s, char c) { put_byte(s.cells, s.col, c); }

std::string ConsoleMux::text(const Stream& s, size_t from) const {
  std::string out;
  for (size_t i = from; i < s.cells.size(); ++i) out += s.cells[i];
  return out;
}

std::optional<ConsoleMux::Clock::time_point> ConsoleMux::due(const Stream& s) const {
  if (!s.dirty) return std::nullopt;
  if (!s.bar) return s.dirty_since + kPartialHold;
  return s.drawn_ever ? std::max(s.dirty_since, s.last_drawn + kBarInterval) : s.dirty_since;
}

void ConsoleMux::take_line(StreamId id, Stream& s, bool as_bar, std::vector<Write>& out) {
  Sink& k = sink_of(s.fd);
  if (!k.owner || *k.owner == id) return;
  // Another stream's line is open. A plain partial line is closed (and continues on a new
  // prefixed line); a bar is left for the caller to overwrite ("\r", padded).
  if (!k.owner_bar) {
    const auto other = streams_.find(*k.owner);
    out.push_back({other != streams_.end() ? other->second.fd : s.fd, "\n"});
    k.owner.reset();
    k.width = 0;
    return;
  }
  if (!as_bar) return;  // a plain line overwrites the bar itself (the caller pads)
}

void ConsoleMux::show(StreamId id, Stream& s, Clock::time_point now, std::vector<Write>& out) {
  Sink& k = sink_of(s.fd);
  s.dirty = false;
  if (s.bar) {
    take_line(id, s, true, out);
    std::string bytes = "\r" + s.prefix + text(s, 0);
    const size_t w = width_of(s.prefix) + s.cells.size();
    if (k.owner && k.width > w) bytes.append(k.width - w, ' ');
    out.push_back({s.fd, std::move(bytes)});
    k.owner = id;
    k.owner_bar = true;
    k.width = w;
    s.last_drawn = now;
    s.drawn_ever = true;
    s.started = true;
    return;
  }
  if (k.owner == id) {  // the line is ours: its new characters only
    const std::string more = (s.interactive && s.shown > 0 ? s.prefix : std::string()) + text(s, s.shown);
    k.width += s.cells.size() - s.shown;
    s.shown = s.cells.size();
    if (!more.empty()) out.push_back({s.fd, more});
    return;
  }
  take_line(id, s, false, out);
  std::string bytes;
  if (k.owner) {  // a bar of another stream: close it, so this partial line stays whole
    bytes = "\n";
    k.owner.reset();
  }
  bytes += s.prefix + text(s, s.shown);
  out.push_back({s.fd, std::move(bytes)});
  k.owner = id;
  k.owner_bar = false;
  k.width = width_of(s.prefix) + s.cells.size() - s.shown;
  s.shown = s.cells.size();
  s.started = true;
}

void ConsoleMux::end_line(StreamId id, Stream& s, std::vector<Write>& out) {
  Sink& k = sink_of(s.fd);
  const bool mine = k.owner == id;
  if (s.bar) {
    if (mine && !s.dirty) {
      out.push_back({s.fd, "\n"});
    } else {
      take_line(id, s, true, out);
      std::string bytes = "\r" + s.prefix + text(s, 0);
      const size_t w = width_of(s.prefix) + s.cells.size();
      if (k.owner && k.width > w) bytes.append(k.width - w, ' ');
      out.push_back({s.fd, bytes + "\n"});
    }
  } else if (mine) {
    out.push_back({s.fd, (s.interactive && s.shown > 0 ? s.prefix : std::string()) + text(s, s.shown) + "\n"});
  } else {
    take_line(id, s, false, out);
    std::string bytes;
    const size_t w = width_of(s.prefix) + s.cells.size() - s.shown;
    if (k.owner) bytes = "\r";  // over another stream's bar, which is redrawn at its next update
    bytes += s.prefix + text(s, s.shown);
    if (k.owner && k.width > w) bytes.append(k.width - w, ' ');
    out.push_back({s.fd, bytes + "\n"});
  }
  if (k.owner) {
    k.owner.reset();
    k.width = 0;
  }
  const int fd = s.fd;
  const bool interactive = s.interactive;
  std::string prefix = std::move(s.prefix);
  s = Stream{};
  s.fd = fd;
  s.interactive = interactive;
  s.prefix = std::move(prefix);
}

void ConsoleMux::feed(StreamId id, int fd, std::string_view prefix, std::string_view bytes, Clock::time_point now,
                      std::vector<Write>& out, bool interactive) {
  auto [it, fresh] = streams_.try_emplace(id);
  Stream& s = it->second;
  if (fresh) {
    s.fd = fd;
    s.prefix = std::string(prefix);
    s.interactive = interactive;
  }
  for (char c : bytes) {
    if (s.cr_pending) {
      s.cr_pending = false;
      if (c == '\n') {
        end_line(id, s, out);
        continue;
      }
      s.col = 0;
      s.bar = true;
    }
    if (c == '\n') {
      end_line(id, s, out);
      continue;
    }
    if (c == '\r') {
      s.cr_pending = true;
      continue;
    }
    put(s, c);
    if (!s.dirty) {
      s.dirty = true;
      s.dirty_since = now;
    }
    if (s.cells.size() >= kMaxLine) end_line(id, s, out);
  }
  if (const auto when = due(s); when && *when <= now) show(id, s, now, out);
}

void ConsoleMux::close(StreamId id, Clock::time_point now, std::vector<Write>& out) {
  (void)now;
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  Stream& s = it->second;
  if (!s.cells.empty() || s.started) end_line(id, s, out);
  for (Sink& k : sinks_)
    if (k.owner == id) k.owner.reset();
  streams_.erase(it);
}

void ConsoleMux::flush_due(Clock::time_point now, std::vector<Write>& out) {
  for (auto& [id, s] : streams_)
    if (const auto when = due(s); when && *when <= now) show(id, s, now, out);
}

std::optional<ConsoleMux::Clock::time_point> ConsoleMux::next_due() const {
  std::optional<Clock::time_point> next;
  for (const auto& [id, s] : streams_)
    if (const auto when = due(s); when && (!next || *when < *next)) next = when;
  return next;
}

}  // namespace ddprun::launcher
