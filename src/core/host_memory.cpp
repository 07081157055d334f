#include "core/host_memory.h"
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

}  // namespace xx
