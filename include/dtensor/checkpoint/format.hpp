// dtensor/checkpoint/format.hpp — what a checkpoint directory holds, and its text manifest.
//
//   DIR/MANIFEST            the metadata (below), last line its checksum
//   DIR/rank-00003.bin      the pieces rank 3 wrote, one after the other (raw row-major elements)
//   DIR/rank-00003.idx      rank 3's tensors and pieces (MANIFEST repeats them; kept for inspection)
//
// MANIFEST, one record per line, fields separated by one space (docs/checkpoint.md):
//
//   dtensor-checkpoint 1
//   step 20                               data_position 640        optimizer_steps 20
//   rng 0123abcd                          (the caller's RNG state, hex; "-" when empty)
//   config dim 16                         (key, then the value: the rest of the line)
//   mesh 2 dp 2 tp 2                      (the saving mesh: dimensions, then name and size of each)
//   tensor h.0.attn.qkv.weight float64 2 48 16 (S(0), R)     (name, dtype, rank, extents, layout)
//   piece h.0.attn.qkv.weight rank-00001.bin 4096 3072 9f0c...e1 24 0 24 16   (tensor, file, byte
//                                         offset, bytes, FNV-1a of the bytes, box offset, box extents)
//   end 5be0...77                         (FNV-1a of every byte before this line)
//
// Names (tensors, config keys, mesh dimensions) have no whitespace; config values no line breaks.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "dtensor/checkpoint/checksum.hpp"
#include "dtensor/checkpoint/region.hpp"
#include "dtensor/core/error.hpp"

namespace dtensor::checkpoint {

inline constexpr int format_version = 1;
inline constexpr const char* manifest_name = "MANIFEST";

/// What a trainer keeps besides the tensors (the caller's values, written and read back as is).
struct TrainingMeta {
  std::int64_t step = 0;
  std::uint64_t data_position = 0;               // e.g. the next batch's index or a byte offset
  std::int64_t optimizer_steps = 0;              // the optimizer's step count (AdamW's bias correction)
  std::string rng_state{};                       // any bytes
  std::map<std::string, std::string> config{};   // the model's configuration, compared on resume
};

/// One saved box of a tensor: where its bytes are and their checksum.
struct PieceInfo {
  std::string file;
  std::uint64_t byte_offset = 0, bytes = 0;
  std::uint64_t checksum = 0;
  Region box;
};

struct TensorInfo {
  std::string name;
  std::string dtype;
  std::vector<Extent> shape;
  std::string layout;  // as the saving rank printed it: placements per mesh dimension
  std::vector<PieceInfo> pieces;
};

struct Manifest {
  TrainingMeta meta;
  std::vector<std::string> mesh_names;
  std::vector<int> mesh_shape;
  std::vector<TensorInfo> tensors;
};

namespace detail {

/// Throws unless s can be one field of a line: non-empty, no whitespace or control characters.
inline void check_token(const char* op, const char* what, const std::string& s) {
  bool ok = !s.empty();
  for (unsigned char c : s) ok = ok && c > ' ' && c != 127;
  if (!ok) throw Error(op, dtensor::detail::cat(what, " '", s, "' must be non-empty, without spaces or control characters"));
}

inline std::string hex_bytes(const std::string& s) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) out += {digits[c >> 4], digits[c & 15]};
  return out.empty() ? "-" : out;
}

inline std::string tensor_line(const TensorInfo& t) {
  std::string s = "tensor " + t.name + " " + t.dtype + " " + std::to_string(t.shape.size());
  for (Extent e : t.shape) s += " " + std::to_string(e);
  return s + " " + t.layout + "\n";
}

inline std::string piece_line(const std::string& tensor, const PieceInfo& p) {
  std::string s = dtensor::detail::cat("piece ", tensor, " ", p.file, " ", p.byte_offset, " ", p.bytes, " ", to_hex(p.checksum));
  for (Extent o : p.box.offset) s += " " + std::to_string(o);
  for (Extent e : p.box.extent) s += " " + std::to_string(e);
  return s + "\n";
}

/// The text with its closing "end <checksum>" line.
inline std::string sealed(std::string body) {
  return body + "end " + to_hex(fnv1a64(body.data(), body.size())) + "\n";
}

/// Reads fields off one line; every failure names the file and the line.
class LineReader {
 public:
  LineReader(std::string line, const std::filesystem::path& file, std::size_t number)
      : in_(line), line_(std::move(line)), file_(file), number_(number) {}
  std::string word() {
    std::string w;
    if (!(in_ >> w)) fail("a field is missing");
    return w;
  }
  template <class I>
  I integer() {
    const std::string w = word();
    std::size_t used = 0;
    I v{};
    try {
      if constexpr (std::is_unsigned_v<I>) {
        if (w.front() != '-') v = I(std::stoull(w, &used));
      } else {
        v = I(std::stoll(w, &used));
      }
    } catch (...) {
      used = 0;
    }
    if (used != w.size()) fail("'" + w + "' is not an integer");
    return v;
  }
  std::uint64_t hex() {
    const std::string w = word();
    std::size_t used = 0;
    std::uint64_t v = 0;
    try {
      v = std::stoull(w, &used, 16);
    } catch (...) {
      used = 0;
    }
    if (used != w.size() || w.size() != 16) fail("'" + w + "' is not a 16-digit checksum");
    return v;
  }
  /// The rest of the line after one space (may be empty).
  std::string rest() {
    std::string r;
    std::getline(in_, r);
    return r.empty() ? r : r.substr(1);
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw Error("checkpoint::load", dtensor::detail::cat(file_.string(), " line ", number_, " ('", line_, "'): ", why));
  }

 private:
  std::istringstream in_;
  std::string line_;
  const std::filesystem::path& file_;
  std::size_t number_;
};

inline std::string unhex(LineReader& r, const std::string& h) {
  if (h == "-") return {};
  std::string out;
  if (h.size() % 2) r.fail("odd number of hex digits");
  for (std::size_t i = 0; i < h.size(); i += 2) {
    const std::string byte = h.substr(i, 2);
    if (byte.find_first_not_of("0123456789abcdef") != std::string::npos) r.fail("'" + h + "' is not hex");
    out += char(std::stoi(byte, nullptr, 16));
  }
  return out;
}

}  // namespace detail

/// The whole MANIFEST text (sealed with its checksum).
inline std::string serialize(const Manifest& m) {
  std::string s = "dtensor-checkpoint " + std::to_string(format_version) + "\n";
  s += dtensor::detail::cat("step ", m.meta.step, "\ndata_position ", m.meta.data_position, "\noptimizer_steps ",
                            m.meta.optimizer_steps, "\nrng ", detail::hex_bytes(m.meta.rng_state), "\n");
  for (const auto& [k, v] : m.meta.config) s += "config " + k + " " + v + "\n";
  s += "mesh " + std::to_string(m.mesh_shape.size());
  for (std::size_t i = 0; i < m.mesh_shape.size(); ++i) s += " " + m.mesh_names[i] + " " + std::to_string(m.mesh_shape[i]);
  s += "\n";
  for (const auto& t : m.tensors) s += detail::tensor_line(t);
  for (const auto& t : m.tensors)
    for (const auto& p : t.pieces) s += detail::piece_line(t.name, p);
  return detail::sealed(std::move(s));
}

/// Parses a MANIFEST or a rank's index (header lines optional); throws naming `file` and the
/// line when the text is malformed or its checksum does not match (a damaged or cut file).
inline Manifest parse(const std::string& text, const std::filesystem::path& file) {
  const auto end_at = text.rfind("end ");
  if (end_at == std::string::npos || (end_at > 0 && text[end_at - 1] != '\n'))
    throw Error("checkpoint::load", dtensor::detail::cat(file.string(), " has no closing 'end' line: truncated?"));
  {
    detail::LineReader r(text.substr(end_at, text.find('\n', end_at) - end_at), file, 0);
    r.word();
    if (r.hex() != fnv1a64(text.data(), end_at))
      throw Error("checkpoint::load", dtensor::detail::cat(file.string(), " is corrupted: its checksum does not match"));
  }
  Manifest m;
  std::map<std::string, std::size_t> index;
  std::istringstream lines(text.substr(0, end_at));
  std::string line;
  for (std::size_t number = 1; std::getline(lines, line); ++number) {
    detail::LineReader r(line, file, number);
    const std::string kind = r.word();
    if (kind == "dtensor-checkpoint") {
      if (const int v = r.integer<int>(); v != format_version) r.fail(dtensor::detail::cat("format version ", v, ", this library reads ", format_version));
    } else if (kind == "step") {
      m.meta.step = r.integer<std::int64_t>();
      if (m.meta.step < 0) r.fail(dtensor::detail::cat("step ", m.meta.step, " is negative"));
    }
    else if (kind == "data_position") m.meta.data_position = r.integer<std::uint64_t>();
    else if (kind == "optimizer_steps") m.meta.optimizer_steps = r.integer<std::int64_t>();
    else if (kind == "rng") m.meta.rng_state = detail::unhex(r, r.word());
    else if (kind == "config") {
      auto key = r.word();
      m.meta.config[key] = r.rest();
    } else if (kind == "mesh") {
      const auto n = r.integer<std::size_t>();
      for (std::size_t i = 0; i < n; ++i) {
        m.mesh_names.push_back(r.word());
        m.mesh_shape.push_back(r.integer<int>());
      }
    } else if (kind == "tensor") {
      TensorInfo t;
      t.name = r.word();
      t.dtype = r.word();
      const auto rank = r.integer<std::size_t>();
      if (rank > 16) r.fail("rank over 16");
      for (std::size_t d = 0; d < rank; ++d) t.shape.push_back(r.integer<Extent>());
      t.layout = r.rest();
      if (!index.emplace(t.name, m.tensors.size()).second) r.fail("tensor " + t.name + " declared twice");
      m.tensors.push_back(std::move(t));
    } else if (kind == "piece") {
      const auto name = r.word();
      const auto it = index.find(name);
      if (it == index.end()) r.fail("piece of undeclared tensor " + name);
      auto& t = m.tensors[it->second];
      PieceInfo p;
      p.file = r.word();
      p.byte_offset = r.integer<std::uint64_t>();
      p.bytes = r.integer<std::uint64_t>();
      p.checksum = r.hex();
      for (std::size_t d = 0; d < t.shape.size(); ++d) p.box.offset.push_back(r.integer<Extent>());
      for (std::size_t d = 0; d < t.shape.size(); ++d) p.box.extent.push_back(r.integer<Extent>());
      t.pieces.push_back(std::move(p));
    } else {
      r.fail("unknown record '" + kind + "'");
    }
  }
  return m;
}

}  // namespace dtensor::checkpoint
