// The safetensors reader (src/hf/safetensors.cpp) on untrusted bytes: the
// file mapped and its header checked, then every tensor of a read dtype read
// whole and in a range, as an import reads a rank's pieces. An InputError is
// the expected outcome of bad bytes; anything else (another exception, a
// crash, a sanitizer report, a hang) is a finding. libFuzzer target under
// XX_FUZZ (tools/lab/fuzz --target safetensors; seeds in tests/fuzz/seeds/safetensors).
#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include "core/error.h"        // InputError
#include "hf/safetensors.h"  // SafetensorsFile

namespace {
std::string g_path;  // the file each input is written to
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char dir[] = "/tmp/xx-fuzz-st.XXXXXX";
  if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
  g_path = std::string(dir) + "/model.safetensors";
  std::atexit([] { std::error_code ignored; std::filesystem::remove_all(std::filesystem::path(g_path).parent_path(), ignored); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  {
    std::ofstream out(g_path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes), std::streamsize(size));
  }
  try {
    xx::SafetensorsFile f(g_path);
    for (const auto& t : f.tensors()) {
      if (t.dtype == xx::StDtype::other) continue;
      f.read_all(t);
      float one = 0;
      if (t.count > 0) f.read(t, t.count - 1, 1, &one);
    }
  } catch (const xx::InputError&) {
    return 0;  // bad input, reported as such: the expected outcome
  }
  return 0;
}
