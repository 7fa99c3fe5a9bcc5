#include "tests/integration/cluster.h"

#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

extern char** environ;

namespace dflash::testing {

std::string BinDir() { return DFLASH_BUILD_DIR "/services"; }

bool HaveNvidiaDevice() {
  std::error_code ec;
  return std::filesystem::exists("/dev/nvidia0", ec) ||
         std::filesystem::exists("/proc/driver/nvidia/gpus", ec);
}

std::string MakeTempDir() {
  char tmpl[] = "/tmp/dflash-it-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return "/tmp";
  return tmpl;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Process::Process(const std::string& binary, const std::vector<std::string>& args,
                 const std::string& log_path) {
  std::vector<std::string> argv_s = {binary};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn(&pid_, binary.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
}

Process::~Process() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    Wait();
  }
}

void Process::Signal(int sig) {
  if (pid_ > 0 && !reaped_) kill(pid_, sig);
}

int Process::Wait() {
  if (!reaped_) {
    waitpid(pid_, &status_, 0);
    reaped_ = true;
  }
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
}

bool Process::Alive() {
  if (reaped_) return false;
  int st;
  pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    status_ = st;
    return false;
  }
  return true;
}

bool WaitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling interval, not a fix
  }
  return condition();
}

int ReadReadyPort(const std::string& path, const std::string& field,
                  std::chrono::milliseconds timeout) {
  int port = 0;
  WaitFor(
      [&] {
        std::string text = ReadFile(path);
        if (text.empty()) return false;
        port = nlohmann::json::parse(text).value(field, 0);
        return port > 0;
      },
      timeout);
  return port;
}

CtlResult RunCtl(const std::string& coordinator, const std::vector<std::string>& args) {
  const std::string dir = MakeTempDir();
  const std::string out_path = dir + "/out", err_path = dir + "/err";
  std::vector<std::string> all = {"--coordinator", coordinator};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<std::string> argv_s = {BinDir() + "/dflashctl/dflashctl"};
  argv_s.insert(argv_s.end(), all.begin(), all.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid;
  posix_spawn(&pid, argv_s[0].c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  int st = 0;
  waitpid(pid, &st, 0);
  CtlResult r{WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), ReadFile(out_path),
              ReadFile(err_path)};
  std::remove(out_path.c_str());
  std::remove(err_path.c_str());
  rmdir(dir.c_str());
  return r;
}

}  // namespace dflash::testing
