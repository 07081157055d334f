// The device emulation (core/device_memory.h) catches what it is for: each
// case runs in a forked child that starts the emulation, so a trap ends the
// child and not the test binary. A device build has no emulation (it exits 2
// when asked): there these cases are hidden (tag [.device_emulation]) and one
// case checks that refusal instead.
#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include "core/device_memory.h"
#include "kernels/gemm.h"

using namespace xx;

#ifdef KOKKOS_ENABLE_CUDA
#define XX_EMULATION_TAG "[.device_emulation]"
#else
#define XX_EMULATION_TAG "[device_emulation]"
#endif

namespace {

struct Child {
  int status = 0;
  std::string err;  // what it wrote to stderr
  bool exited_ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  bool aborted() const { return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT; }
};

Child in_emulated_child(const std::function<int()>& body) {
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(pipe_fds[0]);
    dup2(pipe_fds[1], STDERR_FILENO);
    setenv("XX_EMULATE_DEVICE", "1", 1);
    if (!start_device_emulation_if_asked()) _exit(3);  // (a device build exits 2 inside)
    _exit(body());
  }
  close(pipe_fds[1]);
  Child c;
  char buf[4096];
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof buf)) > 0;) c.err.append(buf, size_t(n));
  close(pipe_fds[0]);
  waitpid(pid, &c.status, 0);
  return c;
}

}  // namespace

TEST_CASE("device emulation: a host read of kernel memory stops the process, naming the buffer",
          XX_EMULATION_TAG) {
  const Child c = in_emulated_child([] {
    Buffer<float> b("test::trapped", 8192);  // 32 KiB: whole pages inside
    volatile float x = b.data()[4000];        // host code reading kernel memory: the bug
    return int(x);
  });
  INFO(c.err);
  CHECK(c.aborted());
  CHECK(c.err.find("host code touched kernel memory") != std::string::npos);
  CHECK(c.err.find("'test::trapped'") != std::string::npos);
  CHECK(c.err.find("byte 16000") != std::string::npos);
}

TEST_CASE("device emulation: a host write is caught as a read is", XX_EMULATION_TAG) {
  const Child c = in_emulated_child([] {
    Buffer<float> b("test::written", 8192);
    volatile float* p = b.data();
    p[4000] = 1.0f;  // the middle: whole pages there
    return 0;
  });
  INFO(c.err);
  CHECK(c.aborted());
  CHECK(c.err.find("'test::written'") != std::string::npos);
}

TEST_CASE("device emulation: kernels, deep_copy, the GEMM seam and host copies pass, with the right values",
          XX_EMULATION_TAG) {
  const Child c = in_emulated_child([] {
    if (kernel_memory_on_host()) return 10;  // the device-side paths are taken
    const int64_t n = 64;
    Buffer<float> a("test::a", n * n), b("test::b", n * n), out("test::c", n * n);
    Kokkos::parallel_for("test::fill", n * n, KOKKOS_LAMBDA(int64_t i) {
      a(i) = float(i % 7);
      b(i) = float(i % 5) - 2.0f;
    });
    kernels::gemm<float>("N", kernels::GemmIn<float>(mat(a, n, n)), "N", kernels::GemmIn<float>(mat(b, n, n)), 1.0f,
                         0.0f, mat(out, n, n));
    auto host = host_copy(out);  // a copy on an emulated device
    if (host.data() == out.data()) return 11;
    double want = 0;
    for (int64_t k = 0; k < n; ++k) want += double(k % 7) * (double((k * n + 5) % 5) - 2.0);
    if (host(5) != float(want)) return 12;  // row 0, column 5
    auto staging = host_staging(a);         // written on the host, copied in
    for (int64_t i = 0; i < n * n; ++i) staging(i) = 1.0f;
    Kokkos::deep_copy(a, staging);
    double sum = 0;
    Kokkos::parallel_reduce("test::sum", n * n, KOKKOS_LAMBDA(int64_t i, double& s) { s += a(i); }, sum);
    if (sum != double(n * n)) return 13;
    return 0;
  });
  INFO(c.err);
  CHECK(c.exited_ok());
  CHECK(WEXITSTATUS(c.status) == 0);
}

TEST_CASE("device emulation: freed kernel memory is host memory again", XX_EMULATION_TAG) {
  const Child c = in_emulated_child([] {
    for (int round = 0; round < 20; ++round) {
      { Buffer<float> b("test::freed", 16384 + round * 1024); }  // allocated, protected, freed
      auto* q = static_cast<char*>(std::malloc(65536 + round * 4096));  // likely where the buffer was
      std::memset(q, 1, 65536 + round * 4096);
      std::free(q);
    }
    return 0;
  });
  INFO(c.err);
  CHECK(c.exited_ok());
}

#ifdef KOKKOS_ENABLE_CUDA
TEST_CASE("device emulation: a device build refuses XX_EMULATE_DEVICE with exit 2", "[device]") {
  const Child c = in_emulated_child([] { return 0; });
  INFO(c.err);
  CHECK((WIFEXITED(c.status) && WEXITSTATUS(c.status) == 2));
  CHECK(c.err.find("XX_EMULATE_DEVICE=1 is for host builds") != std::string::npos);
}
#endif
