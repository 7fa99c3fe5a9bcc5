// A progress bar for long local work (dflashctl prepare), drawn on stderr.
//
// On a terminal it redraws one line at most 10 times a second:
//   [#########...........]  45%  1.2 GiB/2.7 GiB  12,345 docs  3.4M tok  1.2M tok/s  ETA 0:32
// Elsewhere (a log file, CI) it prints a plain line at every 10% step, so logs stay readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace dflash::ctl {

struct ProgressSample {
  uint64_t done_bytes = 0;
  uint64_t total_bytes = 0;
  int64_t documents = 0;
  int64_t tokens = 0;
};

class ProgressBar {
 public:
  // `enabled` false draws nothing (--output json keeps stderr quiet too: scripts parse stdout).
  ProgressBar(std::FILE* out, bool enabled);
  void Update(const ProgressSample& s);
  // Draws the final state and ends the line.
  void Finish(const ProgressSample& s);
  // Ends a half-drawn terminal line so that an error message starts on its own line.
  void Break();

  // The text of one line, without "\r" or "\n"; exposed for tests.
  static std::string Line(const ProgressSample& s, double elapsed_s);

 private:
  void Draw(const ProgressSample& s, bool final);

  std::FILE* out_;
  bool enabled_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  int last_decile_ = -1;
  bool open_line_ = false;  // a terminal line was drawn without its newline
};

// The live line of a followed training run (dflashctl submit), drawn the same way on stdout, where
// it interleaves with the run's events:
//   [########............]  step 80/200  epoch 0  loss 3.412  acc.len 2.31  tau 2.05  12.3K tok/s
//   ETA 0:12   (tau once the run has been evaluated: eval.every_steps)
struct StepSample {
  int64_t step = 0;  // steps done
  int64_t total_steps = 0;
  int64_t epoch = 0;
  double loss = 0, acceptance_length = 0;
  double measured_tau = 0;  // the newest evaluation's tau (eval.every_steps); 0: none yet
  double tokens_per_s = 0;  // of the newest step
  double step_seconds = 0;  // of the newest step
};

class StepProgress {
 public:
  StepProgress(std::FILE* out, bool enabled);
  void Update(const StepSample& s);
  // Ends a half-drawn terminal line (before an event line or at the end).
  void Break();
  static std::string Line(const StepSample& s);

 private:
  std::FILE* out_;
  bool enabled_;
  bool tty_;
  int last_decile_ = -1;
  bool open_line_ = false;
};

}  // namespace dflash::ctl
