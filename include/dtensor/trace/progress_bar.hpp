// dtensor/trace/progress_bar.hpp — training progress: a bar on a terminal, plain lines elsewhere.
//
//   trace::ProgressBar bar(std::cout, {.total_steps = 300, .tokens_per_step = 16 * 64});
//   for (int step = 1; step <= 300; ++step) { ...; bar.update(step, loss); }
//   bar.message("step 50: validation loss 2.31");   // a line that does not break the bar
//   bar.finish();
//
// On a terminal of this process (trace::stdout_is_terminal(), or `terminal` given) update()
// redraws one line in place:  [########............] 120/300  loss 2.3456  41.2k tok/s  ETA 0:43
// Elsewhere (a file, a pipe, CI logs) it prints a plain line every `plain_every` steps and at
// the last step:  step 120/300  loss 2.3456  41.2k tok/s  ETA 0:43
// Under an MPI launcher (mpirun, srun --mpi) standard output is often a pseudo-terminal the
// launcher forwards into whatever its own output is, a log file as often as a screen: isatty()
// says yes there, and carriage returns and escape codes would end up in the log. So under a
// launcher's environment (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK, ...) the bar is off;
// DTENSOR_PROGRESS=bar or =lines decides explicitly, everywhere.
// Tokens per second and the ETA count from the first update (so the set-up before the first
// step does not count) and extrapolate the average step time so far.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <ostream>
#include <optional>
#include <string>
#include <string_view>

#include "dtensor/core/error.hpp"

#if __has_include(<unistd.h>)
#include <unistd.h>
#define DTENSOR_TRACE_HAS_ISATTY 1
#endif

namespace dtensor::trace {

namespace detail {
/// Whether this process was started by an MPI launcher that forwards its output (the variables
/// Open MPI, MPICH/Hydra, PMIx and MVAPICH set in every rank they start).
inline bool under_mpi_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "MPI_LOCALRANKID"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}
/// Whether TERM says the terminal cannot move its cursor or clear a line (unset, empty or
/// "dumb": Emacs' shell, some CI consoles), where ESC[K would print as garbage.
inline bool dumb_terminal() {
  const char* term = std::getenv("TERM");
  return term == nullptr || *term == '\0' || std::string_view(term) == "dumb";
}
}  // namespace detail

/// Whether standard output is a terminal of this process, where a bar redrawn in place belongs:
/// DTENSOR_PROGRESS=bar says yes and =lines no; otherwise isatty(stdout), except under an MPI
/// launcher's forwarding and under TERM=dumb (or no TERM) (false where the platform cannot tell).
inline bool stdout_is_terminal() {
  if (const char* force = std::getenv("DTENSOR_PROGRESS")) {
    const std::string f = force;
    if (f == "bar") return true;
    if (f == "lines") return false;
    throw Error("trace::stdout_is_terminal", "DTENSOR_PROGRESS is bar or lines, got '" + f + "'");
  }
  if (detail::under_mpi_launcher()) return false;
  if (detail::dumb_terminal()) return false;
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
/// "41.2k", "3.10M", "950", "1.17G": a rate with three significant digits and an SI prefix, at
/// any rate (no "1.17e+03M"): the prefix is chosen after rounding, so 999.96k reads "1.00M".
inline std::string short_rate(double per_second) {
  static constexpr const char* prefixes[] = {"", "k", "M", "G", "T", "P", "E"};
  char buf[48];
  if (!std::isfinite(per_second) || per_second < 0) {
    std::snprintf(buf, sizeof buf, "%g", per_second);
    return buf;
  }
  std::size_t p = 0;
  double v = per_second;
  // Three significant digits of v, rounded as printed: 999.96 prints as 1000, so promote it.
  auto rounded = [](double x) { return x >= 100 ? std::round(x) : x >= 10 ? std::round(x * 10) / 10 : std::round(x * 100) / 100; };
  while (p + 1 < std::size(prefixes) && rounded(v) >= 1000) {
    v /= 1000;
    ++p;
  }
  const double r = rounded(v);
  std::snprintf(buf, sizeof buf, r >= 100 ? "%.0f%s" : r >= 10 ? "%.1f%s" : "%.2f%s", r, prefixes[p]);
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
