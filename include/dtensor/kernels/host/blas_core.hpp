// dtensor/kernels/host/blas_core.hpp — which GEMM kernels the host BLAS runs, chosen by the
// CPU's features (not its model number) before the first GEMM, and the one line that says so.
//
//   blas_kernels()            // chooses once (gemm() calls it before its first CBLAS call) and reports
//   blas_kernels_line()       // "host BLAS: OpenBLAS 0.3.21, Cooperlake kernels (CPU: avx2 avx512f ...) ..."
//   DTENSOR_BLAS_CORETYPE=Haswell    // environment: pin OpenBLAS's kernels (any core name it knows)
//   DTENSOR_BLAS_CORETYPE=openblas   // environment: keep OpenBLAS's own choice (dtensor changes nothing)
//   OPENBLAS_CORETYPE=...            // OpenBLAS's own pin: always respected, never changed
//
// Why (docs/host-kernels.md, issue 46): OpenBLAS built with DYNAMIC_ARCH (Debian's, Ubuntu's)
// picks its kernels from the CPU's family/model numbers, read once when the library loads. A CPU
// newer than its table (Debian 12's 0.3.21 on a Sapphire Rapids VM) falls back to the Prescott
// (SSE3) kernels without a word: every GEMM several times slower than the CPU allows. So, before
// the first GEMM, the core OpenBLAS runs (openblas_get_corename) is compared with what the CPU
// offers (cpuid: AVX2, AVX-512, AVX512-BF16), and when the core is narrower than the CPU the core
// table is switched through the DYNAMIC_ARCH build's own exported entry points:
// gotoblas_dynamic_quit() forgets the table, gotoblas_dynamic_init() chooses again from
// OPENBLAS_CORETYPE (set for that call only, then restored) and runs the new core's init
// (its blocking sizes) — exactly what OpenBLAS does at load with the variable set. Nothing runs
// in OpenBLAS meanwhile: the switch happens once, under a once-flag, before dtensor's first CBLAS
// call; programs with threads call blas_kernels() first thing in main (train_gpt does), so that no
// other thread reads the environment while it changes.
//
// The choice: Cooperlake where the CPU has AVX-512 and AVX512-BF16, SkylakeX with AVX-512
// (F/CD/BW/DQ/VL), Haswell with AVX2 + FMA; capped by DTENSOR_HOST_ISA (baseline: no change).
// Cooperlake is what OpenBLAS itself picks on the bf16 CPUs it knows. A core already as wide as
// the CPU is kept: SkylakeX and Cooperlake share their sgemm micro-kernel and ran the trainer at
// the same speed, but not the same bits (their blocking differs), so replacing a full-width
// choice would only change the rounding. 0.3.21 has no Sapphire Rapids table in its DYNAMIC_ARCH
// list; Cooperlake is the best it offers there. Ranks on different hosts must run the same kernels to
// sum alike (docs/multinode.md): pin them with DTENSOR_BLAS_CORETYPE (or OPENBLAS_CORETYPE) and
// forward the variable.
//
// Without the DYNAMIC_ARCH entry points (a single-target OpenBLAS, another CBLAS) nothing is
// switched and the line says what runs. The symbols are weak (GCC/Clang on ELF), as in gemm.hpp.
//
// bf16 GEMMs (gemm<bfloat16>) do not go through the BLAS (Debian's OpenBLAS 0.3.21 exports no
// sbgemm): bf16_gemm_kernel() picks dtensor's own kernel (gemm_bf16.hpp) once per process, by the
// same rule — the widest the CPU and the OS allow: AMX tiles (amx_tile + amx_bf16, and Linux's
// permission for the tile data, requested once per process here), else AVX512-BF16 dot products,
// else the inputs widened to float for sgemm. DTENSOR_HOST_ISA caps it: avx512 (no AMX), avx2 or
// baseline (widened + sgemm); amx or unset, no cap. The line names it ("bf16 GEMMs: AMX tiles").
#pragma once

#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>

#include "dtensor/core/error.hpp"
#include "dtensor/kernels/host/simd.hpp"

#if DTENSOR_HOST_MULTI_ISA
#include <cpuid.h>
#endif
#if DTENSOR_HOST_MULTI_ISA && defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(DTENSOR_HAS_CBLAS) && (defined(__GNUC__) || defined(__clang__)) && defined(__ELF__)
#define DTENSOR_DETAIL_WEAK_OPENBLAS_CORE 1
extern "C" char* openblas_get_corename(void) __attribute__((weak));
extern "C" char* openblas_get_config(void) __attribute__((weak));
extern "C" void gotoblas_dynamic_init(void) __attribute__((weak));
extern "C" void gotoblas_dynamic_quit(void) __attribute__((weak));
#endif

namespace dtensor::kernels::host {

/// What the host BLAS runs and why (blas_kernels()).
struct BlasKernels {
  std::string library;       // "OpenBLAS 0.3.21"; "" when there is no CBLAS or it is not OpenBLAS
  std::string core;          // the kernels that run now, OpenBLAS's name ("Cooperlake"); "" if unknown
  std::string library_pick;  // what OpenBLAS had chosen by itself (or from OPENBLAS_CORETYPE)
  std::string chosen_by;     // "dtensor", "OpenBLAS", "OPENBLAS_CORETYPE" or "DTENSOR_BLAS_CORETYPE"
  std::string cpu;           // the CPU's features that matter here: "avx2 avx512f avx512bw avx512vl avx512_bf16 amx"
};

namespace detail {

/// Vector width of an OpenBLAS core, or of what a CPU offers (ordered).
enum class BlasLevel { unknown = -1, sse = 0, avx = 1, avx2 = 2, avx512 = 3 };

inline bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

/// The width of the kernels of an OpenBLAS x86-64 core name (openblas_get_corename's spelling,
/// any case); unknown for other names (other architectures: never switched).
inline BlasLevel blas_core_level(std::string_view core) {
  for (const char* n : {"Katmai", "Coppermine", "Northwood", "Prescott", "Banias", "Atom", "Core2", "Penryn", "Dunnington",
                        "Nehalem", "Athlon", "Opteron", "Opteron_SSE3", "Barcelona", "Nano", "Bobcat"})
    if (iequal(core, n)) return BlasLevel::sse;
  for (const char* n : {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller", "Excavator"})
    if (iequal(core, n)) return BlasLevel::avx;
  for (const char* n : {"Haswell", "Zen"})
    if (iequal(core, n)) return BlasLevel::avx2;
  for (const char* n : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (iequal(core, n)) return BlasLevel::avx512;
  return BlasLevel::unknown;
}

/// The CPU's features for the choice and the report (cpuid; the OS's register support included).
struct CpuBlasFeatures {
  BlasLevel level = BlasLevel::sse;  // avx2 needs FMA too; avx512 needs F, CD, BW, DQ and VL
  bool avx512_bf16 = false;
  bool amx = false;
  std::string names;  // "avx2 avx512f avx512bw avx512vl avx512_bf16 amx" (those present)
};

inline CpuBlasFeatures cpu_blas_features() {
  CpuBlasFeatures f;
#if DTENSOR_HOST_MULTI_ISA
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool f512 = __builtin_cpu_supports("avx512f"), bw = __builtin_cpu_supports("avx512bw"),
             vl = __builtin_cpu_supports("avx512vl"), dq = __builtin_cpu_supports("avx512dq"),
             cd = __builtin_cpu_supports("avx512cd");
  if (__builtin_cpu_supports("avx")) f.level = BlasLevel::avx;
  if (avx2) f.level = BlasLevel::avx2;
  if (avx2 && f512 && bw && vl && dq && cd) f.level = BlasLevel::avx512;
  // AVX512-BF16 (leaf 7 sub-leaf 1, EAX bit 5) and AMX (leaf 7, EDX bits 22 and 24): __builtin_cpu_supports
  // does not know them in GCC 12 / Clang 14. Both only count where AVX-512's registers are usable.
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    const unsigned max_sub = a;
    f.amx = f.level == BlasLevel::avx512 && (d & (1u << 22)) && (d & (1u << 24));
    if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512_bf16 = f.level == BlasLevel::avx512 && (a & (1u << 5));
  }
  const auto add = [&](bool has, const char* name) {
    if (has) f.names += (f.names.empty() ? "" : " ") + std::string(name);
  };
  add(avx2, "avx2");
  add(f512, "avx512f");
  add(bw, "avx512bw");
  add(vl, "avx512vl");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.amx, "amx");
#endif
  if (f.names.empty()) f.names = "no avx2";
  return f;
}

/// The best OpenBLAS 0.3.21 DYNAMIC_ARCH core for a CPU of that width ("" below AVX2: leave it).
inline const char* best_blas_core(BlasLevel cpu, bool avx512_bf16) {
  if (cpu >= BlasLevel::avx512) return avx512_bf16 ? "Cooperlake" : "SkylakeX";
  if (cpu == BlasLevel::avx2) return "Haswell";
  return "";
}

/// The core to switch to, or "" to keep `running`: only a known core narrower than the CPU (as
/// capped by DTENSOR_HOST_ISA) is replaced.
inline std::string blas_core_to_choose(std::string_view running, BlasLevel cpu, bool avx512_bf16, Isa cap) {
  const BlasLevel have = blas_core_level(running);
  const BlasLevel capped = cap == Isa::baseline ? BlasLevel::sse
                           : cap == Isa::avx2   ? std::min(cpu, BlasLevel::avx2)
                                                : cpu;
  if (have == BlasLevel::unknown || have >= capped) return "";
  return best_blas_core(capped, avx512_bf16);
}

/// The variable, or "" when unset.
inline std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

#ifdef DTENSOR_DETAIL_WEAK_OPENBLAS_CORE
inline bool openblas_can_switch() {
  return &openblas_get_corename != nullptr && &gotoblas_dynamic_init != nullptr && &gotoblas_dynamic_quit != nullptr;
}
inline std::string openblas_core_name() { return &openblas_get_corename != nullptr ? openblas_get_corename() : ""; }

/// Makes OpenBLAS run the core `name` (OpenBLAS's spelling): what it does at load with
/// OPENBLAS_CORETYPE=name. Returns the core that runs afterwards. Call only while no BLAS call
/// runs and no other thread reads the environment (the once-flag of blas_kernels()).
inline std::string switch_openblas_core(const std::string& name) {
  if (!openblas_can_switch()) return openblas_core_name();
  const char* before = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved = before ? before : "";
  ::setenv("OPENBLAS_CORETYPE", name.c_str(), 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  if (before) ::setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  else ::unsetenv("OPENBLAS_CORETYPE");
  return openblas_core_name();
}
#endif

inline BlasKernels choose_blas_kernels() {
  BlasKernels k;
  const CpuBlasFeatures cpu = cpu_blas_features();
  k.cpu = cpu.names;
  const std::string pin = env_or_empty("DTENSOR_BLAS_CORETYPE"), openblas_pin = env_or_empty("OPENBLAS_CORETYPE");
  if (pin.empty() && std::getenv("DTENSOR_BLAS_CORETYPE"))  // set but empty: a forwarding mistake, not "unset"
    throw Error("DTENSOR_BLAS_CORETYPE", "'' names no kernels: unset it, or name a core (Haswell, SkylakeX, Cooperlake, "
                                         "or openblas for OpenBLAS's own choice)");
#ifdef DTENSOR_DETAIL_WEAK_OPENBLAS_CORE
  if (&openblas_get_corename == nullptr) return k;  // a CBLAS that is not OpenBLAS: its kernels are its own
  if (&openblas_get_config != nullptr) {
    const std::string config = openblas_get_config();  // "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY ..."
    const auto second = config.find(' ', config.find(' ') + 1);
    k.library = config.substr(0, second);
  } else {
    k.library = "OpenBLAS";
  }
  k.library_pick = k.core = openblas_core_name();
  k.chosen_by = openblas_pin.empty() ? "OpenBLAS" : "OPENBLAS_CORETYPE";
  if (!pin.empty() && !iequal(pin, "openblas")) {
    if (!openblas_pin.empty() && !iequal(pin, openblas_pin))
      throw Error("DTENSOR_BLAS_CORETYPE", dtensor::detail::cat("'", pin, "' and OPENBLAS_CORETYPE '", openblas_pin,
                                                                "' name different kernels: set one of them"));
    if (iequal(pin, k.core)) {
      k.chosen_by = "DTENSOR_BLAS_CORETYPE";
      return k;
    }
    if (!openblas_can_switch())
      throw Error("DTENSOR_BLAS_CORETYPE", dtensor::detail::cat("'", pin, "': this OpenBLAS (", k.library,
                                                                ") has one core (", k.core, ") and cannot switch"));
    const std::string now = switch_openblas_core(pin);
    if (!iequal(now, pin)) {
      switch_openblas_core(k.library_pick);  // back to what ran, then say why
      throw Error("DTENSOR_BLAS_CORETYPE", dtensor::detail::cat("'", pin, "' is not a core of this OpenBLAS (", k.library,
                                                                "; it fell back to ", now, "); e.g. Haswell, SkylakeX, Cooperlake"));
    }
    k.core = now;
    k.chosen_by = "DTENSOR_BLAS_CORETYPE";
    return k;
  }
  if (!openblas_pin.empty() || !pin.empty() || !openblas_can_switch()) return k;  // a user's choice, or nothing to switch
  const std::string want = blas_core_to_choose(k.core, cpu.level, cpu.avx512_bf16, detected_host_isa());
  if (want.empty()) return k;
  const std::string now = switch_openblas_core(want);
  if (iequal(now, want)) {
    k.core = now;
    k.chosen_by = "dtensor";
  } else {
    k.core = switch_openblas_core(k.library_pick);  // this build lacks that core's table: keep OpenBLAS's
  }
#else
  (void)pin;
  (void)openblas_pin;
#endif
  return k;
}

}  // namespace detail

/// The kernel of gemm<bfloat16> (bf16 inputs, fp32 accumulation, C rounded once), widest last.
enum class Bf16Gemm { widen_sgemm, avx512_bf16, amx };

inline const char* bf16_gemm_name(Bf16Gemm k) {
  switch (k) {
    case Bf16Gemm::amx:
      return "AMX tiles";
    case Bf16Gemm::avx512_bf16:
      return "AVX512-BF16";
    default:
      return "widened to float + sgemm";
  }
}

namespace detail {

/// Asks Linux for the AMX tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA),
/// which a process must hold before its first tile instruction (else SIGILL); the grant is for the
/// whole process, so it is asked once (a function-local static: thread-safe). False where the
/// kernel refuses it or is not Linux (then no tiles are used).
inline bool amx_permitted() {
#if DTENSOR_HOST_MULTI_ISA && defined(__linux__) && defined(__x86_64__)
  static const bool granted = [] {
    constexpr long arch_get_xcomp_perm = 0x1022, arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    if (::syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) != 0) return false;
    unsigned long features = 0;
    return ::syscall(SYS_arch_prctl, arch_get_xcomp_perm, &features) == 0 && (features >> xfeature_xtiledata & 1u);
  }();
  return granted;
#else
  return false;
#endif
}

/// The widest bf16 GEMM kernel for these CPU features under DTENSOR_HOST_ISA's cap (`isa` is the
/// cap's value: "" when unset). amx_ok: the OS grants the tiles.
inline Bf16Gemm choose_bf16_gemm(const CpuBlasFeatures& cpu, bool amx_ok, std::string_view isa) {
  if (isa == "baseline" || isa == "avx2" || cpu.level < BlasLevel::avx512 || !cpu.avx512_bf16)
    return Bf16Gemm::widen_sgemm;
  if (isa != "avx512" && cpu.amx && amx_ok) return Bf16Gemm::amx;
  return Bf16Gemm::avx512_bf16;
}

/// bf16_gemm_kernel() without the runtime cap: chosen once per process (the permission is asked
/// only where the CPU has AMX and the cap allows it).
inline Bf16Gemm detected_bf16_gemm() {
  static const Bf16Gemm k = [] {
    (void)isa_cap_from_env();  // a misspelt DTENSOR_HOST_ISA is an Error here too
    const CpuBlasFeatures cpu = cpu_blas_features();
    const std::string isa = env_or_empty("DTENSOR_HOST_ISA");
    const bool wants_amx = choose_bf16_gemm(cpu, true, isa) == Bf16Gemm::amx;
    return choose_bf16_gemm(cpu, wants_amx && amx_permitted(), isa);
  }();
  return k;
}

}  // namespace detail

/// The kernel gemm<bfloat16> runs (gemm_bf16.hpp): the widest of AMX tiles, AVX512-BF16 and the
/// widened sgemm that the CPU, the OS and DTENSOR_HOST_ISA allow; set_host_isa_cap below avx512
/// (tests, benchmarks) makes it the widened sgemm.
inline Bf16Gemm bf16_gemm_kernel() {
  return host_isa() == Isa::avx512 ? detail::detected_bf16_gemm() : Bf16Gemm::widen_sgemm;
}

/// The host BLAS's kernels: chosen once per process (the first call; gemm() makes it before its
/// first CBLAS call), by the rules at the top of this file. Throws a dtensor::Error for a
/// DTENSOR_BLAS_CORETYPE this OpenBLAS cannot run (and retries on the next call).
inline const BlasKernels& blas_kernels() {
  static const BlasKernels k = detail::choose_blas_kernels();
  return k;
}

/// One line for a program's start: the library, the kernels, the CPU, and who chose them; then
/// the bf16 GEMMs' kernel.
inline std::string blas_kernels_line() {
  const BlasKernels& k = blas_kernels();
  const std::string bf16 = std::string("; bf16 GEMMs: ") + bf16_gemm_name(bf16_gemm_kernel());
  if (k.library.empty()) {
#ifdef DTENSOR_HAS_CBLAS
    return "host BLAS: a CBLAS that is not OpenBLAS (its own kernels; CPU: " + k.cpu + ")" + bf16;
#else
    return "host GEMM: dtensor's portable loop (built without a BLAS; CPU: " + k.cpu + ")" + bf16;
#endif
  }
  std::string line = "host BLAS: " + k.library + ", " + (k.core.empty() ? "unnamed" : k.core) + " kernels (CPU: " + k.cpu + ") - ";
  if (k.chosen_by == "dtensor")
    line += "chosen by dtensor for the CPU's features (OpenBLAS picked " + k.library_pick + ")";
  else if (k.chosen_by == "OpenBLAS")
    line += "OpenBLAS's choice";
  else
    line += "pinned by " + k.chosen_by;
  return line + "; DTENSOR_BLAS_CORETYPE / OPENBLAS_CORETYPE override" + bf16;
}

}  // namespace dtensor::kernels::host
