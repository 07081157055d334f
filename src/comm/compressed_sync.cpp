#include "comm/compressed_sync.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include "core/device_memory.h"
#include "kernels/elementwise.h"

namespace xx {
namespace cx = kernels::compress;

namespace {

constexpr double kExchangeTimeout = 300;  // seconds without a peer's payload before the step fails

using HostBytes = Kokkos::View<uint8_t*, Kokkos::HostSpace, Unmanaged>;

Vec<float> part(const Buffer<float>& b, int64_t begin, int64_t end) { return Vec<float>(b.data() + begin, end - begin); }

// The ranges of the flat buffer, one after the other in packed, and back.
enum class Direction { pack, unpack };
void copy_ranges(const Buffer<float>& flat, const Buffer<float>& packed,
                 const std::vector<std::pair<int64_t, int64_t>>& ranges, Direction d) {
  for (int64_t at = 0; const auto& [offset, size] : ranges) {
    const Vec<float> f = part(flat, offset, offset + size), p = part(packed, at, at + size);
    if (d == Direction::pack) Kokkos::deep_copy(p, f);
    else Kokkos::deep_copy(f, p);
    at += size;
  }
}

// Momentum correction: the local momentum u is cleared at the k sent entries idx (k).
void mask_momentum(Vec<float> u, Vec<const uint32_t> idx) {
  Kokkos::parallel_for(
      "CompressedSync::mask_momentum", Kokkos::RangePolicy<ExecSpace>(0, idx.extent(0)),
      KOKKOS_LAMBDA(int64_t j) { u(idx(j)) = 0.0f; });
}

// Bytes of a range payload of m values with k entries; 0 for none (nothing is sent).
int64_t range_payload_bytes(int64_t m, int64_t k, const cx::Settings& s) {
  return k == 0 ? 0 : cx::payload_bytes(m, k, s.quant, s.block);
}

// Grows a scratch buffer to at least n (its contents are not kept).
template <class T>
void reserve(Buffer<T>& b, int64_t n, const char* label) {
  if (int64_t(b.extent(0)) < n) b = Buffer<T>(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing), n);
}

}  // namespace

CompressedSync::CompressedSync(const std::vector<TensorSpan>& tensors, Buffer<float> grads,
                               const CompressConfig& cfg, double bucket_mb)
    : cfg_(cfg), grads_(grads) {
  settings_.ratio = cfg.ratio;
  settings_.quant = cfg.quant;
  settings_.block = cfg.block;
  settings_.feedback = cfg.feedback;
  // Pack the tensors by size class, merging neighbours in the flat buffer.
  auto add = [](std::vector<std::pair<int64_t, int64_t>>& to, int64_t offset, int64_t size) {
    if (!to.empty() && to.back().first + to.back().second == offset) to.back().second += size;
    else to.emplace_back(offset, size);
  };
  for (const auto& t : tensors) {
    if (t.size >= cfg.min_size) add(sparse_ranges_, t.offset, t.size), sparse_n_ += t.size;
    else add(dense_ranges_, t.offset, t.size), dense_n_ += t.size;
  }
  // Buckets never span two tensors: top-k picks within each tensor (as Deep
  // Gradient Compression does per layer), so a tensor with small gradients
  // is not starved by one with large ones. Large tensors split into buckets
  // of bucket_mb.
  const int64_t per_bucket = std::max<int64_t>(1, int64_t(bucket_mb * 1024 * 1024 / sizeof(float)));
  int64_t largest = 0;
  for (int64_t at = 0; const auto& t : tensors) {
    if (t.size < cfg.min_size) continue;
    for (int64_t b = 0; b < t.size; b += per_bucket) {
      buckets_.push_back({at + b, at + std::min(t.size, b + per_bucket)});
      largest = std::max(largest, buckets_.back().end - buckets_.back().begin);
    }
    at += t.size;
  }
  packed_ = Buffer<float>("CompressedSync::packed", sparse_n_);
  dense_ = Buffer<float>("CompressedSync::dense", dense_n_ + sparse_n_);
  residual_ = Buffer<float>("CompressedSync::residual", sparse_n_);
  if (cfg.momentum > 0) momentum_ = Buffer<float>("CompressedSync::momentum", sparse_n_);
  ws_ = cx::Workspace(largest, largest);
  if (cfg_.exchange == Exchange::partitioned && sparse_n_ > int64_t(UINT32_MAX))
    throw std::invalid_argument(fmt::format("compress exchange partitioned: {} values in the sparse part, the "
                                            "payload indices reach 2^32 - 1", sparse_n_));
}

double CompressedSync::ratio_at(int64_t step) const {
  if (step >= cfg_.warmup) return cfg_.ratio;
  return std::pow(cfg_.ratio, double(step + 1) / double(cfg_.warmup + 1));
}

// Worth it when what this rank sends is less than what the dense bucket costs.
// allgather: one payload to each of the other R-1 members, against the dense
// bucket it would hand to the all-reduce. partitioned: the bucket's k entries
// travel in the range payloads, about 2 (R-1)/R of them per rank (this rank's
// to the owners, then the owners' top-k of the sums to everyone), against the
// ring all-reduce's 2 (R-1)/R of the dense bucket: so the bucket's payload
// (its k entries with a header of their own, which the range payloads share)
// against the bucket.
bool CompressedSync::compressed(const Bucket& b, double ratio, int group_size) const {
  const int64_t n = b.end - b.begin;
  if (cfg_.ratio >= 1) return true;  // asked for: every entry through the sparse path
  const int64_t peers = cfg_.exchange == Exchange::partitioned ? 1 : std::max(1, group_size - 1);
  return peers * cx::payload_bytes(n, cx::topk_count(n, ratio), settings_.quant, settings_.block) <
         n * int64_t(sizeof(float));
}

int CompressedSync::compressed_buckets(int64_t step, int group_size) const {
  const double r = ratio_at(step);
  return int(std::count_if(buckets_.begin(), buckets_.end(),
                           [&](const Bucket& b) { return compressed(b, r, group_size); }));
}

void CompressedSync::own_pieces(int members, int me) {
  if (cfg_.exchange != Exchange::partitioned) return;
  if (members < 1 || me < 0 || me >= members)
    throw std::invalid_argument(fmt::format("CompressedSync::own_pieces: member {} of {}", me, members));
  owner_members_ = members, owner_me_ = me;
  const int64_t m = range_begin(me + 1) - range_begin(me);  // exactly the range: no padding
  owner_residual_ = Buffer<float>("CompressedSync::owner_residual", m);
  owner_sum_ = Buffer<float>("CompressedSync::owner_sum", m);
}

int64_t CompressedSync::range_begin(int64_t j) const { return cx::piece_begin(sparse_n_, j, owner_members_); }

std::vector<float> CompressedSync::owner_residual_whole(MPI_Comm world) const {
  if (cfg_.exchange != Exchange::partitioned || owner_members_ == 0) return {};
  int size = 0;
  MPI_Comm_size(world, &size);
  if (size != owner_members_)
    throw std::logic_error(fmt::format("CompressedSync::owner_residual_whole: laid out for {} members, the "
                                       "communicator has {} ranks", owner_members_, size));
  std::vector<int> counts(size), displs(size);
  for (int j = 0; j < size; ++j) displs[j] = int(range_begin(j)), counts[j] = int(range_begin(j + 1) - range_begin(j));
  std::vector<float> mine(owner_residual_.extent(0)), whole(sparse_n_);
  Kokkos::deep_copy(Kokkos::View<float*, Kokkos::HostSpace, Unmanaged>(mine.data(), mine.size()), owner_residual_);
  MPI_Allgatherv(mine.data(), int(mine.size()), MPI_FLOAT, whole.data(), counts.data(), displs.data(), MPI_FLOAT,
                 world);
  return whole;
}

bool CompressedSync::load_owner_residual_whole(const std::vector<float>& whole) {
  if (cfg_.exchange != Exchange::partitioned || owner_members_ == 0) return false;
  if (int64_t(whole.size()) != sparse_n_) {
    Kokkos::deep_copy(owner_residual_, 0.0f);
    return false;
  }
  const int64_t lo = range_begin(owner_me_);
  Kokkos::deep_copy(owner_residual_, Kokkos::View<const float*, Kokkos::HostSpace, Unmanaged>(
                                         whole.data() + lo, owner_residual_.extent(0)));
  return true;
}

// The intersections of [lo, hi) with the buckets (sorted, disjoint), relative to lo.
std::vector<cx::Segment> CompressedSync::segments_of(const std::vector<const Bucket*>& buckets, int64_t lo,
                                                     int64_t hi) {
  std::vector<cx::Segment> out;
  auto b = std::upper_bound(buckets.begin(), buckets.end(), lo,
                            [](int64_t at, const Bucket* x) { return at < x->end; });  // the first ending after lo
  for (; b != buckets.end() && (*b)->begin < hi; ++b) {
    const int64_t begin = std::max(lo, (*b)->begin), end = std::min(hi, (*b)->end);
    if (end > begin) out.push_back({begin - lo, end - lo});
  }
  return out;
}

std::string CompressedSync::describe() const {
  const char* exchange = cfg_.exchange == Exchange::partitioned
                             ? "exchange partitioned (sparse reduce-scatter to the range owners, then all-gather)"
                             : "exchange allgather (every payload to every member)";
  return fmt::format("top-k {} ({} quant, feedback {}{}), {} buckets over {} values, {} values dense (min_size {}), "
                     "{}",
                     cfg_.ratio, cfg_.quant, cfg_.feedback ? "on" : "off",
                     cfg_.momentum > 0 ? fmt::format(", momentum {}", cfg_.momentum) : "", buckets_.size(),
                     sparse_n_, dense_n_, cfg_.min_size, exchange);
}

std::vector<const uint8_t*> CompressedSync::in_kernel_memory(const std::vector<std::vector<std::byte>>& messages) {
  std::vector<const uint8_t*> at;
  if (kernel_memory_on_host()) {
    for (const auto& m : messages) at.push_back(reinterpret_cast<const uint8_t*>(m.data()));
    return at;
  }
  int64_t total = 0;
  for (const auto& m : messages) total += int64_t(m.size());  // each a multiple of 4: the copies stay aligned
  if (int64_t(received_kernel_.extent(0)) < total) received_kernel_ = Buffer<uint8_t>("CompressedSync::received", total);
  int64_t offset = 0;
  for (const auto& m : messages) {
    Kokkos::deep_copy(Vec<uint8_t>(received_kernel_.data() + offset, m.size()),
                      HostBytes(reinterpret_cast<uint8_t*>(const_cast<std::byte*>(m.data())), m.size()));
    at.push_back(received_kernel_.data() + offset);
    offset += int64_t(m.size());
  }
  return at;
}

void CompressedSync::reduce(const std::vector<int>& members, MPI_Comm group, int64_t step, int micro_steps,
                            Communicator& comm, CommStats& stats) {
  const int R = int(members.size());
  const double ratio = ratio_at(step);
  cx::Settings s = settings_;
  s.ratio = ratio;

  // 1. pack
  copy_ranges(grads_, packed_, sparse_ranges_, Direction::pack);
  copy_ranges(grads_, dense_, dense_ranges_, Direction::pack);
  // Momentum correction (DGC): the local momentum u = m u + g is what gets
  // accumulated and sent; u is cleared where it was sent.
  Buffer<float> send = packed_;
  if (cfg_.momentum > 0) {
    kernels::scale_inplace<float>(Vec<float>(momentum_.data(), sparse_n_), float(cfg_.momentum));
    kernels::add_inplace<float>(Vec<float>(momentum_.data(), sparse_n_), Vec<const float>(packed_.data(), sparse_n_));
    send = momentum_;
  }
  int me = 0;
  if (cfg_.exchange == Exchange::partitioned) {
    MPI_Comm_rank(group, &me);
    if (owner_members_ == 0) own_pieces(R, me);
    if (owner_members_ != R || owner_me_ != me)
      throw std::logic_error(fmt::format("compress exchange partitioned: the owner residual is laid out for member "
                                         "{} of {}, this step's group has this rank as member {} of {}",
                                         owner_me_, owner_members_, me, R));
  }

  // 2. compress (in step 3), or flush into the dense part
  std::vector<const Bucket*> sparse;
  int64_t dense_n = dense_n_;
  std::vector<std::pair<const Bucket*, int64_t>> flushed;  // bucket, its place in dense_
  for (const auto& b : buckets_) {
    if (compressed(b, ratio, R)) {
      sparse.push_back(&b);
    } else {
      flushed.push_back({&b, dense_n});
      dense_n += b.end - b.begin;
    }
  }
  for (const auto& [bp, at] : flushed) {
    const Bucket& b = *bp;
    Vec<float> out = part(dense_, at, at + (b.end - b.begin));
    Kokkos::deep_copy(out, part(send, b.begin, b.end));
    if (cfg_.feedback) {  // nothing held back survives a dense step
      kernels::add_inplace<float>(out, part(residual_, b.begin, b.end));
      Kokkos::deep_copy(part(residual_, b.begin, b.end), 0.0f);
      if (cfg_.exchange == Exchange::partitioned) {  // nor what this rank held back of its range of the sum
        const int64_t lo = range_begin(me), begin = std::max(lo, b.begin), end = std::min(range_begin(me + 1), b.end);
        if (end > begin) {
          Vec<float> held = part(owner_residual_, begin - lo, end - lo);
          kernels::add_inplace<float>(Vec<float>(out.data() + (begin - b.begin), end - begin), held);
          Kokkos::deep_copy(held, 0.0f);
        }
      }
    }
    if (cfg_.momentum > 0) Kokkos::deep_copy(part(momentum_, b.begin, b.end), 0.0f);
  }

  // 3. compress, exchange and decode
  if (cfg_.exchange == Exchange::partitioned) partitioned(sparse, s, send, members, me, step, comm, stats);
  else allgather(sparse, s, send, members, step, comm, stats);

  // 4. the dense part
  if (R > 1) comm.dense().execute(dense_.data(), dense_n, group, stats);

  // 5. unpack and average
  for (const auto& [bp, at] : flushed)
    Kokkos::deep_copy(part(packed_, bp->begin, bp->end), part(dense_, at, at + (bp->end - bp->begin)));
  copy_ranges(grads_, packed_, sparse_ranges_, Direction::unpack);
  copy_ranges(grads_, dense_, dense_ranges_, Direction::unpack);
  if (R * micro_steps > 1)
    kernels::scale_inplace<float>(Vec<float>(grads_.data(), grads_.extent(0)), 1.0f / float(R * micro_steps));
  ExecSpace().fence();
}

// Every rank's payloads of all buckets to every member (one round, tag =
// step); each rank sums them in group order.
void CompressedSync::allgather(const std::vector<const Bucket*>& buckets, const cx::Settings& s,
                               const Buffer<float>& send, const std::vector<int>& members, int64_t step,
                               Communicator& comm, CommStats& stats) {
  const int R = int(members.size());
  struct Sent {
    const Bucket* b;
    int64_t k, offset, size;  // entries sent; the payload's place in the step's message
  };
  std::vector<Sent> sparse;
  int64_t bytes = 0;
  for (const Bucket* b : buckets) {
    const int64_t n = b->end - b->begin;
    const int64_t k = cx::topk_count(n, s.ratio), size = cx::payload_bytes(n, k, s.quant, s.block);
    sparse.push_back({b, k, bytes, size});
    bytes += size;
  }
  payload_.resize(bytes);
  const bool staged = !kernel_memory_on_host();
  if (staged && int64_t(payload_kernel_.extent(0)) < bytes)
    payload_kernel_ = Buffer<uint8_t>("CompressedSync::payload", bytes);
  uint8_t* encoded = staged ? payload_kernel_.data() : reinterpret_cast<uint8_t*>(payload_.data());
  for (const auto& [bp, k, offset, size] : sparse) {
    const Bucket& b = *bp;
    Vec<uint8_t> out(encoded + offset, size);
    cx::compress(out, part(residual_, b.begin, b.end), part(send, b.begin, b.end), s, ws_);
    if (cfg_.momentum > 0) mask_momentum(part(momentum_, b.begin, b.end), Vec<const uint32_t>(ws_.idx.data(), k));
  }
  ExecSpace().fence();
  if (staged) Kokkos::deep_copy(HostBytes(reinterpret_cast<uint8_t*>(payload_.data()), bytes), Vec<uint8_t>(encoded, bytes));
  if (sparse.empty()) return;

  std::vector<std::vector<std::byte>> got;
  const double t0 = MPI_Wtime();
  if (R > 1) {
    got = comm.sparse().exchange(members, payload_, uint64_t(step), kExchangeTimeout);
    stats.rounds += 1;
    stats.bytes_sent += comm.sparse().bytes_sent();
    stats.wire_bytes += comm.sparse().bytes_sent();  // point to point: what leaves this rank
  } else {
    got.push_back(payload_);
  }
  stats.seconds += MPI_Wtime() - t0;
  for (int r = 0; r < R; ++r)
    if (int64_t(got[r].size()) != bytes)
      throw std::runtime_error(fmt::format("step {}: compressed gradients from rank {} are {} bytes, expected {} "
                                           "(do the ranks run the same deck?)",
                                           step + 1, members[r], got[r].size(), bytes));
  const std::vector<const uint8_t*> received = in_kernel_memory(got);
  for (const auto& [bp, k, offset, size] : sparse) {
    std::vector<Vec<const uint8_t>> payloads;
    for (int r = 0; r < R; ++r) payloads.emplace_back(received[r] + offset, size);
    try {
      cx::decode_sum(part(packed_, bp->begin, bp->end), payloads);
    } catch (const std::runtime_error& e) {  // decode_sum names the index in the group
      throw std::runtime_error(fmt::format("step {}: compressed gradients, group {}: {}", step + 1,
                                           detail::rank_list(members), e.what()));
    }
  }
}

// The sparse reduce-scatter and all-gather of compressed_sync.h, steps a-e.
void CompressedSync::partitioned(const std::vector<const Bucket*>& buckets, const cx::Settings& s,
                                 const Buffer<float>& send, const std::vector<int>& members, int me, int64_t step,
                                 Communicator& comm, CommStats& stats) {
  const int R = int(members.size());
  const int64_t nb = int64_t(buckets.size());
  if (nb == 0) return;
  const bool staged = !kernel_memory_on_host();
  auto fail = [&](const std::string& what) {
    return std::runtime_error(fmt::format("step {}: compressed gradients (exchange partitioned), group {}: {}",
                                          step + 1, detail::rank_list(members), what));
  };

  // b. each compressed bucket's top-k, one after the other in packed order
  // (so the whole selection is sorted), cut at the range starts; the entries
  // in range j encoded as one payload into piece_kernel_
  int64_t K = 0;
  for (const Bucket* b : buckets) K += cx::topk_count(b->end - b->begin, s.ratio);
  reserve(sel_idx_, K, "CompressedSync::selected_indices");
  reserve(sel_rel_, K, "CompressedSync::relative_indices");
  reserve(sel_val_, K, "CompressedSync::selected_values");
  reserve(sel_sent_, K, "CompressedSync::sent_values");
  for (int64_t at = 0; const Bucket* b : buckets) {
    const int64_t k = cx::topk_count(b->end - b->begin, s.ratio);
    cx::select_into(Vec<uint32_t>(sel_idx_.data() + at, k), Vec<float>(sel_val_.data() + at, k),
                    part(residual_, b->begin, b->end), part(send, b->begin, b->end), b->begin, s, ws_);
    if (cfg_.momentum > 0)  // packed indices: the local momentum of the whole sparse part
      mask_momentum(part(momentum_, 0, sparse_n_), Vec<const uint32_t>(sel_idx_.data() + at, k));
    at += k;
  }
  const cx::Selection sel = cx::cut_selection(Vec<const uint32_t>(sel_idx_.data(), K),
                                              Vec<const float>(sel_val_.data(), K), Vec<float>(sel_sent_.data(), K),
                                              Vec<uint32_t>(sel_rel_.data(), K), sparse_n_, R, ws_.bounds);
  std::vector<Slice> to(R);
  int64_t bytes = 0;
  for (int j = 0; j < R; ++j) {
    to[j] = {bytes, cx::piece_payload_bytes(sel, j, s)};
    bytes += to[j].size;
  }
  if (int64_t(piece_kernel_.extent(0)) < bytes) piece_kernel_ = Buffer<uint8_t>("CompressedSync::pieces", bytes);
  uint8_t* encoded = piece_kernel_.data();
  for (int j = 0; j < R; ++j)
    if (to[j].size > 0) cx::encode_piece(Vec<uint8_t>(encoded + to[j].offset, to[j].size), sel, j, s, ws_);
  if (s.feedback) {
    cx::finish_pieces(part(residual_, 0, sparse_n_), sel, s, ws_);
  } else {
    for (const Bucket* b : buckets) Kokkos::deep_copy(part(residual_, b->begin, b->end), 0.0f);
  }
  ExecSpace().fence();
  payload_.resize(bytes);
  Kokkos::deep_copy(HostBytes(reinterpret_cast<uint8_t*>(payload_.data()), bytes), Vec<uint8_t>(encoded, bytes));

  // c. round one: to each owner j the payload of its range (nothing without entries)
  std::vector<std::vector<std::byte>> got;
  double t0 = MPI_Wtime();
  if (R > 1) {
    got = comm.sparse().personalized(members, payload_, to, uint64_t(2 * step), kExchangeTimeout);
    stats.rounds += 1;
    stats.bytes_sent += comm.sparse().bytes_sent();
    stats.wire_bytes += comm.sparse().bytes_sent();
  } else {
    got.push_back(payload_);
  }
  stats.seconds += MPI_Wtime() - t0;

  // d. this rank's range: the group's payloads summed in group order, plus the
  // owner residual; the top k' of each segment (the range's intersections with
  // the compressed buckets) encoded as one payload into owned_
  const int64_t lo = range_begin(me), m = range_begin(me + 1) - lo;
  const std::vector<cx::Segment> mine = segments_of(buckets, lo, lo + m);
  const int64_t own_k = cx::segments_count(mine, s.ratio), own_bytes = range_payload_bytes(m, own_k, s);
  owned_.resize(own_bytes);
  if (own_k > 0) {
    for (int r = 0; r < R; ++r)
      if (!got[r].empty() && got[r].size() % 4 != 0)
        throw fail(fmt::format("rank {} sent {} bytes for this rank's range, not a payload", members[r],
                               got[r].size()));
    const std::vector<const uint8_t*> received = in_kernel_memory(got);
    std::vector<cx::Parsed> parsed;
    for (int r = 0; r < R; ++r) {
      if (got[r].empty()) continue;  // none of rank r's entries fell in this range
      try {
        parsed.push_back(cx::parse(Vec<const uint8_t>(received[r], int64_t(got[r].size())), m));
      } catch (const std::runtime_error& e) {
        throw fail(fmt::format("rank {}, the range of member {}: {}", members[r], me, e.what()));
      }
    }
    Vec<float> sum(owner_sum_.data(), m);
    cx::sum_parsed(sum, parsed);
    reserve(own_idx_, own_k, "CompressedSync::owner_indices");
    reserve(own_val_, own_k, "CompressedSync::owner_values");
    reserve(own_sent_, own_k, "CompressedSync::owner_sent");
    if (staged) reserve(owned_kernel_, own_bytes, "CompressedSync::owned");
    uint8_t* out = staged ? owned_kernel_.data() : reinterpret_cast<uint8_t*>(owned_.data());
    cx::compress_segments(Vec<uint8_t>(out, own_bytes), part(owner_residual_, 0, m), sum, mine, s, ws_,
                          Vec<uint32_t>(own_idx_.data(), own_k), Vec<float>(own_val_.data(), own_k),
                          Vec<float>(own_sent_.data(), own_k));
    ExecSpace().fence();  // the parsed payloads in received_kernel_ are read before it is reused
    if (staged)
      Kokkos::deep_copy(HostBytes(reinterpret_cast<uint8_t*>(owned_.data()), own_bytes), Vec<uint8_t>(out, own_bytes));
  } else {
    for (int r = 0; r < R; ++r)
      if (!got[r].empty())
        throw fail(fmt::format("rank {} sent {} bytes for this rank's range, which has no compressed values (do "
                               "the ranks run the same deck?)", members[r], got[r].size()));
  }

  // e. round two: every owner's payload to every member; each decoded into its range
  t0 = MPI_Wtime();
  if (R > 1) {
    got = comm.sparse().exchange(members, owned_, uint64_t(2 * step + 1), kExchangeTimeout);
    stats.rounds += 1;
    stats.bytes_sent += comm.sparse().bytes_sent();
    stats.wire_bytes += comm.sparse().bytes_sent();
  } else {
    got = {owned_};
  }
  stats.seconds += MPI_Wtime() - t0;
  for (int j = 0; j < R; ++j) {
    const int64_t begin = range_begin(j), length = range_begin(j + 1) - begin;
    const int64_t expect = range_payload_bytes(length, cx::segments_count(segments_of(buckets, begin, begin + length),
                                                                          s.ratio), s);
    if (int64_t(got[j].size()) != expect)
      throw fail(fmt::format("rank {} sent {} bytes of its range, expected {} (do the ranks run the same deck?)",
                             members[j], got[j].size(), expect));
  }
  const std::vector<const uint8_t*> received = in_kernel_memory(got);
  for (int j = 0; j < R; ++j) {
    const int64_t begin = range_begin(j), end = range_begin(j + 1);
    if (got[j].empty()) {  // no compressed bucket in the range: its values come from the dense part
      Kokkos::deep_copy(part(packed_, begin, end), 0.0f);
      continue;
    }
    try {
      cx::decode_sum(part(packed_, begin, end), {Vec<const uint8_t>(received[j], int64_t(got[j].size()))});
    } catch (const std::runtime_error& e) {
      throw fail(fmt::format("the range of rank {}: {}", members[j], e.what()));
    }
  }
}

}  // namespace xx
