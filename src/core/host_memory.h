// What this node's memory offers: MemAvailable from /proc/meminfo (the
// kernel's estimate of what can be allocated without swapping).
#pragma once
#include <cstdint>

namespace xx {

int64_t mem_available_bytes();  // -1 when /proc/meminfo cannot be read (not Linux)

}  // namespace xx
