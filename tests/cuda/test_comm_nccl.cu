// The NCCL backend, at the job's size (CTest: 1 rank, and 2 under mpirun): each collective on
// device and host buffers against values every rank can compute, the redistribution oracle
// suite (support/redistribute_cases.hpp) with pieces in cuda_space, split, batching of
// send/recv into a ring, and the error path. Checks are agreed on by all ranks (mpi_check.hpp).
#include <numeric>
#include <vector>

#include "dtensor/comm/nccl.cuh"
#include "dtensor/core/compare.hpp"
#include "dtensor/core/factories.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#include "mpi_check.hpp"
#include "support/redistribute_cases.hpp"

using namespace dtensor;
using namespace dtensor::testing;

namespace {
CommPtr& nccl_world() {
  static CommPtr w = nccl::world();
  return w;
}
template <class T>
Tensor<T, 1, cuda_space> device(const std::vector<T>& v) {
  auto t = Tensor<T, 1, cuda_space>::uninitialized(Shape<1>{Extent(v.size())});
  cuda_space::copy(t.data(), v.data(), v.size() * sizeof(T));
  return t;
}
template <class T>
std::vector<T> host(const Tensor<T, 1, cuda_space>& t) {
  std::vector<T> v(std::size_t(t.numel()));
  cuda_space::copy(v.data(), t.data(), t.bytes());
  return v;
}
/// Rank r's input: small integers, so sums are exact in every type.
template <class T>
std::vector<T> input(int r, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = T(double((r * 3 + int(i)) % 7) - 3);
  return v;
}
}  // namespace

TEST_CASE("nccl: type and op mapping", "[nogpu]") {
  CHECK(nccl::detail::datatype(DType::bfloat16) == ncclBfloat16);
  CHECK(nccl::detail::datatype(DType::int64) == ncclInt64);
  CHECK(nccl::detail::red_op(ReduceOp::avg) == ncclAvg);
  CHECK(nccl::detail::red_op(ReduceOp::min) == ncclMin);
}

TEMPLATE_TEST_CASE("nccl: collectives on device buffers", "[nccl]", float, double, bfloat16, std::int32_t) {
  auto world = nccl_world();
  const int r = world->rank(), k = world->size();
  const std::size_t n = 1000;
  using T = TestType;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
    auto x = device(input<T>(r, n));
    world->all_reduce(x.span(), op);
    std::vector<T> want = input<T>(0, n);
    for (int j = 1; j < k; ++j) {
      const auto in = input<T>(j, n);
      for (std::size_t i = 0; i < n; ++i) want[i] = reduce_pair(op, want[i], in[i]);
    }
    DTENSOR_MPI_CHECK(host(x) == want);
  }
  {
    auto x = device(input<T>(r, n));
    auto all = Tensor<T, 1, cuda_space>::uninitialized(Shape<1>{Extent(n) * k});
    world->all_gather(std::span<const T>(x.span()), all.span());
    std::vector<T> want;
    for (int j = 0; j < k; ++j) {
      const auto in = input<T>(j, n);
      want.insert(want.end(), in.begin(), in.end());
    }
    DTENSOR_MPI_CHECK(host(all) == want);
  }
  {
    auto big = device(input<T>(r, n * std::size_t(k)));
    auto mine = Tensor<T, 1, cuda_space>::uninitialized(Shape<1>{Extent(n)});
    world->reduce_scatter(std::span<const T>(big.span()), mine.span(), ReduceOp::sum);
    std::vector<T> want(n, T(0));
    for (int j = 0; j < k; ++j) {
      const auto in = input<T>(j, n * std::size_t(k));
      for (std::size_t i = 0; i < n; ++i) want[i] = T(want[i] + in[std::size_t(r) * n + i]);
    }
    DTENSOR_MPI_CHECK(host(mine) == want);
  }
  {
    auto s = device(input<T>(r, n * std::size_t(k)));
    auto d = Tensor<T, 1, cuda_space>::uninitialized(Shape<1>{Extent(n) * k});
    world->all_to_all(std::span<const T>(s.span()), d.span());
    std::vector<T> want;
    for (int j = 0; j < k; ++j) {
      const auto in = input<T>(j, n * std::size_t(k));
      want.insert(want.end(), in.begin() + long(std::size_t(r) * n), in.begin() + long(std::size_t(r + 1) * n));
    }
    DTENSOR_MPI_CHECK(host(d) == want);
  }
  {
    auto b = device(input<T>(r, n));
    world->broadcast(b.span(), k - 1);
    DTENSOR_MPI_CHECK(host(b) == input<T>(k - 1, n));
  }
}

TEST_CASE("nccl: host buffers are staged, async work and send_recv ring", "[nccl]") {
  auto world = nccl_world();
  const int r = world->rank(), k = world->size();
  std::vector<std::int64_t> h(5, r + 1);
  world->all_reduce(std::span<std::int64_t>(h), ReduceOp::sum);
  DTENSOR_MPI_CHECK(h == std::vector<std::int64_t>(5, std::int64_t(k) * (k + 1) / 2));
  auto x = device(input<float>(r, 4096));
  auto y = Tensor<float, 1, cuda_space>::uninitialized(Shape<1>{4096});
  Work w = world->send_recv_async(std::span<const float>(x.span()), (r + 1) % k, y.span(), (r + k - 1) % k);
  w.wait();
  DTENSOR_MPI_CHECK(host(y) == input<float>((r + k - 1) % k, 4096));
  world->set_check_collectives(true);  // fingerprints are host memory
  world->all_reduce(x.span(), ReduceOp::max);
  world->set_check_collectives(false);
  world->barrier();
}

TEST_CASE("nccl: every layout pair, pieces on the GPU", "[nccl][redistribute][oracle]") {
  auto world = nccl_world();
  auto f = collect([&](auto& report) { check_all_pairs<cuda_space>(DeviceMesh<"x">(world, {world->size()}), false, report); });
  DTENSOR_MPI_REQUIRE_NO_FAILURES(f);
  auto g = collect([&](auto& report) {
    check_all_pairs<cuda_space>(DeviceMesh<"dp", "tp">(world, {1, world->size()}), true, report);
  });
  DTENSOR_MPI_REQUIRE_NO_FAILURES(g);
  auto e = collect([&](auto& report) {
    check_other_element_types<cuda_space>(DeviceMesh<"dp", "tp">(world, {world->size(), 1}), report);
  });
  DTENSOR_MPI_REQUIRE_NO_FAILURES(e);
}

TEST_CASE("nccl: split gives working sub-groups", "[nccl]") {
  auto world = nccl_world();
  auto sub = world->split(world->rank() % 2, world->rank());
  DTENSOR_MPI_REQUIRE(sub != nullptr && sub->backend() == "nccl");
  auto x = device(std::vector<float>(64, 1.f));
  sub->all_reduce(x.span(), ReduceOp::sum);
  DTENSOR_MPI_CHECK(host(x) == std::vector<float>(64, float(sub->size())));
  auto none = world->split(-1, 0);
  DTENSOR_MPI_CHECK(none == nullptr);
}
