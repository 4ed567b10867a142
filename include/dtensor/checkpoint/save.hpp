// dtensor/checkpoint/save.hpp — saving named boxes of global tensors from every rank, atomically.
//
//   auto slots = checkpoint::parameter_slots(model.units(), mesh);   // checkpoint/slots.hpp
//   checkpoint::save("ckpt", mesh, slots, {.step = 100, .data_position = 6400, .config = {...}});
//
// Collective over the mesh. Every rank writes the boxes it is the writer of (replicated ones
// once) to its own file, and the pieces' metadata to its own index; rank 0 merges the indexes
// into MANIFEST (format.hpp) once every rank's files are durable. The stages:
//
//   1. rank 0 checks that DIR is new, empty or a checkpoint (never a regular file or another
//      directory, which the commit would destroy), removes a stale DIR.partial (a save that
//      crashed) and creates it                                                     — agree
//   2. every rank writes DIR.partial/rank-R.bin and rank-R.idx, fsyncs both        — agree
//   3. rank 0 merges the indexes (checking that the pieces tile every tensor), writes MANIFEST,
//      fsyncs it and the directory                                                 — agree
//   4. rank 0 puts DIR.partial at DIR (detail/files.hpp)                           — agree
//
// "agree" is one all-gather of a 512-byte status per rank (detail/agree.hpp): a failure on any
// rank (an unwritable directory, a full disk, a Partial tensor) throws the same Error on all
// ranks, and DIR is untouched, so the previous checkpoint there stays loadable. A crash (the
// process killed) before the last rename leaves DIR as it was, plus a DIR.partial that the next
// save removes. Those four all-gathers are the only communication. Large boxes are cut into
// slabs of at most max_piece_bytes along dimension 0 (at the same global rows for every rank,
// so the pieces stay a product of per-dimension cuts, which keeps the overlap plan lean), each
// with its checksum: a load reads the slabs it needs, not whole pieces.
// Ranks must see one file system (threads; MPI on one machine or a shared file system).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/checkpoint/checksum.hpp"
#include "dtensor/checkpoint/detail/agree.hpp"
#include "dtensor/checkpoint/detail/files.hpp"
#include "dtensor/checkpoint/format.hpp"
#include "dtensor/checkpoint/slots.hpp"
#include "dtensor/core/dtype.hpp"

namespace dtensor::checkpoint {

struct SaveOptions {
  std::size_t max_piece_bytes = std::size_t(4) << 20;  // slabs of at most this (one row may be more)
  /// Tests: called before stage "data" (2) and "manifest" (3) on every rank, and before
  /// "commit" (the rename) on rank 0; a throw there is a failure of that rank at that point.
  std::function<void(std::string_view stage)> before_stage{};
};

namespace detail {

inline std::string rank_file(int rank, const char* ext) {
  char name[32];
  std::snprintf(name, sizeof name, "rank-%05d.%s", rank, ext);
  return name;
}

inline void check_meta(const TrainingMeta& meta) {
  // A step count read back negative is refused at load (format.hpp): refuse to write one.
  if (meta.step < 0 || meta.optimizer_steps < 0)
    throw Error("checkpoint::save", dtensor::detail::cat("step ", meta.step, ", optimizer steps ", meta.optimizer_steps,
                                                         ": step counts are never negative"));
  for (const auto& [k, v] : meta.config) {
    check_token("checkpoint::save", "config key", k);
    if (v.find_first_of("\r\n") != std::string::npos)
      throw Error("checkpoint::save", "config value of " + k + " has a line break");
  }
}

/// Writes this rank's pieces (its writer slots, cut into slabs) to `file`; returns its index.
template <class T>
Manifest write_pieces(const std::filesystem::path& file, const std::string& file_name, const Slots<T>& slots,
                      std::size_t max_piece_bytes) {
  Manifest index;
  std::map<std::string, std::size_t> seen;
  OutFile out(file);
  for (const auto& s : slots) {
    check_token("checkpoint::save", "tensor name", s.name);
    auto [it, fresh] = seen.emplace(s.name, index.tensors.size());
    if (fresh) index.tensors.push_back({s.name, std::string(name_of(dtype_of<T>)), s.shape, s.layout, {}});
    else if (index.tensors[it->second].shape != s.shape)
      throw Error("checkpoint::save", dtensor::detail::cat("tensor ", s.name, " given as ", to_string(s.shape), " and ",
                                                           to_string(index.tensors[it->second].shape)));
    if (!s.writer || s.box.empty()) continue;
    auto& pieces = index.tensors[it->second].pieces;
    Extent row = 1, global_row = 1;  // elements of one index of dimension 0 in the box, in the tensor
    for (std::size_t d = 1; d < s.box.rank(); ++d) row *= s.box.extent[d], global_row *= s.shape[d];
    const Extent rows_per_slab = std::max<Extent>(1, Extent(max_piece_bytes / sizeof(T)) / std::max<Extent>(1, global_row));
    const Extent first = s.box.rank() ? s.box.offset[0] : 0, end = s.box.rank() ? first + s.box.extent[0] : 1;
    for (Extent r = first; r < end;) {
      const Extent next = std::min(end, (r / rows_per_slab + 1) * rows_per_slab);
      PieceInfo p;
      p.file = file_name;
      p.box = s.box;
      if (p.box.rank()) p.box.offset[0] = r, p.box.extent[0] = next - r;
      const T* data = s.data + (r - first) * row;
      p.bytes = std::uint64_t(p.box.numel()) * sizeof(T);
      p.byte_offset = out.written();
      p.checksum = fnv1a64(data, std::size_t(p.bytes));
      out.write(data, std::size_t(p.bytes));
      pieces.push_back(std::move(p));
      r = next;
    }
  }
  out.sync_and_close();
  return index;
}

/// Index text of one rank: its tensors and pieces, sealed.
inline std::string serialize_index(const Manifest& index) {
  std::string s;
  for (const auto& t : index.tensors) s += tensor_line(t);
  for (const auto& t : index.tensors)
    for (const auto& p : t.pieces) s += piece_line(t.name, p);
  return sealed(std::move(s));
}

/// Rank 0: every rank's index into one manifest; throws unless the pieces of every tensor
/// cover it exactly once (the element counts add up and no two pieces overlap).
inline void merge_indexes(Manifest& m, const std::filesystem::path& staging, int ranks) {
  std::map<std::string, std::size_t> at;
  for (int r = 0; r < ranks; ++r) {
    const auto path = staging / rank_file(r, "idx");
    auto index = parse(read_text(path, "checkpoint::save"), path);
    for (auto& t : index.tensors) {
      auto [it, fresh] = at.emplace(t.name, m.tensors.size());
      if (fresh) {
        m.tensors.push_back(std::move(t));
        continue;
      }
      auto& known = m.tensors[it->second];
      if (known.shape != t.shape || known.dtype != t.dtype)
        throw Error("checkpoint::save", dtensor::detail::cat("tensor ", t.name, " is ", t.dtype, " ", to_string(t.shape),
                                                             " on rank ", r, " but ", known.dtype, " ", to_string(known.shape),
                                                             " on a lower rank"));
      for (auto& p : t.pieces) known.pieces.push_back(std::move(p));
    }
  }
  for (const auto& t : m.tensors) {
    Extent total = 1, held = 0;
    for (Extent e : t.shape) total *= e;
    std::vector<Region> boxes;
    for (const auto& p : t.pieces) held += p.box.numel(), boxes.push_back(p.box);
    std::size_t overlapping = 0;
    const OverlapIndex index(boxes);
    for (const auto& b : boxes) index.for_each_overlap(b, [&](std::size_t, const Region&) { ++overlapping; });
    if (held != total || overlapping != boxes.size())
      throw Error("checkpoint::save", dtensor::detail::cat("the pieces of tensor ", t.name, " ", to_string(t.shape), " (",
                                                           t.layout, ") hold ", held, " elements of ", total,
                                                           overlapping != boxes.size() ? ", some twice" : "",
                                                           ": did every rank pass its slots?"));
  }
}

}  // namespace detail

/// Throws unless `dir` may receive a checkpoint (it is new, an empty directory or a checkpoint).
/// The commit replaces `dir` whole, so a regular file, or a directory that holds files but no
/// manifest (--save-dir $HOME), would be silently destroyed. save checks it on rank 0 before
/// writing anything; a trainer may call it at start-up to fail before training.
inline void check_save_target(const std::filesystem::path& dir, const char* op = "checkpoint::save") {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto st = fs::status(dir, ec);
  if (!fs::exists(st)) return;
  if (!fs::is_directory(st))
    throw Error(op, dtensor::detail::cat("'", dir.string(), "' exists and is not a directory (",
                                         fs::is_regular_file(st) ? "a regular file" : "not a regular file either",
                                         "): a checkpoint would replace it; name a new or checkpoint directory"));
  if (fs::exists(dir / manifest_name, ec) || fs::is_empty(dir, ec)) return;
  throw Error(op, dtensor::detail::cat("'", dir.string(), "' is a directory that holds files but no checkpoint (no ",
                                       manifest_name, "): a checkpoint would replace it; name a new or checkpoint "
                                       "directory"));
}

/// Saves `slots` of every rank and `meta` into directory `dir` (see the top of this file).
template <class T, MeshType Mesh>
void save(const std::filesystem::path& dir, const Mesh& mesh, const Slots<T>& slots, const TrainingMeta& meta,
          const SaveOptions& o = {}) {
  const char* op = "checkpoint::save";
  Communicator& comm = mesh.comm();
  const int rank = comm.rank();
  const auto staging = detail::staging_path(dir);
  auto stage = [&](std::string_view name) {
    if (o.before_stage) o.before_stage(name);
  };
  auto clean_up = [&] {
    if (rank == 0) detail::error_of([&] { detail::remove_tree(staging, op); });
  };
  comm.check_agreement(op, staging.string());  // with the collective check on: one directory for all
  // 1. the staging directory
  detail::agree(comm, op, detail::error_of([&] {
    detail::check_meta(meta);
    if (o.max_piece_bytes < sizeof(T)) throw Error(op, dtensor::detail::cat("max_piece_bytes ", o.max_piece_bytes, " < one element"));
    if (rank != 0) return;
    check_save_target(dir, op);
    detail::remove_tree(staging, op);
    std::error_code ec;
    std::filesystem::create_directories(staging, ec);
    if (ec) throw Error(op, dtensor::detail::cat("cannot create ", staging.string(), ": ", ec.message()));
  }));
  auto agree_or_clean = [&](const std::string& e) {
    try {
      detail::agree(comm, op, e);
    } catch (...) {
      clean_up();
      throw;
    }
  };
  // 2. every rank's pieces and index, durable
  agree_or_clean(detail::error_of([&] {
    stage("data");
    const auto index = detail::write_pieces(staging / detail::rank_file(rank, "bin"), detail::rank_file(rank, "bin"), slots,
                                            o.max_piece_bytes);
    detail::OutFile idx(staging / detail::rank_file(rank, "idx"));
    idx.write(detail::serialize_index(index));
    idx.sync_and_close();
  }));
  // 3. the manifest, durable in the staging directory
  agree_or_clean(detail::error_of([&] {
    stage("manifest");
    if (rank != 0) return;
    Manifest m;
    m.meta = meta;
    for (std::size_t i = 0; i < Mesh::ndim; ++i) {
      m.mesh_names.emplace_back(Mesh::names[i]);
      m.mesh_shape.push_back(mesh.shape()[i]);
    }
    detail::merge_indexes(m, staging, comm.size());
    detail::OutFile manifest(staging / manifest_name);
    manifest.write(serialize(m));
    manifest.sync_and_close();
    detail::sync_directory(staging);
  }));
  // 4. the commit: one rename
  agree_or_clean(detail::error_of([&] {
    if (rank != 0) return;
    stage("commit");
    detail::replace_directory(staging, dir);
  }));
}

}  // namespace dtensor::checkpoint
