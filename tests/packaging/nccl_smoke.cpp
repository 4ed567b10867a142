// tests/packaging/nccl_smoke.cpp — links dtensor::nccl (NCCL + the cuda and mpi components).
#include <cstdio>

#include <nccl.h>

#if !defined(DTENSOR_HAS_NCCL) || !defined(DTENSOR_HAS_CUDA) || !defined(DTENSOR_HAS_MPI)
#error "dtensor::nccl did not bring DTENSOR_HAS_NCCL, DTENSOR_HAS_CUDA and DTENSOR_HAS_MPI"
#endif

int main() {
  int version = 0;
  const bool ok = ncclGetVersion(&version) == ncclSuccess && version > 0;
  std::printf("dtensor nccl smoke test: NCCL %d: %s\n", version, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
