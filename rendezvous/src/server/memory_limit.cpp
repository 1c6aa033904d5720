#include "ddprun/server/memory_limit.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>

namespace ddprun::server {

namespace {
// v1 reports "no limit" as the largest page-aligned counter value (about 2^63).
constexpr uint64_t kUnlimitedFrom = 1ull << 62;

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return out;
    start = at + 1;
  }
}

// mountinfo writes blanks, tabs, newlines and backslashes in paths as \ooo.
std::string unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto octal = [](char c) { return c >= '0' && c <= '7'; };
    if (s[i] == '\\' && i + 3 < s.size() && octal(s[i + 1]) && octal(s[i + 2]) && octal(s[i + 3])) {
      out.push_back(static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

struct Mount {
  std::string root, point;
  bool v2 = false, memory = false;
};

std::vector<Mount> cgroup_mounts(std::string_view mountinfo) {
  std::vector<Mount> out;
  for (std::string_view line : split(mountinfo, '\n')) {
    // ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
    const auto fields = split(line, ' ');
    const auto dash = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || dash == fields.end() || fields.end() - dash < 4) continue;
    Mount m{unescape(fields[3]), unescape(fields[4])};
    const std::string_view type = dash[1];
    m.v2 = type == "cgroup2";
    for (std::string_view opt : split(dash[3], ',')) m.memory = m.memory || opt == "memory";
    if (m.v2 || (type == "cgroup" && m.memory)) out.push_back(std::move(m));
  }
  return out;
}

// The directories of `path` (a cgroup, as /proc/self/cgroup names it) and of its parents that
// the mount shows, deepest first.
void add_files(const Mount& m, std::string_view path, const char* file, std::vector<std::string>& out) {
  std::string_view root = m.root == "/" ? std::string_view() : std::string_view(m.root);
  if (path.substr(0, root.size()) != root || (path.size() > root.size() && path[root.size()] != '/')) return;
  std::string rel(path.substr(root.size()));
  while (!rel.empty() && rel.back() == '/') rel.pop_back();
  while (true) {
    out.push_back(m.point + rel + "/" + file);
    if (rel.empty()) return;
    rel.erase(rel.rfind('/'));
  }
}
}  // namespace

std::optional<uint64_t> parse_memory_limit(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v >= kUnlimitedFrom) return std::nullopt;
  return v;
}

std::vector<std::string> memory_limit_files(std::string_view proc_self_cgroup, std::string_view mountinfo) {
  const std::vector<Mount> mounts = cgroup_mounts(mountinfo);
  std::vector<std::string> out;
  for (std::string_view line : split(proc_self_cgroup, '\n')) {
    // HIERARCHY-ID:CONTROLLERS:PATH (the path may hold colons)
    const size_t a = line.find(':'), b = a == std::string_view::npos ? a : line.find(':', a + 1);
    if (b == std::string_view::npos) continue;
    const std::string_view id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1),
                           path = line.substr(b + 1);
    const bool v2 = id == "0" && controllers.empty();
    const auto names = split(controllers, ',');
    const bool v1_memory = std::find(names.begin(), names.end(), "memory") != names.end();
    if (!v2 && !v1_memory) continue;
    for (const Mount& m : mounts) {
      if (m.v2 == v2 && (v2 || m.memory)) {
        add_files(m, path, v2 ? "memory.max" : "memory.limit_in_bytes", out);
        break;
      }
    }
  }
  return out;
}

uint64_t budget_under_limit(uint64_t limit) {
  if (limit <= kLimitReserveBytes) return 0;
  return (limit - kLimitReserveBytes) / kLimitShareDen * kLimitShareNum;
}

std::optional<CgroupMemoryLimit> read_cgroup_memory_limit() {
  auto slurp = [](const std::string& path) {
    std::ifstream f(path);
    std::ostringstream s;
    if (f) s << f.rdbuf();
    return s.str();
  };
  std::optional<CgroupMemoryLimit> least;
  for (const std::string& file : memory_limit_files(slurp("/proc/self/cgroup"), slurp("/proc/self/mountinfo"))) {
    const std::optional<uint64_t> v = parse_memory_limit(slurp(file));
    if (v && (!least || *v < least->bytes)) least = CgroupMemoryLimit{*v, file};
  }
  return least;
}

}  // namespace ddprun::server
