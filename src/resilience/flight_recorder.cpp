#include "resilience/flight_recorder.h"
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <fmt/format.h>

namespace xx::flight {

namespace fs = std::filesystem;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

FlightRecorder::FlightRecorder(size_t capacity) : ring_(std::max<size_t>(1, capacity)) {}

// The label must come out the same on every member of the communicator:
// it names the communicator by what it spans, never by its local handle.
// Only local MPI calls (PMPI_, so nothing is recorded twice).
static CommInfo describe(MPI_Comm comm) {
  CommInfo c;
  if (comm == MPI_COMM_NULL) return {"null", 0, 0};
  PMPI_Comm_size(comm, &c.size);
  if (comm == MPI_COMM_WORLD) return {"world", c.size, 0};
  if (comm == MPI_COMM_SELF) return {"self", c.size, 0};
  int same = MPI_UNEQUAL;
  PMPI_Comm_compare(comm, MPI_COMM_WORLD, &same);
  if (same == MPI_CONGRUENT) return {"world dup", c.size, 0};
  MPI_Group group, world;
  PMPI_Comm_group(comm, &group);
  PMPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> mine(c.size), there(c.size);
  for (int i = 0; i < c.size; ++i) mine[i] = i;
  PMPI_Group_translate_ranks(group, c.size, mine.data(), world, there.data());
  PMPI_Group_free(&group);
  PMPI_Group_free(&world);
  const int shown = std::min(c.size, 8);
  c.label = fmt::format("ranks {}{}", fmt::join(there.begin(), there.begin() + shown, ","),
                        c.size > shown ? fmt::format(",... ({} ranks)", c.size) : "");
  return c;
}

int FlightRecorder::comm_of(MPI_Comm comm) {
  auto it = comm_index_.find(comm);
  if (it != comm_index_.end()) return it->second;
  comms_.push_back(describe(comm));
  const int index = int(comms_.size()) - 1;
  comm_index_[comm] = index;
  return index;
}

uint64_t FlightRecorder::begin(const char* op, MPI_Comm comm, int64_t bytes) {
  const double t = now();
  std::lock_guard lock(mutex_);
  Entry e;
  e.id = ++calls_;
  e.comm = comm_of(comm);
  e.seq = ++comms_[e.comm].calls;
  e.op = op;
  e.bytes = bytes;
  e.start = t;
  ring_[(e.id - 1) % ring_.size()] = e;
  last_activity_ = t;
  return e.id;
}

void FlightRecorder::end(uint64_t id, int error) {
  const double t = now();
  std::lock_guard lock(mutex_);
  Entry& e = ring_[(id - 1) % ring_.size()];
  if (e.id == id) e.end = t, e.error = error;  // else it has left the ring already
  last_activity_ = t;
}

void FlightRecorder::forget(MPI_Comm comm) {
  std::lock_guard lock(mutex_);
  comm_index_.erase(comm);  // its table row stays: entries in the ring still name it
}

void FlightRecorder::track(MPI_Request request, uint64_t id) {
  std::lock_guard lock(mutex_);
  requests_.emplace(request, id);
}

uint64_t FlightRecorder::untrack(MPI_Request request) {
  std::lock_guard lock(mutex_);
  // The oldest call on this handle (one handle may stand for several, below).
  const auto [first, last] = requests_.equal_range(request);
  if (first == last) return 0;
  auto it = first;
  for (auto i = first; i != last; ++i)
    if (i->second < it->second) it = i;
  const uint64_t id = it->second;
  requests_.erase(it);
  return id;
}

bool FlightRecorder::tracking() const {
  std::lock_guard lock(mutex_);
  return !requests_.empty();
}

FlightRecorder::Status FlightRecorder::status() const {
  std::lock_guard lock(mutex_);
  Status s;
  s.calls = calls_;
  s.last_activity = last_activity_;
  for (const Entry& e : ring_)
    if (e.id != 0 && e.in_flight() && (!s.in_flight || e.id < s.oldest.id)) s.in_flight = true, s.oldest = e;
  if (s.in_flight) s.comm = comms_[s.oldest.comm].label;
  return s;
}

Entry FlightRecorder::entry(uint64_t id) const {
  std::lock_guard lock(mutex_);
  const Entry& e = ring_[(id - 1) % ring_.size()];
  return e.id == id ? e : Entry{};
}

std::string FlightRecorder::comm_label(int comm) const {
  std::lock_guard lock(mutex_);
  return comm >= 0 && comm < int(comms_.size()) ? comms_[comm].label : "?";
}

nlohmann::ordered_json FlightRecorder::to_json(int rank, int world, const std::string& reason) const {
  std::vector<Entry> entries;
  std::vector<CommInfo> comms;
  uint64_t calls = 0;
  double last = 0;
  {
    std::lock_guard lock(mutex_);
    for (const Entry& e : ring_)
      if (e.id != 0) entries.push_back(e);
    comms = comms_;
    // Rows of communicators that are freed and have left the ring (HDF5 dups
    // one per checkpoint file) are noise: keep live and referenced ones.
    std::vector<bool> keep(comms.size(), false);
    for (const auto& [handle, index] : comm_index_) keep[index] = true;
    for (const Entry& e : entries) keep[e.comm] = true;
    for (size_t i = 0; i < comms.size(); ++i)
      if (!keep[i]) comms[i].label.clear();
    calls = calls_;
    last = last_activity_;
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.id < b.id; });
  // Steady-clock seconds to Unix time, so that the ranks' dumps line up.
  const double steady = now();
  const double unix_now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  auto unix_time = [&](double t) { return unix_now - (steady - t); };
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  nlohmann::ordered_json j;
  j["rank"] = rank;
  j["world"] = world;
  j["host"] = host;
  j["pid"] = int(getpid());
  j["reason"] = reason;
  j["dumped_at"] = unix_now;
  j["calls"] = calls;
  j["last_activity"] = last > 0 ? nlohmann::ordered_json(unix_time(last)) : nlohmann::ordered_json();
  j["capacity"] = ring_.size();
  auto& jc = j["communicators"] = nlohmann::ordered_json::array();
  for (const CommInfo& c : comms)
    if (!c.label.empty()) jc.push_back({{"label", c.label}, {"size", c.size}, {"calls", c.calls}});
  auto& je = j["entries"] = nlohmann::ordered_json::array();
  for (const Entry& e : entries) {
    nlohmann::ordered_json x = {{"id", e.id},     {"seq", e.seq},          {"op", e.op},
                        {"comm", comms[e.comm].label}, {"bytes", e.bytes}, {"start", unix_time(e.start)}};
    x["end"] = e.in_flight() ? nlohmann::ordered_json() : nlohmann::ordered_json(unix_time(e.end));
    x["seconds"] = (e.in_flight() ? steady : e.end) - e.start;
    if (e.error) x["error"] = e.error;
    je.push_back(std::move(x));
  }
  return j;
}

// ---------------------------------------------------------------------------
// the process's recorder and where it reports

namespace {
struct Process {
  FlightRecorder recorder;
  std::mutex mutex;  // guards the fields below
  int rank = 0, world = 1;
  std::string run_dir;
};
Process process;

// JSON with one line per communicator and per entry: readable with less,
// and a tail shows the last calls.
void write_lines(std::ostream& out, const nlohmann::ordered_json& j) {
  out << "{";
  const char* sep = "\n";
  for (const auto& [key, value] : j.items()) {
    out << sep << " " << nlohmann::json(key).dump() << ": ";
    sep = ",\n";
    if (!value.is_array()) {
      out << value.dump();
      continue;
    }
    out << "[";
    for (size_t i = 0; i < value.size(); ++i) out << (i ? ",\n  " : "\n  ") << value[i].dump();
    out << (value.empty() ? "]" : "\n ]");
  }
  out << "\n}\n";
}

fs::path rank_dir() {
  std::lock_guard lock(process.mutex);
  if (process.run_dir.empty()) return {};
  return fs::path(process.run_dir) / fmt::format("rank{}", process.rank);
}
}  // namespace

FlightRecorder& recorder() { return process.recorder; }

void set_identity(int rank, int world) {
  std::lock_guard lock(process.mutex);
  process.rank = rank, process.world = world;
}

void set_run_dir(const std::string& run_dir, int rank) {
  std::lock_guard lock(process.mutex);
  process.run_dir = run_dir, process.rank = rank;
}

int rank() {
  std::lock_guard lock(process.mutex);
  return process.rank;
}

std::string dump(const std::string& reason) {
  const fs::path dir = rank_dir();
  if (dir.empty()) return "";
  int r = 0, w = 1;
  {
    std::lock_guard lock(process.mutex);
    r = process.rank, w = process.world;
  }
  const fs::path path = dir / "flight.json";
  const fs::path temp = dir / fmt::format("flight.json.tmp{}", getpid());
  try {
    fs::create_directories(dir);
    {
      std::ofstream out(temp);
      write_lines(out, process.recorder.to_json(r, w, reason));
      if (!out.flush()) return "";
    }
    fs::rename(temp, path);  // readers see the old file or the whole new one
  } catch (const std::exception&) {
    return "";
  }
  return path.string();
}

void report(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  const fs::path dir = rank_dir();
  if (dir.empty()) return;
  // Its own append-mode stream: the main thread may be inside RunLog.
  std::ofstream log(dir / "log.txt", std::ios::app);
  log << line << '\n';
}

void fail(uint64_t id, int error) {
  const Entry e = process.recorder.entry(id);
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  PMPI_Error_string(error, text, &length);
  const std::string what = fmt::format("{} (collective #{} on {}) failed: {}", e.id ? e.op : "an MPI call", e.seq,
                                       process.recorder.comm_label(e.comm), text);
  const std::string path = dump(what);
  std::string line = fmt::format("xuanxue: rank {}: {}", rank(), what);
  if (!path.empty()) line += fmt::format(" (flight recorder: {})", path);
  report(line);
  PMPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // PMPI_Abort does not return; the compiler cannot know
}

}  // namespace xx::flight
