#include "ddprun/launcher/hostlist.h"

#include <algorithm>
#include <charconv>
#include <cstdint>

namespace ddprun::launcher {
namespace {

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

[[noreturn]] void fail(std::string_view expr, size_t pos, const std::string& what) {
  throw HostlistError("invalid Slurm hostlist '" + std::string(expr) + "' at position " +
                      std::to_string(pos) + ": " + what +
                      " (expected names like node[01-04,07],gpu3; pass --no_slurm to skip Slurm detection)");
}

struct Range {
  uint64_t lo = 0;
  uint64_t hi = 0;
  size_t width = 0;
};

// One item's pieces: fixed text, or a bracket group's ranges.
struct Piece {
  std::string text;
  std::vector<Range> ranges;  // empty: `text` is literal
  size_t count() const {
    if (ranges.empty()) return 1;
    size_t n = 0;
    for (const auto& r : ranges) n += static_cast<size_t>(r.hi - r.lo + 1);
    return n;
  }
};

std::string padded(uint64_t v, size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

uint64_t parse_number(std::string_view expr, size_t pos, std::string_view digits) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || p != digits.data() + digits.size()) {
    fail(expr, pos, "number '" + std::string(digits) + "' is too large");
  }
  return v;
}

// Parses "lo[-hi],..." between brackets; `pos` is the offset of `body` in `expr`.
std::vector<Range> parse_ranges(std::string_view expr, size_t pos, std::string_view body) {
  std::vector<Range> out;
  size_t i = 0;
  while (true) {
    const size_t start = i;
    while (i < body.size() && is_digit(body[i])) ++i;
    if (i == start) fail(expr, pos + i, "a bracket range must start with a number");
    Range r;
    std::string_view lo = body.substr(start, i - start);
    r.lo = r.hi = parse_number(expr, pos + start, lo);
    r.width = lo.size();
    if (i < body.size() && body[i] == '-') {
      const size_t hs = ++i;
      while (i < body.size() && is_digit(body[i])) ++i;
      if (i == hs) fail(expr, pos + i, "a range 'lo-hi' needs a number after '-'");
      r.hi = parse_number(expr, pos + hs, body.substr(hs, i - hs));
      if (r.hi < r.lo) {
        fail(expr, pos + start, "range '" + std::string(body.substr(start, i - start)) + "' runs backwards");
      }
    }
    if (r.hi - r.lo >= kMaxHostsPerRange) {
      fail(expr, pos + start, "range '" + std::string(body.substr(start, i - start)) + "' has more than " +
                                  std::to_string(kMaxHostsPerRange) + " hosts");
    }
    out.push_back(r);
    if (i == body.size()) return out;
    if (body[i] != ',') fail(expr, pos + i, std::string("unexpected '") + body[i] + "' inside brackets");
    ++i;
  }
}

// Counts the item's names into `counted` (bounded by kMaxHostlistHosts) and appends them to
// `out` until it holds `max_names`.
void expand_item(std::string_view expr, size_t item_pos, const std::vector<Piece>& pieces, size_t& counted,
                 size_t max_names, std::vector<std::string>& out) {
  size_t total = 1;
  for (const auto& p : pieces) {
    const size_t n = p.count();
    if (n != 0 && total > kMaxHostlistHosts / n) {
      fail(expr, item_pos, "expands to more than " + std::to_string(kMaxHostlistHosts) + " hosts");
    }
    total *= n;
  }
  if (counted + total > kMaxHostlistHosts) {
    fail(expr, item_pos, "expands to more than " + std::to_string(kMaxHostlistHosts) + " hosts");
  }
  counted += total;
  total = std::min(total, max_names - std::min(max_names, out.size()));
  // Odometer over the bracket groups in Slurm's nesting order (hostlist.h), slowest first:
  // the second-to-last group, then leftwards to the first, then the last group.
  std::vector<size_t> groups;
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (!pieces[k].ranges.empty()) groups.push_back(k);
  }
  std::vector<size_t> order;  // slowest first
  if (!groups.empty()) {
    for (size_t g = groups.size() - 1; g-- > 0;) order.push_back(groups[g]);
    order.push_back(groups.back());
  }
  std::vector<size_t> range_idx(pieces.size(), 0);
  std::vector<uint64_t> value(pieces.size(), 0);
  for (size_t k : groups) value[k] = pieces[k].ranges[0].lo;
  for (size_t n = 0; n < total; ++n) {
    std::string name;
    for (size_t k = 0; k < pieces.size(); ++k) {
      const Piece& p = pieces[k];
      name += p.ranges.empty() ? p.text : padded(value[k], p.ranges[range_idx[k]].width);
    }
    out.push_back(std::move(name));
    for (size_t o = order.size(); o-- > 0;) {
      const size_t k = order[o];
      const Piece& p = pieces[k];
      if (value[k] < p.ranges[range_idx[k]].hi) {
        ++value[k];
        break;
      }
      range_idx[k] = (range_idx[k] + 1) % p.ranges.size();
      value[k] = p.ranges[range_idx[k]].lo;
      if (range_idx[k] != 0) break;  // no carry into the next slower group
    }
  }
}

// Parses and validates all of `expr`; materializes at most `max_names` names.
std::vector<std::string> scan(std::string_view expr, size_t max_names) {
  std::vector<std::string> out;
  size_t counted = 0;
  size_t i = 0;
  while (i < expr.size()) {
    if (expr[i] == ',' || is_blank(expr[i])) {
      ++i;
      continue;
    }
    const size_t item_pos = i;
    std::vector<Piece> pieces;
    while (i < expr.size() && expr[i] != ',' && !is_blank(expr[i])) {
      if (expr[i] == ']') fail(expr, i, "']' without a matching '['");
      if (expr[i] == '[') {
        const size_t close = expr.find_first_of("[]", i + 1);
        if (close == std::string_view::npos || expr[close] != ']') {
          fail(expr, i, close == std::string_view::npos ? "'[' is never closed" : "brackets do not nest");
        }
        Piece p;
        p.ranges = parse_ranges(expr, i + 1, expr.substr(i + 1, close - i - 1));
        pieces.push_back(std::move(p));
        i = close + 1;
        continue;
      }
      const size_t start = i;
      while (i < expr.size() && expr[i] != ',' && !is_blank(expr[i]) && expr[i] != '[' && expr[i] != ']') ++i;
      Piece p;
      p.text = std::string(expr.substr(start, i - start));
      pieces.push_back(std::move(p));
    }
    expand_item(expr, item_pos, pieces, counted, max_names, out);
  }
  return out;
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view expr) { return scan(expr, kMaxHostlistHosts); }

std::string first_host(std::string_view expr) {
  // Validated as a whole, but only the first name is built.
  auto hosts = scan(expr, 1);
  if (hosts.empty()) throw HostlistError("Slurm hostlist '" + std::string(expr) + "' names no host");
  return hosts.front();
}

}  // namespace ddprun::launcher
