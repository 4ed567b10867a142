// bench_checkpoint — loading a checkpoint onto another layout: the time follows the bytes, not
// the product of saved and needed pieces.
//
//   bench_checkpoint [--benchmark_filter=load]
//
// A float32 tensor of 6 MiB ([6144, 256]) is saved as `old` pieces (Shard<0> over `old` ranks),
// and loaded as the `new` boxes of Shard<0> over `new` ranks (new = 3 old / 2: every new box
// overlaps one or two saved ones). One rank does both: slots may be any boxes, so it saves the
// old ranks' pieces and loads the new ranks' boxes in one call (the pieces all lie in one
// file; the plan and the reads are what a mesh of `new` ranks does together). Variants, each
// on the same bytes in the same run:
//   load            checkpoint::load of the new boxes: manifest, overlap plan, reads, checksums, copies
//   raw_read        pread of the whole data file into one buffer (the file system's part)
//   raw_read_fnv    the same plus FNV-1a over the bytes (what a load must at least do)
//   all_pairs_plan  only the plan, done the naive way: every needed box against every saved one
// With an all-pairs plan `load` would grow with old x new (4 x 6 .. 1024 x 1536 pieces: 24 .. 1.5 M
// pairs); with the overlap index it stays near raw_read_fnv. The file is in the page cache after
// the first iteration: this measures the library's work, not the disk.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "dtensor/checkpoint/load.hpp"
#include "dtensor/checkpoint/save.hpp"
#include "dtensor/comm/threads.hpp"

namespace {

namespace ckpt = dtensor::checkpoint;
using Mesh = dtensor::DeviceMesh<"x">;
constexpr dtensor::Extent rows = 6144, cols = 256;

std::filesystem::path dir_for(int pieces) {
  return std::filesystem::temp_directory_path() /
         ("dtensor-bench-ckpt-" + std::to_string(::getpid()) + "-" + std::to_string(pieces));
}

/// The boxes of Shard<0> over n ranks, over `data` (the whole tensor, row-major).
ckpt::Slots<float> shard_slots(const Mesh& mesh, int n, float* data) {
  ckpt::Slots<float> slots;
  for (int r = 0; r < n; ++r) {
    const auto range = dtensor::chunk_range(rows, n, r);
    if (range.size() == 0) continue;
    ckpt::add_slot(slots, mesh, "w", {rows, cols}, ckpt::Region{{range.begin, 0}, {range.size(), cols}},
                   data + range.begin * cols, dtensor::Layout<dtensor::Replicate>::desc);
  }
  return slots;
}

enum Variant { load, raw_read, raw_read_fnv, all_pairs_plan };

void run(benchmark::State& st, Variant v) {
  const int old_pieces = int(st.range(0)), new_boxes = old_pieces * 3 / 2;
  const auto dir = dir_for(old_pieces);
  std::vector<float> saved(std::size_t(rows * cols)), loaded(saved.size());
  for (std::size_t i = 0; i < saved.size(); ++i) saved[i] = float(i % 9973);
  ckpt::LoadStats stats;
  dtensor::threads::run(1, [&](dtensor::CommPtr world) {
    Mesh mesh(world, {1});
    if (!std::filesystem::exists(dir / ckpt::manifest_name))
      ckpt::save(dir, mesh, shard_slots(mesh, old_pieces, saved.data()), {}, {.max_piece_bytes = std::size_t(64) << 20});
    auto slots = shard_slots(mesh, new_boxes, loaded.data());
    const auto file = dir / "rank-00000.bin";
    std::vector<char> raw(std::filesystem::file_size(file));
    for (auto _ : st) {
      if (v == load) {
        ckpt::load(dir, mesh, slots, {}, &stats);
        benchmark::DoNotOptimize(loaded.data());
      } else if (v == all_pairs_plan) {
        const auto manifest = ckpt::read_manifest(dir);
        std::size_t overlaps = 0;
        for (const auto& s : slots)
          for (const auto& p : manifest.tensors.front().pieces) overlaps += !ckpt::intersect(p.box, s.box).empty();
        benchmark::DoNotOptimize(overlaps);
      } else {
        ckpt::detail::InFile in(file);
        in.read_at(0, raw.size(), raw.data());
        if (v == raw_read_fnv) benchmark::DoNotOptimize(ckpt::fnv1a64(raw.data(), raw.size()));
        benchmark::DoNotOptimize(raw.data());
      }
    }
  });
  if (v == load && loaded != saved) st.SkipWithError("loaded values differ from the saved ones");
  st.SetBytesProcessed(std::int64_t(st.iterations()) * rows * cols * std::int64_t(sizeof(float)));
  st.counters["old_pieces"] = old_pieces;
  st.counters["new_boxes"] = new_boxes;
  if (v == load) st.counters["overlaps"] = double(stats.candidates);
}

void BM_load(benchmark::State& st) { run(st, load); }
void BM_raw_read(benchmark::State& st) { run(st, raw_read); }
void BM_raw_read_fnv(benchmark::State& st) { run(st, raw_read_fnv); }
void BM_all_pairs_plan(benchmark::State& st) { run(st, all_pairs_plan); }

void pieces(benchmark::internal::Benchmark* b) {
  for (int p : {4, 16, 64, 256, 1024}) b->Arg(p);
  b->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_load)->Apply(pieces);
BENCHMARK(BM_raw_read)->Apply(pieces);
BENCHMARK(BM_raw_read_fnv)->Apply(pieces);
BENCHMARK(BM_all_pairs_plan)->Apply(pieces);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  for (int p : {4, 16, 64, 256, 1024}) std::filesystem::remove_all(dir_for(p));
  return 0;
}
