// The cuda memory space and the one-GPU multi-rank communicator: allocation, copies in every
// direction, 2-D copies, fill, Tensor in cuda_space, the CUDA error path, and each collective of
// cuda_threads against the host threads backend (bit for bit: reductions are in rank order).
#include <catch2/catch.hpp>

#include <thread>
#include <vector>

#include "dtensor/comm/cuda_threads.cuh"
#include "dtensor/core/compare.hpp"
#include "dtensor/core/cuda_space.cuh"
#include "dtensor/core/factories.hpp"

using namespace dtensor;

// ---------------------------------------------------------------- without a GPU

TEST_CASE("a failed CUDA call becomes a dtensor::Error with the call, the code and the text", "[nogpu]") {
  try {
    DTENSOR_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL("no exception");
  } catch (const Error& e) {
    CHECK(e.backend_code() == int(cudaErrorInvalidValue));
    const std::string w = e.what();
    CHECK(w.find("cudaErrorInvalidValue") != std::string::npos);
    CHECK(w.find(cudaGetErrorString(cudaErrorInvalidValue)) != std::string::npos);
    CHECK(e.op() == "cudaErrorInvalidValue");
  }
}

TEST_CASE("without a device, allocating in cuda_space throws a dtensor::Error", "[nogpu]") {
  if (cuda::device_count() > 0) return;  // the no-device path only
  try {
    Tensor<float, 1, cuda_space> t(Shape<1>{16});
    FAIL("allocation without a device did not throw");
  } catch (const Error& e) {
    CHECK(e.backend_code() != 0);
    CHECK(std::string(e.what()).find("cudaMallocAsync") != std::string::npos);
  }
  CHECK_THROWS_AS(cuda_threads::run(2, [](CommPtr) {}), Error);
}

TEST_CASE("element access on a device tensor is a compile-time error", "[nogpu]") {
  // Tensor<float, 1, cuda_space> t; t[0];  -> "element access needs a host-accessible memory space"
  STATIC_REQUIRE(!cuda_space::host_accessible);
  STATIC_REQUIRE(MemorySpace<cuda_space>);
}

// ---------------------------------------------------------------- with a GPU

TEST_CASE("tensors round-trip between host and device", "[cuda]") {
  const auto h = arange<float>(Shape<2>{37, 53});
  auto d = to_space<cuda_space>(h);
  Tensor<float, 2, cuda_space> d2 = d;  // device-to-device copy
  CHECK(equal(to_space<host_space>(d2), h));
  Tensor<double, 3, cuda_space> z(Shape<3>{3, 4, 5});
  CHECK(equal(to_space<host_space>(z), zeros<double>(Shape<3>{3, 4, 5})));
  Tensor<bfloat16, 1, cuda_space> b = Tensor<bfloat16, 1, cuda_space>::uninitialized(Shape<1>{1000});
  cuda_space::fill(b.data(), 1000, bfloat16(2.5f));
  CHECK(equal(to_space<host_space>(b), full<bfloat16>(Shape<1>{1000}, bfloat16(2.5f))));
  Tensor<float, 1, cuda_space> empty(Shape<1>{0});
  CHECK(to_space<host_space>(empty).numel() == 0);
}

TEST_CASE("slices and boxes of device tensors match the host's", "[cuda]") {
  const auto h = arange<std::int32_t>(Shape<3>{5, 7, 9});
  const auto d = to_space<cuda_space>(h);
  for (std::size_t dim = 0; dim < 3; ++dim) {
    const auto want = h.slice(dim, 1, h.extent(dim) - 2);
    CHECK(equal(to_space<host_space>(d.slice(dim, 1, d.extent(dim) - 2)), want));
  }
  Tensor<std::int32_t, 3, cuda_space> out(Shape<3>{6, 8, 10});
  Tensor<std::int32_t, 3> host_out(Shape<3>{6, 8, 10});
  copy_box(d, Shape<3>{1, 2, 3}, out, Shape<3>{0, 1, 2}, Shape<3>{3, 4, 5});
  copy_box(h, Shape<3>{1, 2, 3}, host_out, Shape<3>{0, 1, 2}, Shape<3>{3, 4, 5});
  CHECK(equal(to_space<host_space>(out), host_out));
}

// Boxes of many slabs go to one slab_copy_kernel launch (core/box.hpp's copy_slabs), with the
// widest word every address, run and stride allows (2-byte words for bf16 at odd offsets, 16-byte
// words for double boxes whose runs and strides are even).
TEMPLATE_TEST_CASE("boxes of many slabs in device memory match the host's, every word width", "[cuda]",
                   bfloat16, std::int32_t, double) {
  using T = TestType;
  const auto h = arange<T>(Shape<4>{3, 5, 6, 8}, -100, 0.25);
  const auto d = to_space<cuda_space>(h);
  struct Box {
    Shape<4> from, to, ext;
  };
  for (const Box& b : {Box{{0, 0, 1, 0}, {0, 0, 0, 0}, {3, 5, 2, 8}},    // a head slice: 15 slabs of 2 x 8
                       Box{{1, 1, 0, 2}, {1, 0, 2, 1}, {2, 3, 4, 5}},    // odd runs and offsets
                       Box{{0, 2, 3, 4}, {2, 1, 0, 0}, {1, 3, 3, 4}}}) {  // 4-element runs
    Tensor<T, 4, cuda_space> out(Shape<4>{4, 6, 7, 9});
    Tensor<T, 4> host_out(Shape<4>{4, 6, 7, 9});
    copy_box(d, b.from, out, b.to, b.ext);
    copy_box(h, b.from, host_out, b.to, b.ext);
    CHECK(equal(to_space<host_space>(out), host_out));
  }
  for (std::size_t dim = 0; dim < 4; ++dim)
    CHECK(equal(to_space<host_space>(d.slice(dim, 1, h.extent(dim) - 1)), h.slice(dim, 1, h.extent(dim) - 1)));
}

namespace {
/// Runs the same collectives on the host threads backend and on cuda_threads; returns every
/// rank's outputs of each, to compare.
template <class T>
std::vector<std::vector<T>> collectives(bool on_gpu, int n) {
  std::vector<std::vector<T>> results(static_cast<std::size_t>(n));
  auto body = [&](CommPtr world) {
    const int r = world->rank(), k = world->size();
    std::vector<T> out;
    auto keep = [&](const std::vector<T>& v) { out.insert(out.end(), v.begin(), v.end()); };
    auto through = [&](std::vector<T> host, auto op) {  // host -> (device) -> op -> host
      if (!on_gpu) {
        op(host.data(), host.size());
        return host;
      }
      T* dev = static_cast<T*>(cuda_space::allocate(host.size() * sizeof(T)));
      cuda_space::copy(dev, host.data(), host.size() * sizeof(T));
      op(dev, host.size());
      cuda_space::copy(host.data(), dev, host.size() * sizeof(T));
      cuda_space::deallocate(dev, 0);
      return host;
    };
    const std::size_t m = 1000;  // above the host backend's eager limit for some types
    std::vector<T> mine(m), all(m * static_cast<std::size_t>(k));
    for (std::size_t i = 0; i < m; ++i) mine[i] = T(double((r * 7 + int(i)) % 13) - 6);
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = T(double((r * 5 + int(i)) % 11) - 5);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
      keep(through(mine, [&](T* p, std::size_t c) { world->all_reduce(std::span<T>(p, c), op); }));
      keep(through(all, [&](T* p, std::size_t c) {
        T* tmp = p + c - m;  // into the tail of the send buffer: exercises the overlap handling
        world->reduce_scatter(std::span<const T>(p, c), std::span<T>(tmp, m), op);
      }));
    }
    keep(through(all, [&](T* p, std::size_t) {
      world->all_gather(std::span<const T>(p + std::size_t(r) * m, m), std::span<T>(p, m * std::size_t(k)));
    }));
    keep(through(all, [&](T* p, std::size_t c) {
      T* dst = static_cast<T*>(on_gpu ? cuda_space::allocate(c * sizeof(T)) : host_space::allocate(c * sizeof(T)));
      world->all_to_all(std::span<const T>(p, c), std::span<T>(dst, c));
      if (on_gpu) {
        cuda_space::copy(p, dst, c * sizeof(T));
        cuda_space::deallocate(dst, 0);
      } else {
        host_space::copy(p, dst, c * sizeof(T));
        host_space::deallocate(dst, c * sizeof(T));
      }
    }));
    keep(through(mine, [&](T* p, std::size_t c) { world->broadcast(std::span<T>(p, c), k - 1); }));
    keep(through(mine, [&](T* p, std::size_t c) {
      T* recv = p;  // ring: send mine to the right, receive from the left into the same size
      T* sendbuf = static_cast<T*>(on_gpu ? cuda_space::allocate(c * sizeof(T)) : host_space::allocate(c * sizeof(T)));
      if (on_gpu) cuda_space::copy(sendbuf, p, c * sizeof(T));
      else host_space::copy(sendbuf, p, c * sizeof(T));
      world->send_recv(std::span<const T>(sendbuf, c), (r + 1) % k, std::span<T>(recv, c), (r + k - 1) % k);
      if (on_gpu) cuda_space::deallocate(sendbuf, 0);
      else host_space::deallocate(sendbuf, c * sizeof(T));
    }));
    // all_to_all_v: rank r sends j+1 elements to rank j.
    {
      const auto nk = static_cast<std::size_t>(k);  // not std::size_t(k): a vexing parse
      std::vector<std::size_t> sc(nk), sd(nk), rc(nk), rd(nk);
      std::size_t st = 0, rt = 0;
      for (int j = 0; j < k; ++j) {
        const auto u = std::size_t(j);
        sc[u] = u + 1;
        sd[u] = st;
        st += u + 1;
        rc[u] = std::size_t(r + 1);
        rd[u] = rt;
        rt += std::size_t(r + 1);
      }
      std::vector<T> src(all.begin(), all.begin() + long(st)), dst(rt);
      through(src, [&](T* p, std::size_t) {
        T* d = on_gpu ? static_cast<T*>(cuda_space::allocate(rt * sizeof(T))) : dst.data();
        world->all_to_all_v(std::span<const T>(p, st), std::span<const std::size_t>(sc), std::span<const std::size_t>(sd),
                            std::span<T>(d, rt), std::span<const std::size_t>(rc), std::span<const std::size_t>(rd));
        if (on_gpu) {
          cuda_space::copy(dst.data(), d, rt * sizeof(T));
          cuda_space::deallocate(d, 0);
        }
      });
      keep(dst);
    }
    results[std::size_t(r)] = std::move(out);
  };
  if (on_gpu) cuda_threads::run(n, body);
  else threads::run(n, body);
  return results;
}
}  // namespace

TEMPLATE_TEST_CASE("cuda_threads collectives equal the host threads backend's, bit for bit", "[cuda][comm]", float,
                   double, bfloat16, std::int32_t, std::int64_t) {
  for (int n : {1, 3, 4}) {
    INFO(n << " ranks");
    const auto host = collectives<TestType>(false, n);
    const auto gpu = collectives<TestType>(true, n);
    for (int r = 0; r < n; ++r) {
      REQUIRE(host[std::size_t(r)].size() == gpu[std::size_t(r)].size());
      CHECK(std::memcmp(host[std::size_t(r)].data(), gpu[std::size_t(r)].data(),
                        host[std::size_t(r)].size() * sizeof(TestType)) == 0);
    }
  }
}

TEST_CASE("cuda_threads: a failing rank releases the others, a timeout names the missing rank", "[cuda][comm]") {
  std::vector<std::exception_ptr> errs = cuda_threads::run_collect(3, [](CommPtr world) {
    Tensor<float, 1, cuda_space> x(Shape<1>{64});
    if (world->rank() == 1) throw Error("test", "rank 1 gives up");
    world->all_reduce(x.span(), ReduceOp::sum);
  });
  REQUIRE(errs.size() == 3);
  for (auto& e : errs) CHECK(e);
  // Rank 1 returns without the collective: rank 0 is released at once (the departure is seen,
  // as on the host threads backend), not after its timeout, and the message names rank 1.
  errs = cuda_threads::run_collect(2, [](CommPtr world) {
    world->set_timeout(std::chrono::milliseconds(20000));
    Tensor<float, 1, cuda_space> x(Shape<1>{64});
    if (world->rank() == 0) world->all_reduce(x.span(), ReduceOp::sum);
  });
  REQUIRE(errs[0]);
  try {
    std::rethrow_exception(errs[0]);
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(m.find("rank 1") != std::string::npos);
    CHECK(m.find("can never complete") != std::string::npos);
  }
  // A rank that is merely late: the timeout names the rank that did not arrive.
  errs = cuda_threads::run_collect(2, [](CommPtr world) {
    world->set_timeout(std::chrono::milliseconds(200));
    Tensor<float, 1, cuda_space> x(Shape<1>{64});
    if (world->rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    world->all_reduce(x.span(), ReduceOp::sum);
  });
  REQUIRE(errs[0]);
  try {
    std::rethrow_exception(errs[0]);
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("did not arrive") != std::string::npos);
  }
}

TEST_CASE("cuda_threads: a mesh's sub-groups and collective checks work with device buffers", "[cuda][comm]") {
  cuda_threads::run(4, [](CommPtr world) {
    world->set_check_collectives(true);  // fingerprints travel in host memory through the GPU backend
    REQUIRE(world->backend() == "cuda_threads");
    auto row = world->split(world->rank() / 2, world->rank());
    REQUIRE(row->backend() == "cuda_threads");
    const auto h = full<float>(Shape<1>{300}, float(world->rank()));
    auto d = to_space<cuda_space>(h);
    row->all_reduce(d.span(), ReduceOp::sum);
    const float want = world->rank() < 2 ? 1.f : 5.f;
    CHECK(equal(to_space<host_space>(d), full<float>(Shape<1>{300}, want)));
  });
}

TEST_CASE("cuda_threads: an in-place all-reduce of host memory (a gradient norm) reduces on the host", "[cuda][comm]") {
  // The first GPU run found this: the in-place temporary was device memory while the reduction of
  // host buffers runs on the host (segfault in every trainer step that clips gradients).
  cuda_threads::run(3, [](CommPtr world) {
    for (std::size_t n : {std::size_t(1), std::size_t(5000)}) {  // small and large sends
      std::vector<double> v(n, double(world->rank() + 1));
      world->all_reduce(std::span<double>(v), ReduceOp::sum);
      for (double x : v) REQUIRE(x == 6.0);
    }
  });
}
