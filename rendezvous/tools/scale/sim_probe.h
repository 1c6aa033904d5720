// What the scale simulator measures beside its own actors: another job's store operations on
// the rendezvous server's own port meanwhile (their latency), and the server processes' CPU
// time and peak RSS (/proc).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace ddprun::scale {

class Probe {
 public:
  Probe(const std::string& host, uint16_t port);
  ~Probe();
  Probe(const Probe&) = delete;
  Probe& operator=(const Probe&) = delete;
  bool connected() const { return fd_ >= 0; }
  void run(const std::atomic<bool>& stop);
  bool failed() const { return failed_; }
  size_t ops() const { return lat_us_.size(); }
  double quantile(double q) const;  // microseconds; -1 without samples

 private:
  int fd_ = -1;
  bool failed_ = false;
  std::vector<double> lat_us_;
};

struct ProcStats {
  bool ok = false;
  double cpu_s = 0, peak_rss_mib = 0;
};
ProcStats proc_stats(int pid);

}  // namespace ddprun::scale
