// dtensor/train/flags.hpp — a training program's command-line flags parsed strictly into the type
// they are used as, and the parallelism flags every trainer shares (train_gpt, train_vit, a user's).
//
//   o.steps = flag_value<int>("--steps", "2147483648", 1);   // UsageError: out of range
//   o.lr = positive_flag_value("--lr", "3e-3");
//   struct Options : train::cli::MeshFlags { ... };          // --pp --dp --fsdp --cp --tp --ep --zero --sp ...
//
// The flags' table (each flag one row; the parse loop, --help and the ranks' settings agreement
// generated from it) and the parallelism flags' rows are in train/flag_table.hpp; the Trainer's
// own flags (the loop, checkpoints, --sync, --offload), their checks and the TrainerOptions they
// make, in train/trainer_flags.hpp.
//
// "--steps 4294967298" must not train 2 steps (a long narrowed to int) nor "--steps 12x" 12:
// every integer flag is one whole decimal number within [lo, hi] of its own type, else a
// UsageError that names the flag and quotes the value.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <concepts>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "dtensor/comm/threads.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/core/parse.hpp"
#include "dtensor/nn/context_options.hpp"  // MeshFlags::cp_kind

namespace dtensor::train::cli {

/// Text from streamable pieces: cat("got ", n, " ranks") — the library's one (core/error.hpp).
using dtensor::detail::cat;

/// A bad command line: the program prints it with its usage and exits with status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The value of integer flag `flag` in type T, within [lo, hi].
template <std::integral T>
T flag_value(const std::string& flag, const std::string& text, T lo, T hi = std::numeric_limits<T>::max()) {
  const auto v = dtensor::parse_integer<T>(text);
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (!v) {
    // Digits that do not fit T are out of range; anything else is not a whole number.
    const std::size_t digits = text.find_first_not_of("+-") == 1 ? 1 : 0;
    const bool all_digits = text.size() > digits && text.find_first_not_of("0123456789", digits) == std::string::npos;
    if (all_digits) throw UsageError(flag + " " + text + " is out of range " + range);
    throw UsageError(flag + " expects a whole number, got '" + text + "'");
  }
  if (*v < lo || *v > hi) throw UsageError(flag + " " + text + " is out of range " + range);
  return *v;
}

/// The value of a flag that must be a finite number > 0 and at most `hi` (a bound the flag's
/// user enforces anyway, checked here so that the error names the flag, not the library call).
inline double positive_flag_value(const std::string& flag, const std::string& text,
                                  double hi = std::numeric_limits<double>::max()) {
  const auto v = dtensor::parse_number(text);
  if (!v || !(*v > 0)) throw UsageError(flag + " expects a positive number, got '" + text + "'");
  if (*v > hi) throw UsageError(flag + " " + text + " is out of range (0, " + cat(hi) + "]");
  return *v;
}

/// The value of a flag, which must not be empty: `--trace ""` (an unset shell variable) would
/// otherwise mean "no trace" and the run would silently skip what was asked for.
inline std::string nonempty_flag_value(const std::string& flag, const std::string& text) {
  if (text.empty()) throw UsageError(flag + " needs a value, got ''");
  return text;
}

/// A file the program writes after its run (a trace, a plot): checked before the run, so that
/// a bad path fails at once naming the flag instead of after minutes of work (or, written by one
/// rank at the end, as an error that names neither the flag nor the file's problem).
inline void check_output_file(const std::string& flag, const std::string& file) {
  if (file.empty()) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(file, ec)) throw UsageError(flag + " " + file + " is a directory, not a file");
  const fs::path dir = fs::absolute(file, ec).parent_path();
  if (!fs::is_directory(dir, ec))
    throw UsageError(flag + " " + file + ": the directory " + dir.string() + " does not exist");
  if (::access(dir.c_str(), W_OK) != 0) throw UsageError(flag + " " + file + ": cannot write into " + dir.string());
}

/// Fails at once when a run needs more than this process may hold (ulimit -v, else the
/// machine's memory): `bytes` is a lower bound of what the flags ask for (`sizes` says from
/// which flags), so that a huge size is an error naming the flags before anything is
/// allocated, not minutes of allocating, a bare std::bad_alloc or a tensor's "cannot
/// allocate" that names no flag. A lower bound never refuses a run that fits. `per_process`:
/// MPI ranks are processes, `bytes` is one's share (the message says so). Both trainers' check.
inline void check_fits_memory(long double bytes, const std::string& sizes, bool per_process = false) {
  long double limit = (long double)sysconf(_SC_PHYS_PAGES) * (long double)sysconf(_SC_PAGESIZE);
  const char* what = "the machine's memory";
  if (rlimit r{}; getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY && (long double)r.rlim_cur < limit)
    limit = (long double)r.rlim_cur, what = "this process's address-space limit (ulimit -v)";
  if (limit <= 0 || bytes <= limit) return;
  char text[192];
  std::snprintf(text, sizeof text, " need at least %.3Lg GiB %s, more than %s (%.3Lg GiB); nothing was allocated",
                bytes / (1024.0L * 1024 * 1024), per_process ? "per process" : "in this process", what,
                limit / (1024.0L * 1024 * 1024));
  throw UsageError(sizes + text);
}

/// --kv-heads (grouped-query attention; 0: --heads) must divide --heads: both trainers' and the
/// dry run's check, named by the flags.
inline void check_kv_heads(long long heads, long long kv_heads) {
  if (kv_heads > 0 && heads % kv_heads != 0)
    throw UsageError("--heads " + std::to_string(heads) + " is not a multiple of --kv-heads " +
                     std::to_string(kv_heads));
}

/// A mesh dimension's size: 1 to the most ranks the threads backend runs.
inline int mesh_flag(const std::string& flag, const std::string& text) {
  return flag_value<int>(flag, text, 1, dtensor::threads::max_ranks);
}

/// Whether --help (or -h) stands anywhere on the command line: it wins before any flag is
/// checked, so `train_gpt --pp 0 --help` prints the usage.
inline bool help_requested(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") return true;
  return false;
}

/// The parallelism flags: the mesh (pp, dp, fsdp, cp, tp; ep for the experts) and how each
/// dimension runs. The defaults are train_gpt's (every parallelism on, 16 ranks).
struct MeshFlags {
  int pp = 2, dp = 1, fsdp = 2, cp = 2, tp = 2, ep = 1;
  int zero = 0;  // ZeRO stage over "fsdp" x "cp"; 0: 3 when --fsdp > 1, else 1 (= DDP without CP)
  bool sp = true;
  dtensor::nn::ContextKind cp_kind = dtensor::nn::ContextKind::ring;
  std::string schedule = "1f1b";
  int microbatches = 0;  // 0: 2 x pp with a pipeline, else 1
  // ZeRO-3 inside pipeline stages: gather each unit per micro-batch (true) or keep the stage
  // gathered for the step (false); unset: true at pp 1, false with a pipeline (torchtitan's policy).
  std::optional<bool> reshard_after_forward{};

  int ranks() const { return pp * dp * fsdp * cp * tp; }
};

}  // namespace dtensor::train::cli
