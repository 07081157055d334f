// PageReleaser: a granule of a buffer goes back to the kernel only once every
// byte of it in the buffer is done with, and never a page the buffer shares
// with other memory. Residency is read from the kernel (mincore).
#include <catch2/catch.hpp>
#include <sys/mman.h>
#include <unistd.h>
#include <cstdint>
#include <cstring>
#include <vector>
#include "core/host_memory.h"

using namespace xx;

namespace {

// Resident 4 KiB pages in [p, p + bytes) (p page-aligned).
int64_t resident_pages(const void* p, int64_t bytes) {
  const int64_t page = int64_t(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((bytes + page - 1) / page);
  REQUIRE(::mincore(const_cast<void*>(p), size_t(bytes), in.data()) == 0);
  int64_t n = 0;
  for (auto c : in) n += c & 1;
  return n;
}

}  // namespace

TEST_CASE("PageReleaser gives a page back when every part of it is done, and no page it shares", "[host_memory]") {
  const int64_t page = int64_t(::sysconf(_SC_PAGESIZE));
  // 8 pages mapped; the buffer starts 100 bytes into the first and ends 100 bytes before the last ends.
  auto* map = static_cast<char*>(::mmap(nullptr, size_t(8 * page), PROT_READ | PROT_WRITE,
                                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(map != MAP_FAILED);
  std::memset(map, 1, size_t(8 * page));
  const int64_t bytes = 8 * page - 200;
  PageReleaser pages(map + 100, bytes, false);
  REQUIRE(pages.granule() == page);
  // Page 2 (buffer bytes [2 page - 100, 3 page - 100)) in two halves.
  pages.done(2 * page - 100, 2 * page + 1000);
  CHECK(resident_pages(map, 8 * page) == 8);
  pages.done(2 * page + 1000, 3 * page - 100);
  CHECK(resident_pages(map, 8 * page) == 7);
  CHECK(resident_pages(map + 2 * page, page) == 0);
  // The rest (each byte is done once a round): the shared first and last pages stay, with their bytes.
  pages.done(0, 2 * page - 100);
  pages.done(3 * page - 100, bytes);
  CHECK(resident_pages(map, 8 * page) == 2);
  CHECK(map[50] == 1);
  CHECK(map[8 * page - 50] == 1);
  CHECK(map[2 * page + 5] == 0);  // a page given back reads as zero
  // A new round: pending again, nothing goes back until done.
  std::memset(map, 1, size_t(8 * page));
  pages.reset();
  pages.done(3 * page - 100, 4 * page - 100);
  CHECK(resident_pages(map, 8 * page) == 7);
  ::munmap(map, size_t(8 * page));
}

TEST_CASE("huge_page_memory is aligned to 2 MiB and given back in whole huge pages", "[host_memory]") {
  const int64_t bytes = 3 * kHugePage + 12345;  // rounded up to 4 huge pages
  auto memory = huge_page_memory(bytes);
  auto* p = static_cast<char*>(memory.get());
  REQUIRE(uintptr_t(p) % uintptr_t(kHugePage) == 0);
  std::memset(p, 1, size_t(bytes));
  const int64_t per_huge = kHugePage / int64_t(::sysconf(_SC_PAGESIZE));
  PageReleaser pages(p, bytes, true);
  REQUIRE(pages.granule() == kHugePage);
  pages.done(0, kHugePage / 2);
  CHECK(resident_pages(p, kHugePage) == per_huge);  // half done: all of it stays
  pages.done(kHugePage / 2, kHugePage + 10);
  CHECK(resident_pages(p, kHugePage) == 0);
  CHECK(resident_pages(p + kHugePage, kHugePage) == per_huge);
  // The last granule is the buffer's own (rounded up): it goes with the buffer's last byte.
  pages.done(3 * kHugePage, bytes);
  CHECK(resident_pages(p + 3 * kHugePage, kHugePage) == 0);
  CHECK(p[3 * kHugePage + 7] == 0);
}
