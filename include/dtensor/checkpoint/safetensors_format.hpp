// dtensor/checkpoint/safetensors_format.hpp — the safetensors file format (Hugging Face), read and
// written by byte ranges, without any dependency.
//
//   auto file = checkpoint::safetensors::read_header("model.safetensors");   // names, dtypes, shapes
//   std::vector<float> part(rows * cols);
//   checkpoint::safetensors::read_box(file, "wte.weight", Region{{r0, 0}, {rows, cols}}, part.data());
//
// A file is: 8 bytes, the header's length N as a little-endian uint64; N bytes of JSON, an
// object mapping each tensor's name to {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}
// (offsets into the data that follows the header) plus an optional "__metadata__" object of
// strings; then the raw row-major little-endian data. Hugging Face pads the header with spaces
// to a multiple of 8 bytes; this writer does too. A model cut into several files comes with an
// index, `model.safetensors.index.json`: {"metadata": {...}, "weight_map": {name: file}}.
//
// read_box reads only the byte ranges of one box (the runs of contiguous elements), so each
// rank of a sharded model reads its own shards and nothing else, and converts F64/F32/BF16 to
// the element type asked for. Everything a file can get wrong (a short file, a header length
// beyond it, JSON that does not parse, a dtype or shape that does not match the offsets,
// overlapping or out-of-range data) is a dtensor::Error naming the file and the tensor.
// Little-endian hosts only (as the format's data; checked at compile time).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "dtensor/checkpoint/checksum.hpp"
#include "dtensor/checkpoint/region.hpp"
#include "dtensor/core/bfloat16.hpp"
#include "dtensor/core/error.hpp"
#include "dtensor/core/json.hpp"

namespace dtensor::checkpoint::safetensors {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so must the host be");

/// The header's length is capped, as the reference implementation does (100 MB), so that a
/// corrupt length cannot make a reader allocate without bound.
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

struct TensorEntry {
  std::string dtype;                 // "F32", "F64", "BF16", ...
  std::vector<Extent> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

struct FileInfo {
  std::filesystem::path path;
  std::uint64_t data_start = 0;  // 8 + header length
  std::uint64_t file_size = 0;
  std::map<std::string, TensorEntry> tensors;
  std::map<std::string, std::string> metadata;
};

/// Bytes per element of a safetensors dtype; 0 for one this library cannot convert.
inline std::size_t dtype_bytes(std::string_view dtype) {
  if (dtype == "F64") return 8;
  if (dtype == "F32") return 4;
  if (dtype == "BF16") return 2;
  return 0;
}

template <class T>
constexpr const char* dtype_name() {
  if constexpr (std::is_same_v<T, double>) return "F64";
  else if constexpr (std::is_same_v<T, float>) return "F32";
  else {
    static_assert(std::is_same_v<T, bfloat16>, "safetensors: F64, F32 or BF16 elements");
    return "BF16";
  }
}

/// Bytes this thread has read from safetensors files and indexes (every pread, headers included):
/// a rank of the threads backend is a thread, so a test can check that each rank reads the byte
/// ranges of its own shards and nothing more (tests/unit/test_llama.cpp, [hf]).
inline std::uint64_t& bytes_read() {
  thread_local std::uint64_t n = 0;
  return n;
}

namespace detail {

// ---- a small JSON reader: what safetensors headers and index files use ----------------------
struct Json;
using JsonObject = std::vector<std::pair<std::string, Json>>;
using JsonArray = std::vector<Json>;
struct Json {
  std::variant<std::nullptr_t, bool, double, std::string, std::shared_ptr<JsonArray>, std::shared_ptr<JsonObject>> v;
  const JsonObject* object() const {
    auto p = std::get_if<std::shared_ptr<JsonObject>>(&v);
    return p ? p->get() : nullptr;
  }
  const JsonArray* array() const {
    auto p = std::get_if<std::shared_ptr<JsonArray>>(&v);
    return p ? p->get() : nullptr;
  }
  const std::string* string() const { return std::get_if<std::string>(&v); }
  const double* number() const { return std::get_if<double>(&v); }
};

class JsonParser {
 public:
  JsonParser(std::string_view text, std::string where) : s_(text), where_(std::move(where)) {}
  Json document() {
    Json j = value(0);
    skip();
    if (i_ != s_.size()) fail("text after the JSON value");
    return j;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("safetensors", dtensor::detail::cat(where_, ": invalid JSON at byte ", i_, ": ", what));
  }
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  Json value(int depth) {
    if (depth > 64) fail("nested too deeply");
    skip();
    if (i_ >= s_.size()) fail("unexpected end");
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      auto obj = std::make_shared<JsonObject>();
      if (eat('}')) return {obj};
      do {
        skip();
        std::string key = str();
        if (!eat(':')) fail("expected ':'");
        obj->emplace_back(std::move(key), value(depth + 1));
      } while (eat(','));
      if (!eat('}')) fail("expected ',' or '}'");
      return {obj};
    }
    if (c == '[') {
      ++i_;
      auto arr = std::make_shared<JsonArray>();
      if (eat(']')) return {arr};
      do arr->push_back(value(depth + 1));
      while (eat(','));
      if (!eat(']')) fail("expected ',' or ']'");
      return {arr};
    }
    if (c == '"') return {str()};
    for (auto [word, j] : {std::pair<std::string_view, Json>{"true", {true}}, {"false", {false}}, {"null", {nullptr}}})
      if (s_.substr(i_, word.size()) == word) return i_ += word.size(), j;
    return {number()};
  }
  std::string str() {
    if (i_ >= s_.size() || s_[i_] != '"') fail("expected a string");
    ++i_;
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) break;
      c = s_[i_++];
      switch (c) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (i_ + 4 > s_.size()) fail("short \\u escape");
          const unsigned code = unsigned(std::stoul(std::string(s_.substr(i_, 4)), nullptr, 16));
          i_ += 4;
          // UTF-8 of a BMP code point (names are ASCII in practice; surrogates are kept as is).
          if (code < 0x80) out += char(code);
          else if (code < 0x800) out += char(0xC0 | (code >> 6)), out += char(0x80 | (code & 0x3F));
          else out += char(0xE0 | (code >> 12)), out += char(0x80 | ((code >> 6) & 0x3F)), out += char(0x80 | (code & 0x3F));
          break;
        }
        default: out += c;
      }
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }
  double number() {
    const std::size_t start = i_;
    while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' || s_[i_] == '+' ||
                              s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E'))
      ++i_;
    if (start == i_) fail(dtensor::detail::cat("unexpected character '", s_[i_], "'"));
    try {
      return std::stod(std::string(s_.substr(start, i_ - start)));
    } catch (...) {
      fail("not a number");
    }
  }

  std::string_view s_;
  std::string where_;
  std::size_t i_ = 0;
};

inline Json parse_json(std::string_view text, const std::string& where) { return JsonParser(text, where).document(); }

/// A non-negative whole number that fits in `limit` (shapes, offsets); anything else throws.
inline std::uint64_t whole(const Json& j, const std::string& where, const char* what) {
  const double* d = j.number();
  if (!d || *d < 0 || *d != double(std::uint64_t(*d)) || *d > 9.0e15)
    throw Error("safetensors", dtensor::detail::cat(where, ": ", what, " must be a non-negative whole number"));
  return std::uint64_t(*d);
}

// ---- files --------------------------------------------------------------------------------------
class Fd {
 public:
  Fd(const std::filesystem::path& path, int flags, const char* op) : path_(path) {
    fd_ = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(op, dtensor::detail::cat("cannot open ", path.string(), ": ", std::strerror(errno)));
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  void read_at(void* out, std::size_t n, std::uint64_t offset, const char* op) const {
    auto* p = static_cast<char*>(out);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, p, n, off_t(offset));
      if (got <= 0)
        throw Error(op, dtensor::detail::cat(path_.string(), ": cannot read ", n, " bytes at ", offset,
                                             got == 0 ? ": the file ends there" : std::string(": ") + std::strerror(errno)));
      p += got, n -= std::size_t(got), offset += std::uint64_t(got);
      safetensors::bytes_read() += std::uint64_t(got);
    }
  }
  void write_at(const void* data, std::size_t n, std::uint64_t offset, const char* op) const {
    auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t put = ::pwrite(fd_, p, n, off_t(offset));
      if (put <= 0) throw Error(op, dtensor::detail::cat(path_.string(), ": cannot write at ", offset, ": ", std::strerror(errno)));
      p += put, n -= std::size_t(put), offset += std::uint64_t(put);
    }
  }
  void sync(const char* op) const {
    if (::fsync(fd_) != 0) throw Error(op, dtensor::detail::cat(path_.string(), ": fsync failed: ", std::strerror(errno)));
  }
  void resize(std::uint64_t bytes, const char* op) const {
    if (::ftruncate(fd_, off_t(bytes)) != 0)
      throw Error(op, dtensor::detail::cat(path_.string(), ": cannot size it to ", bytes, " bytes: ", std::strerror(errno)));
  }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

/// Calls f(element_offset_in_tensor, element_offset_in_box, count) for each run of contiguous
/// elements of `box` in a row-major tensor of `shape` (whole trailing dimensions merged).
template <class F>
void for_each_run(const std::vector<Extent>& shape, const Region& box, F&& f) {
  const std::size_t r = shape.size();
  if (box.empty()) return;
  if (r == 0) return f(Extent(0), Extent(0), Extent(1));
  // Dimensions k.. that the box covers whole merge into one run with the dimension before them.
  std::size_t k = r;
  Extent run = 1;
  while (k > 0 && box.offset[k - 1] == 0 && box.extent[k - 1] == shape[k - 1]) run *= shape[--k];
  if (k > 0) run *= box.extent[--k];  // the dimension the run starts in: its extent, from its offset
  std::vector<Extent> stride(r, 1);
  for (std::size_t d = r - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];
  std::vector<Extent> idx(k, 0);  // position in the box over the dimensions before k
  Extent in_box = 0;
  while (true) {
    Extent flat = 0;
    for (std::size_t d = 0; d < k; ++d) flat += (box.offset[d] + idx[d]) * stride[d];
    if (k < r) flat += box.offset[k] * stride[k];
    f(flat, in_box, run);
    in_box += run;
    std::size_t d = k;
    while (d > 0) {
      if (++idx[d - 1] < box.extent[d - 1]) break;
      idx[d - 1] = 0;
      --d;
    }
    if (d == 0) return;
  }
}

template <class T>
void convert_from(const std::string& dtype, const unsigned char* bytes, T* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    double v;
    if (dtype == "F64") std::memcpy(&v, bytes + 8 * i, 8);
    else if (dtype == "F32") {
      float f;
      std::memcpy(&f, bytes + 4 * i, 4);
      v = f;
    } else {
      std::uint16_t h;
      std::memcpy(&h, bytes + 2 * i, 2);
      const std::uint32_t w = std::uint32_t(h) << 16;
      float f;
      std::memcpy(&f, &w, 4);
      v = f;
    }
    if constexpr (std::is_same_v<T, bfloat16>) out[i] = bfloat16(float(v));
    else out[i] = T(v);
  }
}

}  // namespace detail

/// Reads and checks a file's header: every tensor's dtype, shape and data range.
inline FileInfo read_header(const std::filesystem::path& path) {
  constexpr const char* op = "safetensors::read_header";
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw Error(op, dtensor::detail::cat("cannot read ", path.string(), ": ", ec.message()));
  FileInfo info{path, 0, size, {}, {}};
  const std::string where = path.string();
  if (size < 8) throw Error(op, dtensor::detail::cat(where, ": ", size, " bytes, shorter than the 8-byte header length"));
  detail::Fd fd(path, O_RDONLY, op);
  std::uint64_t n = 0;
  fd.read_at(&n, 8, 0, op);
  if (n > max_header_bytes || n > size - 8)
    throw Error(op, dtensor::detail::cat(where, ": header length ", n, " does not fit in the file of ", size,
                                         " bytes (not a safetensors file?)"));
  std::string text(std::size_t(n), '\0');
  fd.read_at(text.data(), text.size(), 8, op);
  info.data_start = 8 + n;
  const detail::Json doc = detail::parse_json(text, where + " (header)");
  const auto* top = doc.object();
  if (!top) throw Error(op, dtensor::detail::cat(where, ": the header is not a JSON object"));
  const std::uint64_t data_bytes = size - info.data_start;
  std::vector<std::pair<std::uint64_t, std::string>> ranges;
  for (const auto& [name, value] : *top) {
    const std::string at = dtensor::detail::cat(where, ": tensor '", name, "'");
    if (name == "__metadata__") {
      if (!value.object()) throw Error(op, dtensor::detail::cat(where, ": __metadata__ is not an object"));
      for (const auto& [k, v] : *value.object()) {
        if (!v.string()) throw Error(op, dtensor::detail::cat(where, ": __metadata__ '", k, "' is not a string"));
        info.metadata[k] = *v.string();
      }
      continue;
    }
    const auto* fields = value.object();
    if (!fields) throw Error(op, dtensor::detail::cat(at, " is not an object"));
    TensorEntry e;
    bool has_dtype = false, has_shape = false, has_offsets = false;
    for (const auto& [k, v] : *fields) {
      if (k == "dtype" && v.string()) e.dtype = *v.string(), has_dtype = true;
      else if (k == "shape" && v.array()) {
        for (const auto& d : *v.array()) e.shape.push_back(Extent(detail::whole(d, at, "each extent")));
        has_shape = true;
      } else if (k == "data_offsets" && v.array() && v.array()->size() == 2) {
        e.begin = detail::whole((*v.array())[0], at, "data_offsets");
        e.end = detail::whole((*v.array())[1], at, "data_offsets");
        has_offsets = true;
      }
    }
    if (!has_dtype || !has_shape || !has_offsets)
      throw Error(op, dtensor::detail::cat(at, " needs \"dtype\" (a string), \"shape\" (an array) and "
                                                "\"data_offsets\" ([begin, end])"));
    if (e.begin > e.end || e.end > data_bytes)
      throw Error(op, dtensor::detail::cat(at, ": data_offsets [", e.begin, ", ", e.end, "] are not inside the ",
                                           data_bytes, " data bytes"));
    if (const std::size_t b = dtype_bytes(e.dtype)) {
      std::uint64_t numel = 1;
      for (Extent d : e.shape) numel *= std::uint64_t(d);
      if (numel * b != e.end - e.begin)
        throw Error(op, dtensor::detail::cat(at, ": ", e.dtype, " of shape ", to_string(e.shape), " is ", numel * b,
                                             " bytes, data_offsets give ", e.end - e.begin));
    }
    if (e.end > e.begin) ranges.emplace_back(e.begin, name);
    info.tensors.emplace(name, std::move(e));
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i)
    if (info.tensors[ranges[i - 1].second].end > ranges[i].first)
      throw Error(op, dtensor::detail::cat(where, ": the data of tensors '", ranges[i - 1].second, "' and '",
                                           ranges[i].second, "' overlap"));
  return info;
}

/// Reads the elements of `box` (a box of tensor `name`) into `out` (row-major over the box),
/// converted to T; only those bytes are read.
template <class T>
void read_box(const FileInfo& file, const std::string& name, const Region& box, T* out) {
  constexpr const char* op = "safetensors::read_box";
  auto it = file.tensors.find(name);
  if (it == file.tensors.end())
    throw Error(op, dtensor::detail::cat(file.path.string(), " has no tensor '", name, "' (it has ", file.tensors.size(),
                                         " tensors)"));
  const TensorEntry& e = it->second;
  const std::size_t b = dtype_bytes(e.dtype);
  if (b == 0)
    throw Error(op, dtensor::detail::cat(file.path.string(), ": tensor '", name, "' is ", e.dtype,
                                         "; readable dtypes are F64, F32 and BF16"));
  if (box.rank() != e.shape.size() || !contains(Region{std::vector<Extent>(e.shape.size(), 0), e.shape}, box))
    throw Error(op, dtensor::detail::cat(file.path.string(), ": box ", to_string(box), " is not inside tensor '", name,
                                         "' of shape ", to_string(e.shape)));
  detail::Fd fd(file.path, O_RDONLY, op);
  std::vector<unsigned char> buf;
  detail::for_each_run(e.shape, box, [&](Extent flat, Extent in_box, Extent count) {
    buf.resize(std::size_t(count) * b);
    fd.read_at(buf.data(), buf.size(), file.data_start + e.begin + std::uint64_t(flat) * b, op);
    detail::convert_from(e.dtype, buf.data(), out + in_box, std::size_t(count));
  });
}

// ---- checksums: what dtensor's writers put in the header, and what its readers verify ----------
// For each tensor T, the header's __metadata__ holds "dtensor.sum64:T": 16 hex digits of the sum
// (mod 2^64) over its elements of mix(index, bits), index the element's row-major position and
// bits its stored bytes (little-endian, zero-extended), mix two rounds of splitmix64. A sum
// because the ranks of an export each hash the boxes they write and add them up (one small
// all-gather), so the checksum says what the ranks held, not what landed on disk; the reader
// hashes the file's bytes. A flipped, zeroed, lost or swapped element changes it (as likely
// not as 2^-64). Files without the key (written by transformers, numpy) are read unverified.

inline constexpr std::string_view checksum_prefix = "dtensor.sum64:";

/// The sum of mix(first + i, element i's bits) over n elements of elem_bytes each.
inline std::uint64_t hash_elements(const void* bytes, std::size_t elem_bytes, std::uint64_t first, std::uint64_t n) {
  auto mix = [](std::uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const auto* p = static_cast<const unsigned char*>(bytes);
  std::uint64_t sum = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, p + i * elem_bytes, elem_bytes);
    sum += mix(bits ^ mix(first + i));
  }
  return sum;
}

/// Checks tensor `name` of `file` against the checksum in its header (when there is one): reads
/// the whole tensor. A mismatch is an error naming the file and the tensor.
inline void verify_checksum(const FileInfo& file, const std::string& name) {
  constexpr const char* op = "safetensors::verify_checksum";
  auto m = file.metadata.find(std::string(checksum_prefix) + name);
  if (m == file.metadata.end()) return;
  auto t = file.tensors.find(name);
  if (t == file.tensors.end())
    throw Error(op, dtensor::detail::cat(file.path.string(), ": a checksum for tensor '", name, "', which the file lacks"));
  const TensorEntry& e = t->second;
  const std::size_t b = dtype_bytes(e.dtype);
  if (b == 0) return;  // a dtype this library does not read: nothing of it is used
  detail::Fd fd(file.path, O_RDONLY, "safetensors::verify_checksum");
  std::vector<unsigned char> buf;
  std::uint64_t sum = 0;
  const std::uint64_t n = (e.end - e.begin) / b, chunk = std::uint64_t(1) << 18;
  for (std::uint64_t at = 0; at < n; at += chunk) {
    const std::uint64_t count = std::min(chunk, n - at);
    buf.resize(std::size_t(count * b));
    fd.read_at(buf.data(), buf.size(), file.data_start + e.begin + at * b, op);
    sum += hash_elements(buf.data(), b, at, count);
  }
  if (checkpoint::to_hex(sum) != m->second)
    throw Error(op, dtensor::detail::cat(file.path.string(), ": tensor '", name, "': its data's checksum is ", checkpoint::to_hex(sum),
                                         ", the header's ", m->second,
                                         ": the file was damaged or not completely written (refused)"));
}

/// One tensor to write: its name, shape and row-major elements (numel of shape of them).
template <class T>
struct Named {
  std::string name;
  std::vector<Extent> shape;
  const T* data = nullptr;
};

/// The header text of tensors (name, shape) of dtype `dtype`, in the given order, data packed in
/// that order; padded with spaces to a multiple of 8 bytes. Also returns each one's begin offset.
inline std::string make_header(const std::vector<std::pair<std::string, std::vector<Extent>>>& tensors,
                               const std::string& dtype, const std::map<std::string, std::string>& metadata,
                               std::vector<std::uint64_t>* begins = nullptr) {
  const std::size_t b = dtype_bytes(dtype);
  std::string h = "{";
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    // Appends only: g++ 12 at -O2 warns (-Wrestrict, a false positive) on `"," + std::string`.
    for (const auto& [k, v] : metadata) {
      if (!first) h += ',';
      first = false;
      h += dtensor::detail::json_string(k);
      h += ':';
      h += dtensor::detail::json_string(v);
    }
    h += "}";
  }
  std::uint64_t offset = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, shape] = tensors[i];
    std::uint64_t numel = 1;
    std::string dims;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      numel *= std::uint64_t(shape[d]);
      if (d) dims += ',';
      dims += std::to_string(shape[d]);
    }
    if (begins) begins->push_back(offset);
    if (h.size() > 1) h += ',';
    h += dtensor::detail::json_string(name);
    h += ":{\"dtype\":\"" + dtype + "\",\"shape\":[" + dims + "],\"data_offsets\":[" + std::to_string(offset) + "," +
         std::to_string(offset + numel * b) + "]}";
    offset += numel * b;
  }
  h += "}";
  while (h.size() % 8) h += ' ';
  return h;
}

/// Writes whole tensors into one file (on one rank; safetensors.hpp writes a model's from every
/// rank), each tensor's checksum in the header. Writes `path` itself: a caller that must leave
/// nothing loadable on failure writes a temporary name and renames it (safetensors.hpp's commit_file).
template <class T>
void write(const std::filesystem::path& path, const std::vector<Named<T>>& tensors,
           const std::map<std::string, std::string>& metadata = {{"format", "pt"}}) {
  constexpr const char* op = "safetensors::write";
  std::vector<std::pair<std::string, std::vector<Extent>>> list;
  std::map<std::string, std::string> meta = metadata;  // and each tensor's checksum
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") throw Error(op, dtensor::detail::cat("tensor name '", t.name, "' is reserved or empty"));
    list.emplace_back(t.name, t.shape);
    std::uint64_t numel = 1;
    for (Extent d : t.shape) numel *= std::uint64_t(d);
    meta[std::string(checksum_prefix) + t.name] = checkpoint::to_hex(hash_elements(t.data, sizeof(T), 0, numel));
  }
  std::vector<std::uint64_t> begins;
  const std::string header = make_header(list, dtype_name<T>(), meta, &begins);
  detail::Fd fd(path, O_WRONLY | O_CREAT | O_TRUNC, op);
  const std::uint64_t n = header.size();
  fd.write_at(&n, 8, 0, op);
  fd.write_at(header.data(), header.size(), 8, op);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    Extent numel = 1;
    for (Extent d : tensors[i].shape) numel *= d;
    fd.write_at(tensors[i].data, std::size_t(numel) * sizeof(T), 8 + n + begins[i], op);
  }
  fd.sync(op);
}

/// The files of a sharded model: `index.json`'s weight_map (name -> file next to it).
inline std::map<std::string, std::filesystem::path> read_index(const std::filesystem::path& index) {
  constexpr const char* op = "safetensors::read_index";
  detail::Fd fd(index, O_RDONLY, op);
  std::error_code ec;
  const auto size = std::filesystem::file_size(index, ec);
  if (ec || size > max_header_bytes) throw Error(op, dtensor::detail::cat("cannot read ", index.string()));
  std::string text(std::size_t(size), '\0');
  fd.read_at(text.data(), text.size(), 0, op);
  const detail::Json doc = detail::parse_json(text, index.string());
  const detail::JsonObject* map = nullptr;
  if (const auto* top = doc.object())
    for (const auto& [k, v] : *top)
      if (k == "weight_map") map = v.object();
  if (!map) throw Error(op, dtensor::detail::cat(index.string(), ": no \"weight_map\" object"));
  std::map<std::string, std::filesystem::path> out;
  for (const auto& [name, file] : *map) {
    if (!file.string()) throw Error(op, dtensor::detail::cat(index.string(), ": weight_map '", name, "' is not a file name"));
    out[name] = index.parent_path() / *file.string();
  }
  return out;
}

}  // namespace dtensor::checkpoint::safetensors
