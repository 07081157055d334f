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

cx::Quant quant_of(const std::string& q) {
  return q == "int8" ? cx::Quant::int8 : q == "int4" ? cx::Quant::int4 : q == "bf16" ? cx::Quant::bf16 : cx::Quant::none;
}

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

// Momentum correction: the local momentum u (n) is cleared where the k entries in ws.idx were sent.
void mask_momentum(Vec<float> u, const cx::Workspace& ws, int64_t k) {
  Vec<const uint32_t> idx(ws.idx.data(), k);
  Kokkos::parallel_for(
      "CompressedSync::mask_momentum", Kokkos::RangePolicy<ExecSpace>(0, k),
      KOKKOS_LAMBDA(int64_t j) { u(idx(j)) = 0.0f; });
}

// Bytes of the payload of piece j of a bucket of n cut in R, as its owner sends it (0 for an empty piece).
int64_t owner_payload_bytes(int64_t n, int64_t j, int64_t R, const cx::Settings& s) {
  const int64_t m = cx::piece_begin(n, j + 1, R) - cx::piece_begin(n, j, R);
  return m == 0 ? 0 : cx::payload_bytes(m, cx::topk_count(m, s.ratio), s.quant, s.block);
}

}  // namespace

CompressedSync::CompressedSync(const std::vector<TensorSpan>& tensors, Buffer<float> grads,
                               const CompressConfig& cfg, double bucket_mb)
    : cfg_(cfg), grads_(grads) {
  settings_.ratio = cfg.ratio;
  settings_.quant = quant_of(cfg.quant);
  settings_.block = cfg.block;
  settings_.feedback = cfg.feedback;
  exchange_ = cfg.exchange == "partitioned" ? Exchange::partitioned : Exchange::allgather;
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
}

double CompressedSync::ratio_at(int64_t step) const {
  if (step >= cfg_.warmup) return cfg_.ratio;
  return std::pow(cfg_.ratio, double(step + 1) / double(cfg_.warmup + 1));
}

// Worth it when what this rank sends is less than what the dense bucket costs.
// allgather: one payload to each of the other R-1 members, against the dense
// bucket it would hand to the all-reduce. partitioned: about 2 (R-1)/R of the
// owners' R piece payloads together (each rank sends its pieces to the owners,
// then its own piece of the sum to everyone), against the ring all-reduce's
// 2 (R-1)/R of the dense bucket: so the R piece payloads against the bucket.
bool CompressedSync::compressed(const Bucket& b, double ratio, int group_size) const {
  const int64_t n = b.end - b.begin;
  if (cfg_.ratio >= 1) return true;  // asked for: every entry through the sparse path
  if (exchange_ == Exchange::partitioned) {
    cx::Settings s = settings_;
    s.ratio = ratio;
    const int64_t R = std::max(1, group_size);
    int64_t pieces = 0;
    for (int64_t j = 0; j < R; ++j) pieces += owner_payload_bytes(n, j, R, s);
    return pieces < n * int64_t(sizeof(float));
  }
  const int64_t peers = std::max(1, group_size - 1);
  return peers * cx::payload_bytes(n, cx::topk_count(n, ratio), settings_.quant, settings_.block) <
         n * int64_t(sizeof(float));
}

int CompressedSync::compressed_buckets(int64_t step, int group_size) const {
  const double r = ratio_at(step);
  return int(std::count_if(buckets_.begin(), buckets_.end(),
                           [&](const Bucket& b) { return compressed(b, r, group_size); }));
}

void CompressedSync::own_pieces(int members, int me) {
  if (exchange_ != Exchange::partitioned) return;
  owner_members_ = members, owner_me_ = me;
  owner_at_.clear();
  // Each bucket's piece gets ceil(n / R) places, one more than it holds when
  // R does not divide n (that place stays 0): every rank's owner residual is
  // then the same length, as a resume at another world size, which averages
  // the ranks' buffers, needs.
  int64_t total = 0, largest = 0;
  for (const auto& b : buckets_) {
    const int64_t n = b.end - b.begin, m = cx::ceil_div(n, members);
    owner_at_.push_back(total);
    total += m, largest = std::max(largest, m);
  }
  owner_residual_ = Buffer<float>("CompressedSync::owner_residual", total);
  owner_sum_ = Buffer<float>("CompressedSync::owner_sum", largest);
}

CompressedSync::OwnPiece CompressedSync::own_piece(size_t b) const {
  const int64_t n = buckets_[b].end - buckets_[b].begin;
  const int64_t begin = cx::piece_begin(n, owner_me_, owner_members_);
  return {begin, cx::piece_begin(n, owner_me_ + 1, owner_members_) - begin, owner_at_[b]};
}

std::string CompressedSync::describe() const {
  const char* exchange = exchange_ == Exchange::partitioned
                             ? "exchange partitioned (sparse reduce-scatter to the piece owners, then all-gather)"
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
  if (exchange_ == Exchange::partitioned) {
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
      if (exchange_ == Exchange::partitioned) {  // nor what this rank held back of its piece of the sum
        const OwnPiece p = own_piece(size_t(bp - buckets_.data()));
        Vec<float> held = part(owner_residual_, p.at, p.at + p.length);
        kernels::add_inplace<float>(Vec<float>(out.data() + p.begin, p.length), held);
        Kokkos::deep_copy(held, 0.0f);
      }
    }
    if (cfg_.momentum > 0) Kokkos::deep_copy(part(momentum_, b.begin, b.end), 0.0f);
  }

  // 3. compress, exchange and decode
  if (exchange_ == Exchange::partitioned) partitioned(sparse, s, send, members, me, step, comm, stats);
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
    if (cfg_.momentum > 0) mask_momentum(part(momentum_, b.begin, b.end), ws_, k);
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

  // b. select each bucket, cut at the piece starts, encode the pieces one
  // after the other (bucket by bucket) into piece_kernel_
  std::vector<std::vector<int64_t>> size(nb, std::vector<int64_t>(R)), at(nb, std::vector<int64_t>(R));
  int64_t used = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const Bucket& b = *buckets[i];
    const cx::Selection sel = cx::select_pieces(part(residual_, b.begin, b.end), part(send, b.begin, b.end), s, R, ws_);
    int64_t total = 0;
    for (int j = 0; j < R; ++j) total += size[i][j] = cx::piece_payload_bytes(sel, j, s);
    if (int64_t(piece_kernel_.extent(0)) < used + total) {  // grows, keeping what is encoded
      const int64_t capacity = std::max(used + total, 2 * int64_t(piece_kernel_.extent(0)));
      if (piece_kernel_.extent(0) == 0) piece_kernel_ = Buffer<uint8_t>("CompressedSync::pieces", capacity);
      else Kokkos::resize(piece_kernel_, capacity);
    }
    for (int j = 0; j < R; ++j) {
      at[i][j] = used;
      if (size[i][j] > 0) cx::encode_piece(Vec<uint8_t>(piece_kernel_.data() + used, size[i][j]), sel, j, s, ws_);
      used += size[i][j];
    }
    cx::finish_pieces(part(residual_, b.begin, b.end), sel, s, ws_);
    if (cfg_.momentum > 0) mask_momentum(part(momentum_, b.begin, b.end), ws_, sel.k);
  }
  ExecSpace().fence();
  const uint8_t* pieces = piece_kernel_.data();
  if (staged) {
    pieces_host_.resize(used);
    Kokkos::deep_copy(HostBytes(reinterpret_cast<uint8_t*>(pieces_host_.data()), used),
                      Vec<uint8_t>(piece_kernel_.data(), used));
    pieces = reinterpret_cast<const uint8_t*>(pieces_host_.data());
  }

  // c. to each owner j: a table of nb uint32 sizes, then its pieces in bucket order
  std::vector<Slice> to(R);
  int64_t bytes = 0;
  for (int j = 0; j < R; ++j) {
    to[j].offset = bytes;
    to[j].size = 4 * nb;
    for (int64_t i = 0; i < nb; ++i) to[j].size += size[i][j];
    bytes += to[j].size;
  }
  payload_.resize(bytes);
  for (int j = 0; j < R; ++j) {
    std::byte* out = payload_.data() + to[j].offset;
    for (int64_t i = 0; i < nb; ++i) {
      const uint32_t sz = uint32_t(size[i][j]);
      std::memcpy(out + 4 * i, &sz, 4);
    }
    out += 4 * nb;
    for (int64_t i = 0; i < nb; ++i) {
      if (size[i][j] > 0) std::memcpy(out, pieces + at[i][j], size_t(size[i][j]));
      out += size[i][j];
    }
  }
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
  // Each message: its table, checked against its size; then where each piece payload lies in it.
  std::vector<std::vector<int64_t>> from(R, std::vector<int64_t>(nb + 1));  // offsets into message r
  for (int r = 0; r < R; ++r) {
    const auto& m = got[r];
    if (int64_t(m.size()) < 4 * nb)
      throw fail(fmt::format("rank {} sent {} bytes, less than its table of {} piece sizes (do the ranks run the "
                             "same deck?)", members[r], m.size(), nb));
    from[r][0] = 4 * nb;
    for (int64_t i = 0; i < nb; ++i) {
      uint32_t sz = 0;
      std::memcpy(&sz, m.data() + 4 * i, 4);
      from[r][i + 1] = from[r][i] + int64_t(sz);
    }
    if (from[r][nb] != int64_t(m.size()))
      throw fail(fmt::format("rank {} sent {} bytes, its table of piece sizes says {}", members[r], m.size(),
                             from[r][nb]));
  }

  // d. this rank's piece of each bucket: the group's payloads summed in group
  // order, plus the owner residual; its top k' encoded into owned_
  std::vector<int64_t> own_at(nb + 1, 0);
  for (int64_t i = 0; i < nb; ++i)
    own_at[i + 1] = own_at[i] + owner_payload_bytes(buckets[i]->end - buckets[i]->begin, me, R, s);
  const int64_t own_bytes = own_at[nb];
  owned_.resize(own_bytes);
  if (staged && int64_t(owned_kernel_.extent(0)) < own_bytes)
    owned_kernel_ = Buffer<uint8_t>("CompressedSync::owned", own_bytes);
  uint8_t* encoded = staged ? owned_kernel_.data() : reinterpret_cast<uint8_t*>(owned_.data());
  {
    const std::vector<const uint8_t*> received = in_kernel_memory(got);
    for (int64_t i = 0; i < nb; ++i) {
      const OwnPiece p = own_piece(size_t(buckets[i] - buckets_.data()));
      if (p.length == 0) continue;
      std::vector<cx::Parsed> parsed;
      for (int r = 0; r < R; ++r) {
        const int64_t sz = from[r][i + 1] - from[r][i];
        if (sz == 0) continue;  // none of rank r's entries fell in this piece
        try {
          parsed.push_back(cx::parse(Vec<const uint8_t>(received[r] + from[r][i], sz), p.length));
        } catch (const std::runtime_error& e) {
          throw fail(fmt::format("rank {}, bucket {} piece {}: {}", members[r], i, me, e.what()));
        }
      }
      Vec<float> sum(owner_sum_.data(), p.length);
      cx::sum_parsed(sum, parsed);
      cx::compress(Vec<uint8_t>(encoded + own_at[i], own_at[i + 1] - own_at[i]),
                   part(owner_residual_, p.at, p.at + p.length), sum, s, ws_);
    }
    ExecSpace().fence();  // the parsed payloads in received_kernel_ are read before it is reused
  }
  if (staged)
    Kokkos::deep_copy(HostBytes(reinterpret_cast<uint8_t*>(owned_.data()), own_bytes), Vec<uint8_t>(encoded, own_bytes));

  // e. every owner's pieces to every member; each decoded into place
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
    int64_t expect = 0;
    for (int64_t i = 0; i < nb; ++i) expect += owner_payload_bytes(buckets[i]->end - buckets[i]->begin, j, R, s);
    if (int64_t(got[j].size()) != expect)
      throw fail(fmt::format("rank {} sent {} bytes of its pieces, expected {} (do the ranks run the same deck?)",
                             members[j], got[j].size(), expect));
  }
  const std::vector<const uint8_t*> received = in_kernel_memory(got);
  for (int j = 0; j < R; ++j) {
    int64_t offset = 0;
    for (int64_t i = 0; i < nb; ++i) {
      const Bucket& b = *buckets[i];
      const int64_t n = b.end - b.begin, begin = cx::piece_begin(n, j, R), m = cx::piece_begin(n, j + 1, R) - begin;
      const int64_t sz = owner_payload_bytes(n, j, R, s);
      if (m == 0) continue;
      try {
        cx::decode_sum(part(packed_, b.begin + begin, b.begin + begin + m), {Vec<const uint8_t>(received[j] + offset, sz)});
      } catch (const std::runtime_error& e) {
        throw fail(fmt::format("the piece {} of bucket {} from rank {}: {}", j, i, members[j], e.what()));
      }
      offset += sz;
    }
  }
}

}  // namespace xx
