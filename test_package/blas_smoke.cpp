// test_package/blas_smoke.cpp — the consumer program of the blas component: dtensor::blas brings
// DTENSOR_HAS_CBLAS, cblas.h's folder and the BLAS library; the GEMM is checked against a loop.
#include <cblas.h>
#include <cstdio>

#ifndef DTENSOR_HAS_CBLAS
#error "dtensor::blas did not define DTENSOR_HAS_CBLAS"
#endif

int main() {
  const float a[6] = {1, 2, 3, 4, 5, 6};  // 2 x 3
  const float b[6] = {7, 8, 9, 10, 11, 12};  // 3 x 2
  float c[4] = {};
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2);
  const float want[4] = {58, 64, 139, 154};
  for (int i = 0; i < 4; ++i)
    if (c[i] != want[i]) {
      std::printf("dtensor smoke (blas): c[%d] = %g, expected %g\n", i, double(c[i]), double(want[i]));
      return 1;
    }
  return 0;
}
