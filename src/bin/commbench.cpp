// xx_commbench: what gradient synchronisation costs on this machine, printed
// as nccl-tests' all_reduce_perf (and its siblings) print it. The cases:
//   dense           MPI_Allreduce(MPI_SUM) of float32 buffers, out of place.
//   reduce_scatter  MPI_Reduce_scatter_block(MPI_SUM) of float32, out of place.
//   all_gather      MPI_Allgather of float32, out of place.
//   all_to_all      MPI_Alltoall of float32, out of place.
//   sparse  the path of docs/COMPRESSION.md for a gradient of N floats:
//           compress (top-k, int8/int4, feedback off so every iteration does
//           the same work), exchange the payloads among all ranks over a
//           PayloadExchange (mpi, ucx), decode_sum.
//
// usage: mpirun -n R xx_commbench [-b MIN] [-e MAX] [-f FACTOR] [-w WARMUP] [-n ITERS]
//          [--sparse N,...] [--ratios X,...] [--quants none,int8,int4,bf16]
//          [--transport mpi|ucx|both] [--cases CASE,...] [--timeout S] [--json FILE]
//   CASE: dense, reduce_scatter, all_gather, all_to_all, sparse (default: all of them)
// Sizes and counts take a K, M or G suffix (powers of 1024), as in nccl-tests.
// The UCX transport needs UCX_TLS=self,tcp on one host (src/comm/exchange.h).
//
// Figures, R ranks. A size S from -b, -e, -f stands for count = S/4 floats, and
// each table sizes its rows as nccl-tests does (count and size are its columns):
//   case            count (the MPI call's)   size (B)                  busbw / algbw
//   dense           S/4                      count * 4                 2(R-1)/R
//   reduce_scatter  S/4/R received           count * R * 4, the send   (R-1)/R
//   all_gather      S/4/R sent               count * R * 4, the recv   (R-1)/R
//   all_to_all      S/4/R to each peer       count * R * 4, the send   (R-1)/R
//   sparse          N (the gradient)         count * 4                 2(R-1)/R
//   (S/4/R rounded down, so size can be below S; nccl-tests also rounds all_to_all's
//   count down to 16 bytes for the GPU's sake, which MPI does not need.)
//   time     max over ranks of the mean over the timed iterations (nccl-tests)
//   med      median over the timed iterations of the slowest rank's time
//   algbw    size / time; for sparse, size is the dense gradient the payloads stand for
//   busbw    algbw * the factor above: nccl-tests' bus bandwidth of each collective.
//            Sparse: the bus bandwidth a dense all-reduce of the same size would need
//            to finish in the same time, so sparse beats dense where its busbw is higher.
//   payload  bytes of one rank's payload, = payload_bytes(N, k, quant, block)
//   factor   size / payload
//   xchg     exchange() alone, as time is (max over ranks of the mean). A barrier
//            before it, not counted anywhere, keeps a peer's slower compress out of it.
//   wire     bytes_sent() / xchg: bytes this rank hands the transport per second
//            ((R-1) payloads, plus 16 bytes per peer over mpi)
//   #wrong   summed over ranks. Dense, reduce_scatter: received elements that differ
//            from the exact sum (small integers, exact in any order). all_gather,
//            all_to_all: received elements that differ from what their sender put
//            there (integers below 2^23 drawn from the sender's rank and index, so
//            an element in the wrong place shows). Sparse: elements of the decoded
//            sum that differ bit for bit from the sum each rank computes itself,
//            compressing every rank's gradient (regenerated from that rank's seed)
//            and decode_summing in rank order.
// Exit status: 0 OK, 1 FAILED (a #wrong, or a transport asked for is disabled), 2 bad usage.

// MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather, MPI_Alltoall, MPI_Wtime
#include <mpi.h>
// Kokkos::ScopeGuard, parallel_for / parallel_reduce
#include <Kokkos_Core.hpp>
// fmt::print for the table
#include <fmt/format.h>
// fmt::join for the --cases message (in fmt/ranges.h from fmt 11)
#include <fmt/ranges.h>
// --json FILE
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

// make_mpi_exchange, make_ucx_exchange: the sparse transports
#include "comm/exchange.h"
// normal(seed, i): the gradients; splitmix64: the collectives' values; regenerable on any rank
#include "core/rng.h"
// Buffer, Vec, ExecSpace
#include "core/views.h"
// compress, decode_sum, payload_bytes, topk_count
#include "kernels/compress.h"

namespace {

using namespace xx;
namespace cz = xx::kernels::compress;
using json = nlohmann::ordered_json;

// The transports move host memory, and the sparse case hands them payloads
// that its kernels wrote, without staging: right where Kokkos runs on the host
// (Debian's). A build whose kernels run on a GPU (the cuda preset) runs the
// MPI collectives only, and refuses `sparse` until it stages through the host.
constexpr bool kHostKernels = Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible;

constexpr uint64_t kSeed = 0x636f6d6d62656e63ULL;  // "commbenc"
constexpr int64_t kF32 = sizeof(float);

// ----------------------------------------------------------------------------
// command line

// --cases, in the order the tables print: kCollectives' names, then sparse.
const char* const kCases[] = {"dense", "reduce_scatter", "all_gather", "all_to_all", "sparse"};

struct Options {
  int64_t min_bytes = 4 << 10, max_bytes = 64 << 20, factor = 4;
  int warmup = 5, iters = 20;
  std::vector<int64_t> sparse_n = {1 << 20, 16 << 20};
  std::vector<double> ratios = {0.1, 0.01, 0.001};
  std::vector<cz::Quant> quants = {cz::Quant::none, cz::Quant::int8, cz::Quant::int4};
  std::vector<std::string> transports = {"mpi", "ucx"};
  std::set<std::string> cases{std::begin(kCases), std::end(kCases)};
  bool ucx_required = false;
  double timeout_s = 300;  // generous: ranks may share cores
  std::string json_path;
  bool has(const std::string& c) const { return cases.count(c) > 0; }
};

const char* kUsage =
    "usage: mpirun -n R xx_commbench [-b MIN] [-e MAX] [-f FACTOR] [-w WARMUP] [-n ITERS]\n"
    "         [--sparse N,...] [--ratios X,...] [--quants none,int8,int4,bf16]\n"
    "         [--transport mpi|ucx|both] [--cases CASE,...] [--timeout S] [--json FILE]\n"
    "  CASE: dense (all-reduce), reduce_scatter, all_gather, all_to_all, sparse\n"
    "  defaults: -b 4K -e 64M -f 4 -w 5 -n 20 --sparse 1M,16M --ratios 0.1,0.01,0.001\n"
    "            --quants none,int8,int4 --transport both\n"
    "            --cases dense,reduce_scatter,all_gather,all_to_all,sparse\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t comma; (comma = s.find(',', start)) != std::string::npos; start = comma + 1)
    out.push_back(s.substr(start, comma - start));
  out.push_back(s.substr(start));
  return out;
}

// "4096", "4K", "16M", "1G" (powers of 1024).
int64_t parse_size(const std::string& flag, const std::string& s) {
  size_t used = 0;
  int64_t v = -1;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
  }
  const std::string unit = used ? s.substr(used) : "";
  const int shift = unit == "" ? 0 : unit == "K" || unit == "k" ? 10 : unit == "M" || unit == "m" ? 20 : unit == "G" || unit == "g" ? 30 : -1;
  if (!used || v < 1 || shift < 0) throw UsageError(fmt::format("{} '{}': expected a positive size like 4096, 4K, 16M", flag, s));
  return v << shift;
}

int parse_count(const std::string& flag, const std::string& s, int min) {
  size_t used = 0;
  int v = -1;
  try {
    v = std::stoi(s, &used);
  } catch (const std::exception&) {
  }
  if (!used || used != s.size() || v < min) throw UsageError(fmt::format("{} '{}': expected an integer >= {}", flag, s, min));
  return v;
}

double parse_number(const std::string& flag, const std::string& s) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
  }
  if (used != s.size() || !(v > 0)) throw UsageError(fmt::format("{} '{}': expected a positive number", flag, s));
  return v;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") throw UsageError("");
    if (i + 1 >= argc) throw UsageError(fmt::format("{}: expected a value after it (or an unknown flag)", flag));
    const std::string v = argv[++i];
    if (flag == "-b") o.min_bytes = parse_size(flag, v);
    else if (flag == "-e") o.max_bytes = parse_size(flag, v);
    else if (flag == "-f") o.factor = parse_count(flag, v, 2);
    else if (flag == "-w") o.warmup = parse_count(flag, v, 0);
    else if (flag == "-n") o.iters = parse_count(flag, v, 1);
    else if (flag == "--timeout") o.timeout_s = parse_number(flag, v);
    else if (flag == "--json") o.json_path = v;
    else if (flag == "--sparse") {
      o.sparse_n.clear();
      for (const auto& s : split(v)) o.sparse_n.push_back(parse_size(flag, s));
    } else if (flag == "--ratios") {
      o.ratios.clear();
      for (const auto& s : split(v)) o.ratios.push_back(parse_number(flag, s));
    } else if (flag == "--quants") {
      o.quants.clear();
      for (const auto& s : split(v)) {
        const auto q = xx::mode_from_name<cz::Quant>(s);
        if (!q) throw UsageError(fmt::format("--quants '{}': expected none, int8, int4 or bf16", s));
        o.quants.push_back(*q);
      }
    } else if (flag == "--transport") {
      if (v == "both") o.transports = {"mpi", "ucx"};
      else if (v == "mpi" || v == "ucx") o.transports = {v};
      else throw UsageError(fmt::format("--transport '{}': expected mpi, ucx or both", v));
      o.ucx_required = v == "ucx";  // asked for by name: disabled is a failure, not a skip
    } else if (flag == "--cases") {
      o.cases.clear();
      for (const auto& s : split(v)) {
        if (std::find(std::begin(kCases), std::end(kCases), s) == std::end(kCases))
          throw UsageError(fmt::format("--cases '{}': expected one of {}", s, fmt::join(kCases, ", ")));
        o.cases.insert(s);
      }
    } else {
      throw UsageError(fmt::format("unknown flag '{}'", flag));
    }
  }
  if (o.min_bytes > o.max_bytes) throw UsageError(fmt::format("-b {} is above -e {}", o.min_bytes, o.max_bytes));
  for (double r : o.ratios)
    if (r >= 1) throw UsageError(fmt::format("--ratios {}: a ratio must be below 1 (1 is the dense case)", r));
  for (int64_t n : o.sparse_n)
    if (n > int64_t(UINT32_MAX)) throw UsageError(fmt::format("--sparse {}: the payload format holds n < 2^32", n));
  return o;
}

// ----------------------------------------------------------------------------
// timing

struct Timing {
  double time_us = 0, med_us = 0;  // max over ranks of the mean; median of the slowest rank per iteration
};

// Every rank passes its per-iteration seconds (the same count on every rank).
Timing reduce_times(std::vector<double> t, MPI_Comm comm) {
  Timing out;
  const double mean = std::accumulate(t.begin(), t.end(), 0.0) / double(t.size());
  MPI_Allreduce(&mean, &out.time_us, 1, MPI_DOUBLE, MPI_MAX, comm);
  MPI_Allreduce(MPI_IN_PLACE, t.data(), int(t.size()), MPI_DOUBLE, MPI_MAX, comm);
  std::sort(t.begin(), t.end());
  const size_t h = t.size() / 2;
  out.med_us = 1e6 * (t.size() % 2 ? t[h] : 0.5 * (t[h - 1] + t[h]));
  out.time_us *= 1e6;
  return out;
}

// Seconds of one iteration: all of it, and the exchange alone (0 for the collectives).
struct Lap {
  double total = 0, inner = 0;
};

// Runs `step` warmup times, then iters times; step() times itself. Ranks
// start the timed loop together.
template <class Step>
std::pair<std::vector<double>, std::vector<double>> timed(const Options& o, MPI_Comm comm, Step&& step) {
  for (int i = 0; i < o.warmup; ++i) step();
  MPI_Barrier(comm);
  std::vector<double> total(o.iters), inner(o.iters);
  for (int i = 0; i < o.iters; ++i) {
    const Lap lap = step();
    total[i] = lap.total, inner[i] = lap.inner;
  }
  return {total, inner};
}

int64_t sum_over_ranks(int64_t v, MPI_Comm comm) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT64_T, MPI_SUM, comm);
  return v;
}

double gbps(double bytes, double us) { return us > 0 ? bytes / us / 1e3 : 0; }

// ----------------------------------------------------------------------------
// collectives: the dense all-reduce and its nccl-tests siblings, one table each

// Rank r's element j of a send buffer, a pure function of (r, j) that any rank
// can recompute: splitmix64 is a bijection, so no two (r, j) share a draw.
uint64_t draw(int r, int64_t j) { return splitmix64(kSeed + (uint64_t(r) << 40) + uint64_t(j)); }
// An integer in [-8, 7]: a sum over ranks (|sum| <= 8R) is exact in float
// whatever order the reduction adds in.
float small_value(int r, int64_t j) { return float(int(draw(r, j) >> 60) - 8); }
// An integer below 2^23, exact in float: moved, not added, and two elements
// agree only 1 time in 2^23, so one that lands in the wrong place shows.
float label_value(int r, int64_t j) { return float(draw(r, j) >> 41); }

// One collective as nccl-tests sizes it. n is the count argument of the MPI
// call (nccl-tests' count column); a buffer holds n floats, or R blocks of n.
// size, the larger buffer of one rank, is what algbw divides by the time.
struct Collective {
  const char* name;   // in --cases, in the --json output and the average's line
  const char* title;  // the line above its table
  const char* mpi;    // the MPI call
  const char* op;     // "sum", or "none" for those that only move data
  bool per_rank;      // n = count / R (one block per rank), not count
  bool send_blocks, recv_blocks;  // that buffer holds R blocks of n
  int bus;                        // busbw = algbw * bus * (R-1)/R
  float (*send_value)(int r, int64_t j);                 // rank r's send element j
  float (*expect)(int r, int64_t i, int64_t n, int R);  // rank r's receive element i
  int (*call)(const float* send, float* recv, int n, MPI_Comm comm);
};

float summed(int64_t j, int R) {
  float s = 0;
  for (int q = 0; q < R; ++q) s += small_value(q, j);
  return s;
}

// MPI_Reduce_scatter_block has no wrapper in src/resilience/mpi_profile.cpp
// (the trainer never calls it), so the flight recorder does not see it, its
// time lacks the recorder's (small) cost, and an error comes back here as a
// code (MPI_ERRORS_RETURN) instead of ending the job there: run_collective checks it.
const Collective kCollectives[] = {
    {"dense", "dense all-reduce: MPI_Allreduce(MPI_SUM) of float32, out of place", "MPI_Allreduce", "sum", false,
     false, false, 2, small_value, [](int, int64_t i, int64_t, int R) { return summed(i, R); },
     [](const float* s, float* r, int n, MPI_Comm c) { return MPI_Allreduce(s, r, n, MPI_FLOAT, MPI_SUM, c); }},
    {"reduce_scatter",
     "reduce-scatter: MPI_Reduce_scatter_block(MPI_SUM) of float32, out of place; count = what each rank\n"
     "# receives, size = the send buffer (count * R * 4)",
     "MPI_Reduce_scatter_block", "sum", true, true, false, 1, small_value,
     [](int r, int64_t i, int64_t n, int R) { return summed(r * n + i, R); },
     [](const float* s, float* r, int n, MPI_Comm c) { return MPI_Reduce_scatter_block(s, r, n, MPI_FLOAT, MPI_SUM, c); }},
    {"all_gather",
     "all-gather: MPI_Allgather of float32, out of place; count = what each rank sends, size = the\n"
     "# receive buffer (count * R * 4)",
     "MPI_Allgather", "none", true, false, true, 1, label_value,
     [](int, int64_t i, int64_t n, int) { return label_value(int(i / n), i % n); },
     [](const float* s, float* r, int n, MPI_Comm c) { return MPI_Allgather(s, n, MPI_FLOAT, r, n, MPI_FLOAT, c); }},
    {"all_to_all",
     "all-to-all: MPI_Alltoall of float32, out of place; count = what each rank sends each peer,\n"
     "# size = the send buffer (count * R * 4)",
     "MPI_Alltoall", "none", true, true, true, 1, label_value,
     [](int r, int64_t i, int64_t n, int) { return label_value(int(i / n), r * n + i % n); },
     [](const float* s, float* r, int n, MPI_Comm c) { return MPI_Alltoall(s, n, MPI_FLOAT, r, n, MPI_FLOAT, c); }},
};

json run_collective(const Collective& c, const Options& o, MPI_Comm comm, int rank, int R, int64_t& wrong_total) {
  if (rank == 0) {
    fmt::print("#\n# {}\n", c.title);
    fmt::print("#\n# {:>10} {:>12} {:>6} {:>6} {:>10} {:>10} {:>8} {:>8} {:>7}\n", "size", "count", "type", "op",
               "time", "med", "algbw", "busbw", "#wrong");
    fmt::print("# {:>10} {:>12} {:>6} {:>6} {:>10} {:>10} {:>8} {:>8} {:>7}\n", "(B)", "(elements)", "", "", "(us)",
               "(us)", "(GB/s)", "(GB/s)", "");
  }
  json rows = json::array();
  double bus_sum = 0;
  for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
    const int64_t n = bytes / kF32 / (c.per_rank ? R : 1);
    if (n < 1) continue;
    std::vector<float> send(n * (c.send_blocks ? R : 1)), recv(n * (c.recv_blocks ? R : 1), 0.0f);
    for (int64_t j = 0; j < int64_t(send.size()); ++j) send[j] = c.send_value(rank, j);
    auto [total, inner] = timed(o, comm, [&] {
      const double t0 = MPI_Wtime();
      const int rc = c.call(send.data(), recv.data(), int(n), comm);
      const double t1 = MPI_Wtime();
      if (rc != MPI_SUCCESS) throw std::runtime_error(fmt::format("{} failed: MPI error {}", c.mpi, rc));
      return Lap{t1 - t0, 0};
    });
    const Timing t = reduce_times(total, comm);
    int64_t wrong = 0;  // the result of the last timed iteration
    for (int64_t i = 0; i < int64_t(recv.size()); ++i) wrong += recv[i] != c.expect(rank, i, n, R);
    wrong = sum_over_ranks(wrong, comm);
    wrong_total += wrong;
    const int64_t size = int64_t(std::max(send.size(), recv.size())) * kF32;
    const double algbw = gbps(double(size), t.time_us), busbw = algbw * c.bus * (R - 1) / R;
    bus_sum += busbw;
    if (rank == 0)
      fmt::print("  {:>10} {:>12} {:>6} {:>6} {:>10.1f} {:>10.1f} {:>8.3f} {:>8.3f} {:>7}\n", size, n, "float", c.op,
                 t.time_us, t.med_us, algbw, busbw, wrong);
    rows.push_back({{"size_bytes", size}, {"count", n}, {"type", "float"}, {"op", c.op}, {"time_us", t.time_us},
                    {"med_us", t.med_us}, {"algbw_gbps", algbw}, {"busbw_gbps", busbw}, {"wrong", wrong}});
  }
  if (rank == 0 && !rows.empty())
    fmt::print("# Avg bus bandwidth ({}) : {:.3f} GB/s\n", c.name, bus_sum / double(rows.size()));
  return rows;
}

// ----------------------------------------------------------------------------
// sparse exchange

// Rank r's gradient: standard normal values, a pure function of (r, i),
// drawn on the host (core/rng.h is host code) and copied to the kernels' memory.
void fill_gradient(Vec<float> g, int r) {
  const uint64_t seed = mix_seed(kSeed, uint64_t(r));
  std::vector<float> values(g.extent(0));
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(normal(seed, uint64_t(i)));
  Kokkos::deep_copy(g, Kokkos::View<const float*, Kokkos::HostSpace, Unmanaged>(values.data(), values.size()));
}

// Elements whose bits differ (so -0 vs 0 and NaNs count too).
int64_t count_differing(Vec<const float> a, Vec<const float> b) {
  int64_t bad = 0;
  Kokkos::parallel_reduce(
      "commbench::compare", Kokkos::RangePolicy<ExecSpace>(0, a.extent(0)),
      KOKKOS_LAMBDA(int64_t i, int64_t & w) {
        uint32_t x, y;
        std::memcpy(&x, &a(i), sizeof(x));
        std::memcpy(&y, &b(i), sizeof(y));
        w += x != y;
      },
      bad);
  return bad;
}

template <class T> Vec<T> V(const Buffer<T>& b) { return Vec<T>(b.data(), b.extent(0)); }
template <class T> Vec<const T> CV(const Buffer<T>& b) { return Vec<const T>(b.data(), b.extent(0)); }
Vec<uint8_t> bytes_of(std::vector<std::byte>& p) { return Vec<uint8_t>(reinterpret_cast<uint8_t*>(p.data()), p.size()); }
Vec<const uint8_t> bytes_of(const std::vector<std::byte>& p) {
  return Vec<const uint8_t>(reinterpret_cast<const uint8_t*>(p.data()), p.size());
}

struct SparseCase {
  double ratio;
  cz::Quant quant;
};

void print_sparse_header(const char* transport) {
  fmt::print("#\n# sparse exchange over {}: time = compress (top-k, feedback off) + exchange + decode_sum, timed\n"
             "# apart with a barrier (not counted) before the exchange; algbw and busbw count the dense bytes\n"
             "# the payloads stand for (size = count * 4)\n",
             transport);
  fmt::print("#\n# {:>10} {:>12} {:>6} {:>12} {:>10} {:>7} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8} {:>7}\n", "size",
             "count", "type", "kind", "payload", "factor", "time", "med", "xchg", "algbw", "busbw", "wire", "#wrong");
  fmt::print("# {:>10} {:>12} {:>6} {:>12} {:>10} {:>7} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8} {:>7}\n", "(B)",
             "(elements)", "", "(ratio:q)", "(B)", "", "(us)", "(us)", "(us)", "(GB/s)", "(GB/s)", "(GB/s)", "");
}

// The sparse rows of every transport; payloads and expected sums are built once per N.
json run_sparse(const Options& o, const std::vector<std::unique_ptr<PayloadExchange>>& xs, MPI_Comm comm, int rank,
                int R, int64_t& wrong_total) {
  std::vector<SparseCase> cases;
  for (double ratio : o.ratios)
    for (cz::Quant q : o.quants) cases.push_back({ratio, q});
  std::vector<int> group(R);
  std::iota(group.begin(), group.end(), 0);
  json rows = json::array();
  std::vector<std::vector<std::string>> lines(xs.size());  // table rows, per transport
  std::vector<double> bus_sum(xs.size(), 0.0);
  std::vector<uint64_t> tags(xs.size(), 1);  // a fresh tag per round, per transport
  for (const int64_t N : o.sparse_n) {
    const double max_ratio = *std::max_element(o.ratios.begin(), o.ratios.end());
    cz::Workspace ws(N, cz::topk_count(N, max_ratio));
    Buffer<float> grad("commbench::grad", N);          // (N) this rank's gradient
    Buffer<float> residual("commbench::residual", N);  // (N) written, not read: feedback is off
    Buffer<float> sum("commbench::sum", N);            // (N) decode_sum of what came over the wire
    Buffer<float> expect("commbench::expect", N);      // (N) the same sum, computed here
    fill_gradient(V(grad), rank);

    // The payload of every rank for every case, made here from its seed:
    // expected[c][r]. One gradient at a time; only the payloads are kept.
    std::vector<std::vector<std::vector<std::byte>>> expected(cases.size(), std::vector<std::vector<std::byte>>(R));
    {
      Buffer<float> other("commbench::other_grad", N);
      for (int r = 0; r < R; ++r) {
        if (r != rank) fill_gradient(V(other), r);
        for (size_t c = 0; c < cases.size(); ++c) {
          const cz::Settings s{cases[c].ratio, cases[c].quant, 64, false};
          auto& p = expected[c][r];
          p.resize(cz::payload_bytes(N, cz::topk_count(N, s.ratio), s.quant, s.block));
          cz::compress(bytes_of(p), V(residual), r == rank ? CV(grad) : CV(other), s, ws);
        }
      }
    }

    for (size_t c = 0; c < cases.size(); ++c) {
      const cz::Settings s{cases[c].ratio, cases[c].quant, 64, false};
      const int64_t k = cz::topk_count(N, s.ratio), payload = cz::payload_bytes(N, k, s.quant, s.block);
      std::vector<Vec<const uint8_t>> views(R);
      for (int r = 0; r < R; ++r) views[r] = bytes_of(expected[c][r]);
      cz::decode_sum(V(expect), views);
      for (size_t x = 0; x < xs.size(); ++x) {
        PayloadExchange& ex = *xs[x];
        std::vector<std::byte> mine(payload);
        int64_t sent = 0;
        // One iteration: compress into the send buffer, exchange, decode_sum,
        // each phase timed. The barrier (not counted) keeps a peer's slower
        // compress out of this rank's exchange time, so xchg is the transport's.
        auto [total, inner] = timed(o, comm, [&] {
          const double t0 = MPI_Wtime();
          cz::compress(bytes_of(mine), V(residual), CV(grad), s, ws);
          Kokkos::fence();  // the payload is complete before the transport reads it
          const double t1 = MPI_Wtime();
          MPI_Barrier(comm);
          const double t2 = MPI_Wtime();
          const auto got = ex.exchange(group, mine, tags[x]++, o.timeout_s);
          const double t3 = MPI_Wtime();
          sent = ex.bytes_sent();
          for (int r = 0; r < R; ++r) views[r] = bytes_of(got[r]);
          cz::decode_sum(V(sum), views);
          Kokkos::fence();
          const double xchg = t3 - t2;
          return Lap{(t1 - t0) + xchg + (MPI_Wtime() - t3), xchg};
        });
        const Timing t = reduce_times(total, comm), tx = reduce_times(inner, comm);
        const int64_t wrong = sum_over_ranks(count_differing(CV(sum), CV(expect)), comm);
        wrong_total += wrong;
        const double size = double(N * kF32), algbw = gbps(size, t.time_us), busbw = algbw * 2.0 * (R - 1) / R;
        const double wire = gbps(double(sent), tx.time_us), factor = size / double(payload);
        const std::string kind = fmt::format("{}:{}", s.ratio, xx::mode_name(s.quant));
        bus_sum[x] += busbw;
        lines[x].push_back(fmt::format(
            "  {:>10} {:>12} {:>6} {:>12} {:>10} {:>7.1f} {:>10.1f} {:>10.1f} {:>10.1f} {:>8.3f} {:>8.3f} {:>8.3f} {:>7}",
            N * kF32, N, "float", kind, payload, factor, t.time_us, t.med_us, tx.time_us, algbw, busbw, wire, wrong));
        rows.push_back({{"transport", ex.name()}, {"size_bytes", N * kF32}, {"count", N}, {"type", "float"},
                        {"ratio", s.ratio}, {"quant", xx::mode_name(s.quant)}, {"k", k}, {"payload_bytes", payload},
                        {"bytes_sent", sent}, {"factor", factor}, {"time_us", t.time_us}, {"med_us", t.med_us},
                        {"xchg_us", tx.time_us}, {"xchg_med_us", tx.med_us}, {"algbw_gbps", algbw},
                        {"busbw_gbps", busbw}, {"wire_gbps", wire}, {"wrong", wrong}});
      }
    }
  }
  // One table per transport, printed after all of them ran so the tables stay whole.
  if (rank == 0) {
    for (size_t x = 0; x < xs.size(); ++x) {
      print_sparse_header(xs[x]->name());
      for (const auto& line : lines[x]) fmt::print("{}\n", line);
      if (!lines[x].empty())
        fmt::print("# Avg bus bandwidth (sparse, {}) : {:.3f} GB/s\n", xs[x]->name(), bus_sum[x] / double(lines[x].size()));
    }
  }
  return rows;
}

// ----------------------------------------------------------------------------
// main program

int run(int argc, char** argv, MPI_Comm comm) {
  int rank = 0, R = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &R);
  Options o;
  try {
    o = parse_options(argc, argv);  // same arguments on every rank: all agree without talking
    if (!kHostKernels && o.has("sparse"))
      throw UsageError("--cases sparse: this build's kernels run on the GPU and the sparse case does not stage its "
                       "payloads through host memory yet; choose the other cases");
  } catch (const UsageError& e) {
    if (rank == 0) fmt::print(stderr, "{}{}{}", e.what(), *e.what() ? "\n" : "", kUsage);
    return std::string(e.what()).empty() ? 0 : 2;
  }
  bool ok = true;
  // Transports are built collectively, the same list on every rank.
  std::vector<std::unique_ptr<PayloadExchange>> xs;
  if (o.has("sparse")) {
    for (const auto& name : o.transports) {
      auto x = name == "mpi" ? make_mpi_exchange(comm) : make_ucx_exchange(comm);
      if (x->enabled()) {
        xs.push_back(std::move(x));
        continue;
      }
      if (rank == 0) fmt::print("# {} transport disabled: {}\n", name, x->disabled_reason());
      if (o.ucx_required) ok = false;  // asked for by name
    }
  }
  if (rank == 0) {
    std::string names;
    for (const auto& x : xs) names += std::string(names.empty() ? "" : ",") + x->name();
    fmt::print("# xx_commbench: {} ranks, {} warmup + {} timed iterations, sparse transports: {}\n", R, o.warmup,
               o.iters, names.empty() || !o.has("sparse") ? "none" : names);
    fmt::print("# time = max over ranks of the mean; med = median over iterations of the slowest rank;\n"
               "# algbw = size / time; busbw = algbw * 2(R-1)/R (nccl-tests all-reduce; sparse), or * (R-1)/R\n"
               "# (nccl-tests reduce-scatter, all-gather, all-to-all); size and count as nccl-tests has them;\n"
               "# payload = bytes of one rank's payload; factor = size / payload; xchg = exchange() alone;\n"
               "# wire = bytes_sent() / xchg; #wrong summed over ranks (bit-exact against a local recomputation)\n");
  }
  int64_t wrong = 0;
  json doc = {{"ranks", R}, {"warmup", o.warmup}, {"iters", o.iters}};
  for (const Collective& c : kCollectives)
    if (o.has(c.name)) doc[c.name] = run_collective(c, o, comm, rank, R, wrong);
  if (o.has("sparse") && !xs.empty()) doc["sparse"] = run_sparse(o, xs, comm, rank, R, wrong);
  ok = ok && wrong == 0;
  doc["wrong"] = wrong;
  doc["ok"] = ok;
  if (rank == 0) {
    fmt::print("#\n# Out of bounds values : {} {}{}\n", wrong, ok ? "OK" : "FAILED",
               ok || wrong ? "" : " (a transport asked for by name is disabled)");
    if (!o.json_path.empty()) {
      std::ofstream f(o.json_path);
      f << doc.dump(2) << "\n";
      if (!f) fmt::print(stderr, "xx_commbench: cannot write {}\n", o.json_path), ok = false;
    }
  }
  MPI_Barrier(comm);  // the UCX destructor flushes endpoints: every rank lets go at about the same time
  xs.clear();
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      code = run(argc, argv, MPI_COMM_WORLD);
    } catch (const std::exception& e) {
      // An exchange that timed out or a payload that failed to parse: name it and stop every rank.
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      std::fprintf(stderr, "xx_commbench: rank %d: %s\n", rank, e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  MPI_Finalize();
  return code;
}
