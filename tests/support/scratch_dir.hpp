// tests/support/scratch_dir.hpp — a fresh directory under the temporary one, removed with the
// object (the offload tests' --offload-dir; read-only ones are made writable again first).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace dtensor::testing {

struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / ("dtensor-" + name + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(path, ec);
  }
  /// The entries in it (what an offload left behind).
  std::size_t files() const {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(path)) ++n;
    return n;
  }
};

}  // namespace dtensor::testing
