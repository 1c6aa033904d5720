// Warnings about peers (bad bytes, limits, strangers, accept errors) are what a stranger
// controls: at most one line per second per kind, the next one saying how many were left out,
// so a fuzzer or a connection flood cannot fill the console of the job the server runs in.
//
// Thread-safety: warn() may be called from any thread; set_sink() before the server starts.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>

namespace ddprun::server {

enum class Warn {
  BadInput,
  Accept,
  ConnectionLimit,
  JobLimit,
  BufferLimit,
  Exception,
  AgentRefused,
  StoreStranger,
  Deadline,
  MemoryLimit,
  kCount
};

class WarnLimiter {
 public:
  // `line` is called only when the line is printed; the server's log prefix goes before it.
  template <class F>
  void warn(Warn kind, F&& line) {
    uint64_t left_out = 0;
    {
      std::lock_guard lock(mu_);
      auto& k = kinds_[static_cast<size_t>(kind)];
      const auto now = std::chrono::steady_clock::now();
      if (k.printed && now - k.last < kPeriod) {
        ++k.left_out;
        return;
      }
      k.printed = true;
      k.last = now;
      left_out = std::exchange(k.left_out, 0);
    }
    std::string text = left_out > 0
                           ? fmt::format("{}{} ({} more like it since the last one shown)", prefix_, line(), left_out)
                           : prefix_ + line();
    if (sink_) sink_(text);
    else spdlog::warn("{}", text);
  }
  void set_sink(std::function<void(const std::string&)> sink) { sink_ = std::move(sink); }
  void set_prefix(std::string prefix) { prefix_ = std::move(prefix); }
  const std::string& prefix() const { return prefix_; }

 private:
  static constexpr auto kPeriod = std::chrono::seconds(1);
  struct Kind {
    bool printed = false;
    std::chrono::steady_clock::time_point last{};
    uint64_t left_out = 0;
  };
  std::mutex mu_;
  Kind kinds_[static_cast<size_t>(Warn::kCount)];
  std::function<void(const std::string&)> sink_;
  std::string prefix_;
};

}  // namespace ddprun::server
