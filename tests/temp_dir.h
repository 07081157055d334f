// A fresh scratch directory per test (mkdtemp, so unique across processes
// and ranks), removed at the end.
#pragma once
#include <catch2/catch.hpp>
#include <stdlib.h>
#include <filesystem>
#include <fstream>
#include <string>

namespace xx::test {

struct TempDir {
  std::filesystem::path dir;
  explicit TempDir(const std::string& tag = "test") {
    std::string name = (std::filesystem::temp_directory_path() / ("xx_" + tag + "_XXXXXX")).string();
    REQUIRE(mkdtemp(name.data()) != nullptr);
    dir = name;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (dir / name).string(); }
  // Writes `text` to dir/name (creating folders) and returns the path.
  std::string write(const std::string& name, const std::string& text) const {
    const auto p = dir / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
};

}  // namespace xx::test
