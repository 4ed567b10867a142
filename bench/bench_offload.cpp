// bench_offload — AdamW's step with its moments in memory against the same step with them in a
// file (optim::OffloadedAdamW: ZeRO-Infinity's optimizer-state offload), and the file system's
// own bandwidth on the same bytes.
//
//   bench_offload [--benchmark_filter=offloaded]      # DTENSOR_OFFLOAD_DIR=/local/nvme (default: the temp dir)
//
// One rank, one fp32 parameter of n elements (moments 8n bytes), gradient fixed. Variants:
//   in_memory/n             optim::AdamW::step (the moments in host memory)
//   offloaded/n/buffer_kib  OffloadedAdamW::step through a host buffer of buffer_kib KiB (two
//                           halves: read-ahead of chunk i+1 and write-behind of chunk i-1 while
//                           chunk i is updated). Counters: io_MBps (the reads' and writes' bytes
//                           over their own time), hidden (the share of that I/O time the update
//                           hid: OffloadStats::overlap), wait_ms (per step, the I/O not hidden)
//   file_rw/n               pwrite then pread of the 8n bytes in one call each, no update: the
//                           bandwidth the file system gives this size (MBps)
//   params/ranks            a ZeRO-3 GPT step (forward, backward, reduce-scatter, clipping, AdamW,
//                           the write-behind) over `ranks` threads with the master shards in memory
//                           and in mapped files (FsdpOptions::offload_params_dir), in the same run.
//                           Counters: memory_ms and offload_ms (per step, rank 0), io_ms (pwrite +
//                           pread of what a step moves: the rank's master bytes 4 times, ZeRO-
//                           Infinity's update read and write, forward and backward reads), hidden
//                           (1 - (offload_ms - memory_ms) / io_ms, clamped to [0, 1]: the share of
//                           that I/O the step did not pay for)
//   activations/0|1         a GPT's forward + backward (one rank, fp32, 6 blocks of dim 256, 4
//                           sequences of 128) with its blocks' saved activations in memory (0) or
//                           written to a file after each block's forward and read back ahead of its
//                           backward (1: nn::ActivationOffload). Counters: saved_MiB (per step, what
//                           went to disk), io_MBps, hidden (ActivationOffloadStats::hidden), wait_ms
// The file is rewritten every step, so unless the moments exceed the free RAM the page cache
// holds it: on a small model this measures the kernel's copy, not the disk (docs/offload.md).
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "dtensor/comm/threads.hpp"
#include "dtensor/models/gpt.hpp"
#include "dtensor/nn/activation_offload.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/optim/offload_adamw.hpp"
#include "dtensor/training.hpp"

namespace {

using namespace dtensor;
using Mesh = DeviceMesh<"x">;
using W = nn::Parameter<float, 1, Mesh, Layout<Replicate>>;

std::string offload_dir() {
  const char* d = std::getenv("DTENSOR_OFFLOAD_DIR");
  return d && *d ? d : std::filesystem::temp_directory_path().string();
}

const optim::AdamWOptions adamw{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

/// Runs body(params, world) on one rank with a parameter of n elements whose gradient is set.
template <class Body>
void with_parameter(Extent n, Body body) {
  threads::run(1, [&](CommPtr world) {
    Mesh mesh(world, {1});
    W w("w", mesh, Shape<1>{n}, nn::Init::normal(1, 0, 0.02));
    nn::ParamList<float, 1> ps;
    w.collect(ps);
    for (std::size_t i = 0; i < ps[0].grad.size(); ++i) ps[0].grad[i] = float(int(i % 17) - 8) * 1e-3f;
    *ps[0].has_grad = true;
    body(ps, *world);
  });
}

void in_memory(benchmark::State& st) {
  with_parameter(Extent(st.range(0)), [&](nn::ParamList<float, 1>& ps, Communicator&) {
    optim::AdamW<float, 1> opt(ps, adamw);
    for (auto _ : st) opt.step();
  });
  st.SetBytesProcessed(std::int64_t(st.iterations()) * st.range(0) * 16);  // p, g, m, v
}

void offloaded(benchmark::State& st) {
  with_parameter(Extent(st.range(0)), [&](nn::ParamList<float, 1>& ps, Communicator& world) {
    optim::OffloadedAdamW<float, 1> opt(ps, adamw, {.dir = offload_dir(), .host_buffer_bytes = std::size_t(st.range(1)) << 10},
                                        &world);
    opt.step();  // the first read of the reserved file
    const auto before = opt.stats();
    for (auto _ : st) opt.step();
    const auto& s = opt.stats();
    const double io = s.io_seconds - before.io_seconds, wait = s.wait_seconds - before.wait_seconds;
    const double bytes = double(s.bytes_read + s.bytes_written - before.bytes_read - before.bytes_written);
    st.counters["io_MBps"] = io > 0 ? bytes / io / 1e6 : 0;
    st.counters["hidden"] = io > 0 ? std::max(0.0, 1 - wait / io) : 1;
    st.counters["wait_ms"] = 1e3 * wait / double(st.iterations());
    st.counters["chunks"] = double(s.chunks);
  });
  st.SetBytesProcessed(std::int64_t(st.iterations()) * st.range(0) * 16);
}

void file_rw(benchmark::State& st) {
  const std::size_t bytes = std::size_t(st.range(0)) * 8;
  const std::string path = offload_dir() + "/dtensor-bench-offload." + std::to_string(::getpid()) + ".tmp";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    st.SkipWithError(("cannot create " + path).c_str());
    return;
  }
  std::vector<char> buf(bytes, 1);
  double seconds = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    bool ok = ::pwrite(fd, buf.data(), bytes, 0) == ssize_t(bytes);
    ok = ok && ::pread(fd, buf.data(), bytes, 0) == ssize_t(bytes);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!ok) {
      st.SkipWithError("short read or write");
      break;
    }
  }
  ::close(fd);
  ::unlink(path.c_str());
  st.counters["MBps"] = seconds > 0 ? 2.0 * double(bytes) * double(st.iterations()) / seconds / 1e6 : 0;
}

/// Seconds per step of a ZeRO-3 GPT over this rank's mesh, the master shards in `dir` (empty: in
/// memory), after one untimed step; `master_bytes`: this rank's master shard bytes.
double zero3_step_seconds(CommPtr world, int ranks, const std::string& dir, std::size_t& master_bytes) {
  using ShardedMesh = DeviceMesh<"dp", "fsdp", "tp">;
  using Model = models::GPT<float, ShardedMesh>;
  ShardedMesh mesh(world, {1, ranks, 1});
  constexpr Extent vocab = 96, seq = 64, batch = 8;
  Model model(mesh, {.vocab = vocab, .seq = seq, .dim = 256, .heads = 4, .layers = 4, .seed = 7});
  auto fsdp = parallel::fully_shard(model, mesh, {.stage = 3, .offload_params_dir = dir});
  master_bytes = 0;
  for (const auto& p : fsdp.params()) master_bytes += p.value.size() * sizeof(float);
  optim::AdamW<float, 3> opt(fsdp.params(), adamw);
  Tensor<std::int32_t, 2> ids(Shape<2>{batch, seq}), tgt(Shape<2>{batch, seq});
  for (Extent i = 0; i < ids.numel(); ++i) ids[i] = std::int32_t(i % vocab), tgt[i] = std::int32_t((i * 7) % vocab);
  using L = typename Model::Ids::layout;
  auto x = distribute_replicated<L>(mesh, ids), y = distribute_replicated<L>(mesh, tgt);
  auto step = [&] {
    opt.zero_grad();
    auto [loss, saved] = model.forward(x, y);
    model.backward(std::move(saved));
    fsdp.finish_gradient_sync();
    optim::clip_grad_norm(fsdp.params(), mesh, 1.0);
    opt.step();
    fsdp.sync_parameters();  // the write-behind (and nothing else at ZeRO-3)
    benchmark::DoNotOptimize(loss);
  };
  constexpr int steps = 4;
  step();
  world->barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) step();
  world->barrier();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
}

/// pwrite + pread of `bytes`, `passes` / 2 times each, in seconds (the file system's own time).
double file_seconds(std::size_t bytes, int passes) {
  const std::string path = offload_dir() + "/dtensor-bench-params." + std::to_string(::getpid()) + ".tmp";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return 0;
  std::vector<char> buf(bytes, 1);
  const auto t0 = std::chrono::steady_clock::now();
  bool ok = true;
  for (int p = 0; p < passes / 2; ++p) {
    ok = ok && ::pwrite(fd, buf.data(), bytes, 0) == ssize_t(bytes);
    ok = ok && ::pread(fd, buf.data(), bytes, 0) == ssize_t(bytes);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(fd);
  ::unlink(path.c_str());
  return ok ? s : 0;
}

void params(benchmark::State& st) {
  const int ranks = int(st.range(0));
  double memory = 0, offload = 0;
  std::size_t bytes = 0;
  for (auto _ : st) {
    threads::run(ranks, [&](CommPtr w) {
      std::size_t b = 0;
      const double m = zero3_step_seconds(w, ranks, "", b);
      const double d = zero3_step_seconds(w, ranks, offload_dir(), b);
      if (w->rank() == 0) memory += m, offload += d, bytes = b;
    });
  }
  const double n = double(st.iterations());
  const double io = file_seconds(bytes, 4);  // update read + write, forward and backward reads
  st.counters["memory_ms"] = 1e3 * memory / n;
  st.counters["offload_ms"] = 1e3 * offload / n;
  st.counters["io_ms"] = 1e3 * io;
  st.counters["hidden"] = io > 0 ? std::clamp(1 - (offload - memory) / n / io, 0.0, 1.0) : 1;
  st.counters["master_MiB"] = double(bytes) / (1 << 20);
}

void activations(benchmark::State& st) {
  using GMesh = DeviceMesh<"dp", "tp">;
  threads::run(1, [&](CommPtr world) {
    GMesh mesh(world, {1, 1});
    const models::GPTConfig cfg{
        .vocab = 64, .seq = 128, .dim = 256, .heads = 8, .layers = 6, .mlp_ratio = 4, .seed = 3};
    models::GPT<float, GMesh> model(mesh, cfg);
    std::shared_ptr<nn::ActivationOffload> off;
    if (st.range(0) == 1) {
      off = std::make_shared<nn::ActivationOffload>(nn::ActivationOffloadOptions{.dir = offload_dir()}, world.get());
      model.set_activation_offload(off);
    }
    Tensor<std::int32_t, 2> ids(Shape<2>{4, cfg.seq});
    for (Extent i = 0; i < ids.numel(); ++i) ids[i] = std::int32_t((i * 7) % cfg.vocab);
    const auto x = distribute_replicated<typename models::GPT<float, GMesh>::Ids::layout>(mesh, ids);
    auto step = [&] {
      auto [loss, saved] = model.forward(x, x);
      model.backward(std::move(saved));
      benchmark::DoNotOptimize(loss);
    };
    step();  // the file's regions reserved, the caches warm
    const nn::ActivationOffloadStats before = off ? off->stats() : nn::ActivationOffloadStats{};
    for (auto _ : st) step();
    if (off) {
      const auto& s = off->stats();
      const double io = s.io_seconds - before.io_seconds, wait = s.wait_seconds - before.wait_seconds;
      const double bytes = double(s.bytes_read + s.bytes_written - before.bytes_read - before.bytes_written);
      st.counters["saved_MiB"] = double(s.bytes_written - before.bytes_written) / double(st.iterations()) / (1 << 20);
      st.counters["io_MBps"] = io > 0 ? bytes / io / 1e6 : 0;
      st.counters["hidden"] = io > 0 ? std::max(0.0, 1 - wait / io) : 1;
      st.counters["wait_ms"] = 1e3 * wait / double(st.iterations());
    }
  });
}

// n = 4 M elements: 32 MiB of moments; buffers of 1 and 8 MiB (chunks of 64 K and 512 K elements).
BENCHMARK(in_memory)->Arg(4 << 20)->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK(offloaded)->Args({4 << 20, 1 << 10})->Args({4 << 20, 8 << 10})->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK(file_rw)->Arg(4 << 20)->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK(params)->ArgName("ranks")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(activations)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();
