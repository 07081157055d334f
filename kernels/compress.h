// Gradient compression, Deep-Gradient-Compression style, for one bucket of
// the flat gradient: error feedback, exact top-k by magnitude, optional int8
// or int4 block quantization, a self-describing byte payload, and the decode
// that sums every rank's payload into a dense bucket. docs/COMPRESSION.md
// gives the payload format, the formulas and what "conserves mass" means.
//
// Legend: n bucket length, k = topk_count(n, ratio) entries sent, B values
// per quantization block, nb = ceil(k / B) blocks, nseg = ceil(n / 65536)
// index segments, R ranks.
//
// Nothing loops over elements on the host and no float sum uses atomics. Top-k
// is a radix select on the bit patterns of |acc| (per-chunk histograms summed
// bin by bin, 8 bits per digit; after the first digit only the candidates in
// the threshold's bin are scanned), then a compaction that counts per chunk,
// scans, and writes each chunk in index order: the same bits on every run and
// every backend. Team-shaped (kernels/team.h): a chunk (or quantization
// block) is a team row, its elements the lanes; a chunk's histogram is one
// team's; the element-wise kernels are flat ranges. Indices travel as 16 low
// bits plus a count per segment of 65536: the counts come from binary
// searches in the sorted indices (one thread per segment), and the receiver
// rebuilds each index by a binary search in the counts' prefix sums (one
// thread per entry). Quantized values decode to q * scale with the product
// exact in float (scales keep 17 significant bits), so decoding involves no
// rounding and an FMA cannot change it. bf16 values (round to nearest even
// from fp32, no scales) widen exactly to float on decode.
//
// Outputs are written (=); the residual is updated in place; decode_add adds
// into its output (+=), decode_sum overwrites it with the sum over ranks.
#pragma once
#include <fmt/format.h>
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>
#include "core/modes.h"  // Quant
#include "core/views.h"
#include "kernels/math.h"
#include "kernels/team.h"

namespace xx::kernels::compress {

static_assert(std::endian::native == std::endian::little, "the payload is little-endian and written natively");

using xx::Quant;  // core/modes.h

// Largest code magnitude: int8 codes lie in [-127, 127], int4 in [-7, 7].
constexpr int32_t quant_max(Quant q) { return q == Quant::int8 ? 127 : q == Quant::int4 ? 7 : 0; }

// Whether the values travel with one fp32 scale per block (int8, int4); none
// and bf16 carry no scales and have block 0 in the header.
constexpr bool has_scales(Quant q) { return q == Quant::int8 || q == Quant::int4; }

// Bytes of the values section of k values: 4k (none), k (int8), ceil(k/2) (int4), 2k (bf16).
constexpr int64_t value_bytes(Quant q, int64_t k) {
  return q == Quant::none ? 4 * k : q == Quant::int8 ? k : q == Quant::int4 ? (k + 1) / 2 : 2 * k;
}

// How one bucket is compressed. Which buckets are compressed at all (min_size,
// the warmup ramp, buckets not worth it) is src/comm/compressed_sync.h's call.
struct Settings {
  double ratio = 0.01;        // k = topk_count(n, ratio); ratio >= 1 sends every entry, without indices
  Quant quant = Quant::none;  // how the selected values travel
  int64_t block = 64;         // B: values per fp32 scale (int8, int4; ignored for none, bf16)
  bool feedback = true;       // keep what was not sent, add it to the next step's gradient
};

constexpr uint32_t kMagic = 0x02435858u;  // the bytes 'X' 'X' 'C' 2: format version 2
constexpr int64_t kHeaderBytes = 20;      // five uint32: magic, n, k, quant, block
constexpr int64_t kSegment = 65536;       // indices per segment: index = segment * 65536 + 16 low bits
constexpr int64_t kChunk = 2048;          // elements per counting chunk in top-k
constexpr int64_t kBins = 256;            // one radix digit of 8 bits

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Elements of counting chunk c of a bucket of n: kChunk, or what the last one holds.
KOKKOS_INLINE_FUNCTION constexpr int64_t chunk_length(int64_t n, int64_t c) {
  return n - c * kChunk < kChunk ? n - c * kChunk : kChunk;
}

// nseg: segments of 65536 covering the index range [0, n).
constexpr int64_t segments(int64_t n) { return ceil_div(n, kSegment); }

// k = max(1, ceil(ratio * n)), at most n; ratio >= 1 gives n. A product within
// a relative 1e-9 of an integer counts as that integer, so that 0.07 * 100
// (7.000000000000001 in double) gives 7, not 8.
inline int64_t topk_count(int64_t n, double ratio) {
  if (n <= 0) return 0;
  if (!(ratio > 0)) throw std::invalid_argument(fmt::format("compress: ratio must be > 0, got {}", ratio));
  if (ratio >= 1) return n;
  const double x = ratio * double(n), r = std::round(x);
  const int64_t k = std::abs(x - r) <= 1e-9 * std::max(1.0, x) ? int64_t(r) : int64_t(std::ceil(x));
  return std::clamp<int64_t>(k, 1, n);
}

// Bytes of one payload, the closed form (docs/COMPRESSION.md), nseg = ceil(n / 65536):
//   20 + [k < n] (4 nseg + 4 ceil(k/2)) + [int8, int4] 4 ceil(k/B) + {4k | k | ceil(k/2) | 2k},
// rounded up to a multiple of 4. The index section is nseg uint32 counts and k
// uint16 low bits padded to 4 bytes (2k rounded up to 4 = 4 ceil(k/2)).
inline int64_t payload_bytes(int64_t n, int64_t k, Quant quant, int64_t block) {
  const int64_t index = k < n ? 4 * segments(n) + 4 * ceil_div(k, 2) : 0;
  const int64_t scales = has_scales(quant) ? 4 * ceil_div(k, block) : 0;
  return (kHeaderBytes + index + scales + value_bytes(quant, k) + 3) / 4 * 4;
}

// What a payload header says.
struct Header {
  int64_t n = 0, k = 0;
  Quant quant = Quant::none;
  int64_t block = 0;  // 0 for quant none and bf16
};

// Byte offsets of the sections, laid out one after the other (encode and
// decode both walk this; payload_bytes is the closed form it is tested against).
struct Layout {
  int64_t counts = 0, low = 0, scales = 0, values = 0;  // section starts (counts == low: no indices)
  int64_t used = 0, end = 0;                            // end of the values, and the padded size
};

inline Layout layout_of(const Header& h) {
  Layout L;
  int64_t off = kHeaderBytes;
  L.counts = off;  // k == n: the indices are 0..n-1, not sent
  if (h.k < h.n) off += segments(h.n) * int64_t(sizeof(uint32_t));  // nseg entries-per-segment counts
  L.low = off;
  if (h.k < h.n) off += ceil_div(h.k, 2) * 2 * int64_t(sizeof(uint16_t));  // k low halves, padded to 4 bytes
  L.scales = off;
  if (has_scales(h.quant)) off += ceil_div(h.k, h.block) * int64_t(sizeof(float));
  L.values = off;
  off += value_bytes(h.quant, h.k);
  L.used = off;
  L.end = (off + 3) / 4 * 4;  // payloads concatenated in one receive buffer stay 4-byte aligned
  return L;
}

// Scratch for compress() and topk_select(), sized once for the largest bucket.
struct Workspace {
  int64_t max_n = 0, max_k = 0;
  Buffer<uint32_t> idx;                // (max_k) selected indices
  Buffer<float> val;                   // (max_k) their accumulated values
  Buffer<float> sent;                  // (max_k) the values as the receiver decodes them
  Buffer<int32_t> chunk_hist;          // (chunks, kBins) per-chunk digit counts, chunks = ceil(max_n / kChunk)
  Buffer<int64_t> hist;                // (kBins) digit counts over the bucket
  Buffer<int64_t> chunk_gt, chunk_eq;  // (chunks) entries above / at the threshold
  Buffer<int64_t> off_gt, off_eq;      // (chunks) their exclusive scans
  Buffer<uint32_t> cand;               // (max_n) keys in the threshold's top bin, in index order
  Buffer<int64_t> cand_off;            // (chunks + 1) where each chunk's candidates start
  Buffer<int64_t> state;               // (2) threshold prefix, entries still to take at it
  Buffer<uint32_t> rel;                // (max_k) indices relative to their piece (partitioned exchange)
  Buffer<int64_t> bounds;              // (pieces + 1) where each piece's entries start (partitioned exchange)

  Workspace() = default;
  Workspace(int64_t max_n_, int64_t max_k_)
      : max_n(max_n_),
        max_k(max_k_),
        idx("compress::idx", max_k_),
        val("compress::val", max_k_),
        sent("compress::sent", max_k_),
        chunk_hist("compress::chunk_hist", ceil_div(max_n_, kChunk) * kBins),
        hist("compress::hist", kBins),
        chunk_gt("compress::chunk_gt", ceil_div(max_n_, kChunk)),
        chunk_eq("compress::chunk_eq", ceil_div(max_n_, kChunk)),
        off_gt("compress::off_gt", ceil_div(max_n_, kChunk)),
        off_eq("compress::off_eq", ceil_div(max_n_, kChunk)),
        cand("compress::cand", max_n_),
        cand_off("compress::cand_off", ceil_div(max_n_, kChunk) + 1),
        state("compress::state", 2),
        rel("compress::rel", max_k_) {}

  void check(int64_t n, int64_t k) const {
    if (n > max_n || k > max_k)
      throw std::invalid_argument(
          fmt::format("compress: workspace holds n <= {}, k <= {}; asked for n = {}, k = {}", max_n, max_k, n, k));
  }
};

// ----------------------------------------------------------------------------
// element functions

// |x| as an unsigned key: for non-negative floats the bit patterns order as
// the values do (NaN ranks above inf; -0 and +0 tie).
KOKKOS_INLINE_FUNCTION uint32_t magnitude_key(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits & 0x7fffffffu;
}

// How many of a[0 .. len) are below x, for a ascending: the lower bound of x.
template <class T>
KOKKOS_INLINE_FUNCTION int64_t count_below(const T* a, int64_t len, int64_t x) {
  int64_t lo = 0, hi = len;  // a[0 .. lo) < x <= a[hi .. len)
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (int64_t(a[mid]) < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Nearest integer to t, ties to the even one (independent of the rounding mode).
KOKKOS_INLINE_FUNCTION int32_t round_half_even(double t) {
  const double f = kmath::floor(t);
  const double r = t - f;  // exact, in [0, 1)
  int32_t q = int32_t(f);
  if (r > 0.5 || (r == 0.5 && (q & 1))) ++q;
  return q;
}

// scale = m / qmax rounded up to a float whose last 7 significand bits are
// zero: scale >= m / qmax exactly (so |v / scale| <= qmax), and q * scale is
// exact in float for |q| <= 127. A positive m never gives 0 (at least 2^-142).
KOKKOS_INLINE_FUNCTION float block_scale(float m, int32_t qmax) {
  const float s0 = m / float(qmax);
  uint32_t bits;
  std::memcpy(&bits, &s0, sizeof(bits));
  if (double(s0) * double(qmax) < double(m)) ++bits;  // the division rounded down: next float up (exact test in double)
  bits = (bits + 0x7fu) & ~0x7fu;
  float s;
  std::memcpy(&s, &bits, sizeof(s));
  return s;
}

// Code of v at scale s: round half to even of the exact quotient v / s (the
// double quotient of two floats is never misrounded across a half), clamped
// to [-qmax, qmax]. A zero or non-finite scale gives 0; the value then
// decodes to 0 * s: 0, or NaN for a block holding inf or NaN.
KOKKOS_INLINE_FUNCTION int32_t quant_code(float v, float s, int32_t qmax) {
  if (!(s > 0) || !(s <= FLT_MAX)) return 0;
  double t = double(v) / double(s);
  if (!(t == t)) return 0;
  t = t > qmax ? double(qmax) : (t < -qmax ? -double(qmax) : t);
  return round_half_even(t);
}

// x rounded to bfloat16 (the top 16 bits of a float), to nearest, ties to
// even: add 0x7fff plus the lowest kept bit, keep the top half. A value at or
// past the largest bf16 plus half its ulp rounds to inf, as IEEE rounding
// does; inf stays inf; a NaN stays a NaN (quiet bit set, so that dropping the
// low half cannot make it inf).
KOKKOS_INLINE_FUNCTION uint16_t to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

// The float a bfloat16 stands for: exact (its 16 bits become the top half).
KOKKOS_INLINE_FUNCTION float from_bf16(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

// Value j of a values section as the receiver decodes it.
template <Quant Q>
KOKKOS_INLINE_FUNCTION float value_of(const uint8_t* values, const float* scales, int64_t block, int64_t j) {
  if constexpr (Q == Quant::none) {
    return reinterpret_cast<const float*>(values)[j];
  } else if constexpr (Q == Quant::int8) {
    return float(int8_t(values[j])) * scales[j / block];
  } else if constexpr (Q == Quant::bf16) {
    return from_bf16(reinterpret_cast<const uint16_t*>(values)[j]);
  } else {
    const int32_t nib = (j & 1) ? values[j >> 1] >> 4 : values[j >> 1] & 0xf;
    return float(nib >= 8 ? nib - 16 : nib) * scales[j / block];
  }
}

// ----------------------------------------------------------------------------
// 1. error feedback

// acc (n) = residual (n) + grad (n); a zero residual leaves grad's bits as they
// are (IEEE would turn -0 into +0), so that with nothing kept the values sent
// are the gradient itself. acc may alias residual or grad.
inline void error_feedback(Vec<float> acc, Vec<const float> residual, Vec<const float> grad) {
  Kokkos::parallel_for(
      "compress::feedback", Kokkos::RangePolicy<ExecSpace>(0, acc.extent(0)), KOKKOS_LAMBDA(int64_t i) {
        const float r = residual(i), g = grad(i);
        acc(i) = r == 0 ? g : r + g;
      });
}

// ----------------------------------------------------------------------------
// 2. top-k by magnitude

// hist (kBins) = the per-chunk rows of chunk_hist (chunks, kBins) summed in
// chunk order; then state(0) gains the digit (at `shift`) of the bin holding
// the state(1)-th largest key, and state(1) becomes its rank within that bin.
inline void topk_choose_digit(Buffer<int64_t> hist, Buffer<int64_t> state, Buffer<int32_t> chunk_hist,
                              int64_t chunks, int shift) {
  // column sums of (chunks, kBins), a team per block of bins (kernels/team.h)
  Kokkos::parallel_for(
      "compress::topk_bins", column_sum_policy<int64_t>(kBins), KOKKOS_LAMBDA(const TeamMember& m) {
        column_sums(
            m, chunks, kBins, [&](int64_t c, int64_t b) { return int64_t(chunk_hist(c * kBins + b)); },
            [&](int64_t b, int64_t s) { hist(b) = s; });
      });
  Kokkos::parallel_for(
      "compress::topk_digit", Kokkos::RangePolicy<ExecSpace>(0, 1), KOKKOS_LAMBDA(int64_t) {
        int64_t need = state(1);
        for (int64_t d = kBins - 1; d >= 0; --d) {
          if (need <= hist(d)) {
            state(0) |= d << shift;
            break;
          }
          need -= hist(d);
        }
        state(1) = need;
      });
}

// idx (k), val (k): the k entries of acc (n) with the largest |acc|, ties to
// the lower index, in increasing index order; val = acc(idx). k = n copies all.
//
// Constraints:
//   1. The threshold T is the exact k-th largest key, found by an 8-bit radix
//      select: a histogram of the top digit over all n keys; the keys in T's
//      top bin (the candidates) copied out, chunk by chunk in index order; then
//      three more digits over the candidates only. No sort of n elements.
//   2. Histograms are counted per chunk, each chunk by one team into its own
//      row (integer counts: the same in any order), then summed bin by bin in
//      chunk order: no float atomics.
//   3. Every key > T is taken, and of the keys == T the `need` with the lowest
//      indices: a chunk's first write position is gt_before + min(eq_before, need),
//      with a chunk's counts taken from its top-digit row and its candidates.
//   4. Three passes read all n values (histogram, candidates, write); the rest
//      touch chunks x bins counters or the candidates.
inline void topk_select(Vec<uint32_t> idx, Vec<float> val, Vec<const float> acc, Workspace& ws) {
  const int64_t n = acc.extent(0), k = idx.extent(0);
  if (k < 1 || k > n || int64_t(val.extent(0)) != k)
    throw std::invalid_argument(fmt::format("compress::topk_select: k = {} (val {}) for n = {}", k, val.extent(0), n));
  if (k == n) {
    Kokkos::parallel_for(
        "compress::topk_all", Kokkos::RangePolicy<ExecSpace>(0, n), KOKKOS_LAMBDA(int64_t i) {
          idx(i) = uint32_t(i);
          val(i) = acc(i);
        });
    return;
  }
  ws.check(n, k);
  const int64_t chunks = ceil_div(n, kChunk);
  auto chunk_hist = ws.chunk_hist;  // (chunks, kBins)
  auto hist = ws.hist;              // (kBins)
  auto state = ws.state;  // (0) the digits of T found so far, (1) entries still to take among the keys matching them
  auto cand = ws.cand;    // (n at most) candidate keys
  auto cand_off = ws.cand_off;  // (chunks + 1) where each chunk's candidates start
  auto chunk_gt = ws.chunk_gt, chunk_eq = ws.chunk_eq, off_gt = ws.off_gt, off_eq = ws.off_eq;  // (chunks)
  Kokkos::parallel_for(
      "compress::topk_init", Kokkos::RangePolicy<ExecSpace>(0, 1), KOKKOS_LAMBDA(int64_t) {
        state(0) = 0;
        state(1) = k;
      });
  // top digit (bits 31..24) over all keys
  Kokkos::parallel_for(
      "compress::topk_histogram", histogram_policy(chunks, kBins), KOKKOS_LAMBDA(const TeamMember& m) {
        const int64_t c = m.league_rank(), i0 = c * kChunk;
        row_histogram(
            m, chunk_length(n, c), kBins, [&](int64_t j) { return int64_t(magnitude_key(acc(i0 + j)) >> 24); },
            &chunk_hist(c * kBins));
      });
  topk_choose_digit(hist, state, chunk_hist, chunks, 24);
  // per chunk: keys above the top bin, and how many candidates; then where they go
  Kokkos::parallel_for(
      "compress::topk_top_bin", row_policy(chunks), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, chunks, [&](int64_t c) {
          const int64_t top = state(0) >> 24;
          const int32_t* h = &chunk_hist(c * kBins);
          const int64_t gt = row_sum(m, kBins - top - 1, [&](int64_t b) { return int64_t(h[top + 1 + b]); });
          row_single(m, [&] { chunk_gt(c) = gt, chunk_eq(c) = h[top]; });
        });
      });
  Kokkos::parallel_scan(
      "compress::topk_scan_candidates", Kokkos::RangePolicy<ExecSpace>(0, chunks + 1),
      KOKKOS_LAMBDA(int64_t c, int64_t & sum, bool final) {
        if (final) cand_off(c) = sum;
        if (c < chunks) sum += chunk_eq(c);
      });
  Kokkos::parallel_for(
      "compress::topk_candidates", row_policy(chunks), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, chunks, [&](int64_t c) {
          const uint32_t top = uint32_t(state(0)) >> 24;
          const int64_t i0 = c * kChunk, p0 = cand_off(c);
          // each candidate goes after the chunk's earlier ones: a scan of 0/1
          row_scan<int32_t>(m, chunk_length(n, c), [&](int64_t j, int32_t& before, bool final) {
            const uint32_t key = magnitude_key(acc(i0 + j));
            if (key >> 24 != top) return;
            if (final) cand(p0 + before) = key;
            ++before;
          });
        });
      });
  // the other three digits over the candidates, each chunk's own
  for (int shift = 16; shift >= 0; shift -= 8) {
    const uint32_t hi_mask = ~((1u << (shift + 8)) - 1u);  // the digits already chosen
    Kokkos::parallel_for(
        "compress::topk_histogram_candidates", histogram_policy(chunks, kBins), KOKKOS_LAMBDA(const TeamMember& m) {
          const int64_t c = m.league_rank(), p0 = cand_off(c);
          const uint32_t prefix = uint32_t(state(0));
          row_histogram(
              m, cand_off(c + 1) - p0, kBins,
              [&](int64_t j) {
                const uint32_t key = cand(p0 + j);
                return (key & hi_mask) == prefix ? int64_t((key >> shift) & 0xffu) : int64_t(-1);
              },
              &chunk_hist(c * kBins));
        });
    topk_choose_digit(hist, state, chunk_hist, chunks, shift);
  }
  // T = state(0); per chunk, keys above T and at T; then where each chunk writes
  Kokkos::parallel_for(
      "compress::topk_count", row_policy(chunks), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, chunks, [&](int64_t c) {
          const uint32_t T = uint32_t(state(0));
          const int64_t p0 = cand_off(c), len = cand_off(c + 1) - p0;
          const int64_t gt = row_sum(m, len, [&](int64_t j) { return int64_t(cand(p0 + j) > T); });
          const int64_t eq = row_sum(m, len, [&](int64_t j) { return int64_t(cand(p0 + j) == T); });
          row_single(m, [&] { chunk_gt(c) += gt, chunk_eq(c) = eq; });
        });
      });
  Kokkos::parallel_scan(
      "compress::topk_scan_gt", Kokkos::RangePolicy<ExecSpace>(0, chunks),
      KOKKOS_LAMBDA(int64_t c, int64_t & sum, bool final) {
        if (final) off_gt(c) = sum;
        sum += chunk_gt(c);
      });
  Kokkos::parallel_scan(
      "compress::topk_scan_eq", Kokkos::RangePolicy<ExecSpace>(0, chunks),
      KOKKOS_LAMBDA(int64_t c, int64_t & sum, bool final) {
        if (final) off_eq(c) = sum;
        sum += chunk_eq(c);
      });
  // Entry i of chunk c is taken if its key is above T, or at T with fewer
  // than `need` keys at T before it (in the chunks before and in this one).
  // It goes to off_gt(c) + min(off_eq(c), need) + the chunk's taken entries
  // before it: one scan per chunk, of (keys above T) + 2^32 (keys at T).
  Kokkos::parallel_for(
      "compress::topk_write", row_policy(chunks), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, chunks, [&](int64_t c) {
          const uint32_t T = uint32_t(state(0));
          const int64_t need = state(1), eq0 = off_eq(c), i0 = c * kChunk;
          const int64_t p0 = off_gt(c) + (eq0 < need ? eq0 : need), eq_room = need - eq0 > 0 ? need - eq0 : 0;
          row_scan<int64_t>(m, chunk_length(n, c), [&](int64_t j, int64_t& before, bool final) {
            const float a = acc(i0 + j);
            const uint32_t key = magnitude_key(a);
            if (key < T) return;
            const int64_t gt_before = before & 0xffffffff, eq_before = before >> 32;
            if (final && (key > T || eq_before < eq_room)) {
              const int64_t p = p0 + gt_before + (eq_before < eq_room ? eq_before : eq_room);
              idx(p) = uint32_t(i0 + j);
              val(p) = a;
            }
            before += key > T ? int64_t(1) : int64_t(1) << 32;
          });
        });
      });
}

// ----------------------------------------------------------------------------
// 3. quantization

// scale (nb) and codes (k bytes for int8; ceil(k/2) for int4, entry 2p in the
// low nibble of byte p, 2p+1 in the high one, a last odd high nibble 0) from
// val (k), blocks of B consecutive values. Codes are two's complement.
inline void quantize(Vec<float> scale, Vec<uint8_t> codes, Vec<const float> val, Quant quant, int64_t block) {
  const int64_t k = val.extent(0), nb = ceil_div(k, block);
  const int32_t qmax = quant_max(quant);
  if (!has_scales(quant) || block < 1 || int64_t(scale.extent(0)) != nb ||
      int64_t(codes.extent(0)) != value_bytes(quant, k))
    throw std::invalid_argument(fmt::format("compress::quantize: quant {}, block {}, k = {}, scales {}, codes {}",
                                            mode_name(quant), block, k, scale.extent(0), codes.extent(0)));
  // a team row per block: the largest |value|, or the block's first NaN
  Kokkos::parallel_for(
      "compress::quant_scales", row_policy(nb), KOKKOS_LAMBDA(const TeamMember& tm) {
        for_rows(tm, nb, [&](int64_t b) {
          const int64_t j0 = b * block, len = k - j0 < block ? k - j0 : block;
          const int64_t nan_at = row_first(tm, len, [&](int64_t j) { return val(j0 + j) != val(j0 + j); });
          const float m = nan_at < len ? kmath::fabs(val(j0 + nan_at))
                                       : row_max(tm, len, [&](int64_t j) { return kmath::fabs(val(j0 + j)); });
          row_single(tm, [&] { scale(b) = block_scale(m, qmax); });
        });
      });
  if (quant == Quant::int8) {
    Kokkos::parallel_for(
        "compress::quant_int8", Kokkos::RangePolicy<ExecSpace>(0, k), KOKKOS_LAMBDA(int64_t j) {
          codes(j) = uint8_t(int8_t(quant_code(val(j), scale(j / block), qmax)));
        });
  } else {
    Kokkos::parallel_for(
        "compress::quant_int4", Kokkos::RangePolicy<ExecSpace>(0, ceil_div(k, 2)), KOKKOS_LAMBDA(int64_t p) {
          const int64_t j = 2 * p;
          const int32_t lo = quant_code(val(j), scale(j / block), qmax);
          const int32_t hi = j + 1 < k ? quant_code(val(j + 1), scale((j + 1) / block), qmax) : 0;
          codes(p) = uint8_t((lo & 0xf) | ((hi & 0xf) << 4));
        });
  }
}

template <Quant Q>
void dequantize_as(Vec<float> out, const float* scales, const uint8_t* values, int64_t block) {
  Kokkos::parallel_for(
      "compress::dequantize", Kokkos::RangePolicy<ExecSpace>(0, out.extent(0)),
      KOKKOS_LAMBDA(int64_t j) { out(j) = value_of<Q>(values, scales, block, j); });
}

// out (k) = code * scale (exact in float), from scale (nb) and codes as quantize writes them.
inline void dequantize(Vec<float> out, Vec<const float> scale, Vec<const uint8_t> codes, Quant quant, int64_t block) {
  const int64_t k = out.extent(0);
  if (!has_scales(quant) || block < 1 || int64_t(scale.extent(0)) != ceil_div(k, block) ||
      int64_t(codes.extent(0)) != value_bytes(quant, k))
    throw std::invalid_argument(fmt::format("compress::dequantize: quant {}, block {}, k = {}, scales {}, codes {}",
                                            mode_name(quant), block, k, scale.extent(0), codes.extent(0)));
  if (quant == Quant::int8) dequantize_as<Quant::int8>(out, scale.data(), codes.data(), block);
  else dequantize_as<Quant::int4>(out, scale.data(), codes.data(), block);
}

// out (k) = val (k) rounded to bfloat16 (to_bf16), one thread per value.
inline void quantize_bf16(Vec<uint16_t> out, Vec<const float> val) {
  if (out.extent(0) != val.extent(0))
    throw std::invalid_argument(fmt::format("compress::quantize_bf16: {} outputs for {} values", out.extent(0), val.extent(0)));
  Kokkos::parallel_for(
      "compress::quant_bf16", Kokkos::RangePolicy<ExecSpace>(0, val.extent(0)),
      KOKKOS_LAMBDA(int64_t j) { out(j) = to_bf16(val(j)); });
}

// out (k) = the values of the payload at base with header h, as the receiver
// decodes them (value_of): what compress() keeps out of the residual.
inline void sent_values(Vec<float> out, const uint8_t* base, const Header& h) {
  const Layout L = layout_of(h);
  const float* scales = reinterpret_cast<const float*>(base + L.scales);
  switch (h.quant) {
    case Quant::none: dequantize_as<Quant::none>(out, scales, base + L.values, h.block); break;
    case Quant::int8: dequantize_as<Quant::int8>(out, scales, base + L.values, h.block); break;
    case Quant::int4: dequantize_as<Quant::int4>(out, scales, base + L.values, h.block); break;
    case Quant::bf16: dequantize_as<Quant::bf16>(out, scales, base + L.values, h.block); break;
  }
}

// ----------------------------------------------------------------------------
// 4. residual

// residual (n) = acc (n), except residual(idx_j) = acc(idx_j) - sent_j for the
// k selected entries. With sent as the receiver decodes it, sent_j +
// residual(idx_j) == acc(idx_j) exactly (docs/COMPRESSION.md). residual may alias acc.
inline void update_residual(Vec<float> residual, Vec<const float> acc, Vec<const uint32_t> idx,
                            Vec<const float> sent) {
  if (residual.data() != acc.data()) Kokkos::deep_copy(residual, acc);
  Kokkos::parallel_for(
      "compress::residual", Kokkos::RangePolicy<ExecSpace>(0, idx.extent(0)), KOKKOS_LAMBDA(int64_t j) {
        const uint32_t i = idx(j);
        residual(i) = acc(i) - sent(j);
      });
}

// ----------------------------------------------------------------------------
// 5. payload

// payload (payload_bytes(n, k, quant, block)) from idx (k), val (k) of a bucket
// of n; returns the bytes written, which is the whole payload. idx must be
// strictly increasing and below n, as topk_select leaves it (not checked here:
// a payload built from other indices is rejected by parse).
//
// The index section (k < n):
//   1. counts (nseg): counts[s] = entries with s * 65536 <= idx < (s + 1) * 65536,
//      two binary searches in idx per segment, one thread per segment;
//   2. low (k): idx & 0xffff as uint16, one thread per entry; an odd k gets a
//      zero uint16 of padding.
inline int64_t encode(Vec<uint8_t> payload, Vec<const uint32_t> idx, Vec<const float> val, int64_t n, Quant quant,
                      int64_t block) {
  const int64_t k = idx.extent(0);
  if (n < 1 || n > int64_t(UINT32_MAX) || k < 1 || k > n || int64_t(val.extent(0)) != k ||
      (has_scales(quant) && (block < 1 || block > int64_t(UINT32_MAX))))
    throw std::invalid_argument(fmt::format("compress::encode: n = {}, k = {} (val {}), quant {}, block {}", n, k,
                                            val.extent(0), mode_name(quant), block));
  const Header h{n, k, quant, has_scales(quant) ? block : 0};
  const Layout L = layout_of(h);
  if (int64_t(payload.extent(0)) != L.end)
    throw std::invalid_argument(fmt::format("compress::encode: payload buffer is {} bytes, the encoding takes {}",
                                            payload.extent(0), L.end));
  if (reinterpret_cast<uintptr_t>(payload.data()) % 4 != 0)
    throw std::invalid_argument("compress::encode: payload buffer is not 4-byte aligned");
  uint8_t* base = payload.data();
  const uint32_t w0 = kMagic, w1 = uint32_t(n), w2 = uint32_t(k), w3 = uint32_t(quant), w4 = uint32_t(h.block);
  Kokkos::parallel_for(
      "compress::encode_header", Kokkos::RangePolicy<ExecSpace>(0, 1), KOKKOS_LAMBDA(int64_t) {
        uint32_t* w = reinterpret_cast<uint32_t*>(base);
        w[0] = w0, w[1] = w1, w[2] = w2, w[3] = w3, w[4] = w4;
      });
  if (k < n) {
    uint32_t* counts = reinterpret_cast<uint32_t*>(base + L.counts);
    uint16_t* low = reinterpret_cast<uint16_t*>(base + L.low);
    const uint32_t* ix = idx.data();
    Kokkos::parallel_for(
        "compress::encode_counts", Kokkos::RangePolicy<ExecSpace>(0, segments(n)), KOKKOS_LAMBDA(int64_t s) {
          counts[s] = uint32_t(count_below(ix, k, (s + 1) * kSegment) - count_below(ix, k, s * kSegment));
        });
    Kokkos::parallel_for(
        "compress::encode_low", Kokkos::RangePolicy<ExecSpace>(0, 2 * ceil_div(k, 2)),
        KOKKOS_LAMBDA(int64_t j) { low[j] = j < k ? uint16_t(ix[j] & 0xffffu) : uint16_t(0); });
  }
  if (quant == Quant::none) {
    float* out = reinterpret_cast<float*>(base + L.values);
    Kokkos::parallel_for(
        "compress::encode_values", Kokkos::RangePolicy<ExecSpace>(0, k),
        KOKKOS_LAMBDA(int64_t j) { out[j] = val(j); });
  } else if (quant == Quant::bf16) {
    quantize_bf16(Vec<uint16_t>(reinterpret_cast<uint16_t*>(base + L.values), k), val);
  } else {
    quantize(Vec<float>(reinterpret_cast<float*>(base + L.scales), ceil_div(k, block)),
             Vec<uint8_t>(base + L.values, L.used - L.values), val, quant, block);
  }
  const int64_t used = L.used;
  Kokkos::parallel_for(
      "compress::encode_padding", Kokkos::RangePolicy<ExecSpace>(0, L.end - L.used),
      KOKKOS_LAMBDA(int64_t j) { base[used + j] = 0; });
  return L.end;
}

// A payload checked against its header, with pointers into its sections and
// the indices rebuilt from the segments. The indices live in a buffer this
// struct owns (reference counted: copies share it, and a copy or move keeps
// it alive and in place); scales and values point into the payload, which
// must outlive the Parsed.
struct Parsed {
  Header h;
  Buffer<uint32_t> indices;        // (k) full indices; empty (data() null) when k == n: 0..n-1
  const float* scales = nullptr;   // null for quant none and bf16
  const uint8_t* values = nullptr;
};

// The header of payload, checked: size, alignment, magic, quant, block, k in
// [1, n], and the size the header implies. Throws std::runtime_error naming
// what is wrong; reads nothing beyond the 20 header bytes.
inline Header read_header(Vec<const uint8_t> payload) {
  const int64_t size = payload.extent(0);
  if (size < kHeaderBytes)
    throw std::runtime_error(fmt::format(
        "compressed payload truncated: {} bytes, the header alone takes {} (lost or cut message?)", size,
        kHeaderBytes));
  if (reinterpret_cast<uintptr_t>(payload.data()) % 4 != 0)
    throw std::runtime_error("compressed payload is not 4-byte aligned (offset into the receive buffer?)");
  uint32_t w[5];
  Kokkos::deep_copy(Kokkos::View<uint8_t*, Kokkos::HostSpace, Unmanaged>(reinterpret_cast<uint8_t*>(w), kHeaderBytes),
                    Kokkos::subview(payload, Kokkos::make_pair(int64_t(0), kHeaderBytes)));
  if (w[0] != kMagic)
    throw std::runtime_error(fmt::format(
        "compressed payload has magic 0x{:08x}, expected 0x{:08x} (\"XXC\" version 2): corrupted, an older "
        "format, or not a payload",
        w[0], kMagic));
  if (w[3] > uint32_t(Quant::bf16))
    throw std::runtime_error(
        fmt::format("compressed payload header: unknown quant kind {} (0 none, 1 int8, 2 int4, 3 bf16)", w[3]));
  const Header h{w[1], w[2], Quant(w[3]), w[4]};
  if (h.n < 1 || h.k < 1 || h.k > h.n)
    throw std::runtime_error(fmt::format("compressed payload header: k = {} for n = {} (need 1 <= k <= n)", h.k, h.n));
  if (has_scales(h.quant) ? h.block < 1 : h.block != 0)
    throw std::runtime_error(
        fmt::format("compressed payload header: block {} with quant {}", h.block, mode_name(h.quant)));
  const int64_t expect = layout_of(h).end;
  if (size != expect)
    throw std::runtime_error(fmt::format(
        "compressed payload is {} bytes, its header (n = {}, k = {}, quant {}, block {}) implies {}: {}", size, h.n,
        h.k, mode_name(h.quant), h.block, expect, size < expect ? "truncated" : "corrupted or trailing bytes"));
  return h;
}

// read_header, plus: the bucket is n long (n_expected < 0: any), and the
// index section is consistent; then the indices are rebuilt in p.indices.
//   1. start (nseg + 1) = exclusive scan of the counts; the total must be k.
//   2. One thread per entry j: its segment s is the last with start[s] <= j
//      (binary search), its index s * 65536 + low[j]; it must be below n, and
//      above entry j - 1 when j - 1 is in the same segment (indices of later
//      segments are larger by construction), so the indices strictly increase.
inline Parsed parse(Vec<const uint8_t> payload, int64_t n_expected = -1) {
  Parsed p;
  p.h = read_header(payload);
  if (n_expected >= 0 && p.h.n != n_expected)
    throw std::runtime_error(
        fmt::format("compressed payload is for a bucket of {} values, this bucket has {}", p.h.n, n_expected));
  const Layout L = layout_of(p.h);
  const uint8_t* base = payload.data();
  p.values = base + L.values;
  if (has_scales(p.h.quant)) p.scales = reinterpret_cast<const float*>(base + L.scales);
  if (p.h.k < p.h.n) {
    const int64_t n = p.h.n, k = p.h.k, nseg = segments(n);
    const uint32_t* counts = reinterpret_cast<const uint32_t*>(base + L.counts);
    const uint16_t* low = reinterpret_cast<const uint16_t*>(base + L.low);
    Buffer<int64_t> start(Kokkos::view_alloc("compress::segment_start", Kokkos::WithoutInitializing), nseg + 1);
    int64_t total = 0;
    Kokkos::parallel_scan(
        "compress::scan_counts", Kokkos::RangePolicy<ExecSpace>(0, nseg + 1),
        KOKKOS_LAMBDA(int64_t s, int64_t & sum, bool final) {
          if (final) start(s) = sum;
          if (s < nseg) sum += int64_t(counts[s]);
        },
        total);
    if (total != k)
      throw std::runtime_error(fmt::format(
          "compressed payload: the {} index segment counts sum to {}, the header says k = {}: corrupted", nseg,
          total, k));
    Buffer<uint32_t> ix(Kokkos::view_alloc("compress::indices", Kokkos::WithoutInitializing), k);
    int64_t bad = 0;
    Kokkos::parallel_reduce(
        "compress::decode_indices", Kokkos::RangePolicy<ExecSpace>(0, k),
        KOKKOS_LAMBDA(int64_t j, int64_t & b) {
          const int64_t s = count_below(start.data(), nseg, j + 1) - 1;  // start[s] <= j < start[s + 1]
          const int64_t i = s * kSegment + int64_t(low[j]);
          ix(j) = uint32_t(i);
          b += i >= n || (j > start(s) && low[j] <= low[j - 1]);
        },
        bad);
    if (bad)
      throw std::runtime_error(fmt::format(
          "compressed payload: {} of {} indices are out of order or not below n = {}: corrupted", bad, k, n));
    p.indices = ix;
  }
  return p;
}

// idx (k), val (k) from a payload: the indices, and the values as sent (decoded).
inline void decode(Vec<uint32_t> idx, Vec<float> val, Vec<const uint8_t> payload) {
  const Parsed p = parse(payload);
  const int64_t k = p.h.k, block = p.h.block;
  if (int64_t(idx.extent(0)) != k || int64_t(val.extent(0)) != k)
    throw std::invalid_argument(
        fmt::format("compress::decode: payload holds k = {}, outputs are {} and {}", k, idx.extent(0), val.extent(0)));
  const uint32_t* ix = p.indices.data();
  Kokkos::parallel_for(
      "compress::decode_copy_indices", Kokkos::RangePolicy<ExecSpace>(0, k),
      KOKKOS_LAMBDA(int64_t j) { idx(j) = ix ? ix[j] : uint32_t(j); });
  switch (p.h.quant) {
    case Quant::none: dequantize_as<Quant::none>(val, p.scales, p.values, block); break;
    case Quant::int8: dequantize_as<Quant::int8>(val, p.scales, p.values, block); break;
    case Quant::int4: dequantize_as<Quant::int4>(val, p.scales, p.values, block); break;
    case Quant::bf16: dequantize_as<Quant::bf16>(val, p.scales, p.values, block); break;
  }
}

// ----------------------------------------------------------------------------
// 6. decode and accumulate

template <Quant Q>
void add_as(Vec<float> out, const Parsed& p, bool assign) {
  const uint32_t* ix = p.indices.data();
  const float* scales = p.scales;
  const uint8_t* values = p.values;
  const int64_t block = p.h.block;
  Kokkos::parallel_for(
      "compress::decode_add", Kokkos::RangePolicy<ExecSpace>(0, p.h.k), KOKKOS_LAMBDA(int64_t j) {
        const int64_t i = ix ? int64_t(ix[j]) : j;
        const float v = value_of<Q>(values, scales, block, j);
        out(i) = assign ? v : out(i) + v;
      });
}

inline void add_parsed(Vec<float> out, const Parsed& p, bool assign) {
  switch (p.h.quant) {
    case Quant::none: add_as<Quant::none>(out, p, assign); break;
    case Quant::int8: add_as<Quant::int8>(out, p, assign); break;
    case Quant::int4: add_as<Quant::int4>(out, p, assign); break;
    case Quant::bf16: add_as<Quant::bf16>(out, p, assign); break;
  }
}

// out (n) = the sum of parsed payloads of n values, in order: the first one's
// values stored, each later one's added; 0 where none has an entry.
inline void sum_parsed(Vec<float> out, const std::vector<Parsed>& parsed) {
  Kokkos::deep_copy(out, 0.0f);
  for (size_t r = 0; r < parsed.size(); ++r) add_parsed(out, parsed[r], r == 0);
}

// out (n) += the payload's values at its indices (indices are distinct, so
// one pass in parallel is deterministic).
inline void decode_add(Vec<float> out, Vec<const uint8_t> payload) {
  add_parsed(out, parse(payload, out.extent(0)), false);
}

// out (n) = sum over ranks r = 0, 1, ..., R-1 of payloads[r], added left to
// right in rank order: rank 0's values are stored, each later rank's added,
// entries no rank sent are 0. With every payload dense (k == n) this is
// ((g_0 + g_1) + g_2) + ... bit for bit. The caller divides by R. Every
// payload is checked before out is touched.
inline void decode_sum(Vec<float> out, const std::vector<Vec<const uint8_t>>& payloads) {
  std::vector<Parsed> parsed;
  parsed.reserve(payloads.size());
  for (size_t r = 0; r < payloads.size(); ++r) {
    try {
      parsed.push_back(parse(payloads[r], out.extent(0)));
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(fmt::format("rank {}: {}", r, e.what()));
    }
  }
  sum_parsed(out, parsed);
}

// ----------------------------------------------------------------------------
// the whole sender side

// payload (payload_bytes(n, k, s.quant, s.block)) from grad (n), with k =
// topk_count(n, s.ratio); residual (n) carries what was not sent to the next
// step (feedback on), or is set to zero (feedback off; it is not read then).
// Returns the bytes written: what the caller hands to the transport.
//   1. acc = residual + grad, in place in residual (feedback on), else acc = grad
//   2. idx, val = top-k of |acc|
//   3. payload = encode(idx, val)
//   4. sent = the values as decoded from the payload; residual(idx) = acc(idx) - sent
inline int64_t compress(Vec<uint8_t> payload, Vec<float> residual, Vec<const float> grad, const Settings& s,
                        Workspace& ws) {
  const int64_t n = grad.extent(0), k = topk_count(n, s.ratio);
  if (int64_t(residual.extent(0)) != n)
    throw std::invalid_argument(fmt::format("compress: residual is {} long, grad {}", residual.extent(0), n));
  ws.check(n, k);
  Vec<const float> acc = grad;
  if (s.feedback) {
    error_feedback(residual, residual, grad);
    acc = residual;
  }
  Vec<uint32_t> idx(ws.idx.data(), k);
  Vec<float> val(ws.val.data(), k);
  topk_select(idx, val, acc, ws);
  const int64_t bytes = encode(payload, idx, val, n, s.quant, s.block);
  if (!s.feedback) {
    Kokkos::deep_copy(residual, 0.0f);
    return bytes;
  }
  Vec<float> sent = val;
  if (s.quant != Quant::none) {
    sent = Vec<float>(ws.sent.data(), k);
    sent_values(sent, payload.data(), Header{n, k, s.quant, has_scales(s.quant) ? s.block : 0});
  }
  update_residual(residual, acc, idx, sent);
  return bytes;
}

// ----------------------------------------------------------------------------
// the sender side, cut into pieces (the partitioned exchange, src/comm/compressed_sync.h)
//
// A sorted selection of k entries of a vector of n values (one bucket's top-k,
// or the concatenated top-k of many buckets) is cut into R contiguous pieces,
// piece j = [n j / R, n (j+1) / R); piece j gets the selected entries that fall
// inside it, as a payload of its own: n = the piece's length, indices relative
// to its start, quantization blocks counted from its first entry. A piece
// without entries sends nothing.
//   1. select_into (per bucket): acc and top-k as in compress(), the indices
//      moved by the bucket's offset, into the caller's idx/val at the bucket's
//      place: concatenated in packed order, the selection stays sorted;
//      (select_pieces: the same for one bucket, into the workspace);
//   2. cut_selection: the R + 1 bounds bounds[j] = entries below piece j's
//      start, a binary search in the sorted indices each (one thread per
//      bound), copied to the host;
//   3. encode_piece, per piece with entries: its indices made relative,
//      encoded; the values as decoded kept in sel.sent at the piece's entries;
//   4. finish_pieces: residual(idx) = acc(idx) - sent, as compress() does.
// Mass is conserved per element exactly as in compress(): every selected entry
// is in exactly one piece, and each piece's sent_i + residual_i == acc_i.

KOKKOS_INLINE_FUNCTION constexpr int64_t piece_begin(int64_t n, int64_t j, int64_t pieces) { return n * j / pieces; }

// A sorted selection and where its pieces' entries are. The views are the
// caller's (or the workspace's): idx (k) indices into [0, n), val (k) their
// values, sent (k) the values as decoded (written by encode_piece), rel (k)
// scratch for the relative indices.
struct Selection {
  int64_t n = 0, k = 0, pieces = 1;
  std::vector<int64_t> bounds;  // (pieces + 1) piece j's entries are [bounds[j], bounds[j + 1])
  Vec<const uint32_t> idx;
  Vec<const float> val;
  Vec<float> sent;
  Vec<uint32_t> rel;
  int64_t begin(int64_t j) const { return piece_begin(n, j, pieces); }
  int64_t length(int64_t j) const { return piece_begin(n, j + 1, pieces) - piece_begin(n, j, pieces); }
  int64_t entries(int64_t j) const { return bounds[j + 1] - bounds[j]; }
};

// Bytes of piece j's payload: payload_bytes(its length, its entries), 0 without entries.
inline int64_t piece_payload_bytes(const Selection& sel, int64_t j, const Settings& s) {
  const int64_t e = sel.entries(j);
  return e == 0 ? 0 : payload_bytes(sel.length(j), e, s.quant, s.block);
}

// Steps 1 and 2 of compress() on grad (n) and residual (n): idx (k), val (k)
// = the top k = topk_count(n, s.ratio) of acc, the indices plus `offset`
// (the bucket's place in a longer vector). Returns k.
inline int64_t select_into(Vec<uint32_t> idx, Vec<float> val, Vec<float> residual, Vec<const float> grad,
                           int64_t offset, const Settings& s, Workspace& ws) {
  const int64_t n = grad.extent(0), k = topk_count(n, s.ratio);
  if (int64_t(residual.extent(0)) != n || int64_t(idx.extent(0)) != k || int64_t(val.extent(0)) != k ||
      offset < 0 || offset + n > int64_t(UINT32_MAX))
    throw std::invalid_argument(fmt::format("compress::select_into: residual {}, grad {}, k = {}, idx {}, val {}, "
                                            "offset {}", residual.extent(0), n, k, idx.extent(0), val.extent(0),
                                            offset));
  ws.check(n, k);
  Vec<const float> acc = grad;
  if (s.feedback) {
    error_feedback(residual, residual, grad);
    acc = residual;
  }
  topk_select(idx, val, acc, ws);
  if (offset != 0)
    Kokkos::parallel_for(
        "compress::select_offset", Kokkos::RangePolicy<ExecSpace>(0, k),
        KOKKOS_LAMBDA(int64_t j) { idx(j) += uint32_t(offset); });
  return k;
}

// The piece bounds of a sorted selection idx (k) of [0, n) cut in `pieces`;
// `scratch` (grown to pieces + 1) holds them in kernel memory.
inline Selection cut_selection(Vec<const uint32_t> idx, Vec<const float> val, Vec<float> sent, Vec<uint32_t> rel,
                               int64_t n, int64_t pieces, Buffer<int64_t>& scratch) {
  const int64_t k = idx.extent(0);
  if (pieces < 1 || int64_t(val.extent(0)) != k || int64_t(sent.extent(0)) != k || int64_t(rel.extent(0)) != k)
    throw std::invalid_argument(fmt::format("compress::cut_selection: {} pieces, idx {}, val {}, sent {}, rel {}",
                                            pieces, k, val.extent(0), sent.extent(0), rel.extent(0)));
  if (int64_t(scratch.extent(0)) < pieces + 1) scratch = Buffer<int64_t>("compress::bounds", pieces + 1);
  auto bounds = scratch;
  const uint32_t* ix = idx.data();
  Kokkos::parallel_for(
      "compress::piece_bounds", Kokkos::RangePolicy<ExecSpace>(0, pieces + 1),
      KOKKOS_LAMBDA(int64_t j) { bounds(j) = count_below(ix, k, piece_begin(n, j, pieces)); });
  Selection sel{n, k, pieces, std::vector<int64_t>(pieces + 1), idx, val, sent, rel};
  Kokkos::deep_copy(Kokkos::View<int64_t*, Kokkos::HostSpace, Unmanaged>(sel.bounds.data(), pieces + 1),
                    Kokkos::subview(bounds, Kokkos::make_pair(int64_t(0), pieces + 1)));
  return sel;
}

// One bucket: select_into the workspace, then cut_selection.
inline Selection select_pieces(Vec<float> residual, Vec<const float> grad, const Settings& s, int64_t pieces,
                               Workspace& ws) {
  const int64_t n = grad.extent(0), k = topk_count(n, s.ratio);
  if (int64_t(residual.extent(0)) != n || pieces < 1)
    throw std::invalid_argument(
        fmt::format("compress::select_pieces: residual {}, grad {}, {} pieces", residual.extent(0), n, pieces));
  ws.check(n, k);
  Vec<uint32_t> idx(ws.idx.data(), k);
  Vec<float> val(ws.val.data(), k);
  select_into(idx, val, residual, grad, 0, s, ws);
  return cut_selection(idx, val, Vec<float>(ws.sent.data(), k), Vec<uint32_t>(ws.rel.data(), k), n, pieces,
                       ws.bounds);
}

// payload (piece_payload_bytes(sel, j, s)) of piece j, which has entries;
// returns its bytes.
inline int64_t encode_piece(Vec<uint8_t> payload, const Selection& sel, int64_t j, const Settings& s,
                            Workspace&) {
  const int64_t b0 = sel.bounds[j], e = sel.entries(j), start = sel.begin(j);
  if (e < 1) throw std::invalid_argument(fmt::format("compress::encode_piece: piece {} has no entries", j));
  Vec<uint32_t> rel(sel.rel.data() + b0, e);
  const uint32_t* ix = sel.idx.data() + b0;
  Kokkos::parallel_for(
      "compress::piece_indices", Kokkos::RangePolicy<ExecSpace>(0, e),
      KOKKOS_LAMBDA(int64_t t) { rel(t) = uint32_t(int64_t(ix[t]) - start); });
  Vec<const float> val(sel.val.data() + b0, e);
  const int64_t bytes = encode(payload, rel, val, sel.length(j), s.quant, s.block);
  if (s.feedback && s.quant != Quant::none)  // what the owner will decode
    sent_values(Vec<float>(sel.sent.data() + b0, e), payload.data(),
                Header{sel.length(j), e, s.quant, has_scales(s.quant) ? s.block : 0});
  return bytes;
}

// residual (n) = acc - what the pieces sent (feedback on; every piece with
// entries encoded), or 0 (feedback off).
inline void finish_pieces(Vec<float> residual, const Selection& sel, const Settings& s, Workspace&) {
  if (!s.feedback) {
    Kokkos::deep_copy(residual, 0.0f);
    return;
  }
  const Vec<const float> sent = s.quant == Quant::none ? sel.val : Vec<const float>(sel.sent.data(), sel.k);
  update_residual(residual, residual, sel.idx, sent);
}

// ----------------------------------------------------------------------------
// the owner side (the partitioned exchange): top-k per segment of a range

// A segment [begin, end) of a range, relative to its start.
struct Segment {
  int64_t begin = 0, end = 0;
};

// k' = the sum over the segments of topk_count(segment length, ratio).
inline int64_t segments_count(const std::vector<Segment>& segments, double ratio) {
  int64_t k = 0;
  for (const auto& g : segments) k += topk_count(g.end - g.begin, ratio);
  return k;
}

// payload (payload_bytes(m, k', s.quant, s.block)) from sum (m), its top
// topk_count(length, ratio) entries of each segment (the segments sorted,
// disjoint, inside [0, m)), as one payload of the whole range: n = m,
// indices relative to the range, quantization blocks over all k' entries.
// residual (m) is the error feedback as in compress(), read and written only
// inside the segments (feedback off: the segments' entries set to 0). idx,
// val, sent (at least k' each) are scratch. Returns the bytes written.
//   1. per segment: acc = residual + sum (feedback on), its top-k into idx,
//      val at the segment's place, the indices moved by the segment's start;
//   2. encode(idx, val) over the range;
//   3. residual(idx) = acc(idx) - sent (feedback on).
inline int64_t compress_segments(Vec<uint8_t> payload, Vec<float> residual, Vec<const float> sum,
                                 const std::vector<Segment>& segments, const Settings& s, Workspace& ws,
                                 Vec<uint32_t> idx, Vec<float> val, Vec<float> sent) {
  const int64_t m = sum.extent(0), k = segments_count(segments, s.ratio);
  if (int64_t(residual.extent(0)) != m || k < 1 || int64_t(idx.extent(0)) < k || int64_t(val.extent(0)) < k ||
      int64_t(sent.extent(0)) < k)
    throw std::invalid_argument(fmt::format("compress::compress_segments: residual {}, sum {}, k' = {}, idx {}, "
                                            "val {}, sent {}", residual.extent(0), m, k, idx.extent(0),
                                            val.extent(0), sent.extent(0)));
  for (int64_t last = 0; const auto& g : segments) {
    if (g.begin < last || g.end <= g.begin || g.end > m)
      throw std::invalid_argument(fmt::format("compress::compress_segments: segment [{}, {}) of {}", g.begin, g.end, m));
    last = g.end;
  }
  int64_t at = 0;
  for (const auto& g : segments) {
    const auto span = Kokkos::make_pair(g.begin, g.end);
    Vec<float> r = Kokkos::subview(residual, span);
    Vec<const float> acc = Kokkos::subview(sum, span);
    if (s.feedback) {
      error_feedback(r, r, acc);
      acc = r;
    } else {
      Kokkos::deep_copy(r, 0.0f);
    }
    const int64_t kg = topk_count(g.end - g.begin, s.ratio);
    Vec<uint32_t> ix(idx.data() + at, kg);
    ws.check(g.end - g.begin, kg);
    topk_select(ix, Vec<float>(val.data() + at, kg), acc, ws);
    if (g.begin != 0) {
      const uint32_t offset = uint32_t(g.begin);
      Kokkos::parallel_for(
          "compress::segment_offset", Kokkos::RangePolicy<ExecSpace>(0, kg),
          KOKKOS_LAMBDA(int64_t j) { ix(j) += offset; });
    }
    at += kg;
  }
  const Vec<const uint32_t> chosen(idx.data(), k);
  const Vec<const float> values(val.data(), k);
  const int64_t bytes = encode(payload, chosen, values, m, s.quant, s.block);
  if (!s.feedback) return bytes;
  Vec<const float> out = values;
  if (s.quant != Quant::none) {
    sent_values(Vec<float>(sent.data(), k), payload.data(), Header{m, k, s.quant, has_scales(s.quant) ? s.block : 0});
    out = Vec<const float>(sent.data(), k);
  }
  update_residual(residual, residual, chosen, out);
  return bytes;
}

}  // namespace xx::kernels::compress
