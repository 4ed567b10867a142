// dtensor/trace/progress_bar.hpp — training progress: a bar on a terminal, plain lines elsewhere.
//
//   trace::ProgressBar bar(std::cout, {.total_steps = 300, .tokens_per_step = 16 * 64});
//   for (int step = 1; step <= 300; ++step) { ...; bar.update(step, loss); }
//   bar.message("step 50: validation loss 2.31");   // a line that does not break the bar
//   bar.finish();
//
// On a terminal (trace::stdout_is_terminal(), or `terminal` given) update() redraws one line in
// place:  [########............] 120/300  loss 2.3456  41.2k tok/s  ETA 0:43
// Elsewhere (a file, a pipe, CI logs) it prints a plain line every `plain_every` steps and at
// the last step:  step 120/300  loss 2.3456  41.2k tok/s  ETA 0:43
// Tokens per second and the ETA count from the first update (so the set-up before the first
// step does not count) and extrapolate the average step time so far.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <optional>
#include <string>

#include "dtensor/core/error.hpp"

#if __has_include(<unistd.h>)
#include <unistd.h>
#define DTENSOR_TRACE_HAS_ISATTY 1
#endif

namespace dtensor::trace {

/// Whether standard output is a terminal (false where the platform cannot tell).
inline bool stdout_is_terminal() {
#ifdef DTENSOR_TRACE_HAS_ISATTY
  return ::isatty(STDOUT_FILENO) == 1;
#else
  return false;
#endif
}

struct ProgressOptions {
  int total_steps = 0;
  double tokens_per_step = 0;  // over all ranks; 0: no tokens/s
  int plain_every = 10;        // not a terminal: a line every this many steps (and at the last)
  int bar_width = 30;          // characters between the brackets
};

namespace detail {
/// "41.2k", "3.10M", "950": a rate with three significant digits.
inline std::string short_rate(double per_second) {
  char buf[32];
  if (per_second >= 1e6) std::snprintf(buf, sizeof buf, "%.3gM", per_second / 1e6);
  else if (per_second >= 1e3) std::snprintf(buf, sizeof buf, "%.3gk", per_second / 1e3);
  else std::snprintf(buf, sizeof buf, "%.3g", per_second);
  return buf;
}
/// "1:02:03", "4:05": hours only when there are some.
inline std::string clock_time(double seconds) {
  const long total = long(std::lround(std::max(0.0, seconds)));
  char buf[32];
  if (total >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", total / 3600, total / 60 % 60, total % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", total / 60, total % 60);
  return buf;
}
}  // namespace detail

class ProgressBar {
 public:
  using Seconds = std::chrono::duration<double>;

  ProgressBar(std::ostream& out, ProgressOptions o, bool terminal = stdout_is_terminal())
      : out_(out), o_(o), terminal_(terminal) {
    if (o.total_steps < 1 || o.tokens_per_step < 0 || o.plain_every < 1 || o.bar_width < 1)
      throw Error("trace::ProgressBar", dtensor::detail::cat("needs total_steps >= 1 (got ", o.total_steps,
                                                             "), tokens_per_step >= 0 (got ", o.tokens_per_step,
                                                             "), plain_every >= 1 (got ", o.plain_every,
                                                             ") and bar_width >= 1 (got ", o.bar_width, ")"));
  }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  /// Step `step` (1 to total_steps) finished with loss `loss`.
  void update(int step, double loss) {
    const auto now = std::chrono::steady_clock::now();
    if (!start_) start_ = now;
    update(step, loss, Seconds(now - *start_));
  }
  /// The same, `elapsed` since the first update: a deterministic clock for tests and replays.
  void update(int step, double loss, Seconds elapsed) {
    if (step < 1 || step > o_.total_steps)
      throw Error("trace::ProgressBar::update",
                  dtensor::detail::cat("step ", step, " is outside 1..", o_.total_steps));
    if (!first_step_) first_step_ = step;
    last_line_ = line(step, loss, elapsed.count());
    if (terminal_) {
      out_ << "\r" << last_line_ << "\x1b[K" << std::flush;  // ESC[K: clear what a longer line left
      drawn_ = true;
    } else if (step % o_.plain_every == 0 || step == o_.total_steps || step == *first_step_) {
      out_ << last_line_ << "\n" << std::flush;
    }
  }
  /// Prints `text` on a line of its own; on a terminal the bar is redrawn below it.
  void message(const std::string& text) {
    if (terminal_ && drawn_) out_ << "\r" << text << "\x1b[K\n" << last_line_ << std::flush;
    else out_ << text << "\n" << std::flush;
  }
  /// Ends the bar's line (on a terminal); call once after the last update.
  void finish() {
    if (terminal_ && drawn_) out_ << "\n" << std::flush;
    drawn_ = false;
  }

  bool terminal() const noexcept { return terminal_; }

 private:
  std::string line(int step, double loss, double elapsed) const {
    std::string s;
    if (terminal_) {
      const int filled = int(double(o_.bar_width) * step / o_.total_steps);
      s = "[" + std::string(std::size_t(filled), '#') + std::string(std::size_t(o_.bar_width - filled), '.') + "] ";
    } else {
      s = "step ";
    }
    char loss_text[32];
    std::snprintf(loss_text, sizeof loss_text, "%.4f", loss);
    s += dtensor::detail::cat(step, "/", o_.total_steps, "  loss ", loss_text);
    // Steps timed so far: the first update starts the clock, so it is not one of them.
    const int timed = step - *first_step_;
    if (timed > 0 && elapsed > 0) {
      const double per_step = elapsed / timed;
      if (o_.tokens_per_step > 0) s += "  " + detail::short_rate(o_.tokens_per_step / per_step) + " tok/s";
      s += "  ETA " + detail::clock_time(per_step * (o_.total_steps - step));
    }
    return s;
  }

  std::ostream& out_;
  ProgressOptions o_;
  bool terminal_;
  bool drawn_ = false;
  std::optional<std::chrono::steady_clock::time_point> start_;
  std::optional<int> first_step_;
  std::string last_line_;
};

}  // namespace dtensor::trace
