// tests/cuda/cuda_skip.hpp — how a CUDA test program behaves on a machine without a GPU.
//
// Each main first runs the cases tagged [nogpu] (checks that need the CUDA runtime library but
// no device: error conversion, the no-device paths). Then, when no device is visible, it
// prints "SKIPPED: no CUDA device" and returns skip_code, which CTest counts as skipped
// (SKIP_RETURN_CODE in tests/cuda/CMakeLists.txt), not as failed. With a device it runs the rest.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

namespace dtensor::testing {

inline constexpr int skip_code = 77;

/// Number of visible devices; 0 without a GPU or a driver (the error is cleared).
inline int visible_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

/// Whether the current device has FP8 tensor cores (sm_89 or later); prints why not when it has not.
inline bool has_fp8_tensor_cores() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    std::printf("no FP8 case: the device's compute capability could not be read\n");
    return false;
  }
  if (major * 10 + minor >= 89) return true;
  std::printf("FP8 tensor cores need sm_89 or later; this GPU is sm_%d%d: FP8 case not run\n", major, minor);
  return false;
}

inline int skipped(const char* program) {
  std::printf("SKIPPED: no CUDA device (%s: the cases tagged [nogpu] ran; the GPU cases did not)\n", program);
  std::fflush(stdout);
  return skip_code;
}

}  // namespace dtensor::testing
