// tests/packaging/cuda_smoke.cpp — links dtensor::cuda (a plain C++ file: the component's usage
// requirements put the CUDA runtime and cuBLAS on the include and link lines and define
// DTENSOR_HAS_CUDA). Needs no GPU: it asks the libraries for their versions only.
#include <cstdio>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#ifndef DTENSOR_HAS_CUDA
#error "dtensor::cuda did not define DTENSOR_HAS_CUDA"
#endif

int main() {
  int runtime = 0, cublas = 0, devices = 0;
  const bool ok = cudaRuntimeGetVersion(&runtime) == cudaSuccess && runtime > 0 &&
                  cublasGetProperty(MAJOR_VERSION, &cublas) == CUBLAS_STATUS_SUCCESS && cublas > 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;  // no GPU (or no driver) is fine here
  std::printf("dtensor cuda smoke test: CUDA runtime %d, cuBLAS %d, %d device(s): %s\n", runtime, cublas, devices,
              ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
