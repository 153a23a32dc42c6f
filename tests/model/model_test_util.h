// Helpers for the model tests: temporary folders and hand-built safetensors bytes.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "pagellm/common/check.h"
#include "pagellm/model/lora.h"

namespace pagellm::testing {

/// A fresh folder under $TMPDIR (or /tmp), removed with everything in it at destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") + "/pagellm-model-XXXXXX";
    char* made = ::mkdtemp(templ.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp failed for " + templ);
    path_ = made;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) throw std::runtime_error("cannot write " + path);
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// 8-byte little-endian length + header + data, with no padding or checks: for crafting
/// both good and bad files byte by byte.
inline std::string safetensors_bytes(const std::string& header, const std::string& data,
                                     uint64_t header_len_override = UINT64_MAX) {
  const uint64_t n = header_len_override == UINT64_MAX ? header.size() : header_len_override;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

/// Runs fn and returns the pagellm::Error message it throws; fails the test when it
/// throws nothing.
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const pagellm::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a pagellm::Error";
  return "";
}

/// An adapter config of `rank` on all seven modules, lora_alpha = 2 · rank.
inline LoraConfig all_modules_lora_config(int64_t rank) {
  LoraConfig c;
  c.rank = rank;
  c.alpha = 2.0 * static_cast<double>(rank);
  c.target_modules = {kAllLoraModules.begin(), kAllLoraModules.end()};
  return c;
}

}  // namespace pagellm::testing
