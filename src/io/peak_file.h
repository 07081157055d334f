// The MFU denominator (../shared/MEASURING.md): one core's GEMM rate (per precision) on the
// model's own GEMM shapes, times the number of ranks. A run never measures
// it; it takes, in this order:
//   1. the deck's `peak_gflops X`;
//   2. the peak file's entry for this machine: peak.json beside the running
//      binary (build/peak.json), written by `tools/bench peak` (build/xx_peak),
//      one entry per (CPU model, GEMM backend, precision), so one file on a
//      shared filesystem serves every kind of node of a cluster;
//   3. none: MFU n/a, and start-up says how to get one.
// An MFU above 100% means the peak is wrong (measured on a busy machine, or on
// other shapes): the run says so once and prints n/a from then on.
//
// The file (docs/BENCHMARKS.md, "tools/bench peak"):
//   {"format": "xuanxue-peak/1",
//    "entries": [{"cpu": "...", "backend": "...", "precision": "fp32",
//                 "gflops_per_core": 95.3, ...how it was measured...}]}
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>

namespace xx {

// What a peak was measured on; an entry serves a run only where all three match.
struct PeakKey {
  std::string cpu;                 // /proc/cpuinfo "model name"
  std::string backend;             // the GEMM library and kernel (kernels/gemm.h, GemmBackend::kernel), e.g.
                                   // "oneDNN 2.6.3 brg:avx512_core_bf16"
  std::string precision = "fp32";  // what the GEMM operands are: fp32, bf16, fp16
  bool operator==(const PeakKey&) const = default;
};

// This machine's key for GEMMs run by `backend` (GemmBackend::kernel, asked
// of the library at run time, so e.g. OPENBLAS_CORETYPE changes it) in `precision`.
PeakKey this_machine(const std::string& backend, const std::string& precision);

struct Peak {
  double gflops_per_core = 0;
  std::string source;  // "from deck", or the file and how the entry was measured
};

// One measurement, as the file holds it.
struct PeakEntry {
  PeakKey key;
  double gflops_per_core = 0;
  nlohmann::json details = nlohmann::json::object();  // trials, shapes, deck, when, host: for people
};

// peak.json beside the running binary (/proc/self/exe), e.g. build/peak.json.
std::string default_peak_file();

// The entries of a peak file; none when it does not exist. Throws
// std::runtime_error naming the file for one that is not a peak file.
std::vector<PeakEntry> read_peak_file(const std::string& path);
// Adds `entry` to the file, replacing the entry with the same key; written
// atomically (temp file and rename). Not safe against two writers at once.
void write_peak_entry(const std::string& path, const PeakEntry& entry);
// The entry for `key`, if any.
std::optional<PeakEntry> find_peak_entry(const std::vector<PeakEntry>& entries, const PeakKey& key);

// The rules above: `deck_peak_gflops` > 0 wins, else the entry of `peak_file`
// for `machine`, else none, and then `why_none` (when given) says why, e.g.
// "build/peak.json has no entry for this machine (cpu ..., backend ...)".
// A file that cannot be read counts as none (why_none says so): a run does
// not fail for its MFU.
std::optional<Peak> resolve_peak(double deck_peak_gflops, const std::string& peak_file, const PeakKey& machine,
                                 std::string* why_none = nullptr);

// The start-up line of a run without a peak.
std::string no_peak_hint(const std::string& why_none);

// MFU against one run's peak: FLOP/token * tokens/s / (peak * ranks).
class MfuMeter {
 public:
  MfuMeter() = default;
  // `why_none`: resolve_peak's reason, for describe() when there is no peak.
  explicit MfuMeter(std::optional<Peak> peak, std::string why_none = "")
      : peak_(std::move(peak)), why_none_(std::move(why_none)) {}

  // The MFU as a fraction; none without a peak, or when the rate is above the
  // peak, which then counts as refuted for the rest of the run.
  std::optional<double> mfu(double flops_per_token, double tokens_per_s, int ranks);
  // format_mfu's text for `mfu(...)`: "MFU 63.2%" or "MFU n/a"; the first n/a
  // after the peak was refuted says why.
  std::string format(const std::optional<double>& mfu);
  // The backends table: "95.3 GFLOP/s per core (source)" or "n/a: why".
  std::string describe() const;
  // The peak's GFLOP/s per core (refuted or not), none without a peak.
  std::optional<double> peak_gflops() const;

 private:
  std::optional<Peak> peak_;
  std::string why_none_;
  bool refuted_ = false, told_ = false;
  double refuting_gflops_ = 0;  // the rate per core that exceeded the peak
};

// "MFU 63.2%" or "MFU n/a": the console's figure for an MFU (a fraction).
std::string format_mfu(const std::optional<double>& mfu);

}  // namespace xx
