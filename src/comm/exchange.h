// Exchange of variable-size byte payloads among the ranks of a group: the
// transport under top-k gradient compression. Per round, every member of a
// group (a subset of the communicator's ranks) hands in one payload for each
// member (personalized(): slices of one send buffer; its own slice is kept,
// not sent) and gets back one from each member, in group order. exchange()
// is the special case of one payload for all (a broadcast to the group).
//
// Two transports behind one interface:
//   "ucx" — UCP tag messages on a private UCX context and worker (one
//           endpoint per peer, created on first use, peer-failure error
//           handling). The 64-bit UCP tag carries (round tag, source rank), so
//           no header travels: a receiver probes for the round, reads the
//           source and length from the tag and message, and receives.
//   "mpi" — nonblocking point-to-point on a private duplicate of the
//           communicator: a 16-byte header {round tag, payload size}, then the
//           payload itself (not sent when empty).
//
// Rules for callers:
//   * Every member of `group` calls exchange() with the same group and tag;
//     ranks outside the group do not call it. Disjoint groups may exchange at
//     the same time, with the same tag or not.
//   * Tags separate rounds: use a fresh tag per round (e.g. the step), and
//     never reuse the tag of a round that failed, since a late peer's message
//     of that round may still arrive. Tags must be below 2^40.
//   * Payloads live in host memory. Debian's UCX has no CUDA support, so
//     device buffers are staged through host memory by the caller.
//   * exchange() copies the payload once into memory the transport owns, so
//     after a failed round (which may leave sends in flight) the caller's
//     buffer is free again the moment exchange() returns or throws.
//   * Not thread-safe: one thread per object.
//   * UCX: the endpoints use peer-failure error handling, which in UCX 1.13
//     the shared-memory transports (posix, sysv, cma) do not support, so
//     UCX_TLS must name one that does (tcp, rc, dc or ud); ranks on one node
//     then talk over it too. Without one, make_ucx_exchange() comes back
//     disabled and says so.
//   * Destroy on all ranks at about the same time: the UCX destructor flushes
//     its endpoints, which needs the peers to progress, and gives up after
//     5 s (at once for a failed peer); the MPI one waits up to 1 s, and only
//     after a failed round.
//
// bytes_sent() after a round over a group of n ranks, slice s_i to member i:
//   ucx: sum over the peers i != me of s_i
//   mpi: sum over the peers i != me of (16 + s_i)   (kMpiHeaderBytes = 16 per peer)
// so for exchange() of one payload of s bytes: (n - 1) s, and (n - 1) (16 + s).
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace xx {

// Bytes [offset, offset + size) of a send buffer.
struct Slice {
  int64_t offset = 0, size = 0;
};

// One transport's way of exchanging variable-size byte payloads within a group.
class PayloadExchange {
 public:
  virtual ~PayloadExchange() = default;
  virtual const char* name() const = 0;  // "ucx" or "mpi"
  virtual bool enabled() const = 0;      // usable in this process
  // Why enabled() is false; empty when enabled.
  virtual std::string disabled_reason() const = 0;
  // Every rank in `group` (sorted, distinct ranks of the communicator, containing this rank) calls this
  // with one send buffer and one slice of it per member, to[i] for group[i] (slices may overlap, be empty, or
  // all be the whole buffer); returns what each member sent this rank, in group order: for this rank itself,
  // a copy of its own slice to[me], which is not sent. `tag` separates rounds. Throws std::invalid_argument
  // for a bad group, tag or slice, and std::runtime_error naming the peer rank(s) on failure (peer died, or
  // no payload within `timeout_s` seconds); never hangs.
  virtual std::vector<std::vector<std::byte>> personalized(const std::vector<int>& group,
                                                           const std::vector<std::byte>& send,
                                                           const std::vector<Slice>& to, uint64_t tag,
                                                           double timeout_s) = 0;
  // The broadcast: `payload` to every member; returns the payloads of all members in group order (own included).
  std::vector<std::vector<std::byte>> exchange(const std::vector<int>& group, const std::vector<std::byte>& payload,
                                               uint64_t tag, double timeout_s) {
    return personalized(group, payload, std::vector<Slice>(group.size(), Slice{0, int64_t(payload.size())}), tag,
                        timeout_s);
  }
  // Bytes this rank handed to the transport in the last exchange (payload plus any headers); see above.
  virtual int64_t bytes_sent() const = 0;
};

constexpr int64_t kMpiHeaderBytes = 16;
constexpr int kExchangeTagBits = 40;  // tags must be < 2^kExchangeTagBits

// Both are collective over `comm` and must be destroyed before MPI_Finalize.
std::unique_ptr<PayloadExchange> make_mpi_exchange(MPI_Comm comm);
// enabled() is false on every rank when UCX failed to start on any rank; disabled_reason() says why.
std::unique_ptr<PayloadExchange> make_ucx_exchange(MPI_Comm comm);

namespace detail {
// Checks the group (sorted, distinct, in [0, size), contains rank) and the tag; returns this rank's index in
// the group. Throws std::invalid_argument naming the problem.
int check_group(const char* transport, const std::vector<int>& group, int rank, int size, uint64_t tag);
// Checks one slice per member, each inside a send buffer of `bytes` and at most `max_size` long.
void check_slices(const char* transport, const std::vector<Slice>& to, size_t members, size_t bytes,
                  int64_t max_size);
// "rank 1, rank 3"
std::string rank_list(const std::vector<int>& ranks);
// Why a round timed out: peers whose payload never came, peers that never took ours.
std::string timeout_reason(const std::vector<int>& silent, const std::vector<int>& stuck, double timeout_s);
}  // namespace detail

}  // namespace xx
