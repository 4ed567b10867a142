// The ops on cuda_space DTensors: each op dispatches to kernels/cuda (kernels/dispatch.hpp) and
// must give the host op's pieces on every rank (2 ranks of the threads backend sharing the GPU,
// uneven extents), within the kernels' tolerances (test_kernels_cuda.cu): float rtol 1e-4.
#include <catch2/catch.hpp>

#include <string>

#include "cuda_skip.hpp"
#include "dtensor/comm/cuda_threads.cuh"
#include "dtensor/core/compare.hpp"
#include "dtensor/core/cuda_space.cuh"
#include "dtensor/dtensor.hpp"
#include "dtensor/mesh/cuda_mesh.cuh"
#include "dtensor/nn/fp8_cuda.cuh"  // registers the GPU's FP8 Linear kernels
#include "dtensor/nn/linear.hpp"
#include "dtensor/ops/all.hpp"
#include "dtensor/parallel/tensor_parallel.hpp"
#include "support/on_ranks.hpp"

using namespace dtensor;
using namespace dtensor::testing;

namespace {
using Mesh1 = DeviceMesh<"tp">;

/// The cuda twin of a host DTensor (same mesh, extents, layout; the piece copied to the GPU).
template <class X>
auto to_cuda(const X& x) {
  return DTensor<typename X::value_type, X::rank, typename X::mesh_type, typename X::layout, cuda_space>(
      x.mesh(), x.shape(), to_space<cuda_space>(x.to_local()));
}

/// "" when the cuda op's piece matches the host op's piece.
template <class C, class H>
std::string close(const char* what, const C& c, const H& h, double rtol = 1e-4) {
  static_assert(std::is_same_v<typename C::layout, typename H::layout>, "the cuda op must give the host op's layout");
  if (c.shape() != h.shape()) return std::string(what) + ": extents " + to_string(c.shape()) + " vs " + to_string(h.shape());
  const auto r = compare(to_space<host_space>(c.to_local()), h.to_local(), {rtol, rtol * 1e-1});
  return r.ok ? "" : std::string(what) + ": " + r.message;
}
}  // namespace

TEST_CASE("ops on cuda DTensors match the host ops, piece by piece", "[cuda][ops]") {
  const auto failures = on_ranks(2, [](CommPtr world, auto report) {
    Mesh1 mesh(world, {2});
    const auto xh = distribute_replicated<Layout<Shard<0>>>(mesh, normal<float>(Shape<3>{5, 4, 16}, 1));
    const auto wh = distribute_replicated<Layout<Replicate>>(mesh, normal<float>(Shape<2>{12, 16}, 2));
    const auto gh = distribute_replicated<Layout<Replicate>>(mesh, normal<float>(Shape<1>{16}, 3, 1, 0.1));
    const auto x = to_cuda(xh);
    const auto w = to_cuda(wh);
    const auto g = to_cuda(gh);
    report(close("matmul", ops::matmul<false, true>(x, w), ops::matmul<false, true>(xh, wh)));
    report(close("gelu", ops::gelu(x), ops::gelu(xh)));
    report(close("add (broadcast)", ops::add(x, ops::sum<1>(x)), ops::add(xh, ops::sum<1>(xh))));
    report(close("softmax", ops::softmax(x), ops::softmax(xh)));
    report(close("layer_norm", ops::layer_norm(x, g, g).y, ops::layer_norm(xh, gh, gh).y));
    report(close("max", ops::max<2>(x).values, ops::max<2>(xh).values));
    report(close("transpose", ops::transpose<1, 2>(x), ops::transpose<1, 2>(xh)));
    report(close("concat(split)", ops::concat<2>(ops::split<2>(x, {5, 11})), ops::concat<2>(ops::split<2>(xh, {5, 11}))));
    const auto qh = distribute_replicated<Layout<Shard<1>>>(mesh, normal<float>(Shape<4>{2, 3, 7, 8}, 4));
    const auto q = to_cuda(qh);
    const auto a = ops::attention(q, q, q);
    const auto ah = ops::attention(qh, qh, qh);
    report(close("attention", a.out, ah.out));
    report(close("attention_backward dq", ops::attention_backward(a.out, q, q, q, a.out, a.stats).dq,
                 ops::attention_backward(ah.out, qh, qh, qh, ah.out, ah.stats).dq));
    Tensor<std::int32_t, 2> idv(Shape<2>{5, 4});
    for (Extent i = 0; i < idv.numel(); ++i) idv[i] = std::int32_t(i % 12);
    const auto idsh = distribute_replicated<Layout<Shard<0>>>(mesh, idv);
    report(close("embedding", ops::embedding(w, to_cuda(idsh)), ops::embedding(wh, idsh)));
    const auto logitsh = distribute_replicated<Layout<Shard<0>>>(mesh, normal<float>(Shape<2>{5, 12}, 5));
    Tensor<std::int64_t, 1> tv(Shape<1>{5});
    for (Extent i = 0; i < 5; ++i) tv[i] = (3 * i) % 12;
    const auto targetsh = distribute_replicated<Layout<Shard<0>>>(mesh, tv);
    report(close("cross_entropy", ops::cross_entropy(to_cuda(logitsh), to_cuda(targetsh)).loss,
                 ops::cross_entropy(logitsh, targetsh).loss, 1e-6));  // float math: expf differs by an ulp
  });
  for (const auto& f : failures) FAIL_CHECK(f);
}

namespace {
/// One rank's FP8 Linear run over two steps (the second with 3x the input: quantized with the
/// first step's delayed scale): the pieces on the host, and the scales each GEMM used.
struct Fp8LinearRun {
  std::vector<Tensor<float, 3>> y, dx;
  std::vector<Tensor<float, 2>> dw;
  std::vector<float> scales;  // per step: x, W, dy
};
constexpr Extent fp8_b = 3, fp8_t = 5, fp8_in = 24, fp8_out = 20;  // k = 24: padded to 32 on the GPU

/// The column-parallel Linear (W over tp: its amax all-reduced there) on mesh, its tensors in Space.
template <class Space, class Mesh>
Fp8LinearRun fp8_linear_run(const Mesh& mesh) {
  const auto x_full = normal<float>(Shape<3>{fp8_b, fp8_t, fp8_in}, 31);
  const auto dy_full = normal<float>(Shape<3>{fp8_b, fp8_t, fp8_out}, 32);
  nn::Linear<float, Mesh, parallel::ColwiseParallel<>> lin("fc", mesh, fp8_in, fp8_out, 5,
                                                           {.bias = true, .init_std = 0.5});
  Fp8LinearRun r;
  for (int step = 0; step < 2; ++step) {
    auto xs = x_full;
    for (Extent i = 0; i < xs.numel(); ++i) xs[i] *= float(1 + 2 * step);
    auto x = distribute_replicated<typename decltype(lin)::InL>(mesh, to_space<Space>(xs));
    auto [y, saved] = lin.forward(x);
    r.scales.push_back(saved.fp8_sx);
    r.scales.push_back(saved.fp8_sw);
    auto dy = distribute_replicated<typename decltype(y)::layout>(mesh, to_space<Space>(dy_full));
    auto [dx, ctx] = lin.backward_input(std::move(saved), dy);
    r.scales.push_back(ctx.fp8_sdy);
    nn::zero_grad(lin);
    lin.backward_weight(std::move(ctx));
    r.y.push_back(to_space<host_space>(y.to_local()));
    r.dx.push_back(to_space<host_space>(dx.to_local()));
    r.dw.push_back(to_space<host_space>(lin.weight().grad_local()));
  }
  return r;
}
}  // namespace

TEST_CASE("nn::Linear under FP8 autocast on the GPU equals the host emulation", "[cuda][fp8]") {
  if (!testing::has_fp8_tensor_cores()) return;
  const nn::Fp8Autocast fp8(true, {.history = 2, .margin = 0});
  std::array<Fp8LinearRun, 2> host, gpu;
  threads::run(2, [&](CommPtr world) {
    DeviceMesh<"tp"> mesh(world, {2});
    host[std::size_t(world->rank())] = fp8_linear_run<host_space>(mesh);
  });
  cuda_threads::run(2, [&](CommPtr world) {
    CudaMesh<"tp"> mesh(world, {2});
    gpu[std::size_t(world->rank())] = fp8_linear_run<cuda_space>(mesh);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    // The amaxes are exact and their all-reduce is the host's: the same scales bit for bit.
    CHECK(gpu[r].scales == host[r].scales);
    CHECK(host[r].scales[3] == host[r].scales[0]);  // step 2 quantizes 3x with step 1's (delayed) scale
    // The same FP8 values; Hopper's FP8 accumulation keeps ~14 bits per promotion interval (1e-2).
    for (std::size_t step = 0; step < 2; ++step) {
      INFO("step " << step);
      const Tolerance t{1e-2, 1e-2};
      const auto y = compare(gpu[r].y[step], host[r].y[step], t), dx = compare(gpu[r].dx[step], host[r].dx[step], t),
                 dw = compare(gpu[r].dw[step], host[r].dw[step], t);
      INFO(y.message << " | " << dx.message << " | " << dw.message);
      CHECK((y.ok && dx.ok && dw.ok));
    }
  }
}
