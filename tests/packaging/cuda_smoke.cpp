// tests/packaging/cuda_smoke.cpp — links dtensor::cuda (a plain C++ file: the component's usage
// requirements put the CUDA runtime and cuBLAS on the include and link lines). Needs no GPU.
#include <cstdio>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#ifndef DTENSOR_HAS_CUDA
#error "dtensor::cuda did not define DTENSOR_HAS_CUDA"
#endif

int main() {
  int runtime = 0, cublas = 0, devices = 0;
  cudaRuntimeGetVersion(&runtime);
  cublasGetProperty(MAJOR_VERSION, &cublas);
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  std::printf("dtensor cuda smoke test: CUDA runtime %d, cuBLAS %d, %d device(s): ok\n", runtime, cublas, devices);
  return 0;
}
