// The flight recorder: a ring buffer of this process's last MPI collectives,
// so that a hung or failed job can say which rank stopped where
// (docs/RESILIENCE.md, "Hangs: the watchdog and the flight recorder").
//
// Every collective the process makes is recorded by the MPI profiling
// wrappers in mpi_profile.cpp, whoever calls it (our code, HDF5, the async
// checkpoint writer thread): call sites stay plain MPI.
#pragma once
#include <mpi.h>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>
#include <nlohmann/json.hpp>

namespace xx::flight {

// One recorded call. Times are seconds on the steady clock (now()).
struct Entry {
  uint64_t id = 0;        // this process's call number, all communicators (1-based; 0: empty slot)
  uint64_t seq = 0;       // the call number on its communicator (1-based): equal on every member
  const char* op = "";    // "MPI_Allreduce" (a string literal)
  int comm = -1;          // index into the recorder's communicator table
  int64_t bytes = 0;      // what this rank hands to the call
  double start = 0;
  double end = -1;        // < 0: in flight
  int error = 0;          // the MPI error code, 0 on success
  bool in_flight() const { return end < 0; }
};

// A communicator as the recorder names it. Labels are the same on every
// member: "world", "self", "world dup", "ranks 0,2" (world ranks).
struct CommInfo {
  std::string label;
  int size = 0;
  uint64_t calls = 0;  // recorded calls so far: the last sequence number
};

double now();  // steady clock, seconds

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity = 1024);

  // A call starts (returns its id) and ends. Thread-safe.
  uint64_t begin(const char* op, MPI_Comm comm, int64_t bytes);
  void end(uint64_t id, int error = MPI_SUCCESS);
  // MPI_Comm_free: the handle may come back for another communicator.
  void forget(MPI_Comm comm);

  // Nonblocking collectives: the request stands for the call until a
  // wait or test completes it.
  void track(MPI_Request request, uint64_t id);
  uint64_t untrack(MPI_Request request);  // 0: not one of ours
  bool tracking() const;                  // any request tracked (the cheap check before a test)

  struct Status {
    uint64_t calls = 0;       // calls recorded so far
    double last_activity = 0; // the last start or end of a call (0: none yet)
    bool in_flight = false;   // the oldest call still in flight, when there is one
    Entry oldest;
    std::string comm;         // its communicator's label
  };
  Status status() const;
  Entry entry(uint64_t id) const;       // id 0 if it has left the ring
  std::string comm_label(int comm) const;

  // The whole recorder as JSON (times as Unix epoch seconds), for flight.json.
  nlohmann::ordered_json to_json(int rank, int world, const std::string& reason) const;

 private:
  mutable std::mutex mutex_;
  std::vector<Entry> ring_;  // entry id lives at ring_[(id - 1) % capacity]
  uint64_t calls_ = 0;
  double last_activity_ = 0;
  std::vector<CommInfo> comms_;
  std::unordered_map<MPI_Comm, int> comm_index_;
  // A multimap: Open MPI hands out one shared, already complete request for
  // collectives that need no communication (a communicator of one rank).
  std::unordered_multimap<MPI_Request, uint64_t> requests_;
  int comm_of(MPI_Comm comm);  // with mutex_ held
};

// The process's recorder, which the MPI wrappers fill. The profiling
// interface makes it one per process by nature.
FlightRecorder& recorder();

// Where this process reports: its rank and world size (set when MPI starts)
// and the run directory (set by the Watchdog, with the rank the run log
// uses): RUN_DIR/rank<r>/flight.json and RUN_DIR/rank<r>/log.txt.
void set_identity(int rank, int world);
void set_run_dir(const std::string& run_dir, int rank);
int rank();

// Writes the recorder to RUN_DIR/rank<r>/flight.json (a temp file, then a
// rename) and returns the path; "" when no run directory is set or the write
// failed. Safe from any thread.
std::string dump(const std::string& reason);
// One line to stderr and, when a run directory is set, to this rank's log.
void report(const std::string& line);
// A recorded call failed: report it, dump the recorder and abort the job.
[[noreturn]] void fail(uint64_t id, int error);

}  // namespace xx::flight
