#include "ddprun/launcher/output.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <optional>

namespace ddprun::launcher {

std::string console_prefix(int node_rank, int global_rank, bool multi_node) {
  if (multi_node) return "[n" + std::to_string(node_rank) + " r" + std::to_string(global_rank) + "]: ";
  return "[r" + std::to_string(global_rank) + "]: ";
}

namespace {

bool identifier_char(char c, bool first) {
  const unsigned char u = static_cast<unsigned char>(c);
  return c == '_' || std::isalpha(u) || (!first && std::isdigit(u));
}

// The value of one macro, or nullopt for a name the template does not know.
std::optional<std::string> macro_value(std::string_view name, const LinePrefixFields& f) {
  if (name == "rank") return std::to_string(f.rank);
  if (name == "local_rank") return std::to_string(f.local_rank);
  if (name == "role_name") return std::string(f.role_name);
  if (name == "hostname") return std::string(f.hostname);
  return std::nullopt;
}

}  // namespace

std::string render_line_prefix(std::string_view tmpl, const LinePrefixFields& fields) {
  std::string out;
  size_t i = 0;
  while (i < tmpl.size()) {
    if (tmpl[i] != '$' || i + 1 == tmpl.size()) {
      out.push_back(tmpl[i++]);
      continue;
    }
    if (tmpl[i + 1] == '$') {
      out.push_back('$');
      i += 2;
      continue;
    }
    const bool braced = tmpl[i + 1] == '{';
    size_t start = i + (braced ? 2 : 1), end = start;
    while (end < tmpl.size() && identifier_char(tmpl[end], end == start)) ++end;
    const bool closed = !braced || (end < tmpl.size() && tmpl[end] == '}');
    const auto value = end > start && closed ? macro_value(tmpl.substr(start, end - start), fields) : std::nullopt;
    if (!value) {  // not a macro: the '$' stays, the rest is read on as text
      out.push_back(tmpl[i++]);
      continue;
    }
    out += *value;
    i = end + (braced ? 1 : 0);
  }
  return out;
}

void LineSplitter::feed(std::string_view bytes, std::vector<std::string>& lines) {
  while (!bytes.empty()) {
    size_t nl = bytes.find('\n');
    std::string_view piece = nl == std::string_view::npos ? bytes : bytes.substr(0, nl);
    // Respect the bound even inside a piece (invariant: partial_.size() <= max_line_).
    while (partial_.size() + piece.size() > max_line_) {
      size_t take = max_line_ - partial_.size();
      partial_.append(piece.substr(0, take));
      lines.push_back(std::move(partial_));
      partial_.clear();
      piece.remove_prefix(take);
    }
    partial_.append(piece);
    if (nl == std::string_view::npos) return;
    if (!partial_.empty() && partial_.back() == '\r') partial_.pop_back();
    lines.push_back(std::move(partial_));
    partial_.clear();
    bytes.remove_prefix(nl + 1);
  }
}

bool LineSplitter::flush(std::string& line) {
  if (partial_.empty()) return false;
  line = std::move(partial_);
  partial_.clear();
  return true;
}

void TailBuffer::push(std::string_view line) {
  if (capacity_ == 0) return;
  if (lines_.size() == capacity_) lines_.pop_front();
  lines_.emplace_back(line.substr(0, max_line_));
}

bool DuplicateFilter::matches(std::string_view line) const {
  for (const auto& needle : needles_) {
    if (line.find(needle) != std::string_view::npos) return true;
  }
  return false;
}

namespace {
std::string errno_text(int err) {
  const char* name = err == ENOSPC   ? "ENOSPC"
                     : err == EIO    ? "EIO"
                     : err == EDQUOT ? "EDQUOT"
                     : err == EFBIG  ? "EFBIG"
                     : err == EROFS  ? "EROFS"
                     : err == EACCES ? "EACCES"
                     : err == ENOENT ? "ENOENT"
                                     : nullptr;
  std::string text = std::strerror(err);
  return name ? std::string(name) + ": " + text : text;
}
}  // namespace

std::string LogWriteFailures::record(const std::string& path, int err, uint64_t bytes_lost, Console console) {
  auto [it, first] = files_.try_emplace(path);
  File& f = it->second;
  f.bytes_lost += bytes_lost;
  ++f.failures;
  if (!first) return "";
  f.first_errno = err;
  if (console.kind == Console::Kind::From && console.file_only_lines == 0) console.kind = Console::Kind::Every;
  f.console = console;
  if (warned_ > kMaxWarnings) return "";
  if (warned_++ == kMaxWarnings)
    return "more log files cannot be written; they are listed in the summary only (the console still gets every line)";
  if (console.kind == Console::Kind::None)
    return "cannot write log file " + path + " (" + errno_text(err) +
           "): its rank is not on the console "
           "(--local_ranks_filter), so what the file lacks is lost; the summary at the end says how much";
  return "cannot write log file " + path + " (" + errno_text(err) +
         "): the console gets its stream from here on; "
         "the summary at the end says how much the file lacks";
}

uint64_t LogWriteFailures::bytes_lost() const {
  uint64_t n = 0;
  for (const auto& [path, f] : files_) n += f.bytes_lost;
  return n;
}

std::vector<std::string> LogWriteFailures::summary_lines() const {
  std::vector<std::pair<std::string, File>> sorted(files_.begin(), files_.end());
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.second.bytes_lost > b.second.bytes_lost; });
  std::vector<std::string> lines;
  for (size_t i = 0; i < sorted.size() && i < kMaxSummaryFiles; ++i) {
    const auto& [path, f] = sorted[i];
    std::string line =
        path + ": " + errno_text(f.first_errno) + ", " + std::to_string(f.bytes_lost) + " bytes not written";
    if (f.console.kind == Console::Kind::From) {
      const std::string n = std::to_string(f.console.file_only_lines);
      line += "; lines 1-" + n + " of the stream are in this file only, the console has every line from line " +
              std::to_string(f.console.file_only_lines + 1) + " on";
    } else if (f.console.kind == Console::Kind::None) {
      line += "; not on the console either (--local_ranks_filter): lost";
    }
    lines.push_back(std::move(line));
  }
  if (sorted.size() > kMaxSummaryFiles)
    lines.push_back("... and " + std::to_string(sorted.size() - kMaxSummaryFiles) + " more");
  return lines;
}

std::string LogWriteFailures::console_note() const {
  bool from = false, none = false;
  for (const auto& [path, f] : files_) {
    from = from || f.console.kind == Console::Kind::From;
    none = none || f.console.kind == Console::Kind::None;
  }
  if (none) return "some of it is on the console neither: each file below says what";
  if (from)
    return "the console got each stream's lines from its file's first failure on; each file below says which "
           "lines it alone has";
  return "the console got every line";
}

std::string missing_module_hint(const std::deque<std::string>& stderr_tail, const std::string& interpreter) {
  if (interpreter.empty()) return "";
  for (const auto& line : stderr_tail) {
    if (line.find("ModuleNotFoundError") != std::string::npos || line.find("No module named") != std::string::npos) {
      return "a module was not found by " + interpreter +
             "; to run the workers with another Python (a virtual environment's), set PYTHON_EXEC=/path/to/python "
             "(or put that environment's bin/ first on PATH)";
    }
  }
  return "";
}

}  // namespace ddprun::launcher
