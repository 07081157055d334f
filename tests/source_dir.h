// Where the tests find the repository's input/ decks at run time: the nearest
// folder above the test binary that holds input/tiny.deck (a build tree, or an
// unpacked tools/device-bundle), else XX_SOURCE_DIR in the environment, else
// the source tree the binary was built from.
#pragma once
#include <filesystem>
#include <string>

namespace xx::test {

inline std::string input_path(const std::string& name) {
  namespace fs = std::filesystem;
  static const fs::path root = [] {
    std::error_code ec;
    for (fs::path dir = fs::read_symlink("/proc/self/exe", ec).parent_path(); !ec && !dir.empty();
         dir = dir.parent_path()) {
      if (fs::exists(dir / "input" / "tiny.deck")) return dir;
      if (dir == dir.root_path()) break;
    }
    if (const char* env = std::getenv("XX_SOURCE_DIR")) return fs::path(env);
    return fs::path(XX_SOURCE_DIR);
  }();
  return (root / "input" / name).string();
}

}  // namespace xx::test
