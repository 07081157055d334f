#include "comm/compressed_sync.h"
#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include "core/device_memory.h"
#include "kernels/elementwise.h"

namespace xx {
namespace cx = kernels::compress;

namespace {

constexpr double kExchangeTimeout = 300;  // seconds without a peer's payload before the step fails

cx::Quant quant_of(const std::string& q) {
  return q == "int8" ? cx::Quant::int8 : q == "int4" ? cx::Quant::int4 : cx::Quant::none;
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

}  // namespace

CompressedSync::CompressedSync(const std::vector<TensorSpan>& tensors, Buffer<float> grads,
                               const CompressConfig& cfg, double bucket_mb)
    : cfg_(cfg), grads_(grads) {
  settings_.ratio = cfg.ratio;
  settings_.quant = quant_of(cfg.quant);
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
}

double CompressedSync::ratio_at(int64_t step) const {
  if (step >= cfg_.warmup) return cfg_.ratio;
  return std::pow(cfg_.ratio, double(step + 1) / double(cfg_.warmup + 1));
}

// Worth it when what this rank sends, one payload to each of the other R-1
// members, is less than the dense bucket it would hand to the all-reduce.
bool CompressedSync::compressed(const Bucket& b, double ratio, int group_size) const {
  const int64_t n = b.end - b.begin;
  if (cfg_.ratio >= 1) return true;  // asked for: every entry through the sparse path
  const int64_t peers = std::max(1, group_size - 1);
  return peers * cx::payload_bytes(n, cx::topk_count(n, ratio), settings_.quant, settings_.block) <
         n * int64_t(sizeof(float));
}

int CompressedSync::compressed_buckets(int64_t step, int group_size) const {
  const double r = ratio_at(step);
  return int(std::count_if(buckets_.begin(), buckets_.end(),
                           [&](const Bucket& b) { return compressed(b, r, group_size); }));
}

std::string CompressedSync::describe() const {
  return fmt::format("top-k {} ({} quant, feedback {}{}), {} buckets over {} values, {} values dense (min_size {})",
                     cfg_.ratio, cfg_.quant, cfg_.feedback ? "on" : "off",
                     cfg_.momentum > 0 ? fmt::format(", momentum {}", cfg_.momentum) : "", buckets_.size(),
                     sparse_n_, dense_n_, cfg_.min_size);
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

  // 2. compress, or flush into the dense part
  struct Sent {
    const Bucket* b;
    int64_t k, offset, size;  // entries sent; the payload's place in the step's message
  };
  std::vector<Sent> sparse;
  int64_t bytes = 0, dense_n = dense_n_;
  std::vector<std::pair<const Bucket*, int64_t>> flushed;  // bucket, its place in dense_
  for (const auto& b : buckets_) {
    const int64_t n = b.end - b.begin;
    if (compressed(b, ratio, R)) {
      const int64_t k = cx::topk_count(n, ratio), size = cx::payload_bytes(n, k, s.quant, s.block);
      sparse.push_back({&b, k, bytes, size});
      bytes += size;
    } else {
      flushed.push_back({&b, dense_n});
      dense_n += n;
    }
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
    if (cfg_.momentum > 0) {
      Vec<float> u = part(momentum_, b.begin, b.end);
      Vec<const uint32_t> idx(ws_.idx.data(), k);
      Kokkos::parallel_for(
          "CompressedSync::mask_momentum", Kokkos::RangePolicy<ExecSpace>(0, k),
          KOKKOS_LAMBDA(int64_t j) { u(idx(j)) = 0.0f; });
    }
  }
  for (const auto& [bp, at] : flushed) {
    const Bucket& b = *bp;
    Vec<float> out = part(dense_, at, at + (b.end - b.begin));
    Kokkos::deep_copy(out, part(send, b.begin, b.end));
    if (cfg_.feedback) {  // nothing held back survives a dense step
      kernels::add_inplace<float>(out, part(residual_, b.begin, b.end));
      Kokkos::deep_copy(part(residual_, b.begin, b.end), 0.0f);
    }
    if (cfg_.momentum > 0) Kokkos::deep_copy(part(momentum_, b.begin, b.end), 0.0f);
  }
  ExecSpace().fence();
  using HostBytes = Kokkos::View<uint8_t*, Kokkos::HostSpace, Unmanaged>;
  if (staged) Kokkos::deep_copy(HostBytes(reinterpret_cast<uint8_t*>(payload_.data()), bytes), Vec<uint8_t>(encoded, bytes));

  // 3. exchange and decode
  if (!sparse.empty()) {
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
    // rank r's payloads: in got[r], or at r * bytes in kernel memory where that is not the host's
    if (staged && int64_t(received_kernel_.extent(0)) < R * bytes)
      received_kernel_ = Buffer<uint8_t>("CompressedSync::received", R * bytes);
    for (int r = 0; r < R && staged; ++r)
      Kokkos::deep_copy(Vec<uint8_t>(received_kernel_.data() + r * bytes, bytes),
                        HostBytes(reinterpret_cast<uint8_t*>(got[r].data()), bytes));
    auto received = [&](int r) {
      return staged ? received_kernel_.data() + r * bytes : reinterpret_cast<const uint8_t*>(got[r].data());
    };
    for (const auto& [bp, k, offset, size] : sparse) {
      std::vector<Vec<const uint8_t>> payloads;
      for (int r = 0; r < R; ++r) payloads.emplace_back(received(r) + offset, size);
      try {
        cx::decode_sum(part(packed_, bp->begin, bp->end), payloads);
      } catch (const std::runtime_error& e) {  // decode_sum names the index in the group
        throw std::runtime_error(fmt::format("step {}: compressed gradients, group {}: {}", step + 1,
                                             detail::rank_list(members), e.what()));
      }
    }
  }

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

}  // namespace xx
