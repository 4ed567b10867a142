// test_package_gpu.cpp — links dtensor::nccl (with_cuda, with_mpi, with_nccl): the CUDA runtime,
// cuBLAS, NCCL and MPI reach the consumer through the system-dependency build module, with the
// components' defines. Needs no GPU.
#include <cstdio>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#if !defined(DTENSOR_HAS_NCCL) || !defined(DTENSOR_HAS_CUDA) || !defined(DTENSOR_HAS_MPI)
#error "dtensor::nccl did not bring DTENSOR_HAS_NCCL, DTENSOR_HAS_CUDA and DTENSOR_HAS_MPI"
#endif

int main() {
  int runtime = 0, cublas = 0, nccl = 0;
  cudaRuntimeGetVersion(&runtime);
  cublasGetProperty(MAJOR_VERSION, &cublas);
  const bool ok = ncclGetVersion(&nccl) == ncclSuccess && nccl > 0;
  std::printf("dtensor test_package (gpu): CUDA runtime %d, cuBLAS %d, NCCL %d: %s\n", runtime, cublas, nccl,
              ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
