// Payload exchange over UCX and MPI (src/comm/exchange.h); ctest runs this
// binary at 2 and 4 ranks. UCX is required: a UCX that does not start fails.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/exchange.h"
#include "mpi_fixture.h"

using namespace xx;
using namespace xx::test;

namespace {

using Payload = std::vector<std::byte>;
constexpr double kTimeout = 120.0;  // generous: 4 ranks share 2 cores on the test machine

// Sizes that cover empty, tiny, eager, rendezvous and ~4 MB payloads.
const std::vector<size_t> kSizes = {0, 1, 7, 4096, 65537, 300000, (size_t(4) << 20) + 3};

size_t payload_size(int rank, int round) { return kSizes[size_t(rank * 3 + round) % kSizes.size()]; }

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Deterministic bytes that differ by rank, round and position.
Payload make_payload(int rank, int round, size_t size) {
  Payload p(size);
  const uint64_t seed = mix(uint64_t(rank) << 32 | uint32_t(round));
  for (size_t i = 0; i < size; i += 8) {
    const uint64_t word = mix(seed ^ i);
    for (size_t b = 0; b < 8 && i + b < size; ++b) p[i + b] = std::byte(word >> (8 * b));
  }
  return p;
}

int64_t expected_bytes_sent(const PayloadExchange& x, size_t group_size, size_t payload) {
  const int64_t header = std::string(x.name()) == "mpi" ? kMpiHeaderBytes : 0;
  return int64_t(group_size - 1) * (header + int64_t(payload));
}

std::vector<int> world_group() {
  std::vector<int> g(mpi_size());
  for (int r = 0; r < mpi_size(); ++r) g[r] = r;
  return g;
}

std::unique_ptr<PayloadExchange> make_ucx() {
  auto x = make_ucx_exchange(MPI_COMM_WORLD);
  INFO("UCX is required here: " << x->disabled_reason());
  REQUIRE(x->enabled());
  REQUIRE(std::string(x->name()) == "ucx");
  return x;
}

std::vector<std::unique_ptr<PayloadExchange>> both_transports() {
  std::vector<std::unique_ptr<PayloadExchange>> v;
  v.push_back(make_ucx());
  v.push_back(make_mpi_exchange(MPI_COMM_WORLD));
  REQUIRE(v.back()->enabled());
  REQUIRE(std::string(v.back()->name()) == "mpi");
  return v;
}

// One round over `group` (which holds this rank): checks every member's bytes and bytes_sent.
std::vector<Payload> checked_round(PayloadExchange& x, const std::vector<int>& group, int round, uint64_t tag) {
  const Payload mine = make_payload(mpi_rank(), round, payload_size(mpi_rank(), round));
  auto out = x.exchange(group, mine, tag, kTimeout);
  INFO(x.name() << " round " << round << " tag " << tag << " on rank " << mpi_rank());
  REQUIRE(out.size() == group.size());
  for (size_t j = 0; j < group.size(); ++j) {
    INFO("payload of rank " << group[j]);
    REQUIRE(out[j] == make_payload(group[j], round, payload_size(group[j], round)));
  }
  REQUIRE(x.bytes_sent() == expected_bytes_sent(x, group.size(), mine.size()));
  return out;
}

// Partitions of the world into groups; a rank in no group sits the round out.
std::vector<std::vector<std::vector<int>>> partitions() {
  const int n = mpi_size();
  std::vector<std::vector<std::vector<int>>> parts;
  std::vector<int> low, high, even, odd, all_but_one, singles;
  for (int r = 0; r < n; ++r) {
    (r < n / 2 ? low : high).push_back(r);
    (r % 2 ? odd : even).push_back(r);
    if (r != n - 2) all_but_one.push_back(r);
  }
  parts.push_back({low, high});     // {0,1} {2,3}
  parts.push_back({even, odd});     // {0,2} {1,3}
  parts.push_back({all_but_one});   // {0,1,3}: rank 2 sits out
  parts.push_back({{0}, {n - 1}});  // singletons; the others sit out
  if (n >= 4) parts.push_back({{1, 2, 3}});
  parts.push_back({world_group()});
  return parts;
}

}  // namespace

TEST_CASE("UCX starts on every rank", "[mpi][exchange]") {
  auto x = make_ucx();
  // A group of one is a copy and sends nothing.
  const Payload p = make_payload(mpi_rank(), 0, 100);
  const auto out = x->exchange({mpi_rank()}, p, 1, kTimeout);
  REQUIRE(out == std::vector<Payload>{p});
  REQUIRE(x->bytes_sent() == 0);
}

TEST_CASE("every member receives every other member's payload, round after round", "[mpi][exchange]") {
  const auto group = world_group();
  for (auto& x : both_transports()) {
    for (int round = 0; round < 2 * int(kSizes.size()); ++round) checked_round(*x, group, round, 1000 + round);
    // The same rounds again under new tags, back to back.
    for (int round = 0; round < int(kSizes.size()); ++round) checked_round(*x, group, round, 5000 + 7 * round);
  }
}

TEST_CASE("disjoint groups exchange at the same time; ranks outside a group take no part", "[mpi][exchange]") {
  for (auto& x : both_transports()) {
    int round = 0;
    for (const auto& part : partitions()) {
      for (int repeat = 0; repeat < 3; ++repeat, ++round) {
        for (const auto& group : part) {
          if (std::find(group.begin(), group.end(), mpi_rank()) == group.end()) continue;
          checked_round(*x, group, round, 20000 + round);  // disjoint groups share the tag
        }
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("UCX and MPI give identical results", "[mpi][exchange]") {
  auto transports = both_transports();
  auto& ucx = *transports[0];
  auto& mpi = *transports[1];
  const auto group = world_group();
  for (int round = 0; round < int(kSizes.size()); ++round) {
    const Payload mine = make_payload(mpi_rank(), round, payload_size(mpi_rank(), round));
    const auto a = ucx.exchange(group, mine, 300 + round, kTimeout);
    const auto b = mpi.exchange(group, mine, 300 + round, kTimeout);
    REQUIRE(a == b);
    REQUIRE(a[mpi_rank()] == mine);
    // bytes_sent: the payload once per peer, plus MPI's 16-byte header per peer.
    REQUIRE(ucx.bytes_sent() == int64_t(group.size() - 1) * int64_t(mine.size()));
    REQUIRE(mpi.bytes_sent() == int64_t(group.size() - 1) * (16 + int64_t(mine.size())));
  }
}

TEST_CASE("personalized: each member gets its own slice, empty ones included", "[mpi][exchange]") {
  auto transports = both_transports();
  const auto group = world_group();
  const int n = mpi_size(), me = mpi_rank();
  // The payload from rank s to member i, round r: distinct bytes, of a size
  // that cycles through kSizes (empty among them).
  auto slice_size = [](int s, int i, int r) { return kSizes[size_t(s * 5 + i * 3 + r) % kSizes.size()]; };
  auto slice = [&](int s, int i, int r) { return make_payload(s * 1000 + i, r, slice_size(s, i, r)); };
  std::vector<std::vector<Payload>> got(transports.size());
  for (int round = 0; round < int(kSizes.size()); ++round) {
    // The slices one after the other in the send buffer, in reverse member order (any layout is fine).
    Payload send;
    std::vector<Slice> to(n);
    for (int i = n - 1; i >= 0; --i) {
      const Payload p = slice(me, i, round);
      to[i] = {int64_t(send.size()), int64_t(p.size())};
      send.insert(send.end(), p.begin(), p.end());
    }
    for (size_t t = 0; t < transports.size(); ++t) {
      PayloadExchange& x = *transports[t];
      INFO(x.name() << " round " << round);
      got[t] = x.personalized(group, send, to, 700 + round, kTimeout);
      REQUIRE(got[t].size() == size_t(n));
      for (int s = 0; s < n; ++s) REQUIRE(got[t][s] == slice(s, me, round));  // own slice included
      // bytes_sent: the slices to the peers, plus MPI's 16-byte header per peer
      int64_t expect = 0;
      for (int i = 0; i < n; ++i)
        if (i != me) expect += int64_t(slice_size(me, i, round)) + (std::string(x.name()) == "mpi" ? 16 : 0);
      REQUIRE(x.bytes_sent() == expect);
    }
    REQUIRE(got[0] == got[1]);
  }
  for (auto& x : transports) {  // a slice outside the buffer, or one slice too few
    const Payload p(10);
    REQUIRE_THROWS_AS(x->personalized(group, p, std::vector<Slice>(n, Slice{4, 7}), 1, 1.0), std::invalid_argument);
    REQUIRE_THROWS_AS(x->personalized(group, p, std::vector<Slice>(n - 1, Slice{0, 1}), 1, 1.0),
                      std::invalid_argument);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("bad groups and tags are refused before anything is sent", "[mpi][exchange]") {
  for (auto& x : both_transports()) {
    const Payload p(10);
    const int me = mpi_rank(), other = (me + 1) % mpi_size();
    REQUIRE_THROWS_AS(x->exchange({other}, p, 1, 1.0), std::invalid_argument);               // without this rank
    REQUIRE_THROWS_AS(x->exchange({me, me}, p, 1, 1.0), std::invalid_argument);              // repeated
    REQUIRE_THROWS_AS(x->exchange({me, mpi_size()}, p, 1, 1.0), std::invalid_argument);      // not a rank
    REQUIRE_THROWS_AS(x->exchange({me}, p, uint64_t(1) << 40, 1.0), std::invalid_argument);  // tag too big
    if (me == 1) REQUIRE_THROWS_AS(x->exchange({1, 0}, p, 1, 1.0), std::invalid_argument);   // unsorted
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("a peer that does not take part is named after the timeout, and the pair recovers", "[mpi][exchange]") {
  for (auto& x : both_transports()) {
    const std::vector<int> pair = {0, 1};
    uint64_t tag = 900;
    for (int waiter = 0; waiter < 2; ++waiter) {
      for (size_t size : {size_t(100), size_t(1) << 20}) {  // eager, and rendezvous left in flight
        ++tag;
        if (mpi_rank() == waiter) {
          const double timeout = 0.5;
          const auto t0 = std::chrono::steady_clock::now();
          std::string message;
          try {
            x->exchange(pair, Payload(size, std::byte(7)), tag, timeout);
          } catch (const std::runtime_error& e) {
            message = e.what();
          }
          const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          INFO(x->name() << ": " << message);
          REQUIRE(message.find("rank " + std::to_string(1 - waiter)) != std::string::npos);
          REQUIRE(message.find("within") != std::string::npos);
          REQUIRE(waited >= timeout);
          REQUIRE(waited < timeout + 10.0);
        }
        // The pair meets again and exchanges under a fresh tag.
        MPI_Barrier(MPI_COMM_WORLD);
        ++tag;
        if (mpi_rank() < 2) checked_round(*x, pair, int(tag), tag);
        MPI_Barrier(MPI_COMM_WORLD);
      }
    }
  }
}

TEST_CASE("a UCX peer that is gone is named at once, and in every later round", "[mpi][exchange]") {
  auto x = make_ucx();
  const std::vector<int> pair = {0, 1};
  if (mpi_rank() < 2) checked_round(*x, pair, 1, 1);  // the endpoints exist both ways
  MPI_Barrier(MPI_COMM_WORLD);
  if (mpi_rank() == 1) {
    // Rank 1 tears its exchange down while rank 0 waits for it in a round.
    const auto t0 = std::chrono::steady_clock::now();
    x.reset();
    REQUIRE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 5.0);
  }
  if (mpi_rank() == 0) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      const double timeout = 30.0;
      const auto t0 = std::chrono::steady_clock::now();
      std::string message;
      try {
        x->exchange(pair, Payload(1000), 2 + attempt, timeout);
      } catch (const std::runtime_error& e) {
        message = e.what();
      }
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      INFO(message);
      REQUIRE(message.find("rank 1") != std::string::npos);
      REQUIRE(message.find("failed") != std::string::npos);  // UCX reported it: no waiting for the timeout
      REQUIRE(waited < timeout / 2);
    }
  }
  x.reset();
  MPI_Barrier(MPI_COMM_WORLD);
}
