// dtensor/sim/device.hpp — what one GPU of a cluster can do, as the cost model reads it.
//
//   sim::Hardware h = sim::device("h100");            // built in: h100, h200, a100, h100-500w
//   sim::Hardware f = sim::read_device_file("my.gpu"); // every field, "name = value" per line
//   sim::set_device_field(h, "network_gbps", "200");  // one field, as --device-field does
//   h.peak_flops();                                    // the peak of the dtype the model computes in
//
// A device description holds per-GPU figures; how well kernels and collectives reach them is the
// calibration's (sim/cost_model.hpp), the same for every device, times the device's
// compute_scale: the share of the calibrated GEMM and attention rates this GPU sustains (1 for a
// GPU at its rated power, as the calibration's rows ran; lower for a power-limited one, whose SM
// clock drops under tensor-core load while its HBM and links do not). Fields (units in the names;
// a file must give every one but the optional ones, in any order; '#' starts a comment):
//
//   name                 a label for reports
//   peak_bf16_tflops     dense bf16 tensor-core peak          (H100 SXM 989, A100 312)
//   peak_fp32_tflops     fp32 peak for an fp32 model           (H100 67 non-tensor; A100 19.5)
//   peak_fp8_tflops      dense FP8 tensor-core peak; 0: none   (H100, H200 1979; A100 0; a file
//                        that leaves it out: 0)
//   hbm_gbytes_per_s     memory bandwidth                      (H100 3350, H200 4800, A100 2039)
//   memory_gbytes        device memory, decimal GB              (80, 141, 80)
//   nvlink_domain        GPUs joined by NVLink (a node)         (8)
//   nvlink_gbytes_per_s  NVLink per GPU and direction           (450 NVLink 4, 300 NVLink 3)
//   nvlink_latency_us    one NVLink message's latency           (3)
//   network_gbps         network per GPU, gigabits per second   (400 NDR; 200 HDR on Selene)
//   network_latency_us   one network message's latency          (6)
//   compute_scale        optional, default 1: see above         (h100-500w 0.57, fitted)
//   sm_count             optional, default 132: streaming multiprocessors (H100 SXM, H200 132;
//                        A100 108): a GEMM's output tiles run this many at a time
//   gemm_tile_m, gemm_tile_n  optional, default 128, 256: a tensor-core GEMM's output tile per SM
//                        (bf16 and FP8; an fp32 model's CUDA-core GEMMs use 128 x 128)
//   gemm_overhead_us     optional, default 11: a GEMM's fixed time per launch (launch, ramp)
//
// The last four make a GEMM's rate depend on its shape (sim::op_seconds, docs/dry-run.md "GEMM
// efficiency by shape"): a GEMM of m x n outputs is batch x ceil(m / tm) x ceil(n / tn) tiles,
// run in waves of sm_count (the last wave partly empty), plus the fixed overhead. The tile is
// 128 x 256 on every built-in device: CUTLASS's default threadblock tile for Ampere tensor-core
// GEMMs (DefaultGemmConfiguration<OpClassTensorOp, Sm80>: GemmShape<128, 256, 64>, 3 stages)
// and the largest tile of the Hopper warp-specialized bf16 and FP8 kernels (CUTLASS 3's
// 128 x 256 x 64), the tiles large GEMMs run on; one such tile fills an SM (its registers hold
// the 128 x 256 fp32 accumulators), so a wave is sm_count tiles. The fp32 tile is CUTLASS's SIMT
// default (GemmShape<128, 128, 8>). The overhead is this project's bench_gemm_cuda on an H100
// (docs/benchmarks.md, "GPU": cuBLAS bf16 at n = 256 and 512 takes 16-17 us a call, 10-12 us more
// than its tiles would; with 11 us the model reproduces its n = 512 ... 8192 fractions of peak
// within 16 %: n = 2048 is +15 %; test_sim asserts 20 %). The benchmark times one call between
// two events, so the host's launch gap is in it: an upper bound for a step whose launches queue ahead. The A100 is given the same figure
// (no measurement of ours).
//
// The built-in devices (sim::device): h100 (SXM, 700 W, 80 GB HBM3), h200 (SXM, 141 GB HBM3e),
// a100 (SXM 80 GB, HDR 200 Gb/s per GPU as on Selene, where Megatron's published runs were
// measured) and h100-500w: the H100 of torchtitan's published benchmarks (Meta's Grand Teton
// hosts: 96 GB HBM2e at 2.4 TB/s, 400 Gb/s RDMA per GPU, the 500 W default power limit; its
// bf16 peak is "between SXM and NVL" and not known, torchtitan's footnote). Its compute_scale is
// not a microbenchmark's: it is fitted on torchtitan's Llama 3.1 8B rows (sim/published_runs.hpp,
// sim::fit_device_scale; test_sim checks the fit gives this value), the 405B row held out. The
// measured GEMM figures of the others (this project's bench_gemm_cuda, cuBLAS bf16 at n = 8192,
// docs/benchmarks.md: 806 of 989 TFLOP/s on an H100 SXM, 819 on an H200, i.e. 0.82 and 0.83)
// are about what the cost model gives that GEMM (0.837: the fitted 0.87 x its wave efficiency
// 0.97, 2,048 tiles in 16 waves of 132, plus the fixed 11 us); the smaller ones' are reproduced
// within 16 % (test_sim asserts 20 %; docs/dry-run.md "GEMM efficiency by shape").
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtensor/core/error.hpp"

namespace dtensor::sim {

/// One class of link, per GPU and direction.
struct Link {
  double latency_seconds = 0;
  double bytes_per_second = 1;
};

/// One GPU of the cluster (see the synopsis). Defaults: H100 SXM.
struct Hardware {
  std::string name = "h100";
  double peak_bf16_flops = 989e12;
  double peak_fp32_flops = 67e12;
  // The FP8 GEMMs' peak (nn::Linear under nn::Fp8Autocast: op "gemm_fp8"); 0: no FP8 tensor
  // cores, and a plan with FP8 GEMMs is refused on the device (sim::op_seconds).
  double peak_fp8_flops = 1979e12;
  double hbm_bytes_per_second = 3.35e12;
  double memory_bytes = 80e9;
  int gpus_per_node = 8;  // the NVLink domain
  Link nvlink{3e-6, 450e9};
  Link infiniband{6e-6, 50e9};  // the network, per GPU
  bool fp32 = false;            // the model computes in fp32 (its GEMMs run at peak_fp32_flops)
  double compute_scale = 1;     // the share of the calibrated GEMM and attention rates sustained
  // A GEMM's shape model (see the synopsis): its tiles over the SMs, and a fixed time per GEMM.
  int sm_count = 132;
  int gemm_tile_m = 128, gemm_tile_n = 256;  // tensor-core GEMMs (bf16, FP8)
  double gemm_overhead_seconds = 11e-6;

  /// The rated peak of the dtype the model computes in (what MFU divides by).
  double peak_flops() const { return fp32 ? peak_fp32_flops : peak_bf16_flops; }
  /// The peak the cost model's GEMMs and attention scale from: the rated one x compute_scale.
  double sustained_flops() const { return peak_flops() * compute_scale; }
  /// The output tile (rows, columns) of one SM's share of a GEMM in the dtype the model computes
  /// in: the tensor-core tile, or CUTLASS's SIMT 128 x 128 for an fp32 model's GEMMs.
  std::pair<int, int> gemm_tile() const { return fp32 ? std::pair{128, 128} : std::pair{gemm_tile_m, gemm_tile_n}; }

  void check(const char* op) const {
    if (!(peak_bf16_flops > 0) || !(peak_fp32_flops > 0) || !(hbm_bytes_per_second > 0) || !(memory_bytes > 0) ||
        gpus_per_node < 1 || !(nvlink.bytes_per_second > 0) || !(infiniband.bytes_per_second > 0) ||
        !(nvlink.latency_seconds >= 0) || !(infiniband.latency_seconds >= 0) || !(compute_scale > 0) ||
        !(peak_fp8_flops >= 0) || compute_scale > 1)
      throw Error(op, dtensor::detail::cat("device '", name, "': peak ", peak_bf16_flops, " / ", peak_fp32_flops,
                                           " FLOP/s, HBM ", hbm_bytes_per_second, " B/s, memory ", memory_bytes, " B, ",
                                           gpus_per_node, " GPUs per NVLink domain, bandwidths ", nvlink.bytes_per_second,
                                           " / ", infiniband.bytes_per_second,
                                           " B/s, compute_scale ", compute_scale,
                                           ": need positive figures, latencies >= 0 and 0 < compute_scale <= 1"));
    // The GEMM shape model's: the wave count divides by the SMs and the tile (0 would be a NaN).
    const auto whole = [&](const char* field, int v) {
      if (v < 1)
        throw Error(op, dtensor::detail::cat("device '", name, "': ", field, " ", v, ": need a whole number >= 1"));
    };
    whole("sm_count", sm_count);
    whole("gemm_tile_m", gemm_tile_m);
    whole("gemm_tile_n", gemm_tile_n);
    if (!(gemm_overhead_seconds >= 0) || !std::isfinite(gemm_overhead_seconds))
      throw Error(op, dtensor::detail::cat("device '", name, "': gemm_overhead_us ", gemm_overhead_seconds / 1e-6,
                                           ": need a finite number >= 0"));
  }
};

namespace detail {
struct DeviceField {
  const char* key;
  double scale;  // file units -> the struct's
  double Hardware::*number;
  int Hardware::*integer;
  double Link::*link_member;
  Link Hardware::*link;
};
inline const std::vector<DeviceField>& device_fields() {
  static const std::vector<DeviceField> fields{
      {"peak_bf16_tflops", 1e12, &Hardware::peak_bf16_flops, nullptr, nullptr, nullptr},
      {"peak_fp32_tflops", 1e12, &Hardware::peak_fp32_flops, nullptr, nullptr, nullptr},
      {"peak_fp8_tflops", 1e12, &Hardware::peak_fp8_flops, nullptr, nullptr, nullptr},
      {"hbm_gbytes_per_s", 1e9, &Hardware::hbm_bytes_per_second, nullptr, nullptr, nullptr},
      {"memory_gbytes", 1e9, &Hardware::memory_bytes, nullptr, nullptr, nullptr},
      {"nvlink_domain", 1, nullptr, &Hardware::gpus_per_node, nullptr, nullptr},
      {"nvlink_gbytes_per_s", 1e9, nullptr, nullptr, &Link::bytes_per_second, &Hardware::nvlink},
      {"nvlink_latency_us", 1e-6, nullptr, nullptr, &Link::latency_seconds, &Hardware::nvlink},
      {"network_gbps", 1e9 / 8, nullptr, nullptr, &Link::bytes_per_second, &Hardware::infiniband},
      {"network_latency_us", 1e-6, nullptr, nullptr, &Link::latency_seconds, &Hardware::infiniband},
      {"compute_scale", 1, &Hardware::compute_scale, nullptr, nullptr, nullptr},
      {"sm_count", 1, nullptr, &Hardware::sm_count, nullptr, nullptr},
      {"gemm_tile_m", 1, nullptr, &Hardware::gemm_tile_m, nullptr, nullptr},
      {"gemm_tile_n", 1, nullptr, &Hardware::gemm_tile_n, nullptr, nullptr},
      {"gemm_overhead_us", 1e-6, &Hardware::gemm_overhead_seconds, nullptr, nullptr, nullptr},
  };
  return fields;
}
}  // namespace detail

/// The names of a device description's fields (name first), as files and overrides spell them.
inline std::vector<std::string> device_field_names() {
  std::vector<std::string> names{"name"};
  for (const auto& f : detail::device_fields()) names.emplace_back(f.key);
  return names;
}

/// Sets one field from its text (see the synopsis for names and units); throws naming both.
inline void set_device_field(Hardware& h, std::string_view key, const std::string& text) {
  constexpr const char* op = "sim::set_device_field";
  if (key == "name") {
    if (text.empty()) throw Error(op, "device field name: empty");
    h.name = text;
    return;
  }
  for (const auto& f : detail::device_fields()) {
    if (key != f.key) continue;
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v < 0 ||
        (f.integer && (v < 1 || v != std::floor(v) || v > 1e6)))
      throw Error(op, dtensor::detail::cat("device field ", key, " = '", text, "': need a finite number >= 0",
                                           f.integer ? " (a whole number >= 1)" : ""));
    if (f.number) h.*(f.number) = v * f.scale;
    else if (f.integer) h.*(f.integer) = int(v);
    else (h.*(f.link)).*(f.link_member) = v * f.scale;
    return;
  }
  std::string known;
  for (const auto& n : device_field_names()) known += " " + n;
  throw Error(op, dtensor::detail::cat("unknown device field '", key, "'; fields:", known));
}

/// The fields a device file may leave out (their defaults: the H100 SXM's).
inline bool optional_device_field(std::string_view key) {
  return key == "compute_scale" || key == "peak_fp8_tflops" || key == "sm_count" || key == "gemm_tile_m" ||
         key == "gemm_tile_n" || key == "gemm_overhead_us";
}

/// The compute_scale of torchtitan's 500 W HBM2e H100s, fitted (see the synopsis).
inline constexpr double h100_500w_compute_scale = 0.57;

/// A built-in device (see the synopsis for each).
inline Hardware device(std::string_view name) {
  Hardware h;  // H100 SXM
  if (name == "h100") return h;
  if (name == "h100-500w") {
    h.name = "h100-500w";
    h.hbm_bytes_per_second = 2.4e12;
    h.memory_bytes = 96e9;
    h.infiniband = {6e-6, 50e9};  // 400 Gb/s per GPU
    h.compute_scale = h100_500w_compute_scale;
    return h;
  }
  if (name == "h200") {
    h.name = "h200";
    h.hbm_bytes_per_second = 4.8e12;
    h.memory_bytes = 141e9;
    return h;
  }
  if (name == "a100") {
    h.name = "a100";
    h.peak_bf16_flops = 312e12;
    h.peak_fp32_flops = 19.5e12;
    h.peak_fp8_flops = 0;  // Ampere has no FP8 tensor cores
    h.hbm_bytes_per_second = 2.039e12;
    h.memory_bytes = 80e9;
    h.nvlink = {3e-6, 300e9};
    h.infiniband = {6e-6, 25e9};
    h.sm_count = 108;
    return h;
  }
  throw Error("sim::device",
              dtensor::detail::cat("unknown device '", name, "': h100, h200, a100 or h100-500w (or --device-file)"));
}

/// A device description from text: every field once (see the synopsis); `source` names it in errors.
inline Hardware parse_device(const std::string& text, std::string_view source) {
  constexpr const char* op = "sim::parse_device";
  Hardware h;
  std::vector<std::string> seen;
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    const auto trim = [](std::string s) {
      const auto b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
      return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
    };
    line = trim(line);
    if (line.empty()) continue;
    const auto eq = line.find('=');
    if (eq == std::string::npos)
      throw Error(op, dtensor::detail::cat(source, ":", number, ": '", line, "' is not 'field = value'"));
    const std::string key = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
    for (const auto& s : seen)
      if (s == key) throw Error(op, dtensor::detail::cat(source, ":", number, ": field ", key, " given twice"));
    try {
      set_device_field(h, key, value);
    } catch (const Error& e) {
      throw Error(op, dtensor::detail::cat(source, ":", number, ": ", e.what()));
    }
    seen.push_back(key);
  }
  std::string missing;
  for (const auto& n : device_field_names()) {
    bool found = false;
    for (const auto& s : seen) found = found || s == n;
    if (!found && !optional_device_field(n)) missing += " " + n;
  }
  if (!missing.empty()) throw Error(op, dtensor::detail::cat(source, ": missing device field(s):", missing));
  // A file that names no FP8 peak describes a device without FP8 tensor cores (not the H100's).
  if (std::find(seen.begin(), seen.end(), "peak_fp8_tflops") == seen.end()) h.peak_fp8_flops = 0;
  h.check(op);
  return h;
}

inline Hardware read_device_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("sim::read_device_file", dtensor::detail::cat("cannot read device file '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  return parse_device(text.str(), path);
}

/// The description as a file (parse_device reads it back).
inline std::string to_device_file(const Hardware& h) {
  std::ostringstream s;
  s << "name = " << h.name << "\npeak_bf16_tflops = " << h.peak_bf16_flops / 1e12
    << "\npeak_fp32_tflops = " << h.peak_fp32_flops / 1e12 << "\npeak_fp8_tflops = " << h.peak_fp8_flops / 1e12
    << "\nhbm_gbytes_per_s = " << h.hbm_bytes_per_second / 1e9 << "\nmemory_gbytes = " << h.memory_bytes / 1e9
    << "\nnvlink_domain = " << h.gpus_per_node << "\nnvlink_gbytes_per_s = " << h.nvlink.bytes_per_second / 1e9
    << "\nnvlink_latency_us = " << h.nvlink.latency_seconds / 1e-6
    << "\nnetwork_gbps = " << h.infiniband.bytes_per_second * 8 / 1e9
    << "\nnetwork_latency_us = " << h.infiniband.latency_seconds / 1e-6 << "\ncompute_scale = " << h.compute_scale
    << "\nsm_count = " << h.sm_count << "\ngemm_tile_m = " << h.gemm_tile_m << "\ngemm_tile_n = " << h.gemm_tile_n
    << "\ngemm_overhead_us = " << h.gemm_overhead_seconds / 1e-6 << "\n";
  return s.str();
}

}  // namespace dtensor::sim
