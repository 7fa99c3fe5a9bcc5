// Child processes for tests of cross-process code (shared memory, futexes): ForkChild runs a
// callable in a forked process whose exit code is its return value; WaitChild reaps it.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

namespace dflash::testing {

template <typename Fn>
pid_t ForkChild(Fn child) {
  const pid_t pid = fork();
  if (pid == 0) _exit(child());
  return pid;
}

// The child's exit code, or 128 + the signal that ended it.
inline int WaitChild(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace dflash::testing
