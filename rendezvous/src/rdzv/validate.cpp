#include "ddprun/rdzv/validate.h"

#include <algorithm>
#include <cstdint>

namespace ddprun::rdzv {
namespace {

// Length of the UTF-8 character at s[i] and its code point, or 0 when the bytes are not one.
size_t utf8_char(std::string_view s, size_t i, uint32_t& cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n = 0;
  if (c >= 0xc2 && c <= 0xdf) n = 2, cp = c & 0x1f;
  else if (c >= 0xe0 && c <= 0xef) n = 3, cp = c & 0x0f;
  else if (c >= 0xf0 && c <= 0xf4) n = 4, cp = c & 0x07;
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3f);
  }
  // Overlong forms, surrogates and code points past U+10FFFF are not characters.
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

// C1 controls (U+009B is a one-character CSI to some terminals) and the bidirectional
// overrides, which reorder what a reader sees.
bool hidden_code_point(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9f) || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

// Index just past the escape sequence that starts with ESC at s[i].
size_t skip_escape(std::string_view s, size_t i) {
  ++i;  // ESC
  if (i >= s.size()) return i;
  const char intro = s[i++];
  if (intro == '[') {  // CSI: parameters, intermediates, one final byte
    while (i < s.size() && static_cast<unsigned char>(s[i]) >= 0x20 && static_cast<unsigned char>(s[i]) <= 0x3f) ++i;
    if (i < s.size() && static_cast<unsigned char>(s[i]) >= 0x40 && static_cast<unsigned char>(s[i]) <= 0x7e) ++i;
    return i;
  }
  if (intro == ']' || intro == 'P' || intro == 'X' || intro == '^' || intro == '_') {
    // A string (OSC: window title, hyperlinks; DCS ...) up to BEL or ESC '\'.
    while (i < s.size()) {
      if (s[i] == '\a') return i + 1;
      if (s[i] == '\x1b') return i + 1 < s.size() && s[i + 1] == '\\' ? i + 2 : i + 1;
      ++i;
    }
    return i;
  }
  return i;  // a two-byte sequence (ESC c resets the terminal): both dropped
}

bool in_range(int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; }

}  // namespace

std::string printable(std::string_view s, size_t max_bytes, bool multiline) {
  std::string out;
  out.reserve(std::min(s.size(), max_bytes));
  const std::string_view cut = "...";
  auto fits = [&](size_t n) { return out.size() + n <= max_bytes; };
  bool truncated = false;
  for (size_t i = 0; i < s.size() && !truncated;) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::string_view piece;
    char one = 0;
    size_t next = i + 1;
    if (c == 0x1b) {
      next = skip_escape(s, i);
    } else if (c == '\r') {
      // "\r\n" is one line end; a lone '\r' (progress bars) would let the text overwrite a line.
      if (i + 1 < s.size() && s[i + 1] == '\n') next = i + 2;
      one = multiline ? '\n' : ' ';
    } else if (c == '\n') {
      one = multiline ? '\n' : ' ';
    } else if (c == '\t') {
      one = ' ';
    } else if (c < 0x20 || c == 0x7f) {
      one = '?';
    } else if (c < 0x80) {
      one = static_cast<char>(c);
    } else {
      uint32_t cp = 0;
      const size_t n = utf8_char(s, i, cp);
      if (n == 0) {
        one = '?';
      } else {
        next = i + n;
        if (!hidden_code_point(cp)) piece = s.substr(i, n);
      }
    }
    if (one) piece = std::string_view(&one, 1);
    if (!piece.empty()) {
      if (!fits(piece.size())) {
        truncated = true;
        break;
      }
      out.append(piece);
    }
    i = next;
  }
  if (truncated) {
    // Room for the mark: drop whole characters from the end.
    while (!out.empty() && out.size() + cut.size() > max_bytes) {
      size_t k = out.size() - 1;
      while (k > 0 && (static_cast<unsigned char>(out[k]) & 0xc0) == 0x80) --k;
      out.resize(k);
    }
    if (out.size() + cut.size() <= max_bytes) out.append(cut);
  }
  return out;
}

bool is_clean_name(std::string_view s, size_t max_len, bool allow_space) {
  if (s.empty() || s.size() > max_len) return false;
  for (unsigned char c : s)
    if (c > 0x7e || c < (allow_space ? 0x20 : 0x21)) return false;
  return true;
}

std::optional<std::string> check_join(const Join& j) {
  using std::to_string;
  if (!is_clean_name(j.run_id, kMaxRunIdLen, true))
    return "JOIN refused: the run id must be 1.." + to_string(kMaxRunIdLen) + " printable ASCII characters";
  if (!is_clean_name(j.node_id, kMaxNameLen, true))
    return "JOIN refused: the node id must be 1.." + to_string(kMaxNameLen) + " printable ASCII characters";
  if (!is_clean_name(j.host, kMaxNameLen))
    return "JOIN refused: the host must be 1.." + to_string(kMaxNameLen) + " printable ASCII characters without spaces";
  if (!in_range(j.local_world_size, 1, kMaxLocalWorldSize))
    return "JOIN refused: local_world_size " + to_string(j.local_world_size) + " is outside 1.." +
           to_string(kMaxLocalWorldSize);
  if (!in_range(j.min_nodes, 1, kMaxNodes) || !in_range(j.max_nodes, j.min_nodes, kMaxNodes))
    return "JOIN refused: needs 1 <= min_nodes <= max_nodes <= " + to_string(kMaxNodes) + " (got " +
           to_string(j.min_nodes) + ":" + to_string(j.max_nodes) + ")";
  if (!in_range(j.max_restarts, 0, kMaxRestarts))
    return "JOIN refused: max_restarts " + to_string(j.max_restarts) + " is outside 0.." + to_string(kMaxRestarts);
  if (!in_range(j.last_call_ms, 0, kMaxTimeoutMs) || !in_range(j.join_timeout_ms, 0, kMaxTimeoutMs) ||
      !in_range(j.heartbeat_timeout_ms, 1, kMaxTimeoutMs))
    return "JOIN refused: a timeout is outside 0.." + to_string(kMaxTimeoutMs) + " ms";
  if (!in_range(j.node_rank, -1, j.max_nodes - 1))
    return "JOIN refused: --node_rank " + to_string(j.node_rank) + " is out of range for " + to_string(j.max_nodes) +
           " nodes (0.." + to_string(j.max_nodes - 1) + ")";
  if (j.resume_round >= 0 &&
      (!in_range(j.resume_round, 0, int64_t{1} << 40) || !in_range(j.resume_restart_count, 0, j.max_restarts) ||
       !in_range(j.resume_nnodes, 1, j.max_nodes) || !in_range(j.resume_node_rank, 0, j.resume_nnodes - 1) ||
       !in_range(j.resume_store_port, 0, 65535)))
    return "JOIN refused: the round to resume is out of range (round " + to_string(j.resume_round) + ", node rank " +
           to_string(j.resume_node_rank) + " of " + to_string(j.resume_nnodes) + ", restart count " +
           to_string(j.resume_restart_count) + ")";
  if (!in_range(j.store_offer_port, 0, 65535))
    return "JOIN refused: store_offer_port " + to_string(j.store_offer_port) + " is outside 0..65535";
  if (!j.resume_store_host.empty() && !is_clean_name(j.resume_store_host, kMaxNameLen))
    return "JOIN refused: resume_store_host must be 1.." + to_string(kMaxNameLen) +
           " printable ASCII characters without spaces";
  return std::nullopt;
}

Failure sanitized(Failure f) {
  auto clamp = [](int64_t& v, int64_t lo, int64_t hi) {
    if (!in_range(v, lo, hi)) v = -1;
  };
  clamp(f.global_rank, -1, kMaxWorldSize - 1);
  clamp(f.local_rank, -1, kMaxLocalWorldSize - 1);
  clamp(f.node_rank, -1, kMaxNodes - 1);
  if (!in_range(f.exit_code, INT32_MIN, INT32_MAX)) f.exit_code = -1;
  // A signal is a name such as SIGKILL or SIGRTMIN+3: anything else is not shown as one.
  if (!f.signal.empty()) {
    bool ok = f.signal.size() <= 16 && f.signal.rfind("SIG", 0) == 0;
    for (unsigned char c : f.signal)
      ok = ok && ((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '+' || c == '-');
    if (!ok) f.signal = "SIG?";
  }
  f.when = printable(f.when, kMaxShortLen);
  f.stderr_tail = printable(f.stderr_tail, kMaxTailLen, /*multiline=*/true);
  f.host = printable(f.host, kMaxNameLen);
  f.node_id = printable(f.node_id, kMaxNameLen);
  return f;
}

std::optional<std::string> check_round(const Round& r, int64_t local_world_size) {
  using std::to_string;
  const bool ok = in_range(r.world_size, 1, kMaxWorldSize) && in_range(r.nnodes, 1, kMaxNodes) &&
                  in_range(r.node_rank, 0, r.nnodes - 1) && in_range(r.base_rank, 0, r.world_size - 1) &&
                  r.base_rank + local_world_size <= r.world_size && in_range(r.store_port, 1, 65535) &&
                  in_range(r.restart_count, 0, kMaxRestarts) && in_range(r.max_restarts, 0, kMaxRestarts) &&
                  r.round >= 0 && (r.store_host.empty() || is_clean_name(r.store_host, kMaxNameLen)) &&
                  (r.store_peers.empty() || is_clean_name(r.store_peers, kMaxStorePeersLen));
  if (ok) return std::nullopt;
  return "the rendezvous server sent an impossible round (world size " + to_string(r.world_size) + ", node rank " +
         to_string(r.node_rank) + " of " + to_string(r.nnodes) + ", base rank " + to_string(r.base_rank) + " for " +
         to_string(local_world_size) + " local workers, store " + printable(r.store_host, kMaxNameLen) + ":" +
         to_string(r.store_port) + "): not starting workers with it";
}

}  // namespace ddprun::rdzv
