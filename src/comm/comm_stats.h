// What a step's communication cost: counted the same way by every strategy,
// transport and collective, so that arms compare on the wire.
#pragma once
#include <cstdint>

namespace xx {

// Traffic of one step. bytes_sent is what this rank handed to the transports
// (a collective's whole buffer, once); wire_bytes is what it puts on the wire
// under the bandwidth-optimal algorithm of each collective, for g ranks and a
// buffer of b bytes (integer arithmetic, rounded down):
//   all-reduce (ring: reduce-scatter, then all-gather)   2 (g-1) b / g
//   reduce-scatter, all-gather (b: the whole buffer)      (g-1) b / g
//   point-to-point, all-to-all, payload exchanges        what leaves this rank
struct CommStats {
  int64_t rounds = 0;      // collectives started this step
  int64_t bytes_sent = 0;  // bytes handed to MPI this step (payload)
  int64_t wire_bytes = 0;  // bytes this rank puts on the wire this step (above)
  double seconds = 0;      // wall time inside MPI calls this step
  CommStats& operator+=(const CommStats& s) {
    rounds += s.rounds, bytes_sent += s.bytes_sent, wire_bytes += s.wire_bytes, seconds += s.seconds;
    return *this;
  }
};

// The formulas above: bytes this rank puts on the wire in a collective of g ranks over a buffer of `bytes`.
inline int64_t allreduce_wire_bytes(int64_t bytes, int g) { return g > 1 ? 2 * int64_t(g - 1) * bytes / g : 0; }
inline int64_t gather_wire_bytes(int64_t bytes, int g) { return g > 1 ? int64_t(g - 1) * bytes / g : 0; }

}  // namespace xx
