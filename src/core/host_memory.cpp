#include "core/host_memory.h"
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

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

std::shared_ptr<void> huge_page_memory(int64_t bytes) {
  const size_t size = size_t((std::max<int64_t>(bytes, 1) + kHugePage - 1) / kHugePage * kHugePage);
  // Over-reserve one huge page to align the start, then trim the rest.
  void* raw = ::mmap(nullptr, size + size_t(kHugePage), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = uintptr_t(raw), aligned = (start + uintptr_t(kHugePage) - 1) / uintptr_t(kHugePage) * uintptr_t(kHugePage);
  if (aligned > start) ::munmap(raw, aligned - start);
  if (const uintptr_t end = aligned + size; end < start + size + size_t(kHugePage))
    ::munmap(reinterpret_cast<void*>(end), start + size + size_t(kHugePage) - end);
  void* p = reinterpret_cast<void*>(aligned);
  ::madvise(p, size, MADV_HUGEPAGE);  // advice: without transparent huge pages, 4 KiB pages as before
  return std::shared_ptr<void>(p, [size](void* q) { ::munmap(q, size); });
}

PageReleaser::PageReleaser(void* base, int64_t bytes, bool huge) : bytes_(bytes) {
  granule_ = huge ? kHugePage : int64_t(::sysconf(_SC_PAGESIZE));
  first_ = uintptr_t(base) / uintptr_t(granule_) * uintptr_t(granule_);
  offset_ = int64_t(uintptr_t(base) - first_);
  reset();
}

void PageReleaser::reset() {
  const int64_t granules = (offset_ + bytes_ + granule_ - 1) / granule_;
  pending_.assign(size_t(granules), granule_);
  if (granules == 0) return;
  pending_.front() -= offset_;  // bytes before the base are not the buffer's
  pending_.back() -= granules * granule_ - (offset_ + bytes_);
}

void PageReleaser::done(int64_t begin, int64_t end) {
  begin = std::max<int64_t>(begin, 0), end = std::min(end, bytes_);
  for (int64_t at = begin; at < end;) {
    const int64_t g = (offset_ + at) / granule_, to = std::min(end, (g + 1) * granule_ - offset_);
    // A granule that reaches past either end of the buffer goes back only
    // when the buffer owns it whole (huge_page_memory's rounding).
    const bool inside = g * granule_ >= offset_ && (g + 1) * granule_ <= offset_ + bytes_;
    if ((pending_[size_t(g)] -= to - at) == 0 && (inside || granule_ == kHugePage))
      release_whole_pages(reinterpret_cast<void*>(first_ + uintptr_t(g * granule_)), granule_);
    at = to;
  }
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

void return_free_heap() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

int64_t peak_resident_bytes() { return status_kib("VmHWM:"); }
int64_t resident_bytes() { return status_kib("VmRSS:"); }

}  // namespace xx
