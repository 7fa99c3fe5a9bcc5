// Line-oriented logging. Every line carries time, level, process, and (when known) the run id and
// step, so a line from an older run is never mistaken for the current one:
//   2026-12-02T14:20:01.123Z I coordinator run=r-1a2b step=12 registry.cc:88] worker up
// Written here rather than taken from absl::log, which Debian 12's abseil (20220623) predates.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>

#include "absl/strings/string_view.h"

namespace dflash {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Process-wide settings; call once from main().
void SetLogProcessName(absl::string_view name);
void SetLogMinLevel(LogLevel level);
// Parses "debug|info|warning|error"; returns false on anything else.
bool ParseLogLevel(absl::string_view text, LogLevel* level);
// Also append every line to this file (empty: stderr only). Returns false if it cannot be opened.
bool SetLogFile(const std::string& path);
// Also append the lines tagged with `run_id` (LOG_RUN) to `path` until CloseRunLog(run_id): the
// run directory's per-process log. Returns false if it cannot be opened (logging goes on).
bool OpenRunLog(const std::string& run_id, const std::string& path);
void CloseRunLog(const std::string& run_id);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line, absl::string_view run_id = {},
             int64_t step = -1);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::string run_id_;
  std::ostringstream stream_;
};

bool LogEnabled(LogLevel level);

}  // namespace dflash

#define DFLASH_LOG_LEVEL_DEBUG ::dflash::LogLevel::kDebug
#define DFLASH_LOG_LEVEL_INFO ::dflash::LogLevel::kInfo
#define DFLASH_LOG_LEVEL_WARNING ::dflash::LogLevel::kWarning
#define DFLASH_LOG_LEVEL_ERROR ::dflash::LogLevel::kError

#define LOG(level)                                       \
  if (!::dflash::LogEnabled(DFLASH_LOG_LEVEL_##level)) { \
  } else                                                 \
    ::dflash::LogMessage(DFLASH_LOG_LEVEL_##level, __FILE__, __LINE__).stream()

// LOG_RUN(INFO, run_id, step) << ...; step < 0 is omitted.
#define LOG_RUN(level, run_id, step)                     \
  if (!::dflash::LogEnabled(DFLASH_LOG_LEVEL_##level)) { \
  } else                                                 \
    ::dflash::LogMessage(DFLASH_LOG_LEVEL_##level, __FILE__, __LINE__, (run_id), (step)).stream()
