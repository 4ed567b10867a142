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
// library's names); no name map for Hugging Face's GPT-2 or Llama is built in (their layouts
// differ too: GPT-2's Conv1D weights are transposed, its q, k, v fused).
// Errors on any rank are agreed on (checkpoint/detail/agree.hpp): every rank throws the same.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dtensor/checkpoint/detail/agree.hpp"
#include "dtensor/checkpoint/safetensors_format.hpp"
#include "dtensor/checkpoint/slots.hpp"

namespace dtensor::checkpoint {

struct SafetensorsOptions {
  std::function<std::string(const std::string&)> rename{};    // slot name -> name in the file
  std::map<std::string, std::string> metadata{{"format", "pt"}};  // export: the header's __metadata__
};

namespace detail {

inline std::string mapped(const SafetensorsOptions& o, const std::string& name) { return o.rename ? o.rename(name) : name; }

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

/// Writes the slots' tensors (every rank's) as one safetensors file. Collective over the mesh.
template <class T, MeshType Mesh>
void export_safetensors(const std::filesystem::path& path, const Mesh& mesh, const Slots<T>& slots,
                        const SafetensorsOptions& o = {}) {
  constexpr const char* op = "checkpoint::export_safetensors";
  Communicator& comm = mesh.comm();
  comm.check_agreement(op, path.string());
  // "name \t e0,e1,.. \t elements this rank writes \n" per slot.
  std::string mine;
  for (const auto& s : slots) {
    std::string dims;
    for (std::size_t d = 0; d < s.shape.size(); ++d) dims += (d ? "," : "") + std::to_string(s.shape[d]);
    mine += dtensor::detail::cat(detail::mapped(o, s.name), "\t", dims, "\t", s.writer ? s.box.numel() : 0, "\n");
  }
  std::map<std::string, std::pair<std::vector<Extent>, Extent>> tensors;  // name -> shape, elements written
  std::string problem;
  for (const std::string& text : detail::all_gather_text(comm, mine)) {
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
  std::vector<std::uint64_t> begins;
  const std::string header = safetensors::make_header(list, safetensors::dtype_name<T>(), o.metadata, &begins);
  std::map<std::string, std::uint64_t> begin_of;
  for (std::size_t i = 0; i < list.size(); ++i) begin_of[list[i].first] = begins[i];
  const std::uint64_t data_start = 8 + header.size();
  // Rank 0 creates the file at its final size; then every rank writes its boxes into it.
  detail::agree(comm, op, dtensor::detail::error_of([&] {
    if (comm.rank() != 0) return;
    std::uint64_t total = 0;
    for (const auto& [name, shape] : list) {
      std::uint64_t numel = 1;
      for (Extent d : shape) numel *= std::uint64_t(d);
      total += numel * sizeof(T);
    }
    safetensors::detail::Fd fd(path, O_WRONLY | O_CREAT | O_TRUNC, op);
    const std::uint64_t n = header.size();
    fd.write_at(&n, 8, 0, op);
    fd.write_at(header.data(), header.size(), 8, op);
    fd.resize(data_start + total, op);
    fd.sync(op);
  }));
  detail::agree(comm, op, dtensor::detail::error_of([&] {
    bool any = false;
    for (const auto& s : slots) any = any || (s.writer && !s.box.empty());
    if (!any) return;
    safetensors::detail::Fd fd(path, O_WRONLY, op);
    for (const auto& s : slots) {
      if (!s.writer || s.box.empty()) continue;
      const std::uint64_t base = data_start + begin_of.at(detail::mapped(o, s.name));
      safetensors::detail::for_each_run(s.shape, s.box, [&](Extent flat, Extent in_box, Extent count) {
        fd.write_at(s.data + in_box, std::size_t(count) * sizeof(T), base + std::uint64_t(flat) * sizeof(T), op);
      });
    }
    fd.sync(op);
  }));
}

/// Fills the slots from a safetensors file or an index of several (`*.index.json`). Collective
/// only in agreeing on errors; each rank reads its own boxes.
template <class T, MeshType Mesh>
void import_safetensors(const std::filesystem::path& path, const Mesh& mesh, Slots<T>& slots, const SafetensorsOptions& o = {}) {
  constexpr const char* op = "checkpoint::import_safetensors";
  Communicator& comm = mesh.comm();
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
  }));
}

}  // namespace dtensor::checkpoint
