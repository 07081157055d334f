// The MFU denominator (src/io/peak_file.*): where a run's peak comes from
// (the deck wins; else the peak file's entry for this machine; else none),
// the peak file itself, and MFU n/a without a peak or against a wrong one.
#include <catch2/catch.hpp>
#include <string>
#include "io/peak_file.h"
#include "temp_dir.h"

using namespace xx;

namespace {

const PeakKey kHere{"Test CPU @ 3.0GHz", "OpenBLAS 0.3.21 test, core SkylakeX", "fp32"};

PeakEntry entry(const PeakKey& key, double gflops) {
  PeakEntry e{key, gflops};
  e.details = {{"measured", "2025-01-01T00:00:00Z"}, {"deck", "input/tiny.deck"}, {"trials", 9}};
  return e;
}

}  // namespace

TEST_CASE("peak: the deck's peak_gflops wins over the file", "[peak]") {
  test::TempDir tmp("peak");
  const std::string file = tmp.file("peak.json");
  write_peak_entry(file, entry(kHere, 80.0));
  std::string why;
  const auto peak = resolve_peak(50.0, file, kHere, &why);
  REQUIRE(peak);
  CHECK(peak->gflops_per_core == 50.0);
  CHECK(peak->source == "from deck");
  // without a file as well
  CHECK(resolve_peak(50.0, tmp.file("absent.json"), kHere)->gflops_per_core == 50.0);
}

TEST_CASE("peak: the file's entry for this machine", "[peak]") {
  test::TempDir tmp("peak");
  const std::string file = tmp.file("peak.json");
  write_peak_entry(file, entry({"Other CPU", kHere.backend, "fp32"}, 120.0));
  write_peak_entry(file, entry(kHere, 80.0));
  std::string why;
  const auto peak = resolve_peak(0.0, file, kHere, &why);
  REQUIRE(peak);
  CHECK(peak->gflops_per_core == 80.0);
  CHECK(peak->source.find(file) == 0);
  CHECK(peak->source.find("input/tiny.deck") != std::string::npos);
  CHECK(peak->source.find(')') == std::string::npos);  // tools/bench reads it between parentheses
  CHECK(why.empty());
}

TEST_CASE("peak: an entry for another machine or backend is no peak", "[peak]") {
  test::TempDir tmp("peak");
  const std::string file = tmp.file("peak.json");
  write_peak_entry(file, entry(kHere, 80.0));
  for (const PeakKey& other : {PeakKey{"Other CPU", kHere.backend, "fp32"},
                               PeakKey{kHere.cpu, "OpenBLAS 0.3.21 test, core Prescott", "fp32"},
                               PeakKey{kHere.cpu, kHere.backend, "fp64"}}) {
    std::string why;
    CHECK_FALSE(resolve_peak(0.0, file, other, &why));
    CHECK(why.find("has no entry for this machine") != std::string::npos);
    CHECK(why.find(other.cpu) != std::string::npos);
  }
}

TEST_CASE("peak: no file, a broken file, a bad entry: no peak, and why", "[peak]") {
  test::TempDir tmp("peak");
  std::string why;
  CHECK_FALSE(resolve_peak(0.0, tmp.file("absent.json"), kHere, &why));
  CHECK(why.find("no peak file") != std::string::npos);

  CHECK_FALSE(resolve_peak(0.0, tmp.write("broken.json", "{not json"), kHere, &why));
  CHECK(why.find("not JSON") != std::string::npos);

  CHECK_FALSE(resolve_peak(0.0, tmp.write("other.json", R"({"entries": []})"), kHere, &why));
  CHECK(why.find("not a peak file") != std::string::npos);

  const std::string zero = tmp.file("zero.json");
  write_peak_entry(zero, entry(kHere, 0.0));
  CHECK_FALSE(resolve_peak(0.0, zero, kHere, &why));
  CHECK(why.find("gflops_per_core 0") != std::string::npos);

  CHECK(no_peak_hint("no peak file x").find("tools/bench peak") != std::string::npos);
  CHECK(no_peak_hint("no peak file x").find("peak_gflops") != std::string::npos);
}

TEST_CASE("peak: writing replaces this machine's entry and keeps the others", "[peak]") {
  test::TempDir tmp("peak");
  const std::string file = tmp.file("sub/dir/peak.json");  // folders made as needed
  const PeakKey other{"Other CPU", kHere.backend, "fp32"};
  write_peak_entry(file, entry(other, 120.0));  // creates the file
  write_peak_entry(file, entry(kHere, 80.0));
  write_peak_entry(file, entry(kHere, 90.0));
  const auto entries = read_peak_file(file);
  REQUIRE(entries.size() == 2);
  CHECK(find_peak_entry(entries, other)->gflops_per_core == 120.0);
  CHECK(find_peak_entry(entries, kHere)->gflops_per_core == 90.0);
  CHECK(find_peak_entry(entries, kHere)->details["deck"] == "input/tiny.deck");
  CHECK(read_peak_file(tmp.file("absent.json")).empty());
}

TEST_CASE("peak: this machine has a CPU and a backend", "[peak]") {
  const PeakKey key = this_machine("oneDNN 2.6.3 brg:avx512_core_bf16", "bf16");
  CHECK_FALSE(key.cpu.empty());
  CHECK(key.backend == "oneDNN 2.6.3 brg:avx512_core_bf16");
  CHECK(key.precision == "bf16");
  CHECK(this_machine("oneDNN 2.6.3 brg:avx512_core_bf16", "bf16") == key);
  CHECK_FALSE(this_machine("oneDNN 2.6.3 brg:avx512_core", "fp32") == key);
  CHECK(default_peak_file().ends_with("/peak.json"));
}

TEST_CASE("mfu: n/a without a peak", "[peak]") {
  MfuMeter meter(std::nullopt, "no peak file build/peak.json");
  const auto mfu = meter.mfu(1e6, 5e4, 1);
  CHECK_FALSE(mfu);
  CHECK(meter.format(mfu) == "MFU n/a");
  CHECK(meter.describe() == "n/a: no peak file build/peak.json");
  CHECK_FALSE(meter.peak_gflops());
  CHECK(format_mfu(std::nullopt) == "MFU n/a");
}

TEST_CASE("mfu: FLOP/token * tokens/s / (peak * ranks)", "[peak]") {
  MfuMeter meter(Peak{100.0, "test"});
  // 1e6 FLOP/token * 5e4 tokens/s = 50 GFLOP/s, on 1 rank or 2
  const auto one = meter.mfu(1e6, 5e4, 1);
  REQUIRE(one);
  CHECK(*one == Approx(0.5));
  CHECK(meter.format(one) == "MFU 50.0%");
  CHECK(*meter.mfu(1e6, 5e4, 2) == Approx(0.25));
  CHECK(*meter.mfu(1e6, 1e5, 1) == Approx(1.0));  // exactly the peak is still an MFU
  CHECK(meter.describe() == "100.0 GFLOP/s per core (test)");
  CHECK(*meter.peak_gflops() == 100.0);
}

TEST_CASE("mfu: a rate above the peak refutes it: n/a, said once", "[peak]") {
  MfuMeter meter(Peak{50.0, "build/peak.json"});
  CHECK(meter.format(meter.mfu(1e6, 2.5e4, 1)) == "MFU 50.0%");
  const auto above = meter.mfu(1e6, 1.08e5, 2);  // 54 GFLOP/s per core, MFU 108%
  CHECK_FALSE(above);
  const std::string first = meter.format(above);
  CHECK(first.rfind("MFU n/a (peak 50.0 GFLOP/s per core is below the measured 54.0", 0) == 0);
  CHECK(first.find("rerun tools/bench peak") != std::string::npos);
  CHECK(meter.format(above) == "MFU n/a");  // once
  // refuted for the rest of the run, even at rates below it
  const auto later = meter.mfu(1e6, 2.5e4, 1);
  CHECK_FALSE(later);
  CHECK(meter.format(later) == "MFU n/a");
  CHECK(*meter.peak_gflops() == 50.0);  // the PERFORMANCE line still names the peak it had

  MfuMeter deck(Peak{10.0, "from deck"});
  CHECK(deck.format(deck.mfu(1e6, 1e5, 1)).find("fix peak_gflops in the deck") != std::string::npos);
}
