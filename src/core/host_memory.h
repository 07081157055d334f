// What this node's memory offers: MemAvailable from /proc/meminfo (the
// kernel's estimate of what can be allocated without swapping); handing
// pages of a buffer back to it; this process's peak resident memory.
#pragma once
#include <cstdint>

namespace xx {

int64_t mem_available_bytes();  // -1 when /proc/meminfo cannot be read (not Linux)

// Zeroes [p, p + bytes) of host memory and returns its whole pages to the
// kernel (madvise MADV_DONTNEED: they read as zero and take no memory until
// written again); the partial pages at either end are zeroed in place.
// Sharded gradients use it so a bucket's full-size gradients do not stay
// resident after it is reduced.
void zero_and_release(void* p, int64_t bytes);
// Only the whole pages inside [p, p + bytes): they read as zero afterwards;
// the partial pages at either end, shared with neighbours, are left alone.
void release_whole_pages(void* p, int64_t bytes);

int64_t peak_resident_bytes();  // VmHWM from /proc/self/status; -1 when unknown
int64_t resident_bytes();       // VmRSS, now; -1 when unknown

}  // namespace xx
