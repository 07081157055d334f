#include "io/peak_file.h"
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <fmt/format.h>
#include "core/atomic_file.h"

namespace xx {
namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "xuanxue-peak/1";

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      std::string v = line.substr(line.find(':') + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  return "unknown";
}

std::string describe_key(const PeakKey& k) {
  return fmt::format("cpu '{}', backend '{}', {}", k.cpu, k.backend, k.precision);
}

}  // namespace

PeakKey this_machine(const std::string& backend, const std::string& precision) {
  return {cpu_model(), backend, precision};
}

std::string default_peak_file() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "peak.json" : (exe.parent_path() / "peak.json").string();
}

std::vector<PeakEntry> read_peak_file(const std::string& path) {
  std::vector<PeakEntry> out;
  std::ifstream in(path);
  if (!in) {
    if (!fs::exists(path)) return out;
    throw std::runtime_error(path + ": cannot be read");
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": not JSON (" + e.what() + "); expected a peak file of tools/bench peak");
  }
  if (!j.is_object() || j.value("format", "") != kFormat || !j.contains("entries") || !j["entries"].is_array())
    throw std::runtime_error(fmt::format("{}: not a peak file (expected an object with \"format\": \"{}\" and "
                                         "\"entries\"; rerun tools/bench peak)", path, kFormat));
  for (const auto& e : j["entries"]) {
    if (!e.is_object() || !e.contains("cpu") || !e.contains("backend") || !e.contains("precision") ||
        !e.contains("gflops_per_core") || !e["gflops_per_core"].is_number())
      throw std::runtime_error(path + ": an entry lacks cpu, backend, precision or gflops_per_core "
                               "(rerun tools/bench peak)");
    PeakEntry entry;
    entry.key = {e["cpu"].get<std::string>(), e["backend"].get<std::string>(), e["precision"].get<std::string>()};
    entry.gflops_per_core = e["gflops_per_core"].get<double>();
    entry.details = e;
    for (const char* k : {"cpu", "backend", "precision", "gflops_per_core"}) entry.details.erase(k);
    out.push_back(std::move(entry));
  }
  return out;
}

void write_peak_entry(const std::string& path, const PeakEntry& entry) {
  std::vector<PeakEntry> entries = read_peak_file(path);
  std::erase_if(entries, [&](const PeakEntry& e) { return e.key == entry.key; });
  entries.push_back(entry);
  nlohmann::json list = nlohmann::json::array();
  for (const auto& e : entries) {
    nlohmann::json j = {{"cpu", e.key.cpu}, {"backend", e.key.backend}, {"precision", e.key.precision},
                        {"gflops_per_core", e.gflops_per_core}};
    j.update(e.details);
    list.push_back(j);
  }
  if (const fs::path dir = fs::path(path).parent_path(); !dir.empty()) fs::create_directories(dir);
  write_file_atomic(path, nlohmann::json({{"format", kFormat}, {"entries", list}}).dump(1) + "\n");
}

std::optional<PeakEntry> find_peak_entry(const std::vector<PeakEntry>& entries, const PeakKey& key) {
  for (const auto& e : entries)
    if (e.key == key) return e;
  return std::nullopt;
}

std::optional<Peak> resolve_peak(double deck_peak_gflops, const std::string& peak_file, const PeakKey& machine,
                                 std::string* why_none) {
  std::string why;
  std::optional<Peak> peak;
  if (deck_peak_gflops > 0) return Peak{deck_peak_gflops, "from deck"};
  try {
    const auto entries = read_peak_file(peak_file);
    const auto entry = find_peak_entry(entries, machine);
    if (entries.empty())
      why = fmt::format("no peak file {}", peak_file);
    else if (!entry)
      why = fmt::format("{} has no entry for this machine ({})", peak_file, describe_key(machine));
    else if (!(entry->gflops_per_core > 0) || !std::isfinite(entry->gflops_per_core))
      why = fmt::format("{}: the entry for this machine has gflops_per_core {}", peak_file, entry->gflops_per_core);
    else {
      const auto& d = entry->details;
      std::string how = fmt::format("{}", peak_file);
      if (d.contains("measured") && d["measured"].is_string()) how += ", measured " + d["measured"].get<std::string>();
      if (d.contains("deck") && d["deck"].is_string()) how += " on " + d["deck"].get<std::string>() + "'s GEMMs";
      if (d.contains("trials") && d["trials"].is_number()) how += fmt::format(", best of {} trials", d["trials"].get<int>());
      peak = Peak{entry->gflops_per_core, how};
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (!peak && why_none) *why_none = why;
  return peak;
}

std::string no_peak_hint(const std::string& why_none) {
  return fmt::format("MFU n/a: {}; run tools/bench peak, or set peak_gflops in the deck", why_none);
}

std::optional<double> MfuMeter::mfu(double flops_per_token, double tokens_per_s, int ranks) {
  if (!peak_ || refuted_) return std::nullopt;
  const double per_core = flops_per_token * tokens_per_s / std::max(ranks, 1) / 1e9;  // GFLOP/s per core
  if (!std::isfinite(per_core)) return std::nullopt;
  if (per_core > peak_->gflops_per_core) {
    refuted_ = true, refuting_gflops_ = per_core;
    return std::nullopt;
  }
  return per_core / peak_->gflops_per_core;
}

std::string MfuMeter::format(const std::optional<double>& mfu) {
  if (mfu || !refuted_ || told_) return format_mfu(mfu);
  told_ = true;
  return fmt::format("MFU n/a (peak {:.1f} GFLOP/s per core is below the measured {:.1f}; {})", peak_->gflops_per_core,
                     refuting_gflops_,
                     peak_->source == "from deck" ? "fix peak_gflops in the deck" : "rerun tools/bench peak");
}

std::string MfuMeter::describe() const {
  if (!peak_) return "n/a: " + (why_none_.empty() ? std::string("no peak") : why_none_);
  return fmt::format("{:.1f} GFLOP/s per core ({})", peak_->gflops_per_core, peak_->source);
}

std::optional<double> MfuMeter::peak_gflops() const {
  if (!peak_) return std::nullopt;
  return peak_->gflops_per_core;
}

std::string format_mfu(const std::optional<double>& mfu) {
  return mfu ? fmt::format("MFU {:.1f}%", 100 * *mfu) : "MFU n/a";
}

}  // namespace xx
