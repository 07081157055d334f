#include "core/host_memory.h"
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>

namespace xx {

int64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t value = 0;
  while (in >> key >> value) {
    std::getline(in, unit);  // " kB"
    if (key == "MemAvailable:") return value * 1024;
  }
  return -1;
}

namespace {

// [first, last): the whole pages inside [p, p + bytes).
std::pair<uintptr_t, uintptr_t> whole_pages(void* p, int64_t bytes) {
  static const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = uintptr_t(p), end = begin + uintptr_t(bytes);
  const uintptr_t first = std::min(end, (begin + page - 1) / page * page);
  return {first, std::max(first, end / page * page)};
}

}  // namespace

void release_whole_pages(void* p, int64_t bytes) {
  if (bytes <= 0) return;
  const auto [first, last] = whole_pages(p, bytes);
  if (last > first && ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0)
    std::memset(reinterpret_cast<void*>(first), 0, last - first);  // not released, but zero all the same
}

void zero_and_release(void* p, int64_t bytes) {
  if (bytes <= 0) return;
  const auto [first, last] = whole_pages(p, bytes);
  const uintptr_t begin = uintptr_t(p), end = begin + uintptr_t(bytes);
  std::memset(p, 0, first - begin);
  release_whole_pages(p, bytes);
  std::memset(reinterpret_cast<void*>(last), 0, end - last);
}

namespace {

int64_t status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  const std::string k = key;
  for (std::string line; std::getline(in, line);)
    if (line.rfind(k, 0) == 0) return std::stoll(line.substr(k.size())) * 1024;
  return -1;
}

}  // namespace

int64_t peak_resident_bytes() { return status_kib("VmHWM:"); }
int64_t resident_bytes() { return status_kib("VmRSS:"); }

}  // namespace xx
