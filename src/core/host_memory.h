// What this node's memory offers: MemAvailable from /proc/meminfo (the
// kernel's estimate of what can be allocated without swapping); handing
// pages of a buffer back to it; this process's peak resident memory.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

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

// Host memory for a large buffer that gives its pages back while in use:
// anonymous, aligned to 2 MiB at both ends and marked for transparent huge
// pages (madvise MADV_HUGEPAGE), untouched. A huge page costs one fault to
// take back where 4 KiB pages cost 512: the fault, not the zeroing, is what
// handing pages back and forth costs (11 us a fault on the VM of
// docs/SCALING.md). Freed when the last copy of the pointer goes.
std::shared_ptr<void> huge_page_memory(int64_t bytes);
inline constexpr int64_t kHugePage = int64_t(2) << 20;

// Hands pages of a buffer back to the kernel as its parts are done with, in
// whole granules (huge: kHugePage, for memory from huge_page_memory; else
// the page size): a granule goes back once every byte of it in the buffer is
// done, so one shared by two gradient buckets goes back with the second.
// Pages at the ends that the buffer shares with other memory never go.
class PageReleaser {
 public:
  PageReleaser() = default;
  PageReleaser(void* base, int64_t bytes, bool huge);
  // A new round: every byte of the buffer pending again (its pages are
  // zero and untouched, or being written).
  void reset();
  // [begin, end) (bytes from the base) is done with: the granules that are now done go back.
  void done(int64_t begin, int64_t end);
  int64_t granule() const { return granule_; }

 private:
  uintptr_t first_ = 0;  // the first granule's address (at or below the base)
  int64_t granule_ = 4096, offset_ = 0, bytes_ = 0;  // offset_: the base's place in the first granule
  std::vector<int64_t> pending_;  // bytes of each granule in the buffer not yet done
};

// After a buffer was freed to grow it (model/store.h): the malloc
// heap's free pages go back to the kernel (glibc malloc_trim; elsewhere
// nothing). Once any large block has been freed, glibc serves blocks up to
// that size from its heap instead of their own mappings (its dynamic mmap
// threshold: Open MPI's nonblocking all-reduce frees one bucket-sized
// temporary per bucket), so a buffer regrown step after step would leave the
// old one's pages resident as a hole.
void return_free_heap();

int64_t peak_resident_bytes();  // VmHWM from /proc/self/status; -1 when unknown
int64_t resident_bytes();       // VmRSS, now; -1 when unknown

}  // namespace xx
