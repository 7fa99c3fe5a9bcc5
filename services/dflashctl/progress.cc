#include "services/dflashctl/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/dflashctl/output.h"

namespace dflash::ctl {
namespace {

constexpr int kBarWidth = 20;

// 1234 -> "1.2K", 3400000 -> "3.4M": counts in a progress line need two significant figures only.
std::string Short(double v) {
  if (v < 1e3) return absl::StrFormat("%.0f", v);
  if (v < 1e6) return absl::StrFormat("%.1fK", v / 1e3);
  if (v < 1e9) return absl::StrFormat("%.1fM", v / 1e6);
  return absl::StrFormat("%.1fG", v / 1e9);
}

std::string Clock(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

}  // namespace

ProgressBar::ProgressBar(std::FILE* out, bool enabled)
    : out_(out),
      enabled_(enabled),
      tty_(isatty(fileno(out)) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

std::string ProgressBar::Line(const ProgressSample& s, double elapsed_s) {
  const double frac =
      s.total_bytes > 0 ? std::min(1.0, static_cast<double>(s.done_bytes) / s.total_bytes) : 0.0;
  const int filled = static_cast<int>(frac * kBarWidth);
  std::string line = absl::StrCat(
      "[", std::string(filled, '#'), std::string(kBarWidth - filled, '.'), "] ",
      absl::StrFormat("%3.0f%%", 100.0 * frac), "  ", FormatBytes(s.done_bytes), "/",
      FormatBytes(s.total_bytes), "  ", Short(s.documents), " docs  ", Short(s.tokens), " tok");
  if (elapsed_s > 0) absl::StrAppend(&line, "  ", Short(s.tokens / elapsed_s), " tok/s");
  if (frac > 0 && frac < 1) {
    absl::StrAppend(&line, "  ETA ", Clock(elapsed_s * (1 - frac) / frac));
  } else if (frac >= 1) {
    absl::StrAppend(&line, "  in ", Clock(elapsed_s));
  }
  return line;
}

void ProgressBar::Update(const ProgressSample& s) {
  if (!enabled_) return;
  Draw(s, /*final=*/false);
}

void ProgressBar::Finish(const ProgressSample& s) {
  if (!enabled_) return;
  Draw(s, /*final=*/true);
}

void ProgressBar::Break() {
  if (!open_line_) return;
  std::fputc('\n', out_);
  open_line_ = false;
}

void ProgressBar::Draw(const ProgressSample& s, bool final) {
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (tty_) {
    if (!final && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    std::fprintf(out_, "\r%s\033[K%s", Line(s, elapsed).c_str(), final ? "\n" : "");
    open_line_ = !final;
  } else {
    const int decile =
        s.total_bytes > 0 ? static_cast<int>(10.0 * s.done_bytes / s.total_bytes) : 0;
    // The final line repeats nothing: the 100% line may already be out.
    if (decile == last_decile_ && (!final || decile == 10)) return;
    last_decile_ = decile;
    std::fprintf(out_, "%s\n", Line(s, elapsed).c_str());
  }
  std::fflush(out_);
}

StepProgress::StepProgress(std::FILE* out, bool enabled)
    : out_(out), enabled_(enabled), tty_(isatty(fileno(out)) == 1) {}

std::string StepProgress::Line(const StepSample& s) {
  const double frac =
      s.total_steps > 0 ? std::min(1.0, static_cast<double>(s.step) / s.total_steps) : 0.0;
  const int filled = static_cast<int>(frac * kBarWidth);
  std::string line =
      absl::StrCat("[", std::string(filled, '#'), std::string(kBarWidth - filled, '.'), "]  step ",
                   s.step, "/", s.total_steps, "  epoch ", s.epoch,
                   absl::StrFormat("  loss %.4f  acc.len %.2f", s.loss, s.acceptance_length),
                   s.measured_tau > 0 ? absl::StrFormat("  tau %.2f", s.measured_tau) : "", "  ",
                   Short(s.tokens_per_s), " tok/s");
  if (s.step < s.total_steps && s.step_seconds > 0) {
    absl::StrAppend(&line, "  ETA ", Clock(s.step_seconds * (s.total_steps - s.step)));
  }
  return line;
}

void StepProgress::Update(const StepSample& s) {
  if (!enabled_) return;
  if (tty_) {
    std::fprintf(out_, "\r%s\033[K", Line(s).c_str());
    open_line_ = true;
  } else {
    const int decile = s.total_steps > 0 ? static_cast<int>(10 * s.step / s.total_steps) : 0;
    if (decile == last_decile_) return;
    last_decile_ = decile;
    std::fprintf(out_, "%s\n", Line(s).c_str());
  }
  std::fflush(out_);
}

void StepProgress::Break() {
  if (!open_line_) return;
  std::fputc('\n', out_);
  std::fflush(out_);
  open_line_ = false;
}

}  // namespace dflash::ctl
