// Starts the real dflash binaries on loopback ports chosen by the OS, for integration tests.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace dflash::testing {

// A child process with stdout+stderr in a log file. Killed (SIGKILL) on destruction if alive.
class Process {
 public:
  Process(const std::string& binary, const std::vector<std::string>& args,
          const std::string& log_path);
  ~Process();
  pid_t pid() const { return pid_; }
  void Signal(int sig);
  // Waits for exit; returns the exit status (128+signal when killed).
  int Wait();
  bool Alive();

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

// Polls `condition` every 20 ms until it holds or `timeout` passes; returns whether it held.
bool WaitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout);

// Reads an integer field of a ready file ({"grpc_port": N, ...}) once it exists.
int ReadReadyPort(const std::string& path, const std::string& field,
                  std::chrono::milliseconds timeout);

struct CtlResult {
  int exit_code;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs dflashctl with args against `coordinator` (host:port).
CtlResult RunCtl(const std::string& coordinator, const std::vector<std::string>& args);

std::string BinDir();
// Whether the NVIDIA driver's device node is there (without linking CUDA into the test process).
bool HaveNvidiaDevice();
std::string MakeTempDir();
std::string ReadFile(const std::string& path);

}  // namespace dflash::testing
