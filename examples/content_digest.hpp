// examples/content_digest.hpp — what the trainers' settings agreement compares for the file a rank
// starts from (--init-from FILE, --resume DIR): its contents, not its path.
//
//   settings.push_back(examples::starting_file_setting(o.init_from, o.resume));
//   // {"--init-from --resume (contents)", "7712 bytes, hash 9f..."}
//
// Ranks started on other hosts (MPI) may each read a different file of the same name: comparing
// paths would let them start from other weights and the run exit 0. A directory (a checkpoint)
// is digested by its MANIFEST, which holds every piece's size and checksum (checkpoint/format.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dtensor/checkpoint/format.hpp"
#include "dtensor/comm/settings_agreement.hpp"

namespace examples {

/// "N bytes, hash H" of a file (of a directory: its checkpoint MANIFEST); "" for no path;
/// "unreadable" for one this rank cannot read (a rank that can differs from it).
inline std::string content_digest(const std::string& path) {
  if (path.empty()) return "";
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(file)) file /= dtensor::checkpoint::manifest_name;
  std::ifstream in(file, std::ios::binary);
  if (!in) return "unreadable";
  std::uint64_t h = 14695981039346656037ull, n = 0;
  std::vector<char> buf(1 << 16);
  while (in.read(buf.data(), std::streamsize(buf.size())) || in.gcount() > 0) {
    const auto got = std::size_t(in.gcount());
    for (std::size_t i = 0; i < got; i += 8) {  // eight bytes a step
      std::uint64_t w = 0;
      std::memcpy(&w, buf.data() + i, std::min<std::size_t>(8, got - i));
      h = (h ^ w) * 1099511628211ull + 0x9e3779b97f4a7c15ull;
    }
    n += got;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::to_string(n) + " bytes, hash " + hex;
}

/// The settings agreement's entry for the file a rank starts from (--init-from and --resume
/// exclude each other): its contents' digest.
inline dtensor::Setting starting_file_setting(const std::string& init_from, const std::string& resume) {
  return {"--init-from --resume (contents)", content_digest(init_from.empty() ? resume : init_from)};
}

}  // namespace examples
