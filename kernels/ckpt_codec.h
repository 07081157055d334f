// Checkpoint diff codecs: how one tensor is stored as its difference from a
// base (the average of the ranks' tensors, or an earlier checkpoint's tensor)
// and rebuilt from it (issue 5/6, docs/CHECKPOINT.md). Each codec's encode
// and decode sit side by side; the arrays they fill become HDF5 datasets
// (shuffle + deflate do the actual compression there).
//
// Legend: n tensor length, B values per int8 block, nb = ceil(n / B) blocks,
// R kept fraction, k = kept_count(n, R), d = fl(value - base) the difference
// as a float (one rounding).
//
//   codec     arrays                                 bytes       restore
//   lossless  diff (n) uint32 = bits(value)^bits(base)  4n       bits(base) ^ diff: bit-exact for every float
//   int8      codes (n) int8, scales (nb) float32    n + 4 nb    base + code * scale; base where the code is 0
//   topk R    index (k) uint32, kept (k) float32     8k          base, and value(index_j) = kept_j
//
// Guarantees (tested in tests/test_ckpt_codec.cpp):
//   lossless  decode(encode(value)) has value's bits: NaN payloads, -0, inf, subnormals.
//   int8      scale_b = max_{i in b} |d_i| / 127 rounded up to 17 significant
//             bits (compress::block_scale: code * scale is exact in float),
//             code_i = round_half_even(d_i / scale_b); for every element
//               |decoded_i - value_i| <= scale_b / 2 + ulp(d_i) / 2 + ulp(decoded_i) / 2,
//             with ulp(x) the gap from |x| to the next float up: half a step,
//             the rounding of the difference, the rounding of the final add.
//             A block of equal values has scale 0 and restores base bit-exactly.
//             A non-finite difference (inf or NaN in the tensor or the base),
//             or a restore that would overflow, cannot be stored: encode
//             refuses its block (scale NaN, codes 0), returns the count, and
//             the caller stores the tensor with lossless instead; decode
//             rejects a NaN, inf or negative scale.
//   topk      the k entries with the largest |d| (ties to the lower index;
//             compress::topk_select, an exact radix select) store the tensor's
//             own value, not d: kept entries restore bit-exactly and a dropped
//             one restores to base, so max_i |fl(value_i - decoded_i)| is the
//             largest dropped |d| exactly, and it is <= the smallest kept |d|.
//             NaN differences rank above inf, so they are dropped last.
//
// Nothing loops over elements on the host; nothing uses atomics; every
// reduction is a max, min or integer count, so results do not depend on order.
#pragma once
#include <fmt/format.h>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string_view>
#include "core/device_memory.h"
#include "core/modes.h"  // Codec
#include "core/views.h"
#include "kernels/math.h"
// topk_count, topk_select and its Workspace, block_scale, quant_code, magnitude_key
#include "kernels/compress.h"

namespace xx::kernels::ckpt_codec {

// ----------------------------------------------------------------------------
// the setting a deck line `checkpoint ... codec lossless|int8|topk R` fills

using xx::Codec;  // core/modes.h

struct CodecSetting {
  Codec kind = Codec::lossless;
  int64_t block = 64;   // B: values per float scale (int8)
  double ratio = 0.01;  // R: fraction of entries kept (topk), in (0, 1]
  bool operator==(const CodecSetting&) const = default;
};

// Throws std::invalid_argument naming the bad field (the deck reader turns it
// into its file:line message).
inline void check_setting(const CodecSetting& s) {
  if (s.kind == Codec::int8 && (s.block < 1 || s.block > int64_t(UINT32_MAX)))
    throw std::invalid_argument(fmt::format("codec int8: block must be in [1, 2^32), got {}", s.block));
  if (s.kind == Codec::topk && !(s.ratio > 0 && s.ratio <= 1))
    throw std::invalid_argument(fmt::format("codec topk: ratio must be in (0, 1], got {}", s.ratio));
}

// k = max(1, ceil(R n)) at most n, a product within 1e-9 of an integer
// counting as that integer (0.07 * 100 keeps 7); 0 for n = 0. The same count
// as gradient compression's.
inline int64_t kept_count(int64_t n, double ratio) { return compress::topk_count(n, ratio); }

// nb: int8 scales for n values.
inline int64_t scale_count(int64_t n, int64_t block) { return compress::ceil_div(n, block); }

// Bytes of the arrays a tensor of n values encodes to, before HDF5's filters:
//   lossless 4n;  int8 n + 4 ceil(n / B);  topk 8 kept_count(n, R).
inline int64_t encoded_bytes(const CodecSetting& s, int64_t n) {
  check_setting(s);
  switch (s.kind) {
    case Codec::lossless: return 4 * n;
    case Codec::int8: return n + 4 * scale_count(n, s.block);
    case Codec::topk: return 8 * kept_count(n, s.ratio);
  }
  return 0;
}

// Flat loops run one work item per chunk with a vector loop inside.
constexpr int64_t kChunk = 2048;

inline void check_length(const char* what, int64_t got, int64_t want) {
  if (got != want)
    throw std::invalid_argument(fmt::format("ckpt_codec::{}: array of {} values, expected {}", what, got, want));
}

// ----------------------------------------------------------------------------
// lossless: XOR of the bit patterns

template <class T> struct BitsOf;
template <> struct BitsOf<float> { using type = uint32_t; };
template <> struct BitsOf<double> { using type = uint64_t; };
template <class T> using bits_t = typename BitsOf<T>::type;  // the unsigned integer of T's width

// diff (n) = bits(value) ^ bits(base). Equal values give 0; close ones give
// zero high bytes, which is what the shuffle filter groups for deflate.
template <class T>
void lossless_encode(Vec<bits_t<T>> diff, Vec<const T> value, Vec<const T> base) {
  using U = bits_t<T>;
  const int64_t n = value.extent(0);
  check_length("lossless_encode base", base.extent(0), n);
  check_length("lossless_encode diff", diff.extent(0), n);
  U* pd = diff.data();
  const T *pv = value.data(), *pb = base.data();
  Kokkos::parallel_for(
      "ckpt_codec::lossless_encode", Kokkos::RangePolicy<ExecSpace>(0, compress::ceil_div(n, kChunk)),
      KOKKOS_LAMBDA(int64_t c) {
        const int64_t end = (c + 1) * kChunk < n ? (c + 1) * kChunk : n;
        for (int64_t i = c * kChunk; i < end; ++i) pd[i] = kmath::bit_cast<U>(pv[i]) ^ kmath::bit_cast<U>(pb[i]);
      });
}

// value (n) = the float whose bits are bits(base) ^ diff. value may alias base.
template <class T>
void lossless_decode(Vec<T> value, Vec<const bits_t<T>> diff, Vec<const T> base) {
  using U = bits_t<T>;
  const int64_t n = diff.extent(0);
  check_length("lossless_decode base", base.extent(0), n);
  check_length("lossless_decode value", value.extent(0), n);
  T* pv = value.data();
  const T* pb = base.data();
  const U* pd = diff.data();
  Kokkos::parallel_for(
      "ckpt_codec::lossless_decode", Kokkos::RangePolicy<ExecSpace>(0, compress::ceil_div(n, kChunk)),
      KOKKOS_LAMBDA(int64_t c) {
        const int64_t end = (c + 1) * kChunk < n ? (c + 1) * kChunk : n;
        for (int64_t i = c * kChunk; i < end; ++i) pv[i] = kmath::bit_cast<T>(kmath::bit_cast<U>(pb[i]) ^ pd[i]);
      });
}

// Shannon entropy, in bits per byte, of each byte plane of diff (plane 0 the
// least significant byte): sum over planes / 8 estimates the fraction of 4n
// bytes an order-0 coder after the shuffle filter could reach (tools/bench ckpt).
// Histograms are counted per chunk into their own rows, then summed bin by bin.
inline std::array<double, 4> byte_plane_entropy(Vec<const uint32_t> diff) {
  constexpr int64_t kPlaneChunk = 65536, kBins = 4 * 256;  // large chunks: the rows stay small
  const int64_t n = diff.extent(0), chunks = compress::ceil_div(n, kPlaneChunk);
  std::array<double, 4> bits{0, 0, 0, 0};
  if (n == 0) return bits;
  Buffer<int32_t> rows("ckpt_codec::plane_rows", chunks * kBins);  // (chunks, 4 planes x 256)
  Buffer<int64_t> total("ckpt_codec::plane_hist", kBins);
  const uint32_t* pd = diff.data();
  Kokkos::parallel_for(
      "ckpt_codec::plane_histogram", Kokkos::RangePolicy<ExecSpace>(0, chunks), KOKKOS_LAMBDA(int64_t c) {
        int32_t* h = &rows(c * kBins);
        const int64_t end = (c + 1) * kPlaneChunk < n ? (c + 1) * kPlaneChunk : n;
        for (int64_t i = c * kPlaneChunk; i < end; ++i)
          for (int p = 0; p < 4; ++p) ++h[p * 256 + ((pd[i] >> (8 * p)) & 0xffu)];
      });
  Kokkos::parallel_for(
      "ckpt_codec::plane_sum", Kokkos::RangePolicy<ExecSpace>(0, kBins), KOKKOS_LAMBDA(int64_t b) {
        int64_t s = 0;
        for (int64_t c = 0; c < chunks; ++c) s += rows(c * kBins + b);
        total(b) = s;
      });
  auto host = host_copy(total);
  for (int p = 0; p < 4; ++p)
    for (int b = 0; b < 256; ++b)
      if (const int64_t count = host(p * 256 + b)) {
        const double f = double(count) / double(n);
        bits[p] -= f * std::log2(f);
      }
  return bits;
}

// ----------------------------------------------------------------------------
// int8: the difference quantized per block of B values, one float scale each

// What int8_encode could not store. refused > 0: those blocks hold scale NaN
// and codes 0 (decode rejects them); store the tensor with lossless instead.
struct Int8Result {
  int64_t refused = 0;  // elements whose difference is not finite, or whose restore would overflow
  bool ok() const { return refused == 0; }
};

// codes (n), scales (nb) from value (n) and base (n), blocks of `block`
// consecutive values, one work item per block:
//   1. d = value - base (float); m = max |d| over the block; any non-finite d refuses the block;
//   2. scale = block_scale(m, 127) >= m / 127 (0 when m = 0); code = round_half_even(d / scale);
//   3. the restore base + code * scale must be finite, else the block is refused.
[[nodiscard]] inline Int8Result int8_encode(Vec<int8_t> codes, Vec<float> scales, Vec<const float> value,
                                            Vec<const float> base, int64_t block) {
  const int64_t n = value.extent(0);
  if (block < 1) throw std::invalid_argument(fmt::format("ckpt_codec::int8_encode: block {} (need >= 1)", block));
  const int64_t nb = scale_count(n, block);
  check_length("int8_encode base", base.extent(0), n);
  check_length("int8_encode codes", codes.extent(0), n);
  check_length("int8_encode scales", scales.extent(0), nb);
  constexpr int32_t qmax = 127;
  const float refused_scale = std::bit_cast<float>(0x7fc00000u);  // quiet NaN
  Int8Result result;
  Kokkos::parallel_reduce(
      "ckpt_codec::int8_encode", Kokkos::RangePolicy<ExecSpace>(0, nb),
      KOKKOS_LAMBDA(int64_t b, int64_t & refused) {
        const int64_t begin = b * block, end = begin + block < n ? begin + block : n;
        float m = 0;
        int64_t bad = 0;
        for (int64_t i = begin; i < end; ++i) {
          const float d = value(i) - base(i);
          if (!kmath::isfinite(d)) ++bad;
          else m = kmath::fabs(d) > m ? kmath::fabs(d) : m;
        }
        const float scale = bad ? refused_scale : compress::block_scale(m, qmax);
        if (!bad) {
          for (int64_t i = begin; i < end; ++i) {
            const int32_t q = compress::quant_code(value(i) - base(i), scale, qmax);
            codes(i) = int8_t(q);
            bad += !kmath::isfinite(base(i) + float(q) * scale);  // q * scale within ~2^-16 of FLT_MAX
          }
        }
        if (bad) {
          for (int64_t i = begin; i < end; ++i) codes(i) = 0;
          scales(b) = refused_scale;
          refused += bad;
        } else {
          scales(b) = scale;
        }
      },
      result.refused);
  return result;
}

// value (n) = base + code * scale, and base itself where the code is 0 (so a
// block of equal values keeps base's bits, -0 included). code * scale is exact
// in float, so the add is the only rounding (an FMA gives the same bits).
// Throws std::runtime_error when a scale is NaN, inf or negative. value may alias base.
inline void int8_decode(Vec<float> value, Vec<const int8_t> codes, Vec<const float> scales, Vec<const float> base,
                        int64_t block) {
  const int64_t n = codes.extent(0);
  if (block < 1) throw std::invalid_argument(fmt::format("ckpt_codec::int8_decode: block {} (need >= 1)", block));
  const int64_t nb = scale_count(n, block);
  check_length("int8_decode base", base.extent(0), n);
  check_length("int8_decode value", value.extent(0), n);
  check_length("int8_decode scales", scales.extent(0), nb);
  int64_t bad = 0;
  Kokkos::parallel_reduce(
      "ckpt_codec::int8_check_scales", Kokkos::RangePolicy<ExecSpace>(0, nb),
      KOKKOS_LAMBDA(int64_t b, int64_t & count) { count += !(scales(b) >= 0 && scales(b) <= FLT_MAX); }, bad);
  if (bad)
    throw std::runtime_error(fmt::format(
        "int8 diff: {} of {} block scales are NaN, inf or negative (corrupt data, or a block the encoder refused)",
        bad, nb));
  float* pv = value.data();
  const float *pb = base.data(), *ps = scales.data();
  const int8_t* pq = codes.data();
  Kokkos::parallel_for(
      "ckpt_codec::int8_decode", Kokkos::RangePolicy<ExecSpace>(0, compress::ceil_div(n, kChunk)),
      KOKKOS_LAMBDA(int64_t c) {
        const int64_t end = (c + 1) * kChunk < n ? (c + 1) * kChunk : n;
        for (int64_t i = c * kChunk; i < end; ++i) {
          const int32_t q = pq[i];
          pv[i] = q == 0 ? pb[i] : pb[i] + float(q) * ps[i / block];
        }
      });
}

// ----------------------------------------------------------------------------
// topk R: the largest R of the difference, by magnitude

// Scratch for topk_encode, sized once for the largest tensor.
struct TopkWorkspace {
  Buffer<float> diff;          // (max_n) d = value - base
  compress::Workspace select;  // the radix select's counters and candidates
  TopkWorkspace() = default;
  TopkWorkspace(int64_t max_n, int64_t max_k) : diff("ckpt_codec::topk_diff", max_n), select(max_n, max_k) {}
};

// What topk_encode dropped, as magnitudes of d (from their bit patterns, so
// NaN and inf come through): max_dropped is the largest error of the restore
// (0 when nothing was dropped), min_kept the smallest kept |d|; max_dropped <= min_kept.
struct TopkResult {
  float min_kept = 0, max_dropped = 0;
};

// index (k), kept (k) from value (n), base (n), k = the outputs' length (size
// them kept_count(n, R)): index increasing, kept_j = value(index_j).
//   1. diff = value - base;
//   2. index = top-k of |diff| (exact radix select, ties to the lower index, index order);
//   3. T = min kept |d| (as a bit pattern key); kept = value at index;
//   4. largest dropped key: T if fewer than all keys >= T were kept, else the largest key < T.
inline TopkResult topk_encode(Vec<uint32_t> index, Vec<float> kept, Vec<const float> value, Vec<const float> base,
                              TopkWorkspace& ws) {
  const int64_t n = value.extent(0), k = index.extent(0);
  check_length("topk_encode base", base.extent(0), n);
  check_length("topk_encode kept", kept.extent(0), k);
  if (n > int64_t(UINT32_MAX) || k > n || (n > 0 && k < 1) || n > int64_t(ws.diff.extent(0)))
    throw std::invalid_argument(fmt::format("ckpt_codec::topk_encode: n = {}, k = {} (need 1 <= k <= n < 2^32), "
                                            "workspace for n <= {}",
                                            n, k, ws.diff.extent(0)));
  TopkResult result;
  if (n == 0) return result;
  const int64_t chunks = compress::ceil_div(n, kChunk);
  float* pdiff = ws.diff.data();
  Kokkos::parallel_for(
      "ckpt_codec::topk_diff", Kokkos::RangePolicy<ExecSpace>(0, chunks), KOKKOS_LAMBDA(int64_t c) {
        const int64_t end = (c + 1) * kChunk < n ? (c + 1) * kChunk : n;
        for (int64_t i = c * kChunk; i < end; ++i) pdiff[i] = value(i) - base(i);
      });
  compress::topk_select(index, kept, Vec<const float>(pdiff, n), ws.select);
  uint32_t min_key = 0;
  Kokkos::parallel_reduce(
      "ckpt_codec::topk_keep_values", Kokkos::RangePolicy<ExecSpace>(0, k),
      KOKKOS_LAMBDA(int64_t j, uint32_t & lowest) {
        const uint32_t key = compress::magnitude_key(kept(j));
        lowest = key < lowest ? key : lowest;
        kept(j) = value(index(j));
      },
      Kokkos::Min<uint32_t>(min_key));
  result.min_kept = std::bit_cast<float>(min_key);
  if (k == n) return result;
  int64_t at_or_above = 0;
  uint32_t below = 0;
  Kokkos::parallel_reduce(
      "ckpt_codec::topk_count_at_threshold", Kokkos::RangePolicy<ExecSpace>(0, chunks),
      KOKKOS_LAMBDA(int64_t c, int64_t & count) {
        const int64_t end = (c + 1) * kChunk < n ? (c + 1) * kChunk : n;
        for (int64_t i = c * kChunk; i < end; ++i) count += compress::magnitude_key(pdiff[i]) >= min_key;
      },
      at_or_above);
  Kokkos::parallel_reduce(
      "ckpt_codec::topk_largest_below", Kokkos::RangePolicy<ExecSpace>(0, chunks),
      KOKKOS_LAMBDA(int64_t c, uint32_t & largest) {
        const int64_t end = (c + 1) * kChunk < n ? (c + 1) * kChunk : n;
        for (int64_t i = c * kChunk; i < end; ++i) {
          const uint32_t key = compress::magnitude_key(pdiff[i]);
          if (key < min_key && key > largest) largest = key;
        }
      },
      Kokkos::Max<uint32_t>(below));
  result.max_dropped = std::bit_cast<float>(at_or_above > k ? min_key : below);
  return result;
}

// value (n) = base, then value(index_j) = kept_j. Throws std::runtime_error
// unless index is strictly increasing and below n (one thread per entry
// compares with its predecessor), before value is touched. value may alias base.
inline void topk_decode(Vec<float> value, Vec<const uint32_t> index, Vec<const float> kept, Vec<const float> base) {
  const int64_t n = base.extent(0), k = index.extent(0);
  check_length("topk_decode value", value.extent(0), n);
  check_length("topk_decode kept", kept.extent(0), k);
  int64_t bad = 0;
  Kokkos::parallel_reduce(
      "ckpt_codec::topk_check_index", Kokkos::RangePolicy<ExecSpace>(0, k),
      KOKKOS_LAMBDA(int64_t j, int64_t & count) {
        count += int64_t(index(j)) >= n || (j > 0 && index(j) <= index(j - 1));
      },
      bad);
  if (bad)
    throw std::runtime_error(fmt::format(
        "topk diff: {} of {} indices are out of order or not below n = {} (corrupt data)", bad, k, n));
  if (value.data() != base.data()) Kokkos::deep_copy(value, base);
  Kokkos::parallel_for(
      "ckpt_codec::topk_decode", Kokkos::RangePolicy<ExecSpace>(0, k),
      KOKKOS_LAMBDA(int64_t j) { value(index(j)) = kept(j); });
}

}  // namespace xx::kernels::ckpt_codec
