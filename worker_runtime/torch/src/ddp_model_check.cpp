// DDP's check that every rank built the same model (DdpOptions::check_same_model).
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "ddp_state.h"

namespace ddprun::worker::libtorch {

namespace {

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find('\n', start);
    if (end == std::string::npos) end = s.size();
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// "ranks 0, 2: parameter 'fc.weight' [10, 32] Float; rank 1: parameter 'fc.weight' [10, 33] Float"
std::string describe_difference(const std::vector<std::vector<std::string>>& per_rank) {
  size_t longest = 0;
  for (const auto& r : per_rank) longest = std::max(longest, r.size());
  for (size_t i = 0; i < longest; ++i) {
    std::vector<std::pair<std::string, std::vector<int>>> groups;  // entry -> ranks, in rank order
    for (size_t r = 0; r < per_rank.size(); ++r) {
      const std::string entry = i < per_rank[r].size() ? per_rank[r][i] : "nothing (its model ends here)";
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == entry; });
      if (it == groups.end()) groups.push_back({entry, {static_cast<int>(r)}});
      else it->second.push_back(static_cast<int>(r));
    }
    if (groups.size() == 1) continue;
    std::string msg = "entry " + std::to_string(i + 1) + " of the model (parameters, then buffers) differs: ";
    for (size_t g = 0; g < groups.size() && g < 4; ++g) {
      const auto& ranks = groups[g].second;
      msg += (g ? "; " : "") + std::string(ranks.size() > 1 ? "ranks " : "rank ");
      for (size_t k = 0; k < ranks.size() && k < 8; ++k) msg += (k ? ", " : "") + std::to_string(ranks[k]);
      if (ranks.size() > 8) msg += " and " + std::to_string(ranks.size() - 8) + " more";
      msg += ": " + groups[g].first;
    }
    if (groups.size() > 4) msg += "; and " + std::to_string(groups.size() - 4) + " more versions";
    return msg;
  }
  return "";
}

}  // namespace

std::vector<std::string> describe_model(const ::torch::nn::Module& module) {
  std::vector<std::string> out;
  auto shape = [](const at::Tensor& t) {
    std::string s = "[";
    for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
    return s + "] " + std::string(c10::toString(t.scalar_type()));
  };
  for (const auto& item : module.named_parameters(true))
    if (item.value().requires_grad()) out.push_back("parameter '" + item.key() + "' " + shape(item.value()));
  for (const auto& item : module.named_buffers(true))
    out.push_back("buffer '" + item.key() + "' " + shape(item.value()));
  return out;
}

// Every rank's describe_model() lines, gathered (collective; the same two all-gathers on
// every rank, whatever its model). Throws ConfigError naming the first difference.
void DdpEngine::State::check_same_model(const std::vector<std::string>& mine) {
  if (comm.size() == 1) return;
  at::NoGradGuard ng;
  std::string text;
  for (const auto& line : mine) text += line + "\n";
  const auto n = static_cast<size_t>(comm.size());
  const at::TensorOptions i64 = at::TensorOptions().dtype(at::kLong).device(params[0].device());
  at::Tensor len = at::full({1}, static_cast<int64_t>(text.size()), i64);
  at::Tensor lens = at::empty({static_cast<int64_t>(n)}, i64);
  stream_prologue();
  comm.allgather(len.data_ptr(), lens.data_ptr(), 1, DType::I64);
  stream_epilogue();
  at::Tensor lens_cpu = lens.to(at::kCPU);
  const int64_t* l = lens_cpu.data_ptr<int64_t>();
  int64_t longest = 0;
  bool alike = true;
  for (size_t r = 0; r < n; ++r) longest = std::max(longest, l[r]);
  // The text itself, padded to whole 8-byte words of the longest one.
  const int64_t words = (longest + 7) / 8;
  if (words == 0) return;
  at::Tensor mine_words = at::zeros({words}, at::TensorOptions().dtype(at::kLong));
  std::memcpy(mine_words.data_ptr(), text.data(), text.size());
  at::Tensor in = mine_words.to(params[0].device());
  at::Tensor all = at::empty({static_cast<int64_t>(n) * words}, i64);
  stream_prologue();
  comm.allgather(in.data_ptr(), all.data_ptr(), static_cast<size_t>(words), DType::I64);
  stream_epilogue();
  at::Tensor all_cpu = all.to(at::kCPU);
  const char* bytes = static_cast<const char*>(all_cpu.data_ptr());
  std::vector<std::vector<std::string>> per_rank(n);
  for (size_t r = 0; r < n; ++r) {
    std::string t(bytes + r * static_cast<size_t>(words) * 8, static_cast<size_t>(l[r]));
    alike = alike && t == text;
    per_rank[r] = split_lines(t);
  }
  if (alike) return;
  throw ConfigError("DDP: the ranks built different models (rank " + std::to_string(comm.rank()) +
                    " checked): " + describe_difference(per_rank) +
                    ". Build the same model on every rank (same constructor arguments and flags)");
}

}  // namespace ddprun::worker::libtorch
