// The device emulation (core/device_memory.h). Kokkos' tool callbacks say
// when kernel memory is allocated and freed, and when a kernel or a deep_copy
// begins and ends. Between them, outside every kernel, deep_copy and
// DeviceWork scope, the whole pages of every kernel allocation are
// PROT_NONE, so host code that reads or writes one faults. Inside a scope the
// first touch of a buffer faults too: the handler opens that buffer's pages
// and lets the access through, and the scope's end closes them again. So the
// cost is one fault per buffer a kernel touches, not an mprotect of every
// buffer per kernel. A fault outside every scope is the bug it looks for: it
// prints the buffer's label, the byte and the call stack, and aborts (or,
// under XX_EMULATE_DEVICE=report, opens the buffer until the next scope ends
// and goes on). The handler runs on its own signal stack: oneDNN's JIT
// kernels keep data below their stack pointer, where a signal frame lands.
//
// Only whole pages inside an allocation are protected: an allocation smaller
// than a page, and the partial pages at its ends, go unchecked. Kokkos keeps
// an allocation's label in a header before its data, which it reads and
// writes from the host: the pages protected begin after it.
#include "core/device_memory.h"
#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>
#ifdef KOKKOS_ENABLE_CUDA
#include <cuda_runtime.h>
#endif

namespace xx {
namespace {

struct Region {
  uintptr_t end = 0;   // of the protected pages (begin is the map's key)
  uintptr_t alloc = 0;  // what Kokkos allocated: its header, then the data
  uintptr_t data = 0;   // after the header
  uint64_t bytes = 0;  // of the allocation, as Kokkos reported it
  char label[96] = {};
  bool open = false;
};

std::atomic<bool> g_emulated{false};
std::atomic<int> g_scopes{0};  // kernels, deep_copies and DeviceWork open now
bool g_report_only = false;    // XX_EMULATE_DEVICE=report: say each touch, go on
std::mutex g_mutex;            // the maps, outside the fault handler
std::map<uintptr_t, Region>* g_regions = nullptr;
std::vector<uintptr_t>* g_opened = nullptr;  // regions the open scopes touched
std::map<uintptr_t, uintptr_t>* g_allocations = nullptr;  // every kernel allocation's data: begin -> end
uintptr_t g_page = 4096;

void protect(uintptr_t begin, const Region& r, int prot) {
  if (mprotect(reinterpret_cast<void*>(begin), r.end - begin, prot) != 0) {
    std::perror("xuanxue: device emulation: mprotect");
    std::abort();
  }
}

void on_fault(int sig, siginfo_t* info, void* context);

// The fault handler, installed again where someone replaced it (a test
// framework installs its own per test case).
void own_the_fault_handler() {
  struct sigaction current {};
  sigaction(SIGSEGV, nullptr, &current);
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_fault) return;
  struct sigaction act {};
  act.sa_sigaction = on_fault;
  act.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  sigemptyset(&act.sa_mask);
  sigaction(SIGSEGV, &act, nullptr);
}

void open_scope() {
  if (g_scopes.fetch_add(1) == 0) own_the_fault_handler();
}

void close_scope() {
  if (g_scopes.fetch_sub(1) != 1) return;
  std::lock_guard lock(g_mutex);
  for (uintptr_t begin : *g_opened) {
    auto it = g_regions->find(begin);
    if (it == g_regions->end() || !it->second.open) continue;
    protect(begin, it->second, PROT_NONE);
    it->second.open = false;
  }
  g_opened->clear();
}

void say(const char* s) { [[maybe_unused]] auto n = write(STDERR_FILENO, s, std::strlen(s)); }

void report(const Region& r, uintptr_t addr) {
  char line[320];
  std::snprintf(line, sizeof line,
                "xuanxue: XX_EMULATE_DEVICE: host code touched kernel memory outside a kernel or deep_copy: "
                "'%s', byte %llu (a %llu-byte allocation); on a GPU this reads device memory from the host. Call "
                "stack:\n",
                r.label, static_cast<unsigned long long>(addr - r.data), static_cast<unsigned long long>(r.bytes));
  say(line);
  void* frames[48];
  backtrace_symbols_fd(frames, backtrace(frames, 48), STDERR_FILENO);
}

// Not async-signal-safe in the lookup (the map may be changing on another
// thread); the emulation is a debugging mode and the bad case aborts anyway.
void on_fault(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  auto it = g_regions->upper_bound(addr);
  if (it != g_regions->begin()) {
    --it;
    Region& r = it->second;
    if (addr < r.end) {
      if (g_scopes.load() == 0) report(r, addr);  // report only: go on
      if (g_scopes.load() > 0 || g_report_only) {  // a kernel's (or a device library's) first touch
        protect(it->first, r, PROT_READ | PROT_WRITE);
        r.open = true;
        g_opened->push_back(it->first);
        return;
      }
      signal(SIGABRT, SIG_DFL);
      abort();
    }
  }
  // Not ours: a crash, as without the emulation (not handed to a handler it
  // replaced: a test framework's re-raises, which would come back here).
  signal(SIGSEGV, SIG_DFL);
  raise(SIGSEGV);
}

// The first whole page of an allocation's data (Kokkos reports the
// allocation, header first).
uintptr_t first_page(uintptr_t alloc) {
  const uintptr_t data = alloc + sizeof(Kokkos::Impl::SharedAllocationHeader);
  return (data + g_page - 1) / g_page * g_page;
}

void on_allocate(Kokkos_Profiling_SpaceHandle, const char* label, const void* ptr, uint64_t bytes) {
  if (std::strncmp(label, kHostLabel, std::strlen(kHostLabel)) == 0) return;
  if (std::strncmp(label, "Kokkos::", 8) == 0) return;  // its own (scratch): freed without a callback
  const auto alloc = reinterpret_cast<uintptr_t>(ptr), data = alloc + sizeof(Kokkos::Impl::SharedAllocationHeader);
  {
    std::lock_guard lock(g_mutex);
    (*g_allocations)[data] = data + bytes;
  }
  const uintptr_t begin = first_page(alloc), end = (data + bytes) / g_page * g_page;
  if (end <= begin) return;  // no whole page inside
  Region r;
  r.end = end, r.alloc = alloc, r.data = data, r.bytes = bytes;
  std::snprintf(r.label, sizeof r.label, "%s", label);
  std::lock_guard lock(g_mutex);
  r.open = g_scopes.load() > 0;
  if (r.open) g_opened->push_back(begin);
  else protect(begin, r, PROT_NONE);
  (*g_regions)[begin] = r;
}

void on_deallocate(Kokkos_Profiling_SpaceHandle, const char*, const void* ptr, uint64_t) {
  const auto alloc = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard lock(g_mutex);
  g_allocations->erase(alloc + sizeof(Kokkos::Impl::SharedAllocationHeader));
  auto it = g_regions->find(first_page(alloc));
  if (it == g_regions->end() || it->second.alloc != alloc) return;  // not one it protects
  protect(it->first, it->second, PROT_READ | PROT_WRITE);  // before the allocator writes to it
  g_regions->erase(it);
}

void on_begin(const char*, uint32_t, uint64_t*) { open_scope(); }
void on_end(uint64_t) { close_scope(); }
void on_begin_copy(Kokkos_Profiling_SpaceHandle, const char*, const void*, Kokkos_Profiling_SpaceHandle, const char*,
                   const void*, uint64_t) {
  open_scope();
}
void on_end_copy() { close_scope(); }

}  // namespace

bool device_emulated() { return g_emulated.load(); }

bool kernel_memory_on_host() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible && !device_emulated();
}

bool start_device_emulation_if_asked() {
  const char* asked = std::getenv("XX_EMULATE_DEVICE");
  if (!asked || (std::strcmp(asked, "1") != 0 && std::strcmp(asked, "report") != 0)) return false;
  g_report_only = std::strcmp(asked, "report") == 0;
  if (!Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible) {
    std::fprintf(stderr, "xuanxue: XX_EMULATE_DEVICE=1 is for host builds: this build's kernels run on a device\n");
    std::exit(2);
  }
  if (device_emulated()) return own_the_fault_handler(), true;
  g_page = uintptr_t(sysconf(_SC_PAGESIZE));
  g_regions = new std::map<uintptr_t, Region>;  // never freed: the callbacks may outlive static destructors
  g_opened = new std::vector<uintptr_t>;
  g_allocations = new std::map<uintptr_t, uintptr_t>;
  g_opened->reserve(4096);
  stack_t alt{};  // (the main thread's: the kernels and GEMMs run on it)
  alt.ss_size = size_t(1) << 20;
  alt.ss_sp = std::malloc(alt.ss_size);
  sigaltstack(&alt, nullptr);
  own_the_fault_handler();
  namespace tools = Kokkos::Tools::Experimental;
  tools::set_allocate_data_callback(on_allocate);
  tools::set_deallocate_data_callback(on_deallocate);
  tools::set_begin_parallel_for_callback(on_begin);
  tools::set_end_parallel_for_callback(on_end);
  tools::set_begin_parallel_reduce_callback(on_begin);
  tools::set_end_parallel_reduce_callback(on_end);
  tools::set_begin_parallel_scan_callback(on_begin);
  tools::set_end_parallel_scan_callback(on_end);
  tools::set_begin_deep_copy_callback(on_begin_copy);
  tools::set_end_deep_copy_callback(on_end_copy);
  g_emulated = true;
  return true;
}

std::string device_emulation_report() {
  if (!device_emulated()) return "";
  return "emulated device (XX_EMULATE_DEVICE=1): device-side paths, kernel memory trapped outside kernels";
}

int visible_gpus() {
#ifdef KOKKOS_ENABLE_CUDA
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
#else
  if (!device_emulated()) return 0;
  const char* asked = std::getenv("XX_EMULATE_GPUS");
  if (!asked) return 1;
  char* end = nullptr;
  const long count = std::strtol(asked, &end, 10);
  if (*asked == '\0' || *end != '\0' || count < 0 || count > 1024) {
    std::fprintf(stderr, "xuanxue: XX_EMULATE_GPUS='%s' (expected a GPU count from 0 to 1024)\n", asked);
    std::exit(2);
  }
  return int(count);
#endif
}

bool is_kernel_memory(const void* p, int64_t bytes) {
  if (!device_emulated()) return true;  // (a GPU build would ask CUDA; a host build cannot tell)
  const auto begin = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(g_mutex);
  auto it = g_allocations->upper_bound(begin);
  if (it == g_allocations->begin()) return false;
  --it;
  return begin >= it->first && begin + uintptr_t(std::max<int64_t>(bytes, 0)) <= it->second;
}

DeviceWork::DeviceWork() {
  if (device_emulated()) open_scope();
}
DeviceWork::~DeviceWork() {
  if (device_emulated()) close_scope();
}

}  // namespace xx
