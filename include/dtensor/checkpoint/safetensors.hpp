// dtensor/checkpoint/safetensors.hpp — a model's parameters to and from safetensors files, from
// any placement, every rank writing and reading only its own boxes.
//
//   auto slots = checkpoint::parameter_slots(model.units(), mesh);   // or fsdp_parameter_slots
//   checkpoint::export_safetensors("model.safetensors", mesh, slots);   // one file, whole tensors
//   checkpoint::import_safetensors("model.safetensors", mesh, slots);   // or "model.safetensors.index.json"
//
// Export is collective over the mesh: the ranks all-gather the names and shapes of their slots
// (so that pipeline stages holding different parameters write one file), every rank computes
// the same header (tensors in name order, the slots' dtype), rank 0 creates the file at its
// final size, and every rank writes the boxes it is the writer of (slots.hpp: replicated pieces
// once) at their byte ranges. The result is a plain safetensors file: whole tensors, readable
// by Python's safetensors / torch (safetensors.torch.load_file). The ranks' boxes must tile each
// tensor exactly; a gap (a writer missing) is an error naming the tensor.
// Import reads, on each rank, the byte ranges of its own slots' boxes (read_box), from one file
// or from the files an index (`*.index.json`, Hugging Face's sharded layout) maps each name to,
// converting F64/F32/BF16 to the slots' type. A tensor missing or of another shape is an error
// naming it and both shapes. `rename` maps a slot's name to the file's (e.g. to another
// library's names); Hugging Face's GPT-2 and Llama need more than renaming (GPT-2's Conv1D
// weights are transposed, q, k, v fused or split): models/hf_checkpoint.hpp maps them.
// Errors on any rank are agreed on (checkpoint/detail/agree.hpp): every rank throws the same.
// Every tensor's checksum goes into the header's __metadata__ (each rank hashing what it writes,
// safetensors_format.hpp); import verifies each (the ranks sharing the work: every tensor read
// whole once) and refuses a file whose data no longer match, naming the file and the tensor.
// The file is written as PATH.partial, synced and renamed: a failed write leaves nothing at PATH.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dtensor/checkpoint/detail/agree.hpp"
#include "dtensor/checkpoint/safetensors_format.hpp"
#include "dtensor/checkpoint/slots.hpp"

namespace dtensor::checkpoint {

struct SafetensorsOptions {
  std::function<std::string(const std::string&)> rename{};    // slot name -> name in the file
  std::map<std::string, std::string> metadata{{"format", "pt"}};  // export: the header's __metadata__
  /// import: a tensor of the file that no slot of any rank reads is an error (a 3-layer file
  /// loaded into 2 layers must not drop h.2.* silently) unless this says it may stay unread:
  /// a partial load, asked for by name.
  std::function<bool(const std::string&)> may_leave_unread{};
};

namespace detail {

inline std::string mapped(const SafetensorsOptions& o, const std::string& name) { return o.rename ? o.rename(name) : name; }

/// Renames a written and synced `partial` to `path` and syncs the directory, so that the file
/// appears whole or not at all; on failure removes `partial` and throws naming both.
inline void commit_file(const std::filesystem::path& partial, const std::filesystem::path& path, const char* op) {
  std::error_code ec;
  std::filesystem::rename(partial, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    throw Error(op, dtensor::detail::cat("cannot rename ", partial.string(), " to ", path.string(), ": ", ec.message()));
  }
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {  // best effort: the rename's own durability; the data was synced before it
    (void)::fsync(fd);
    ::close(fd);
  }
}

/// Every rank's text, gathered on every rank (lengths first, then the texts padded to the longest).
inline std::vector<std::string> all_gather_text(Communicator& comm, const std::string& mine) {
  const std::int64_t n = std::int64_t(mine.size());
  std::vector<std::int64_t> sizes(std::size_t(comm.size()));
  comm.all_gather(std::span<const std::int64_t>(&n, 1), std::span<std::int64_t>(sizes));
  const std::int64_t longest = std::max<std::int64_t>(1, *std::max_element(sizes.begin(), sizes.end()));
  std::vector<std::uint8_t> send(std::size_t(longest), 0), all(std::size_t(longest) * sizes.size());
  std::copy(mine.begin(), mine.end(), send.begin());
  comm.all_gather(std::span<const std::uint8_t>(send), std::span<std::uint8_t>(all));
  std::vector<std::string> out;
  for (std::size_t r = 0; r < sizes.size(); ++r)
    out.emplace_back(reinterpret_cast<const char*>(all.data() + r * std::size_t(longest)), std::size_t(sizes[r]));
  return out;
}

}  // namespace detail

namespace detail {

/// Every rank's slots' tensors (name in the file, shape), gathered and checked: one shape per
/// name, and the ranks' writers covering each tensor's elements exactly. In name order.
template <class T>
std::vector<std::pair<std::string, std::vector<Extent>>> gathered_tensors(Communicator& comm, const char* op,
                                                                         const Slots<T>& slots, const SafetensorsOptions& o) {
  // "name \t e0,e1,.. \t elements this rank writes \n" per slot.
  std::string mine;
  for (const auto& s : slots) {
    std::string dims;
    for (std::size_t d = 0; d < s.shape.size(); ++d) dims += (d ? "," : "") + std::to_string(s.shape[d]);
    mine += dtensor::detail::cat(mapped(o, s.name), "\t", dims, "\t", s.writer ? s.box.numel() : 0, "\n");
  }
  std::map<std::string, std::pair<std::vector<Extent>, Extent>> tensors;  // name -> shape, elements written
  std::string problem;
  for (const std::string& text : all_gather_text(comm, mine)) {
    std::size_t at = 0;
    while (at < text.size()) {
      const std::size_t end = text.find('\n', at), t1 = text.find('\t', at), t2 = text.find('\t', t1 + 1);
      const std::string name = text.substr(at, t1 - at), dims = text.substr(t1 + 1, t2 - t1 - 1);
      const Extent written = std::stoll(text.substr(t2 + 1, end - t2 - 1));
      std::vector<Extent> shape;
      for (std::size_t p = 0; p < dims.size();) {
        const std::size_t comma = std::min(dims.find(',', p), dims.size());
        shape.push_back(std::stoll(dims.substr(p, comma - p)));
        p = comma + 1;
      }
      auto [it, fresh] = tensors.emplace(name, std::make_pair(shape, Extent(0)));
      if (!fresh && it->second.first != shape && problem.empty())
        problem = dtensor::detail::cat("tensor '", name, "' is ", to_string(it->second.first), " on one rank and ",
                                       to_string(shape), " on another");
      it->second.second += written;
      at = end + 1;
    }
  }
  std::vector<std::pair<std::string, std::vector<Extent>>> list;
  for (const auto& [name, info] : tensors) {
    Extent numel = 1;
    for (Extent d : info.first) numel *= d;
    if (info.second != numel && problem.empty())
      problem = dtensor::detail::cat("tensor '", name, "' of ", to_string(info.first), ": the ranks' boxes cover ",
                                     info.second, " of its ", numel, " elements");
    list.emplace_back(name, info.first);
  }
  if (!problem.empty()) throw Error(op, problem, comm.rank());
  return list;
}

/// Writes files[i] holding the tensors groups[i] (each group's data packed in its order): rank 0
/// creates every file at its final size, then every rank writes its writer boxes at their byte
/// ranges in the file of their tensor. Collective.
template <class T>
void write_groups(Communicator& comm, const char* op, const std::vector<std::filesystem::path>& files,
                  const std::vector<std::vector<std::pair<std::string, std::vector<Extent>>>>& groups, const Slots<T>& slots,
                  const SafetensorsOptions& o) {
  struct Place {
    std::size_t file;
    std::uint64_t begin;  // absolute byte offset of the tensor's data
  };
  std::map<std::string, Place> place;
  std::vector<std::string> headers;
  std::vector<std::uint64_t> sizes;
  // Each tensor's checksum (safetensors_format.hpp): every rank hashes the elements it writes,
  // from memory; the ranks' partial sums, all-gathered, add up to the whole tensor's.
  std::map<std::string, std::size_t> index_of;
  for (const auto& group : groups)
    for (const auto& t : group) index_of.emplace(t.first, index_of.size());
  std::vector<std::uint64_t> part(index_of.size(), 0);
  for (const auto& s : slots) {
    if (!s.writer || s.box.empty()) continue;
    std::uint64_t& h = part[index_of.at(mapped(o, s.name))];
    safetensors::detail::for_each_run(s.shape, s.box, [&](Extent flat, Extent in_box, Extent count) {
      h += safetensors::hash_elements(s.data + in_box, sizeof(T), std::uint64_t(flat), std::uint64_t(count));
    });
  }
  std::vector<std::int64_t> mine(part.size()), all(part.size() * std::size_t(comm.size()), 0);
  for (std::size_t i = 0; i < part.size(); ++i) mine[i] = std::bit_cast<std::int64_t>(part[i]);
  if (!mine.empty()) comm.all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
  std::vector<std::uint64_t> sums(mine.size(), 0);
  for (std::size_t i = 0; i < all.size(); ++i) sums[i % mine.size()] += std::uint64_t(all[i]);
  for (std::size_t f = 0; f < groups.size(); ++f) {
    std::vector<std::uint64_t> begins;
    std::map<std::string, std::string> metadata = o.metadata;
    for (const auto& t : groups[f])
      metadata[std::string(safetensors::checksum_prefix) + t.first] = to_hex(sums[index_of.at(t.first)]);
    headers.push_back(safetensors::make_header(groups[f], safetensors::dtype_name<T>(), metadata, &begins));
    std::uint64_t total = 8 + headers.back().size();
    for (std::size_t i = 0; i < groups[f].size(); ++i) {
      place[groups[f][i].first] = {f, 8 + headers.back().size() + begins[i]};
      std::uint64_t numel = 1;
      for (Extent d : groups[f][i].second) numel *= std::uint64_t(d);
      total += numel * sizeof(T);
    }
    sizes.push_back(total);
  }
  agree(comm, op, dtensor::detail::error_of([&] {
    if (comm.rank() != 0) return;
    for (std::size_t f = 0; f < files.size(); ++f) {
      safetensors::detail::Fd fd(files[f], O_WRONLY | O_CREAT | O_TRUNC, op);
      const std::uint64_t n = headers[f].size();
      fd.write_at(&n, 8, 0, op);
      fd.write_at(headers[f].data(), headers[f].size(), 8, op);
      fd.resize(sizes[f], op);
      fd.sync(op);
    }
  }));
  agree(comm, op, dtensor::detail::error_of([&] {
    std::map<std::size_t, std::unique_ptr<safetensors::detail::Fd>> open;  // only the files this rank writes
    for (const auto& s : slots) {
      if (!s.writer || s.box.empty()) continue;
      const Place at = place.at(mapped(o, s.name));
      auto& fd = open[at.file];
      if (!fd) fd = std::make_unique<safetensors::detail::Fd>(files[at.file], O_WRONLY, op);
      safetensors::detail::for_each_run(s.shape, s.box, [&](Extent flat, Extent in_box, Extent count) {
        fd->write_at(s.data + in_box, std::size_t(count) * sizeof(T), at.begin + std::uint64_t(flat) * sizeof(T), op);
      });
    }
    for (auto& [f, fd] : open) fd->sync(op);
  }));
}

}  // namespace detail

/// Writes the slots' tensors (every rank's) as one safetensors file. Collective over the mesh.
template <class T, MeshType Mesh>
void export_safetensors(const std::filesystem::path& path, const Mesh& mesh, const Slots<T>& slots,
                        const SafetensorsOptions& o = {}) {
  constexpr const char* op = "checkpoint::export_safetensors";
  Communicator& comm = mesh.comm();
  comm.check_agreement(op, path.string());
  // Written under a temporary name, synced, then renamed: a write that fails (a full disk, whose
  // file rank 0 had already sized, header and all) leaves nothing loadable at `path`.
  const std::filesystem::path partial = path.string() + ".partial";
  try {
    detail::write_groups(comm, op, {partial}, {detail::gathered_tensors(comm, op, slots, o)}, slots, o);
  } catch (...) {
    std::error_code ec;
    if (comm.rank() == 0) std::filesystem::remove(partial, ec);
    throw;
  }
  detail::agree(comm, op, dtensor::detail::error_of([&] {
    if (comm.rank() == 0) detail::commit_file(partial, path, op);
  }));
}

/// Writes the slots' tensors as `files` safetensors files in `dir`, Hugging Face's sharded
/// layout: model-00001-of-0000M.safetensors ... (tensors in name order, cut where the bytes so
/// far reach i/M of the total, so the files are of about equal size; a tensor is never split)
/// and model.safetensors.index.json (weight_map: name -> file; metadata.total_size). Every rank
/// writes its own boxes into the files of their tensors. Returns the index's path, which
/// import_safetensors reads on any mesh. Collective over the mesh.
template <class T, MeshType Mesh>
std::filesystem::path export_safetensors_sharded(const std::filesystem::path& dir, const Mesh& mesh, const Slots<T>& slots,
                                                 int files, const SafetensorsOptions& o = {}) {
  constexpr const char* op = "checkpoint::export_safetensors_sharded";
  Communicator& comm = mesh.comm();
  comm.check_agreement(op, dir.string() + " " + std::to_string(files));
  if (files < 1 || files > 99999) throw Error(op, dtensor::detail::cat("files ", files, ": 1 to 99999"), comm.rank());
  const auto list = detail::gathered_tensors(comm, op, slots, o);
  std::uint64_t total = 0;
  std::vector<std::uint64_t> bytes;
  for (const auto& [name, shape] : list) {
    std::uint64_t numel = sizeof(T);
    for (Extent d : shape) numel *= std::uint64_t(d);
    bytes.push_back(numel);
    total += numel;
  }
  const int m = std::max(1, std::min<int>(files, int(list.size())));
  auto file_name = [&](int i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i + 1, m);
    return std::string(buf);
  };
  std::vector<std::filesystem::path> paths;
  std::vector<std::vector<std::pair<std::string, std::vector<Extent>>>> groups(static_cast<std::size_t>(m));
  std::string weight_map;
  std::uint64_t so_far = 0;
  for (std::size_t i = 0, g = 0; i < list.size(); ++i) {
    // Move to the next file once this one holds its share, keeping one tensor for each file left.
    while (g + 1 < std::size_t(m) && !groups[g].empty() &&
           (so_far * std::uint64_t(m) >= total * (g + 1) || list.size() - i <= std::size_t(m) - g - 1))
      ++g;
    groups[g].push_back(list[i]);
    so_far += bytes[i];
    weight_map += dtensor::detail::cat(weight_map.empty() ? "" : ",\n  ", dtensor::detail::json_string(list[i].first), ": \"",
                                       file_name(int(g)), "\"");
  }
  for (int i = 0; i < m; ++i) paths.push_back(dir / file_name(i));
  detail::agree(comm, op, dtensor::detail::error_of([&] {
    if (comm.rank() == 0) std::filesystem::create_directories(dir);
  }));
  detail::write_groups(comm, op, paths, groups, slots, o);
  const std::filesystem::path index = dir / "model.safetensors.index.json";
  detail::agree(comm, op, dtensor::detail::error_of([&] {
    if (comm.rank() != 0) return;
    const std::string text = dtensor::detail::cat("{\"metadata\": {\"total_size\": ", total, "},\n \"weight_map\": {\n  ",
                                                  weight_map, "\n }\n}\n");
    // The index last, and whole or not at all (temporary name, synced, renamed): it is what a
    // loader opens, so shards that failed to write are never reachable through it.
    const std::filesystem::path partial = index.string() + ".partial";
    {
      safetensors::detail::Fd fd(partial, O_WRONLY | O_CREAT | O_TRUNC, op);
      fd.write_at(text.data(), text.size(), 0, op);
      fd.resize(text.size(), op);
      fd.sync(op);
    }
    detail::commit_file(partial, index, op);
  }));
  return index;
}

/// Fills the slots from a safetensors file or an index of several (`*.index.json`). A tensor of
/// the file that no rank reads is an error naming it, unless o.may_leave_unread allows it.
/// Collective: the ranks gather the names they read, and agree on errors; each rank reads its
/// own boxes.
template <class T, MeshType Mesh>
void import_safetensors(const std::filesystem::path& path, const Mesh& mesh, Slots<T>& slots, const SafetensorsOptions& o = {}) {
  constexpr const char* op = "checkpoint::import_safetensors";
  Communicator& comm = mesh.comm();
  // Every name any rank reads (in the file's naming): what the file holds beyond them is unread.
  std::string mine;
  for (const auto& s : slots) mine += detail::mapped(o, s.name) + "\n";
  std::set<std::string> wanted;
  for (const std::string& text : detail::all_gather_text(comm, mine))
    for (std::size_t at = 0; at < text.size();) {
      const std::size_t end = text.find('\n', at);
      wanted.insert(text.substr(at, end - at));
      at = end + 1;
    }
  detail::agree(comm, op, dtensor::detail::error_of([&] {
    const bool indexed = path.string().ends_with(".index.json");
    std::map<std::string, std::filesystem::path> file_of;
    if (indexed) file_of = safetensors::read_index(path);
    std::map<std::filesystem::path, safetensors::FileInfo> headers;
    auto header = [&](const std::filesystem::path& file) -> const safetensors::FileInfo& {
      auto it = headers.find(file);
      if (it == headers.end()) it = headers.emplace(file, safetensors::read_header(file)).first;
      return it->second;
    };
    std::string missing;
    int missing_count = 0;
    for (auto& s : slots) {
      const std::string name = detail::mapped(o, s.name);
      std::filesystem::path file = path;
      if (indexed) {
        auto f = file_of.find(name);
        if (f == file_of.end()) {
          missing += (missing_count++ < 5 ? " '" + name + "'" : std::string());
          continue;
        }
        file = f->second;
      }
      const auto& info = header(file);
      auto t = info.tensors.find(name);
      if (t == info.tensors.end()) {
        missing += (missing_count++ < 5 ? " '" + name + "'" : std::string());
        continue;
      }
      if (t->second.shape != s.shape)
        throw Error(op, dtensor::detail::cat(file.string(), ": tensor '", name, "' is ", to_string(t->second.shape),
                                             ", the model's is ", to_string(s.shape)));
      safetensors::read_box(info, name, s.box, s.data);
    }
    if (missing_count > 0)
      throw Error(op, dtensor::detail::cat(path.string(), " lacks ", missing_count, " of the model's tensors:", missing,
                                           missing_count > 5 ? " ..." : ""));
    // The checksums of dtensor's writers (safetensors_format.hpp): each tensor read whole once in
    // all, by the rank its place among the names read falls to.
    std::size_t turn = 0;
    for (const auto& name : wanted) {
      if (turn++ % std::size_t(comm.size()) != std::size_t(comm.rank())) continue;
      std::filesystem::path file = path;
      if (indexed) {
        auto f = file_of.find(name);
        if (f == file_of.end()) continue;
        file = f->second;
      }
      if (header(file).tensors.count(name)) safetensors::verify_checksum(header(file), name);
    }
    if (comm.rank() != 0) return;  // the same verdict everywhere: one rank reads every header
    std::string unexpected;
    int unexpected_count = 0;
    auto look = [&](const std::string& name) {
      if (wanted.count(name) || (o.may_leave_unread && o.may_leave_unread(name))) return;
      unexpected += (unexpected_count++ < 5 ? " '" + name + "'" : std::string());
    };
    if (indexed) {
      for (const auto& [name, file] : file_of) look(name);
    } else {
      for (const auto& [name, t] : header(path).tensors) look(name);
    }
    if (unexpected_count > 0)
      throw Error(op, dtensor::detail::cat(path.string(), " holds ", unexpected_count,
                                           " tensors the model has no place for:", unexpected,
                                           unexpected_count > 5 ? " ..." : "",
                                           " (another model configuration, e.g. more layers? a partial load names "
                                           "what may stay unread: SafetensorsOptions::may_leave_unread)"));
  }));
}

}  // namespace dtensor::checkpoint
