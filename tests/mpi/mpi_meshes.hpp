// tests/mpi/mpi_meshes.hpp — the mesh shapes an MPI test program covers at the job's size.
//
//   for (auto s : mesh_shapes<2>(world->size())) check(DeviceMesh<"dp", "tp">(world, s));
//
// Every factorization of the job's size into N dimensions of at least 2 each: at 4 ranks
// (4) and (2, 2); at 8 ranks (8), (2, 4), (4, 2) and (2, 2, 2). The same program thus tests
// more meshes when CTest runs it with more ranks.
#pragma once

#include <array>
#include <cstddef>
#include <vector>

namespace dtensor::testing {

template <std::size_t N>
std::vector<std::array<int, N>> mesh_shapes(int n) {
  std::vector<std::array<int, N>> out;
  if constexpr (N == 1) {
    out.push_back({n});
  } else {
    for (int first = 2; first <= n / 2; ++first)
      if (n % first == 0)
        for (const auto& rest : mesh_shapes<N - 1>(n / first)) {
          if (rest[0] < 2) continue;
          std::array<int, N> s{first};
          for (std::size_t i = 0; i + 1 < N; ++i) s[i + 1] = rest[i];
          out.push_back(s);
        }
  }
  return out;
}

}  // namespace dtensor::testing
