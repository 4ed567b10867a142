// Configuration: environment variables and setters are validated, and a bad value is an Error
// that quotes it — never "3e5" read as 3 ms or "abc" as 0 ms.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "content_digest.hpp"
#include "dtensor/comm/comm_log.hpp"
#include "dtensor/comm/env_agreement.hpp"
#include "dtensor/comm/threads.hpp"
#include "dtensor/core/parse.hpp"
#include "dtensor/distributed/settings_agreement.hpp"
#include "dtensor/kernels/host/gemm.hpp"
#include "dtensor/kernels/host/simd.hpp"
#include "flag_table.hpp"
#include "flags.hpp"
#include "hardening/hardening.hpp"

// This file's own namespace: test_hardening compiles its files as one unit (tests/CMakeLists.txt).
namespace hardening_configuration {

using namespace dtensor;
using namespace dtensor::hardening;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {
/// Sets an environment variable for the scope of one check (the tests run on one thread).
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* value) : name(n) { ::setenv(n, value, 1); }
  ~ScopedEnv() { ::unsetenv(name); }
};
}  // namespace

TEST_CASE("DTENSOR_TIMEOUT_MS is a whole number of milliseconds in range", "[hardening][config]") {
  {
    ScopedEnv e("DTENSOR_TIMEOUT_MS", "30000");
    CHECK(detail::timeout_from_env(1ms) == 30000ms);
  }
  CHECK(detail::timeout_from_env(7ms) == 7ms);  // unset: the fallback
  for (const char* bad : {"3e5", "abc", "", "30s", " 100", "100 ", "1.5", "0x10"}) {
    ScopedEnv e("DTENSOR_TIMEOUT_MS", bad);
    const auto o = outcome_of_call([] { (void)detail::timeout_from_env(1ms); });
    INFO(bad << " -> " << o.message);
    CHECK(o.is_error);
    CHECK_THAT(o.message, Contains("DTENSOR_TIMEOUT_MS") && Contains(std::string("'") + bad + "'"));
  }
  for (const char* bad : {"0", "-5", "99999999999999999999", "9223372036854775807"}) {
    ScopedEnv e("DTENSOR_TIMEOUT_MS", bad);
    const auto o = outcome_of_call([] { (void)detail::timeout_from_env(1ms); });
    INFO(bad << " -> " << o.message);
    CHECK(o.is_error);
    CHECK_THAT(o.message, Contains("DTENSOR_TIMEOUT_MS") && Contains(bad));
  }
}

TEST_CASE("DTENSOR_CHECK_COLLECTIVES is 0 or 1", "[hardening][config]") {
  {
    ScopedEnv e("DTENSOR_CHECK_COLLECTIVES", "1");
    CHECK(detail::check_from_env(false));
  }
  {
    ScopedEnv e("DTENSOR_CHECK_COLLECTIVES", "0");
    CHECK_FALSE(detail::check_from_env(true));
  }
  for (const char* bad : {"yes", "2", "", "true "}) {
    ScopedEnv e("DTENSOR_CHECK_COLLECTIVES", bad);
    const auto o = outcome_of_call([] { (void)detail::check_from_env(false); });
    CHECK(o.is_error);
    CHECK_THAT(o.message, Contains("DTENSOR_CHECK_COLLECTIVES") && Contains(std::string("'") + bad + "'"));
  }
}

TEST_CASE("DTENSOR_HOST_ISA is baseline, avx2 or avx512", "[hardening][config]") {
  using kernels::host::Isa;
  using kernels::host::detail::isa_cap_from_env;
  CHECK(isa_cap_from_env() == Isa::avx512);  // unset: no cap
  for (auto [text, isa] : {std::pair{"baseline", Isa::baseline}, {"avx2", Isa::avx2}, {"avx512", Isa::avx512}}) {
    ScopedEnv e("DTENSOR_HOST_ISA", text);
    CHECK(isa_cap_from_env() == isa);
  }
  // Regression: anything else was read as avx512 (no cap), so a typo silently ran the fastest path.
  for (const char* bad : {"AVX2", "sse", "", "avx2 ", "avx", "baseline,avx2"}) {
    ScopedEnv e("DTENSOR_HOST_ISA", bad);
    const auto o = outcome_of_call([] { (void)isa_cap_from_env(); });
    INFO(bad << " -> " << o.message);
    CHECK(o.is_error);
    CHECK_THAT(o.message, Contains("DTENSOR_HOST_ISA") && Contains(std::string("'") + bad + "'"));
  }
}

TEST_CASE("DTENSOR_BLAS_THREADS is a whole number of threads in range", "[hardening][config]") {
  using kernels::host::detail::blas_threads_from_env;
  CHECK(blas_threads_from_env() == 1);  // unset: one thread per rank
  {
    ScopedEnv e("DTENSOR_BLAS_THREADS", "4");
    CHECK(blas_threads_from_env() == 4);
  }
  // Regression: atoi read "4x" as 4, and "abc", "0" and "-2" as the default of 1, without a word.
  for (const char* bad : {"4x", "abc", "", "0", "-2", "1e3", " 2", "99999999999", "4097"}) {
    ScopedEnv e("DTENSOR_BLAS_THREADS", bad);
    const auto o = outcome_of_call([] { (void)blas_threads_from_env(); });
    INFO(bad << " -> " << o.message);
    CHECK(o.is_error);
    CHECK_THAT(o.message, Contains("DTENSOR_BLAS_THREADS") && Contains(std::string("'") + bad + "'"));
  }
}

TEST_CASE("ranks given different settings are found at setup, naming the setting and the ranks", "[hardening][config]") {
  // What train_gpt passes (a few of its flags): every rank parses its own command line.
  auto settings = [](int rank) {
    std::vector<Setting> s{{"--seed", "1"}, {"--lr", "0.003"}, {"--dim", "64"}, {"--steps", "100"},
                           {"--schedule", "1f1b"}, {"--microbatches", "4"}, {"--data", "corpus.txt"},
                           {"--save-dir", "ckpt"}};
    if (rank == 2) s[1].value = "0.01";
    if (rank == 3) s[4].value = "gpipe", s[5].value = "8";
    return s;
  };
  for (bool check : {true, false}) {  // in every build: whatever the collective check's switch
    Stopwatch clock;
    const auto out = outcomes(4, [&](CommPtr w) {
      w->set_check_collectives(check);
      w->set_timeout(long_timeout);
      require_same_settings(*w, "train_gpt", settings(w->rank()));
    });
    CHECK(clock.elapsed() < prompt);
    for (const auto& o : out) {
      INFO("check " << check << ": " << o.message);
      CHECK(o.is_error);
      CHECK_THAT(o.message, Contains("train_gpt") && Contains("ranks were given different settings"));
      CHECK_THAT(o.message, Contains("--lr: ranks 0, 1, 3 '0.003'; rank 2 '0.01';"));
      CHECK_THAT(o.message, Contains("--schedule: ranks 0, 1, 2 '1f1b'; rank 3 'gpipe';"));
      CHECK_THAT(o.message, Contains("--microbatches: ranks 0, 1, 2 '4'; rank 3 '8';"));
      CHECK_THAT(o.message, !Contains("--seed") && !Contains("--dim") && !Contains("--save-dir"));
    }
  }
  // Agreeing ranks pass, with one all-gather (the check's only communication).
  std::vector<std::size_t> gathers(2);
  const auto fine = outcomes(2, [&](CommPtr w) {
    CommLog log;
    require_same_settings(*w, "train_gpt", settings(0));
    gathers[std::size_t(w->rank())] = log.records().size();
  });
  for (const auto& o : fine) CHECK_FALSE(o.threw);
  CHECK(gathers == std::vector<std::size_t>{1, 1});
  // A rank with another number of settings (another program) and a long value, shown cut.
  const auto odd = outcomes(3, [&](CommPtr w) {
    auto s = settings(0);
    if (w->rank() == 1) s.pop_back();
    require_same_settings(*w, "setup", s);
  });
  for (const auto& o : odd) CHECK_THAT(o.message, Contains("the number of settings: rank 0: 8; rank 1: 7; rank 2: 8;"));
  const std::string long_path(100, 'x');
  const auto cut = outcomes(2, [&](CommPtr w) {
    require_same_settings(*w, "setup", {{"--data", w->rank() == 0 ? long_path : long_path + "y"}});
  });
  for (const auto& o : cut) CHECK_THAT(o.message, Contains("--data: rank 0 '" + std::string(40, 'x') + "…'; rank 1"));
}

TEST_CASE("--init-from / --resume: ranks starting from files of the same name but other contents are refused on every "
          "rank (the agreement compares contents, not paths)", "[hardening][config]") {
  // Ranks started on other hosts read "the same" path: simulated by digesting one path twice,
  // its contents changed in between (same size, one byte other).
  const auto dir = std::filesystem::temp_directory_path() / ("dtensor_digest_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "init.safetensors").string();
  std::ofstream(file, std::ios::binary) << std::string(1000, 'a');
  const Setting mine = examples::starting_file_setting(file, "");
  std::ofstream(file, std::ios::binary) << std::string(999, 'a') << 'b';
  const Setting theirs = examples::starting_file_setting(file, "");
  CHECK(mine.name == "--init-from --resume (contents)");
  CHECK_THAT(mine.value, Contains("1000 bytes, hash "));
  CHECK(mine.value != theirs.value);
  CHECK(examples::starting_file_setting(file, "").value == theirs.value);  // the same contents: the same digest
  CHECK(examples::starting_file_setting("", "").value.empty());
  CHECK(examples::content_digest((dir / "absent").string()) == "unreadable");
  // A checkpoint directory is digested by its MANIFEST.
  std::ofstream((dir / checkpoint::manifest_name).string()) << "pieces";
  CHECK(examples::starting_file_setting("", dir.string()).value == examples::content_digest((dir / checkpoint::manifest_name).string()));
  for (bool check : {true, false}) {  // in every build, whatever the collective check's switch
    const auto out = outcomes(2, [&](CommPtr w) {
      w->set_check_collectives(check);
      w->set_timeout(long_timeout);
      // The path itself is the same on both ranks (the trainer agrees on it in another entry).
      require_same_settings(*w, "train_gpt", {{"--init-from", file}, w->rank() == 0 ? mine : theirs});
    });
    for (const auto& o : out) {
      INFO(o.message);
      CHECK(o.is_error);
      CHECK_THAT(o.message, Contains("--init-from --resume (contents): rank 0 '" + mine.value + "'; rank 1 '" + theirs.value + "'"));
      CHECK_THAT(o.message, !Contains("--init-from: "));
    }
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("set_timeout rejects zero, negative and absurd timeouts, naming the group", "[hardening][config]") {
  auto out = outcomes(2, [](CommPtr w) {
    auto sub = w->split(0, w->rank());
    sub->set_label("tp");
    for (auto bad : {0ms, -5ms, std::chrono::milliseconds(std::numeric_limits<std::int64_t>::max())}) {
      const auto o = outcome_of_call([&] { sub->set_timeout(bad); });
      if (!o.is_error || o.message.find("set_timeout[tp]") == std::string::npos ||
          o.message.find(std::to_string(bad.count()) + " ms") == std::string::npos)
        throw std::runtime_error("set_timeout(" + std::to_string(bad.count()) + "): " + o.message);
    }
    sub->set_timeout(1ms);  // the smallest valid one
    if (sub->timeout() != 1ms) throw std::runtime_error("set_timeout(1ms) did not take");
  });
  for (const auto& r : out) {
    INFO(r.message);
    CHECK_FALSE(r.threw);
  }
}

TEST_CASE("numbers are parsed in full and in the range of their type", "[hardening][config]") {
  CHECK(parse_integer<int>("42") == 42);
  CHECK(parse_integer<int>("+42") == 42);
  CHECK(parse_integer<int>("-7") == -7);
  CHECK(parse_integer<int>("2147483647") == 2147483647);
  for (const char* bad : {"2147483648", "4294967298", "12x", "3e5", "", "+", "-", "++1", " 1", "1 ", "0x1"})
    CHECK_FALSE(parse_integer<int>(bad).has_value());
  CHECK_FALSE(parse_integer<std::uint64_t>("-1").has_value());
  CHECK(parse_number("3e-3") == 3e-3);
  for (const char* bad : {"nan", "inf", "1e999", "1.5x", "", "--1"}) CHECK_FALSE(parse_number(bad).has_value());
}

TEST_CASE("trainer flags: integers in the type they are used as, naming flag and value", "[hardening][flags]") {
  using examples::flag_value;
  CHECK(flag_value<int>("--steps", "300", 1) == 300);
  auto message = [](auto fn) {
    try {
      fn();
    } catch (const examples::UsageError& e) {
      return std::string(e.what());
    }
    return std::string("<no UsageError>");
  };
  CHECK_THAT(message([&] { flag_value<int>("--steps", "2147483648", 1); }),
             Contains("--steps 2147483648 is out of range [1, 2147483647]"));
  CHECK_THAT(message([&] { flag_value<int>("--steps", "4294967298", 1); }), Contains("--steps 4294967298 is out of range"));
  CHECK_THAT(message([&] { flag_value<int>("--dp", "4294967298", 1, 4096); }), Contains("--dp 4294967298 is out of range [1, 4096]"));
  CHECK_THAT(message([&] { flag_value<int>("--dp", "0", 1, 4096); }), Contains("--dp 0 is out of range"));
  CHECK_THAT(message([&] { flag_value<int>("--steps", "12x", 1); }), Contains("--steps expects a whole number, got '12x'"));
  CHECK_THAT(message([&] { flag_value<std::uint64_t>("--seed", "-1", 0); }), Contains("--seed -1 is out of range"));
  CHECK_THAT(message([&] { examples::positive_flag_value("--lr", "nan"); }), Contains("--lr expects a positive number"));
  CHECK_THAT(message([&] { examples::positive_flag_value("--lr", "-1"); }), Contains("--lr expects a positive number"));
}

namespace {
// A program's options for the flag table's test: the parallelism flags and one row of each kind.
struct TableOptions : examples::MeshFlags {
  std::int64_t layers = 4;
  double lr = 3e-3;
  std::string data, backend = "threads";
  bool check = false, inner_given = false;
  std::vector<std::string> offload;
  int inner = 50;
};

const examples::FlagTable<TableOptions>& test_table() {
  using O = TableOptions;
  using namespace examples;
  static const FlagTable<O> table = [] {
    auto t = mesh_flag_rows<O>("mesh (a heading)");
    const FlagTable<O> rows{{"", "", "the model:"},
                            {"--layers", "N", "blocks", integer(&O::layers, 1)},
                            {"--lr", "X", "the learning rate", positive(&O::lr, 1e6)},
                            {"--data", "FILE", "the text", text(&O::data)},
                            {"--backend", "threads|mpi", "the ranks", choice(&O::backend, {"threads", "mpi"})},
                            {"--check", "", "check every step", set_to(&O::check, true)},
                            {"--offload", "LIST", "what to offload", comma_list(&O::offload, "--offload needs a list")},
                            {"--inner", "H", "inner steps", marking(integer(&O::inner, 1), &O::inner_given)}};
    t.insert(t.end(), rows.begin(), rows.end());
    return t;
  }();
  return table;
}

// The flags parsed by the table (argv[0] added), or the UsageError's message.
std::pair<TableOptions, std::string> parse_table(std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  TableOptions o;
  try {
    examples::parse_flags(test_table(), o, int(argv.size()), argv.data(), "prog");
  } catch (const examples::UsageError& e) {
    return {o, e.what()};
  }
  return {o, ""};
}
}  // namespace

TEST_CASE("the flag table: one row per flag stores, checks and explains it", "[hardening][flags]") {
  const auto [o, error] =
      parse_table({"--layers", "3", "--tp", "4", "--no-sp", "--no-reshard-after-forward", "--lr", "0.5", "--backend",
                   "mpi", "--check", "--offload", "b,a,b", "--inner", "7", "--cp-kind", "ulysses", "--data", "t.txt"});
  REQUIRE(error.empty());
  CHECK(o.layers == 3);
  CHECK(o.tp == 4);
  CHECK_FALSE(o.sp);
  CHECK(o.reshard_after_forward == std::optional<bool>(false));
  CHECK(o.lr == 0.5);
  CHECK(o.backend == "mpi");
  CHECK(o.check);
  CHECK(o.offload == std::vector<std::string>{"b", "a"});  // each once, in order
  CHECK((o.inner == 7 && o.inner_given));
  CHECK(o.cp_kind == nn::ContextKind::ulysses);
  CHECK(o.data == "t.txt");
  CHECK_FALSE(parse_table({"--layers", "2"}).first.inner_given);
  // The wording of examples/flags.hpp, which the trainers' CTests match.
  CHECK(parse_table({"--layers", "0"}).second == "--layers 0 is out of range [1, 9223372036854775807]");
  CHECK(parse_table({"--layers", "12x"}).second == "--layers expects a whole number, got '12x'");
  CHECK(parse_table({"--dp", "4294967298"}).second.starts_with("--dp 4294967298 is out of range [1, "));
  CHECK(parse_table({"--zero", "4"}).second == "--zero 4 is out of range [1, 3]");
  CHECK(parse_table({"--lr", "nan"}).second == "--lr expects a positive number, got 'nan'");
  CHECK(parse_table({"--lr", "1e300"}).second == "--lr 1e300 is out of range (0, 1e+06]");
  CHECK(parse_table({"--backend", "nccl"}).second == "--backend is threads or mpi, got 'nccl'");
  CHECK(parse_table({"--cp-kind", "x"}).second == "--cp-kind is ring, allgather or ulysses, got 'x'");
  CHECK(parse_table({"--offload", ","}).second == "--offload needs a list");
  CHECK(parse_table({"--bogus"}).second == "unknown flag '--bogus'");
  CHECK(parse_table({"--layers"}).second == "--layers needs a value");
  CHECK(parse_table({"--data", ""}).second == "--data needs a value, got ''");
  CHECK(parse_table({"--check", "3"}).second == "unknown flag '3'");  // a switch takes no value
  // --help and the synopsis name every flag; --help gives each its text and every heading.
  const std::string help = examples::flags_help(test_table(), "prog");
  const std::string synopsis = examples::flags_synopsis(test_table(), "prog");
  CHECK(help.starts_with(synopsis));
  for (const auto& f : test_table()) {
    CHECK_THAT(help, Contains(f.help.substr(0, 12)));
    if (!f.name.empty())
      CHECK_THAT(synopsis, Contains("[" + f.name + (f.metavar.empty() ? "]" : " " + f.metavar + "]")));
  }
  for (std::size_t from = 0, to; from < help.size(); from = to + 1) {  // wrapped at 120 columns
    to = help.find('\n', from);
    CHECK(to - from <= 120);
  }
  // A flag of two rows (the second would never be reached) is the program's error, found at its first parse.
  auto twice = test_table();
  twice.push_back({"--layers", "N", "again", examples::integer(&TableOptions::layers, 2)});
  TableOptions o2;
  char prog[] = "prog";
  char* argv[] = {prog};
  CHECK_THROWS_WITH(examples::parse_flags(twice, o2, 1, argv, "prog"), "prog's flag table has two rows for --layers");
  CHECK(examples::is_mesh_flag<TableOptions>("--no-sp"));
  CHECK_FALSE(examples::is_mesh_flag<TableOptions>("--layers"));
}

TEST_CASE("DTENSOR_VERIFY_EVERY is a whole number of calls in 0 .. 16", "[hardening][config]") {
  CHECK(detail::verify_every_from_env(16) == 16);  // unset: the fallback
  {
    ScopedEnv e("DTENSOR_VERIFY_EVERY", "0");
    CHECK(detail::verify_every_from_env(16) == 0);
  }
  for (const char* bad : {"17", "-1", "4x", "", "1e1", "on"}) {
    ScopedEnv e("DTENSOR_VERIFY_EVERY", bad);
    const auto o = outcome_of_call([] { (void)detail::verify_every_from_env(16); });
    INFO(bad << " -> " << o.message);
    CHECK(o.is_error);
    CHECK_THAT(o.message, Contains("DTENSOR_VERIFY_EVERY") && Contains(std::string("'") + bad + "'"));
  }
}

TEST_CASE("DTENSOR_AGREE_BEFORE_DATA is 0 or 1, on by default, and part of the ranks' environment agreement",
          "[hardening][config]") {
  CHECK(detail::agree_from_env(true));  // unset: the fallback (on, every build type)
  {
    ScopedEnv e("DTENSOR_AGREE_BEFORE_DATA", "0");
    CHECK_FALSE(detail::agree_from_env(true));
  }
  for (const char* bad : {"2", "", "on", "yes"}) {
    ScopedEnv e("DTENSOR_AGREE_BEFORE_DATA", bad);
    const auto o = outcome_of_call([] { (void)detail::agree_from_env(true); });
    CHECK(o.is_error);
    CHECK_THAT(o.message, Contains("DTENSOR_AGREE_BEFORE_DATA") && Contains(std::string("'") + bad + "'"));
  }
  bool listed = false;
  for (const auto& s : environment_settings()) listed = listed || s.name == "DTENSOR_AGREE_BEFORE_DATA";
  CHECK(listed);
}

}  // namespace hardening_configuration
