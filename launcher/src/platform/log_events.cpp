#include "ddprun/launcher/log_events.h"

#include <spdlog/formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

namespace ddprun::launcher {

namespace {

struct Pending {
  bool set = false;
  std::string event;
  std::vector<LogField> fields;
  std::optional<int> rank;
};
thread_local Pending t_pending;

std::atomic<LogFormat> g_format{LogFormat::Text};
std::atomic<bool> g_timestamps{false};
std::atomic<int> g_node_rank{-1};

const std::string& host_name() {
  static const std::string name = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return std::string("?");
    return std::string(buf);
  }();
  return name;
}

std::optional<int> node_rank() {
  const int n = g_node_rank.load(std::memory_order_relaxed);
  return n < 0 ? std::nullopt : std::optional<int>(n);
}

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    Pending p = std::move(t_pending);
    t_pending = Pending{};
    LogRecord r;
    r.time = msg.time;
    const auto lv = spdlog::level::to_string_view(msg.level);
    r.level = std::string_view(lv.data(), lv.size());
    r.host = host_name();
    r.node_rank = node_rank();
    if (p.set) {
      r.event = p.event;
      r.rank = p.rank;
      r.fields = &p.fields;
    }
    r.message = std::string_view(msg.payload.data(), msg.payload.size());
    const std::string line = json_log_line(r);
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonFormatter>(); }
};

}  // namespace

LogEvent::LogEvent(std::string_view event, std::vector<LogField> fields, std::optional<int> rank) {
  if (g_format.load(std::memory_order_relaxed) != LogFormat::Json) return;
  t_pending.set = true;
  t_pending.event = std::string(event);
  t_pending.fields = std::move(fields);
  t_pending.rank = rank;
}

LogEvent::~LogEvent() { t_pending = Pending{}; }  // a line that was not logged (level off) takes nothing along

void configure_logging(LogFormat format, int verbosity, bool timestamps) {
  g_format.store(format, std::memory_order_relaxed);
  g_timestamps.store(timestamps, std::memory_order_relaxed);
  auto logger = spdlog::get("ddprun");
  // _mt: the in-process store server logs from its own thread.
  if (!logger) logger = spdlog::stderr_logger_mt("ddprun");
  if (format == LogFormat::Json) logger->set_formatter(std::make_unique<JsonFormatter>());
  else logger->set_pattern(text_log_pattern(timestamps));
  logger->set_level(verbosity > 0 ? spdlog::level::debug : spdlog::level::info);
  spdlog::set_default_logger(logger);
}

LogFormat log_format() { return g_format.load(std::memory_order_relaxed); }

void set_log_node_rank(std::optional<int> n) { g_node_rank.store(n ? *n : -1, std::memory_order_relaxed); }

void write_log_line(std::string_view level, std::string_view event, std::string_view text, std::string_view message,
                    const std::vector<LogField>& fields) {
  if (auto l = spdlog::get("ddprun")) l->flush();
  if (log_format() == LogFormat::Json) {
    LogRecord r;
    r.time = std::chrono::system_clock::now();
    r.level = level;
    r.host = host_name();
    r.node_rank = node_rank();
    r.event = event;
    r.message = message;
    r.fields = &fields;
    const std::string line = json_log_line(r);
    std::fwrite(line.data(), 1, line.size(), stderr);
  } else {
    const std::string stamped = g_timestamps.load(std::memory_order_relaxed)
                                    ? stamp_lines(text, local_time_text(std::chrono::system_clock::now()))
                                    : std::string(text);
    std::fwrite(stamped.data(), 1, stamped.size(), stderr);
  }
  std::fflush(stderr);
}

}  // namespace ddprun::launcher
