// dtensor/checkpoint/load.hpp — loading named boxes from a checkpoint saved on any mesh.
//
//   auto slots = checkpoint::parameter_slots(model.units(), mesh);   // the boxes this rank needs
//   checkpoint::LoadStats stats;
//   auto meta = checkpoint::load("ckpt", mesh, slots, {.config = expected}, &stats);
//
// Each rank reads MANIFEST, and for every slot finds the saved pieces that overlap its box
// through an OverlapIndex per tensor (region.hpp: O((L + C) log C), not all pairs), reads
// each such piece once (a slab of at most the save's max_piece_bytes, checked against its
// checksum) and copies the overlaps into place. The layout and mesh it was saved with do not
// matter: a piece is a box of the global tensor. What is checked, each a dtensor::Error that
// names the tensor (and the file and box where one is at fault):
//   - MANIFEST present and intact (its checksum); else DIR.previous when DIR is missing (a save
//     interrupted between its two renames, detail/files.hpp);
//   - the configuration equals `config` when given (every differing key listed);
//   - every slot's tensor is in the checkpoint with the same element type and extents;
//   - the pieces cover every needed box (a piece missing from MANIFEST or its file);
//   - every piece read is whole (a truncated file) and matches its checksum (corruption).
// The only communication is one all-gather of a status at the end (detail/agree.hpp), so every
// rank throws when any rank fails. On an error the slots may be partly overwritten: the
// checkpoint on disk is untouched, the in-memory state is not to be used.
#pragma once

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "dtensor/checkpoint/checksum.hpp"
#include "dtensor/checkpoint/detail/agree.hpp"
#include "dtensor/checkpoint/detail/files.hpp"
#include "dtensor/checkpoint/format.hpp"
#include "dtensor/checkpoint/slots.hpp"
#include "dtensor/core/dtype.hpp"

namespace dtensor::checkpoint {

struct LoadOptions {
  /// When set, the checkpoint's configuration must equal it (a resumed model must be the same).
  std::optional<std::map<std::string, std::string>> config{};
};

/// What one rank's load did.
struct LoadStats {
  std::size_t pieces_read = 0;    // saved pieces read (each once)
  std::uint64_t bytes_read = 0;   // their bytes
  std::uint64_t bytes_needed = 0; // the bytes of this rank's slots
  std::size_t candidates = 0;     // (slot, piece) overlaps found by the plan
};

/// The directory that holds the checkpoint saved at `dir`: `dir`, or DIR.previous when `dir`
/// is missing (see the top of this file).
inline std::filesystem::path resolve(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec) && std::filesystem::exists(detail::previous_path(dir) / manifest_name, ec))
    return detail::previous_path(dir);
  return dir;
}

/// The manifest of the checkpoint at resolve(dir).
inline Manifest read_manifest(const std::filesystem::path& dir) {
  std::error_code ec;
  const auto path = resolve(dir) / manifest_name;
  if (!std::filesystem::exists(path, ec))
    throw Error("checkpoint::load", dtensor::detail::cat("no checkpoint at ", dir.string(), ": ", path.string(), " is missing"));
  return parse(detail::read_text(path, "checkpoint::load"), path);
}

namespace detail {

inline void check_config(const std::map<std::string, std::string>& saved, const std::map<std::string, std::string>& want) {
  std::string diff;
  for (const auto& [k, v] : want) {
    const auto it = saved.find(k);
    if (it == saved.end()) diff += dtensor::detail::cat("; ", k, ": missing in the checkpoint, ", v, " here");
    else if (it->second != v) diff += dtensor::detail::cat("; ", k, ": ", it->second, " in the checkpoint, ", v, " here");
  }
  for (const auto& [k, v] : saved)
    if (!want.contains(k)) diff += dtensor::detail::cat("; ", k, ": ", v, " in the checkpoint, not set here");
  if (!diff.empty())
    throw Error("checkpoint::load", "the checkpoint was saved with another model configuration: " + diff.substr(2));
}

/// One overlap of a needed box with a saved piece.
struct Overlap {
  std::size_t tensor, piece, slot;
  Region common;
};

template <class T>
void load_slots(const std::filesystem::path& dir, const Manifest& m, Slots<T>& slots, LoadStats& stats) {
  const char* op = "checkpoint::load";
  std::map<std::string, std::size_t> by_name;
  for (std::size_t i = 0; i < m.tensors.size(); ++i) by_name.emplace(m.tensors[i].name, i);
  std::map<std::size_t, OverlapIndex> indexes;  // only the tensors this rank needs
  std::vector<Overlap> overlaps;
  for (std::size_t s = 0; s < slots.size(); ++s) {
    auto& slot = slots[s];
    const auto it = by_name.find(slot.name);
    if (it == by_name.end()) throw Error(op, dtensor::detail::cat("tensor ", slot.name, " is not in the checkpoint at ", dir.string()));
    const auto& t = m.tensors[it->second];
    if (t.dtype != name_of(dtype_of<T>) || t.shape != slot.shape)
      throw Error(op, dtensor::detail::cat("tensor ", slot.name, " is ", t.dtype, " ", to_string(t.shape), " in the checkpoint, ",
                                           name_of(dtype_of<T>), " ", to_string(slot.shape), " here"));
    auto index = indexes.find(it->second);
    if (index == indexes.end()) {
      std::vector<Region> boxes;
      for (const auto& p : t.pieces) {
        if (p.box.rank() != t.shape.size() || !contains(Region{std::vector<Extent>(t.shape.size(), 0), t.shape}, p.box) ||
            p.bytes != std::uint64_t(p.box.numel()) * sizeof(T))
          throw Error(op, dtensor::detail::cat("tensor ", t.name, ": piece ", to_string(p.box), " in ", p.file, " of ", p.bytes,
                                               " bytes does not fit the tensor ", to_string(t.shape)));
        boxes.push_back(p.box);
      }
      index = indexes.emplace(it->second, OverlapIndex(std::move(boxes))).first;
    }
    Extent covered = 0;
    index->second.for_each_overlap(slot.box, [&](std::size_t piece, const Region& common) {
      covered += common.numel();
      overlaps.push_back({it->second, piece, s, common});
    });
    if (covered != slot.box.numel())
      throw Error(op, dtensor::detail::cat("tensor ", slot.name, ": the checkpoint's pieces cover ", covered, " of the ",
                                           slot.box.numel(), " elements of box ", to_string(slot.box),
                                           " (a piece is missing)"));
    stats.bytes_needed += std::uint64_t(slot.box.numel()) * sizeof(T);
  }
  stats.candidates += overlaps.size();
  // Read each piece once, in file order.
  std::sort(overlaps.begin(), overlaps.end(), [&](const Overlap& a, const Overlap& b) {
    const auto &pa = m.tensors[a.tensor].pieces[a.piece], &pb = m.tensors[b.tensor].pieces[b.piece];
    return std::tie(pa.file, pa.byte_offset) < std::tie(pb.file, pb.byte_offset);
  });
  std::map<std::string, InFile> files;
  std::vector<T> buffer;
  for (std::size_t i = 0; i < overlaps.size();) {
    const auto& t = m.tensors[overlaps[i].tensor];
    const auto& p = t.pieces[overlaps[i].piece];
    auto file = files.find(p.file);
    if (file == files.end()) {
      check_token(op, "file name", p.file);
      if (p.file.find('/') != std::string::npos) throw Error(op, "tensor " + t.name + ": piece file " + p.file + " is not in the checkpoint");
      const auto path = dir / p.file;
      std::error_code ec;
      if (!std::filesystem::exists(path, ec))
        throw Error(op, dtensor::detail::cat("tensor ", t.name, ": file ", path.string(), " of piece ", to_string(p.box), " is missing"));
      file = files.emplace(p.file, InFile(path)).first;
    }
    buffer.resize(std::size_t(p.box.numel()));
    const std::size_t got = file->second.read_at(p.byte_offset, std::size_t(p.bytes), buffer.data());
    if (got != p.bytes)
      throw Error(op, dtensor::detail::cat("tensor ", t.name, ": piece ", to_string(p.box), " in ", file->second.path().string(),
                                           " is truncated: ", got, " of ", p.bytes, " bytes at offset ", p.byte_offset));
    if (fnv1a64(buffer.data(), std::size_t(p.bytes)) != p.checksum)
      throw Error(op, dtensor::detail::cat("tensor ", t.name, ": piece ", to_string(p.box), " in ", file->second.path().string(),
                                           " is corrupted (checksum mismatch)"));
    ++stats.pieces_read;
    stats.bytes_read += p.bytes;
    const auto& piece = overlaps[i];
    for (; i < overlaps.size() && overlaps[i].tensor == piece.tensor && overlaps[i].piece == piece.piece; ++i) {
      auto& slot = slots[overlaps[i].slot];
      copy_region(buffer.data(), p.box, slot.data, slot.box, overlaps[i].common, sizeof(T));
    }
  }
}

}  // namespace detail

/// Fills every slot of every rank from the checkpoint at `dir`; returns its metadata. Collective
/// over the mesh (one all-gather; see the top of this file).
template <class T, MeshType Mesh>
TrainingMeta load(const std::filesystem::path& dir, const Mesh& mesh, Slots<T>& slots, const LoadOptions& o = {},
                  LoadStats* stats = nullptr) {
  Manifest m;
  LoadStats mine;
  mesh.comm().check_agreement("checkpoint::load", dir.string());  // with the collective check on
  detail::agree(mesh.comm(), "checkpoint::load", detail::error_of([&] {
                  m = read_manifest(dir);
                  if (o.config) detail::check_config(m.meta.config, *o.config);
                  detail::load_slots(resolve(dir), m, slots, mine);
                }));
  if (stats) *stats = mine;
  return m.meta;
}

}  // namespace dtensor::checkpoint
