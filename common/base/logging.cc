#include "common/base/logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <mutex>

namespace dflash {
namespace {

struct LogState {
  std::mutex mu;
  std::string process = "dflash";
  FILE* file = nullptr;
  std::map<std::string, FILE*> run_files;  // OpenRunLog
};

LogState& State() {
  static LogState* state = new LogState();  // never destroyed: logging works during shutdown
  return *state;
}

std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};

const char* Basename(const char* path) {
  const char* base = path;
  for (const char* p = path; *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  return base;
}

char LevelChar(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return 'D';
    case LogLevel::kInfo:
      return 'I';
    case LogLevel::kWarning:
      return 'W';
    case LogLevel::kError:
      return 'E';
  }
  return '?';
}

}  // namespace

void SetLogProcessName(absl::string_view name) {
  std::lock_guard<std::mutex> lock(State().mu);
  State().process = std::string(name);
}

void SetLogMinLevel(LogLevel level) { g_min_level = static_cast<int>(level); }

bool ParseLogLevel(absl::string_view text, LogLevel* level) {
  if (text == "debug")
    *level = LogLevel::kDebug;
  else if (text == "info")
    *level = LogLevel::kInfo;
  else if (text == "warning")
    *level = LogLevel::kWarning;
  else if (text == "error")
    *level = LogLevel::kError;
  else
    return false;
  return true;
}

bool SetLogFile(const std::string& path) {
  std::lock_guard<std::mutex> lock(State().mu);
  if (State().file) std::fclose(State().file);
  State().file = nullptr;
  if (path.empty()) return true;
  State().file = std::fopen(path.c_str(), "a");
  return State().file != nullptr;
}

bool OpenRunLog(const std::string& run_id, const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "a");
  std::lock_guard<std::mutex> lock(State().mu);
  FILE*& slot = State().run_files[run_id];
  if (slot) std::fclose(slot);
  slot = f;
  if (!f) State().run_files.erase(run_id);
  return f != nullptr;
}

void CloseRunLog(const std::string& run_id) {
  std::lock_guard<std::mutex> lock(State().mu);
  auto it = State().run_files.find(run_id);
  if (it == State().run_files.end()) return;
  std::fclose(it->second);
  State().run_files.erase(it);
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_min_level.load(); }

LogMessage::LogMessage(LogLevel level, const char* file, int line, absl::string_view run_id,
                       int64_t step)
    : level_(level), run_id_(run_id) {
  auto now = std::chrono::system_clock::now();
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm_utc;
  gmtime_r(&secs, &tm_utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm_utc);
  char millis[8];
  std::snprintf(millis, sizeof(millis), ".%03dZ", static_cast<int>(ms % 1000));
  std::string process;
  {
    std::lock_guard<std::mutex> lock(State().mu);
    process = State().process;
  }
  stream_ << stamp << millis << ' ' << LevelChar(level) << ' ' << process;
  if (!run_id.empty()) stream_ << " run=" << run_id;
  if (step >= 0) stream_ << " step=" << step;
  stream_ << ' ' << Basename(file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string line = stream_.str();
  std::lock_guard<std::mutex> lock(State().mu);
  std::fwrite(line.data(), 1, line.size(), stderr);
  if (State().file) {
    std::fwrite(line.data(), 1, line.size(), State().file);
    std::fflush(State().file);
  }
  if (!run_id_.empty() && !State().run_files.empty()) {
    auto it = State().run_files.find(run_id_);
    if (it != State().run_files.end()) {
      std::fwrite(line.data(), 1, line.size(), it->second);
      std::fflush(it->second);
    }
  }
  (void)level_;
}

}  // namespace dflash
