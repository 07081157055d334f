// xx_peak: one core's GEMM rate on a deck's GEMM shapes, the MFU
// denominator (../shared/MEASURING.md), written to the peak file that runs
// read (src/io/peak_file.h). Run it through `tools/bench peak`, which gives it
// the environment of tools/env.sh, as every run has.
//
// usage: xx_peak -in DECK [-var NAME VALUE]... [--out FILE] [--trials N] [--seconds S]
//          [--precision fp32,bf16] [--gemm auto|onednn|blas] [--products native|widened]
//          [--replace] [--if-missing] [--quiet]
//
// What is timed: on one thread, the GEMM seam (kernels/gemm.h, the backend
// --gemm chooses, as a deck's `gemm` does) through the model's own calls
// (kernels/linear.h), once per --precision: fp32 operands, or 16-bit ones
// (the weights and inputs packed beforehand, as a step packs them; the
// output gradient packed inside, as the backward does), on the forward, input-gradient and
// weight-gradient GEMMs of the deck's dense block (fused QKV (3C, C), output
// (C, C), fused gate/up (2F, C), down (C, F)) and of the head (V, C), each on
// N = batch * seq rows. One untimed pass, then --trials trials; a trial
// repeats whole passes for --seconds and gives
//   GFLOP/s = sum over its GEMMs of 2 * rows * out * in / its time.
// The peak is the best trial: on a shared machine a slow trial measures the
// neighbours, never a faster core. Median and min-max are printed beside it.
//
// The file keeps one entry per (CPU model, GEMM library and kernel,
// precision); the entry for this machine is replaced only by a higher peak
// (a busier machine only measures lower), unless --replace. --if-missing
// measures only when the file has no entry for this machine.
// Exit status: 0 OK, 1 the file could not be written, 2 bad usage or deck.

// Kokkos::ScopeGuard, fences
#include <Kokkos_Core.hpp>
// openblas_set_num_threads, looked up at run time
#include <dlfcn.h>
// fmt::print for the table
#include <fmt/format.h>
// the entry's details
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

// InputError: bad decks
#include "core/error.h"
// Buffer, mat
#include "core/views.h"
// read_deck, build_program, ModelConfig
#include "deck/deck.h"
// PeakKey, this_machine, the peak file
#include "io/peak_file.h"
// linear_forward, linear_backward: the model's GEMMs
#include "kernels/linear.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string deck, out;
  std::map<std::string, std::string> vars;
  int trials = 9;
  double seconds = 0.3;
  bool replace = false, if_missing = false, quiet = false;
  std::vector<std::string> precisions = {"fp32", "bf16"};
  std::string gemm = "auto";
  std::string products = "native";  // as the deck's `precision ... products`
};

const char* kUsage =
    "usage: xx_peak -in DECK [-var NAME VALUE]... [--out FILE] [--trials N] [--seconds S] "
    "[--precision fp32,bf16] [--gemm auto|onednn|blas] [--products native|widened] [--replace] [--if-missing] "
    "[--quiet]\n";

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "xx_peak: %s\n%s", what.c_str(), kUsage);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) usage_error(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "-in") a.deck = value(i);
      else if (arg == "-var") {
        const std::string name = value(i);
        a.vars[name] = value(i);
      } else if (arg == "--out") a.out = value(i);
      else if (arg == "--trials") a.trials = std::stoi(value(i));
      else if (arg == "--seconds") a.seconds = std::stod(value(i));
      else if (arg == "--precision") {
        a.precisions.clear();
        std::string list = value(i);
        for (size_t at = 0; at <= list.size();) {
          const size_t comma = std::min(list.find(',', at), list.size());
          const std::string p = list.substr(at, comma - at);
          if (p != "fp32" && p != "bf16" && p != "fp16") usage_error("--precision: '" + p + "' (expected fp32, bf16 or fp16)");
          a.precisions.push_back(p);
          at = comma + 1;
        }
      } else if (arg == "--gemm") {
        a.gemm = value(i);
        if (!xx::mode_from_name<xx::GemmChoice>(a.gemm))
          usage_error("--gemm: '" + a.gemm + "' (expected auto, onednn, cublas or blas)");
      } else if (arg == "--products") {
        a.products = value(i);
        if (a.products != "native" && a.products != "widened") usage_error("--products: expected native or widened");
      }
      else if (arg == "--replace") a.replace = true;
      else if (arg == "--if-missing") a.if_missing = true;
      else if (arg == "--quiet") a.quiet = true;
      else if (arg == "-h" || arg == "--help") {
        std::fputs(kUsage, stdout);
        std::exit(0);
      } else usage_error("unknown argument '" + arg + "'");
    }
  } catch (const std::logic_error&) {  // stoi and friends
    usage_error("a number did not parse");
  }
  if (a.deck.empty()) usage_error("-in DECK is required");
  if (a.trials < 1 || !(a.seconds > 0)) usage_error("--trials must be >= 1 and --seconds > 0");
  if (a.out.empty()) a.out = xx::default_peak_file();
  return a;
}

// One BLAS thread: the peak is one core's (tools/env.sh sets
// OPENBLAS_NUM_THREADS=1 too; this holds without it).
void one_blas_thread() {
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(1);
}

double load_average() {
  double load = -1;
  std::ifstream("/proc/loadavg") >> load;
  return load;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

struct Shape {
  std::string name;
  int64_t out, in;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// One precision's peak: measured, printed, written (or kept).
int measure(const Args& a, const xx::Config& cfg, const std::string& precision) {
  const xx::ModelConfig& m = cfg.model;
  const auto type = *xx::mode_from_name<xx::Precision>(precision);
  const xx::PeakKey key = xx::this_machine(xx::kernels::gemm_kernel(type), precision);

  if (a.if_missing) {
    const auto entry = xx::find_peak_entry(xx::read_peak_file(a.out), key);
    if (entry) {
      if (!a.quiet)
        fmt::print("# {} already holds a peak for this machine: {:.1f} GFLOP/s per core; nothing measured\n",
                   a.out, entry->gflops_per_core);
      return 0;
    }
  }

  const int64_t N = int64_t(cfg.data.batch) * m.seq, C = m.dim, F = m.ffn, V = m.vocab;
  const std::vector<Shape> shapes = {{"qkv", 3 * C, C}, {"out", C, C}, {"gate_up", 2 * F, C}, {"down", C, F},
                                     {"head", V, C}};
  int64_t widest = 0, largest = 0;
  for (const auto& s : shapes) widest = std::max({widest, s.out, s.in}), largest = std::max(largest, s.out * s.in);
  xx::Buffer<float> x("peak::x", N * widest), dx("peak::dx", N * widest), y("peak::y", N * widest),
      w("peak::w", largest), dw("peak::dw", largest);
  Kokkos::deep_copy(x, 0.01f);
  Kokkos::deep_copy(w, 0.01f);
  Kokkos::deep_copy(y, 0.01f);
  // 16-bit runs: the inputs and weights as the model keeps them
  xx::Buffer<uint16_t> x16("peak::x16", type == xx::kernels::Precision::fp32 ? 0 : N * widest),
      w16("peak::w16", type == xx::kernels::Precision::fp32 ? 0 : largest);
  if (x16.extent(0) > 0) {
    xx::kernels::pack_half(x16.data(), x.data(), N * widest, type);
    xx::kernels::pack_half(w16.data(), w.data(), largest, type);
  }
  using In = xx::kernels::GemmIn<float>;
  auto input = [&](const xx::Buffer<float>& f, const xx::Buffer<uint16_t>& h, int64_t rows, int64_t cols) {
    return h.extent(0) > 0 ? In::of_half(h.data(), rows, cols, type) : In(xx::mat(f, rows, cols));
  };

  // One pass: the three GEMMs of every shape; adds each shape's seconds.
  std::vector<double> shape_seconds(shapes.size());
  auto pass = [&] {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Shape& s = shapes[i];
      const auto t0 = Clock::now();
      xx::kernels::linear_forward<float>(xx::mat(y, N, s.out), input(x, x16, N, s.in), input(w, w16, s.out, s.in));
      xx::kernels::linear_backward<float>(xx::mat(dx, N, s.in), xx::mat(dw, s.out, s.in), xx::mat(y, N, s.out),
                                          input(x, x16, N, s.in), input(w, w16, s.out, s.in));
      xx::ExecSpace().fence();
      shape_seconds[i] += std::chrono::duration<double>(Clock::now() - t0).count();
    }
  };
  auto flops = [&](const Shape& s) { return 3.0 * 2.0 * double(N) * double(s.out) * double(s.in); };

  const double load_before = load_average();
  pass();  // untimed: first touch, BLAS buffers
  std::vector<double> trials;
  std::vector<std::vector<double>> shape_rates(shapes.size());
  for (int t = 0; t < a.trials; ++t) {
    std::fill(shape_seconds.begin(), shape_seconds.end(), 0.0);
    int passes = 0;
    const auto t0 = Clock::now();
    double elapsed = 0;
    while (elapsed < a.seconds) {
      pass();
      ++passes;
      elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    double total = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      total += passes * flops(shapes[i]);
      shape_rates[i].push_back(passes * flops(shapes[i]) / shape_seconds[i] / 1e9);
    }
    trials.push_back(total / elapsed / 1e9);
  }
  const double load_after = load_average();
  const double best = *std::max_element(trials.begin(), trials.end());
  const double worst = *std::min_element(trials.begin(), trials.end());
  const double mid = median(trials);
  const unsigned cores = std::thread::hardware_concurrency();

  if (!a.quiet) {
    fmt::print("# xx_peak: one core's {} GEMM rate on {}'s GEMM shapes (N = batch {} x seq {} = {} rows)\n",
               precision, a.deck, cfg.data.batch, m.seq, N);
    fmt::print("#   {:<10} {}\n", "cpu", key.cpu);
    fmt::print("#   {:<10} {}\n", "backend", key.backend);
    fmt::print("#   {:<10} {} operands, fp32 accumulation (kernels/linear.h on the seam kernels/gemm.h), 1 thread\n",
               "precision", key.precision);
    fmt::print("#   {:<10} {}\n", "gemm", xx::kernels::gemm_report(type));
    fmt::print("#   {:<10} a trial repeats forward, input-gradient and weight-gradient GEMMs of every shape for "
               "{:.2f} s;\n", "method", a.seconds);
    fmt::print("#   {:<10} {} trials after one untimed pass; peak = the best trial\n", "", a.trials);
    fmt::print("#   {:<10} 1-min load average {:.2f} before, {:.2f} after, on {} cores\n", "load", load_before,
               load_after, cores);
    fmt::print("#\n# {:>8} {:>7} {:>6} {:>6} {:>9} {:>13}\n", "gemm", "rows", "out", "in", "GFLOP/s", "spread");
    fmt::print("# {:>8} {:>7} {:>6} {:>6} {:>9} {:>13}\n", "", "", "", "", "best", "min-max");
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto [lo, hi] = std::minmax_element(shape_rates[i].begin(), shape_rates[i].end());
      fmt::print("  {:>8} {:>7} {:>6} {:>6} {:>9.1f} {:>13}\n", shapes[i].name, N, shapes[i].out, shapes[i].in, *hi,
                 fmt::format("{:.1f}-{:.1f}", *lo, *hi));
    }
    fmt::print("  {:>8} {:>7} {:>6} {:>6} {:>9.1f} {:>13}\n", "all", "", "", "", best,
               fmt::format("{:.1f}-{:.1f}", worst, best));
  }

  xx::PeakEntry entry{key, best};
  nlohmann::json shape_list = nlohmann::json::array();
  for (size_t i = 0; i < shapes.size(); ++i)
    shape_list.push_back({{"gemm", shapes[i].name}, {"rows", N}, {"out", shapes[i].out}, {"in", shapes[i].in},
                          {"best_gflops", *std::max_element(shape_rates[i].begin(), shape_rates[i].end())}});
  entry.details = {{"measured", utc_now()}, {"host", hostname()}, {"deck", a.deck}, {"tool", "tools/bench peak"},
                   {"trials", a.trials}, {"seconds_per_trial", a.seconds}, {"median_gflops", mid},
                   {"min_gflops", worst}, {"load_average", {load_before, load_after}}, {"cores", cores},
                   {"shapes", shape_list}};

  const auto earlier = xx::find_peak_entry(xx::read_peak_file(a.out), key);
  std::vector<std::string> notes;
  if (std::max(load_before, load_after) >= 0.5)
    notes.push_back(fmt::format("the machine was not idle (load average {:.2f}-{:.2f} on {} cores): other work may "
                                "have slowed the trials; rerun when it is quiet",
                                std::min(load_before, load_after), std::max(load_before, load_after), cores));
  if (best > 1.2 * mid)
    notes.push_back(fmt::format("the trials spread widely ({:.1f}-{:.1f} GFLOP/s): a noisy machine", worst, best));
  bool write = true;
  if (earlier && earlier->gflops_per_core >= best && !a.replace) {
    write = false;
    notes.push_back(fmt::format("kept the entry already in {}: {:.1f} GFLOP/s per core{}, higher than this "
                                "measurement (a busy machine only measures lower; --replace to overwrite it)",
                                a.out, earlier->gflops_per_core,
                                earlier->details.contains("measured")
                                    ? " (measured " + earlier->details["measured"].get<std::string>() + ")"
                                    : std::string()));
  }
  if (write) xx::write_peak_entry(a.out, entry);
  const double kept = write ? best : earlier->gflops_per_core;
  if (a.quiet) {
    const double load = std::max(load_before, load_after);
    fmt::print("peak {} {:.1f} GFLOP/s per core (best of {} trials on {}'s GEMMs, median {:.1f}){} {}{}\n",
               precision, kept, a.trials, a.deck, mid, write ? " ->" : "; kept the higher entry in", a.out,
               load >= 0.5 ? fmt::format(" (load average {:.2f} on {} cores: rerun when the machine is quiet)", load,
                                         cores)
                           : std::string());
  } else {
    for (const auto& n : notes) fmt::print("# note: {}\n", n);
    fmt::print("# peak {:.1f} GFLOP/s per core (best of {} trials; median {:.1f}); {} {}\n", kept, a.trials, mid,
               write ? "wrote" : "unchanged:", a.out);
    fmt::print("# OK\n");
  }
  return 0;
}

int run(const Args& a) {
  const xx::Program program = xx::build_program(xx::read_deck(a.deck, a.vars), /*check_files=*/false);
  try {
    xx::kernels::select_gemm_backend(*xx::mode_from_name<xx::GemmChoice>(a.gemm));
    xx::kernels::set_widened_products(a.products == "widened");
  } catch (const std::runtime_error& e) {
    usage_error(std::string("--gemm: ") + e.what());
  }
  one_blas_thread();
  int status = 0;
  for (const auto& p : a.precisions) status = std::max(status, measure(a, program.phases.front().config, p));
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  int status = 0;
  Kokkos::ScopeGuard kokkos(argc, argv);
  try {
    status = run(args);
  } catch (const xx::InputError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    status = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "xx_peak: %s\n", e.what());
    status = 1;
  }
  return status;
}
