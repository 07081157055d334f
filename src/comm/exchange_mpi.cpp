// The MPI payload exchange (see exchange.h): on a private duplicate of the
// communicator, each rank posts a header receive from every peer, then sends
// every peer a 16-byte header {round tag, size} followed by that peer's slice
// of the send buffer (not sent when empty). A header that arrives posts the payload receive of its
// size. Everything is polled with MPI_Testsome until done or the deadline, so
// a peer that never answers becomes an error naming it, not a hang.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "comm/exchange.h"

namespace xx {

namespace detail {

int check_group(const char* transport, const std::vector<int>& group, int rank, int size, uint64_t tag) {
  if (tag >> kExchangeTagBits)
    throw std::invalid_argument(fmt::format("{} exchange: tag {} is not below 2^{}", transport, tag, kExchangeTagBits));
  int me = -1;
  for (size_t i = 0; i < group.size(); ++i) {
    if (group[i] < 0 || group[i] >= size)
      throw std::invalid_argument(fmt::format("{} exchange: group member {} is not a rank of the {}-rank communicator",
                                              transport, group[i], size));
    if (i > 0 && group[i] <= group[i - 1])
      throw std::invalid_argument(fmt::format("{} exchange: group is not sorted and distinct ({} after {})", transport,
                                              group[i], group[i - 1]));
    if (group[i] == rank) me = int(i);
  }
  if (me < 0)
    throw std::invalid_argument(
        fmt::format("{} exchange: rank {} is not in the group it exchanges with", transport, rank));
  return me;
}

void check_slices(const char* transport, const std::vector<Slice>& to, size_t members, size_t bytes,
                  int64_t max_size) {
  if (to.size() != members)
    throw std::invalid_argument(
        fmt::format("{} exchange: {} slices for a group of {} (expected one per member)", transport, to.size(), members));
  for (size_t i = 0; i < to.size(); ++i) {
    const Slice& s = to[i];
    if (s.offset < 0 || s.size < 0 || uint64_t(s.offset) + uint64_t(s.size) > bytes)
      throw std::invalid_argument(fmt::format("{} exchange: slice {} [{}, {} + {}) is outside the {}-byte send buffer",
                                              transport, i, s.offset, s.offset, s.size, bytes));
    if (s.size > max_size)
      throw std::invalid_argument(fmt::format("{} exchange: payload of {} bytes is over the {} limit of one message",
                                              transport, s.size, max_size == INT_MAX ? "2 GiB" : "size"));
  }
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += fmt::format("{}rank {}", i ? ", " : "", ranks[i]);
  return s;
}

std::string timeout_reason(const std::vector<int>& silent, const std::vector<int>& stuck, double timeout_s) {
  std::string what;
  if (!silent.empty()) what = fmt::format("no payload from {}", rank_list(silent));
  if (!stuck.empty())
    what += fmt::format("{}{} did not take this rank's payload", what.empty() ? "" : "; ", rank_list(stuck));
  return fmt::format("{} within {} s", what, timeout_s);
}

}  // namespace detail

namespace {

using Clock = std::chrono::steady_clock;

using detail::rank_list;

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, len);
}

// What one round keeps alive while its requests may still be in flight.
struct RoundBuffers {
  std::vector<std::array<uint64_t, 2>> send_headers;  // {tag, size} per member
  std::vector<std::byte> send_data;                   // the staged copy of the send buffer
  std::vector<std::array<uint64_t, 2>> recv_headers;
  std::vector<std::vector<std::byte>> inbox;
};

class MpiExchange final : public PayloadExchange {
 public:
  explicit MpiExchange(MPI_Comm comm) {
    MPI_Comm_dup(comm, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    void* value = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &value, &flag);
    const int tag_ub = flag ? *static_cast<int*>(value) : 32767;
    tag_slots_ = uint64_t(tag_ub) / 2;  // two MPI tags (header, payload) per slot
  }

  ~MpiExchange() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;  // too late to touch MPI: leak
    // After a failed round: take the messages of abandoned rounds that have arrived (so that no unmatched message
    // outlives the communicator) and give sends still in flight a moment to be taken by the peers doing the same.
    auto junk = std::make_shared<RoundBuffers>();
    junk->inbox.reserve(1024);  // at most this many
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    for (;;) {
      int flag = 1;
      while (flag && junk->inbox.size() < junk->inbox.capacity()) {
        MPI_Message message;
        MPI_Status status;
        MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, &message, &status);
        if (!flag) break;
        int bytes = 0;
        MPI_Get_count(&status, MPI_BYTE, &bytes);
        auto& buffer = junk->inbox.emplace_back(std::max(bytes, 1));
        MPI_Request request;
        MPI_Imrecv(buffer.data(), bytes, MPI_BYTE, &message, &request);
        orphans_.push_back({request, junk});
      }
      reap_orphans();
      if (orphans_.empty() || Clock::now() > deadline) break;
      std::this_thread::yield();
    }
    // What is left: let MPI release the requests when they complete, and keep their buffers alive for the rest
    // of the process, since MPI may still read or write them.
    static std::vector<std::shared_ptr<RoundBuffers>> graveyard;
    for (auto& o : orphans_) {
      MPI_Request_free(&o.request);
      graveyard.push_back(std::move(o.keep));
    }
    MPI_Comm_free(&comm_);
  }

  const char* name() const override { return "mpi"; }
  bool enabled() const override { return true; }
  std::string disabled_reason() const override { return {}; }
  int64_t bytes_sent() const override { return bytes_sent_; }

  std::vector<std::vector<std::byte>> personalized(const std::vector<int>& group, const std::vector<std::byte>& send,
                                                   const std::vector<Slice>& to, uint64_t tag,
                                                   double timeout_s) override {
    const int me = detail::check_group("mpi", group, rank_, size_, tag);
    detail::check_slices("mpi", to, group.size(), send.size(), INT_MAX);  // one MPI message each
    bytes_sent_ = 0;
    reap_orphans();
    const int n = int(group.size());
    auto own = [&] {
      return std::vector<std::byte>(send.begin() + to[me].offset, send.begin() + to[me].offset + to[me].size);
    };
    if (n == 1) return {own()};

    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    const int header_tag = int(tag % tag_slots_) * 2, payload_tag = header_tag + 1;

    // Reuse the last round's staging capacity unless a failed round still holds it.
    auto round = spare_ && spare_.use_count() == 1 ? std::move(spare_) : std::make_shared<RoundBuffers>();
    round->send_headers.assign(n, {tag, 0});
    for (int i = 0; i < n; ++i) round->send_headers[i][1] = uint64_t(to[i].size);
    round->send_data.assign(send.begin(), send.end());
    round->recv_headers.assign(n, {0, 0});
    round->inbox.assign(n, {});

    // Requests: [0, n) header receives, [n, 2n) payload receives, [2n, 3n) header sends, [3n, 4n) payload sends.
    std::vector<MPI_Request> req(4 * n, MPI_REQUEST_NULL);
    auto check = [&](int rc, int peer, const char* what) {
      if (rc != MPI_SUCCESS)
        fail(group, req, round, tag, fmt::format("{} rank {} failed: {}", what, peer, mpi_error_string(rc)));
    };
    for (int k = 1; k < n; ++k) {
      const int i = (me + k) % n;
      check(MPI_Irecv(round->recv_headers[i].data(), 2, MPI_UINT64_T, group[i], header_tag, comm_, &req[i]), group[i],
            "receiving the header from");
    }
    for (int k = 1; k < n; ++k) {
      const int i = (me + k) % n;
      check(MPI_Isend(round->send_headers[i].data(), 2, MPI_UINT64_T, group[i], header_tag, comm_, &req[2 * n + i]),
            group[i], "sending the header to");
      if (to[i].size > 0)
        check(MPI_Isend(round->send_data.data() + to[i].offset, int(to[i].size), MPI_BYTE, group[i], payload_tag,
                        comm_, &req[3 * n + i]),
              group[i], "sending the payload to");
      bytes_sent_ += kMpiHeaderBytes + to[i].size;
    }

    std::vector<int> done(4 * n);
    std::vector<MPI_Status> statuses(4 * n);
    for (;;) {
      int count = 0;
      const int rc = MPI_Testsome(4 * n, req.data(), &count, done.data(), statuses.data());
      if (rc != MPI_SUCCESS) {
        // Name the peers whose requests reported the error.
        std::vector<int> bad;
        if (rc == MPI_ERR_IN_STATUS)
          for (int c = 0; c < count; ++c)
            if (statuses[c].MPI_ERROR != MPI_SUCCESS) bad.push_back(group[done[c] % n]);
        fail(group, req, round, tag,
             fmt::format("{}: {}", bad.empty() ? std::string("a request") : rank_list(bad), mpi_error_string(rc)));
      }
      if (count == MPI_UNDEFINED) break;  // every request is complete
      for (int c = 0; c < count; ++c) {
        const int slot = done[c];
        if (slot >= n) continue;  // a payload or a send: nothing more to do
        const auto& h = round->recv_headers[slot];
        const int peer = group[slot];
        if (h[0] != tag)
          fail(group, req, round, tag,
               fmt::format("rank {} sent round {} while this rank expected round {}", peer, h[0], tag));
        if (h[1] > uint64_t(INT_MAX))
          fail(group, req, round, tag,
               fmt::format("rank {} announced a payload of {} bytes, over the 2 GiB limit", peer, h[1]));
        round->inbox[slot].resize(h[1]);
        if (h[1] > 0)
          check(MPI_Irecv(round->inbox[slot].data(), int(h[1]), MPI_BYTE, peer, payload_tag, comm_, &req[n + slot]),
                peer, "receiving the payload from");
      }
      if (count == 0) {
        if (Clock::now() > deadline) {
          std::vector<int> silent, stuck;
          for (int i = 0; i < n; ++i) {
            if (req[i] != MPI_REQUEST_NULL || req[n + i] != MPI_REQUEST_NULL)
              silent.push_back(group[i]);
            else if (req[2 * n + i] != MPI_REQUEST_NULL || req[3 * n + i] != MPI_REQUEST_NULL)
              stuck.push_back(group[i]);
          }
          fail(group, req, round, tag, detail::timeout_reason(silent, stuck, timeout_s));
        }
        std::this_thread::yield();
      }
    }
    round->inbox[me] = own();
    auto result = std::move(round->inbox);
    round->inbox.clear();
    spare_ = std::move(round);
    return result;
  }

 private:
  struct Orphan {
    MPI_Request request;
    std::shared_ptr<RoundBuffers> keep;
  };

  // Abandons the round: receives are cancelled, and whatever is still in flight keeps its buffers.
  [[noreturn]] void fail(const std::vector<int>& group, std::vector<MPI_Request>& req,
                         const std::shared_ptr<RoundBuffers>& round, uint64_t tag, const std::string& what) {
    const size_t n = group.size();
    for (size_t s = 0; s < 2 * n; ++s)
      if (req[s] != MPI_REQUEST_NULL) MPI_Cancel(&req[s]);
    for (auto& r : req) {
      if (r == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
      if (!flag) orphans_.push_back({r, round});
    }
    std::string members;
    for (size_t i = 0; i < n; ++i) members += fmt::format("{}{}", i ? "," : "", group[i]);
    throw std::runtime_error(
        fmt::format("mpi exchange on rank {} (round {}, group {{{}}}): {}", rank_, tag, members, what));
  }

  void reap_orphans() {
    std::erase_if(orphans_, [](Orphan& o) {
      int flag = 0;
      MPI_Test(&o.request, &flag, MPI_STATUS_IGNORE);
      return flag != 0;
    });
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  uint64_t tag_slots_ = 16383;
  int64_t bytes_sent_ = 0;
  std::shared_ptr<RoundBuffers> spare_;  // the last round's buffers, reused when nothing else holds them
  std::vector<Orphan> orphans_;
};

}  // namespace

std::unique_ptr<PayloadExchange> make_mpi_exchange(MPI_Comm comm) { return std::make_unique<MpiExchange>(comm); }

}  // namespace xx
