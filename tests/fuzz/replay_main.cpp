// Replays files through a fuzz entry without libFuzzer: the kept crashers
// (tests/fuzz/regressions/<target>/) and the seed corpus (tests/fuzz/corpus/<target>/) run
// in every ordinary build, so a fixed crash stays fixed.
//   ddprun_fuzz_replay <target> <file or directory>...
// Exit 0 when every file ran; a broken invariant aborts (the file is named first).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_entries.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <codec|server|options|auth> <file or directory>...\n", argv[0]);
    return 2;
  }
  auto entry = ddprun::fuzz::entry_by_name(argv[1]);
  if (!entry) {
    std::fprintf(stderr, "unknown fuzz target '%s' (codec, server, options or auth)\n", argv[1]);
    return 2;
  }
  std::vector<fs::path> files;
  for (int i = 2; i < argc; ++i) {
    fs::path p = argv[i];
    if (fs::is_directory(p)) {
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file() && e.path().filename().string()[0] != '.') files.push_back(e.path());
    } else if (fs::is_regular_file(p)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "%s: no such file or directory\n", p.c_str());
      return 2;
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "no input files for target %s: the corpus directory is empty\n", argv[1]);
    return 2;
  }
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "replay %s (%zu bytes)\n", f.c_str(), bytes.size());
    entry(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("%s: %zu inputs replayed, no crash\n", argv[1], files.size());
  return 0;
}
