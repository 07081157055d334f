// The tiled, online-softmax causal attention (kernels/flash_attention.h):
// in double against a naive reference and central finite differences, and
// against the packed kernel (kernels/attention_packed.h) in double, fp32 and with
// 16-bit inputs, for T not a multiple of the block, several heads and a
// value width other than the query/key width (MLA's).
#include <algorithm>
#include <cmath>
#include <vector>
// random_buffer, check_gradient, dot, naive_attention, M/V
#include "fd.h"
// attention_forward/backward (the packed kernel), CausalBlocks, merge_heads_forward
#include "kernels/attention_packed.h"
// flash_attention_forward/backward/delta, flash_scratch_size
#include "kernels/flash_attention.h"

using namespace xx;
using namespace xx::test;
namespace k = xx::kernels;

namespace {

Buffer<float> to_float(const Buffer<double>& d) {
  Buffer<float> f("test::float", d.extent(0));
  Kokkos::parallel_for("test::to_float", d.extent(0), KOKKOS_LAMBDA(int64_t i) { f(i) = float(d(i)); });
  return f;
}

// The largest |a - b| over the largest |b|.
template <class A, class B>
double relative_gap(const std::vector<A>& a, const std::vector<B>& b) {
  double gap = 0, top = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    gap = std::max(gap, std::fabs(double(a[i]) - double(b[i])));
    top = std::max(top, std::fabs(double(b[i])));
  }
  return gap / top;
}

// One causal-attention problem and both kernels' answers in T: outputs and
// the gradients of L = sum(out * r). q, k, v and r are given in double.
template <class T>
struct Answers {
  std::vector<T> out, dq, dk, dv;
};

template <class T>
struct Problem {
  int64_t BH, Tn, D, Dv, block;
  Buffer<T> q, k, v, r;
  Buffer<uint16_t> q16, k16, v16;  // their 16-bit copies, when `type` is not fp32
  k::Precision type = k::Precision::fp32;

  k::GemmIn<T> in(const Buffer<T>& x, const Buffer<uint16_t>& h, int64_t cols) const {
    if (type == k::Precision::fp32) return k::GemmIn<T>(Mat<const T>(x.data(), BH * Tn, cols));
    return k::GemmIn<T>::of_half(h.data(), BH * Tn, cols, type);
  }
  T scale() const { return T(1) / T(std::sqrt(double(D))); }  // as attention_score_scale without YaRN

  Answers<T> flash() const {
    const k::CausalBlocks blocks(Tn, block);
    Buffer<T> out("out", BH * Tn * Dv), lse("lse", BH * Tn), delta("delta", BH * Tn);
    Buffer<T> scratch("scratch", k::flash_scratch_size(BH, Tn, block));
    Buffer<T> dq("dq", BH * Tn * D), dk("dk", BH * Tn * D), dv("dv", BH * Tn * Dv);
    k::flash_attention_forward<T>(Mat<T>(out.data(), BH * Tn, Dv), Vec<T>(lse.data(), BH * Tn), in(q, q16, D),
                                  in(k, k16, D), in(v, v16, Dv), Vec<T>(scratch.data(), scratch.extent(0)), blocks,
                                  BH, scale());
    // Each (batch, head) is its own batch of one head: the merged layout is the heads'.
    k::flash_attention_delta<T>(Vec<T>(delta.data(), BH * Tn), Mat<const T>(r.data(), BH * Tn, Dv),
                                k::GemmIn<T>(Mat<const T>(out.data(), BH * Tn, Dv)), BH, Tn, 1);
    Kokkos::deep_copy(dq, T(9)), Kokkos::deep_copy(dk, T(9)), Kokkos::deep_copy(dv, T(9));  // written (=)
    k::flash_attention_backward<T>(Mat<T>(dq.data(), BH * Tn, D), Mat<T>(dk.data(), BH * Tn, D),
                                   Mat<T>(dv.data(), BH * Tn, Dv), Vec<T>(scratch.data(), scratch.extent(0)),
                                   Mat<const T>(r.data(), BH * Tn, Dv), Vec<const T>(delta.data(), BH * Tn),
                                   Vec<const T>(lse.data(), BH * Tn), in(q, q16, D), in(k, k16, D), in(v, v16, Dv),
                                   blocks, BH, scale());
    return {host(out), host(dq), host(dk), host(dv)};
  }

  Answers<T> packed() const {
    const k::CausalBlocks blocks(Tn, block);
    Buffer<T> out("out", BH * Tn * Dv), scratch("scratch", block * Tn);
    Buffer<T> att("att", type == k::Precision::fp32 ? BH * blocks.per_head() : 0);
    Buffer<uint16_t> att16("att16", type == k::Precision::fp32 ? 0 : BH * blocks.per_head());
    const k::KeptProbabilities<T> p{att.data(), type == k::Precision::fp32 ? nullptr : att16.data(), type};
    Buffer<T> dq("dq", BH * Tn * D), dk("dk", BH * Tn * D), dv("dv", BH * Tn * Dv);
    k::attention_forward<T>(Mat<T>(out.data(), BH * Tn, Dv), p, in(q, q16, D), in(k, k16, D), in(v, v16, Dv),
                            Vec<T>(scratch.data(), scratch.extent(0)), blocks, BH, scale());
    k::attention_backward<T>(Mat<T>(dq.data(), BH * Tn, D), Mat<T>(dk.data(), BH * Tn, D),
                             Mat<T>(dv.data(), BH * Tn, Dv), Vec<T>(scratch.data(), scratch.extent(0)),
                             Mat<const T>(r.data(), BH * Tn, Dv), p, in(q, q16, D), in(k, k16, D), in(v, v16, Dv),
                             blocks, BH, scale());
    return {host(out), host(dq), host(dk), host(dv)};
  }
};

Problem<float> float_problem(int64_t BH, int64_t Tn, int64_t D, int64_t Dv, int64_t block, k::Precision type,
                             unsigned seed) {
  Problem<float> p{BH, Tn, D, Dv, block, {}, {}, {}, {}, {}, {}, {}};
  p.q = to_float(random_buffer(BH * Tn * D, seed)), p.k = to_float(random_buffer(BH * Tn * D, seed + 1));
  p.v = to_float(random_buffer(BH * Tn * Dv, seed + 2)), p.r = to_float(random_buffer(BH * Tn * Dv, seed + 3));
  p.type = type;
  if (type != k::Precision::fp32) {
    p.q16 = Buffer<uint16_t>("q16", p.q.extent(0)), p.k16 = Buffer<uint16_t>("k16", p.k.extent(0));
    p.v16 = Buffer<uint16_t>("v16", p.v.extent(0));
    k::pack_half(p.q16.data(), p.q.data(), p.q.extent(0), type);
    k::pack_half(p.k16.data(), p.k.data(), p.k.extent(0), type);
    k::pack_half(p.v16.data(), p.v.data(), p.v.extent(0), type);
  }
  return p;
}

}  // namespace

TEST_CASE("flash attention (double): forward matches a naive reference, backward finite differences and the packed "
          "kernel",
          "[kernels][flash]") {
  const int64_t BH = 3;
  auto [D, Dv] = GENERATE(std::pair<int64_t, int64_t>{4, 4}, std::pair<int64_t, int64_t>{6, 3},
                          std::pair<int64_t, int64_t>{3, 5});
  auto [T, block] = GENERATE(std::pair<int64_t, int64_t>{7, 3}, std::pair<int64_t, int64_t>{8, 4},
                             std::pair<int64_t, int64_t>{5, 8}, std::pair<int64_t, int64_t>{11, 4});
  CAPTURE(D, Dv, T, block);
  const k::CausalBlocks blocks(T, block);
  auto q = random_buffer(BH * T * D, 171), kk = random_buffer(BH * T * D, 172), v = random_buffer(BH * T * Dv, 173);
  auto r = random_buffer(BH * T * Dv, 174);
  Buffer<double> out("out", BH * T * Dv), lse("lse", BH * T), delta("delta", BH * T);
  Buffer<double> scratch("scratch", k::flash_scratch_size(BH, T, block));
  Buffer<double> dq("dq", BH * T * D), dk("dk", BH * T * D), dv("dv", BH * T * Dv);
  auto loss = [&] {
    k::flash_attention_forward<double>(M(out, BH * T, Dv), V(lse), M(q, BH * T, D), M(kk, BH * T, D),
                                       M(v, BH * T, Dv), V(scratch), blocks, BH, 1 / std::sqrt(double(D)));
    return dot(out, r);
  };
  loss();
  const auto ref = naive_attention(host(q), host(kk), host(v), BH, T, D, Dv);
  const auto got = host(out);
  REQUIRE(got.size() == ref.size());
  for (size_t i = 0; i < ref.size(); ++i) REQUIRE(got[i] == Approx(ref[i]).epsilon(1e-12).margin(1e-14));
  // lse is the log of the softmax's denominator: row 0 of each head sees one key.
  const auto hq = host(q), hk = host(kk), hl = host(lse);
  for (int64_t bh = 0; bh < BH; ++bh) {
    double s = 0;
    for (int64_t c = 0; c < D; ++c) s += hq[bh * T * D + c] * hk[bh * T * D + c];
    REQUIRE(hl[bh * T] == Approx(s / std::sqrt(double(D))).epsilon(1e-12));
  }

  k::flash_attention_delta<double>(V(delta), M(r, BH * T, Dv), M(out, BH * T, Dv), BH, T, 1);
  Kokkos::deep_copy(dq, 9.0), Kokkos::deep_copy(dk, 9.0), Kokkos::deep_copy(dv, 9.0);  // written (=)
  k::flash_attention_backward<double>(M(dq, BH * T, D), M(dk, BH * T, D), M(dv, BH * T, Dv), V(scratch),
                                      M(r, BH * T, Dv), V(delta), V(lse), M(q, BH * T, D), M(kk, BH * T, D),
                                      M(v, BH * T, Dv), blocks, BH, 1 / std::sqrt(double(D)));
  const auto fq = host(dq), fk = host(dk), fv = host(dv);
  check_gradient("flash dq", q, dq, loss, 1000);
  check_gradient("flash dk", kk, dk, loss, 1000);
  check_gradient("flash dv", v, dv, loss, 1000);

  // The packed kernel computes the same function: equal to rounding.
  Problem<double> p{BH, T, D, Dv, block, q, kk, v, r, {}, {}, {}};
  const auto packed = p.packed();
  CHECK(relative_gap(got, packed.out) < 1e-13);
  CHECK(relative_gap(fq, packed.dq) < 1e-12);
  CHECK(relative_gap(fk, packed.dk) < 1e-12);
  CHECK(relative_gap(fv, packed.dv) < 1e-12);
}

TEST_CASE("flash attention delta: rowsum(dO o O) per head row of the merged layout, O in T or 16 bits",
          "[kernels][flash]") {
  const int64_t B = 2, H = 3, T = 5, Dv = 4, N = B * T, W = H * Dv;
  auto dout = to_float(random_buffer(N * W, 181)), out = to_float(random_buffer(N * W, 182));
  Buffer<uint16_t> out16("out16", N * W);
  k::pack_half(out16.data(), out.data(), N * W, k::Precision::bf16);
  Buffer<float> delta("delta", B * H * T), delta16("delta16", B * H * T);
  k::flash_attention_delta<float>(Vec<float>(delta.data(), B * H * T), Mat<const float>(dout.data(), N, W),
                                  k::GemmIn<float>(Mat<const float>(out.data(), N, W)), B, T, H);
  k::flash_attention_delta<float>(Vec<float>(delta16.data(), B * H * T), Mat<const float>(dout.data(), N, W),
                                  k::GemmIn<float>::of_half(out16.data(), N, W, k::Precision::bf16), B, T, H);
  const auto hd = host(dout), ho = host(out), got = host(delta), got16 = host(delta16);
  const auto ho16 = host(out16);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        double want = 0, want16 = 0;
        for (int64_t d = 0; d < Dv; ++d) {
          const int64_t at = (b * T + t) * W + h * Dv + d;
          want += double(hd[at]) * ho[at];
          want16 += double(hd[at]) * k::half_bits_to_float(ho16[at], k::Precision::bf16);
        }
        const int64_t row = (b * H + h) * T + t;
        REQUIRE(got[row] == Approx(want).epsilon(1e-5).margin(1e-6));
        REQUIRE(got16[row] == Approx(want16).epsilon(1e-5).margin(1e-6));
      }
}

// fp32: the two kernels sum in different orders (flash rescales its running
// sums block by block), so they agree to rounding, not bit for bit. Over
// these shapes the largest gap is 3.6e-7 of the largest value; the bound
// is 1e-5, small against any real error (a dropped block moves them by O(1)).
TEST_CASE("flash attention (fp32) follows the packed kernel and reruns bit for bit", "[kernels][flash]") {
  auto [BH, T, D, Dv] = GENERATE(std::tuple<int64_t, int64_t, int64_t, int64_t>{4, 150, 24, 16},
                                 std::tuple<int64_t, int64_t, int64_t, int64_t>{2, 128, 48, 32},
                                 std::tuple<int64_t, int64_t, int64_t, int64_t>{3, 70, 16, 16},
                                 // longer than a span: key blocks meet their queries in two GEMM calls
                                 std::tuple<int64_t, int64_t, int64_t, int64_t>{2, k::kFlashSpan + 70, 8, 8});
  CAPTURE(BH, T, D, Dv);
  const auto p = float_problem(BH, T, D, Dv, 64, k::Precision::fp32, 191);
  const auto flash = p.flash(), packed = p.packed(), again = p.flash();
  const double gaps[] = {relative_gap(flash.out, packed.out), relative_gap(flash.dq, packed.dq),
                         relative_gap(flash.dk, packed.dk), relative_gap(flash.dv, packed.dv)};
  CAPTURE(gaps[0], gaps[1], gaps[2], gaps[3]);
  for (double g : gaps) CHECK(g < 1e-5);
  CHECK(flash.out == again.out);  // deterministic: no atomics, a fixed order
  CHECK(flash.dq == again.dq);
  CHECK(flash.dk == again.dk);
  CHECK(flash.dv == again.dv);
}

// bf16 and fp16 inputs: both kernels multiply the same 16-bit q, k, v and
// dO, and round their probabilities to 16 bits before the GEMMs that read
// them (flash: exp(S - m) before normalising, packed: the normalised P), so
// they differ by about the type's rounding (bf16 2^-9, fp16 2^-12 relative).
// Measured largest gaps (of the largest value): bf16 5.1e-3, fp16 6.7e-4
// between the kernels, 7.0e-3 and 6.7e-4 to fp32; the bounds are about 3x
// (4.5x to fp32).
TEST_CASE("flash attention with 16-bit inputs follows the packed kernel within the type's rounding",
          "[kernels][flash]") {
  auto [type, bound] = GENERATE(std::pair<k::Precision, double>{k::Precision::bf16, 0.016},
                                std::pair<k::Precision, double>{k::Precision::fp16, 0.002});
  CAPTURE(int(type));
  const int64_t BH = 3, T = 100, D = 24, Dv = 16;
  const auto p = float_problem(BH, T, D, Dv, 64, type, 201);
  const auto flash = p.flash(), packed = p.packed(), again = p.flash();
  const auto exact = float_problem(BH, T, D, Dv, 64, k::Precision::fp32, 201).flash();
  const double gaps[] = {relative_gap(flash.out, packed.out), relative_gap(flash.dq, packed.dq),
                         relative_gap(flash.dk, packed.dk), relative_gap(flash.dv, packed.dv)};
  const double to_fp32[] = {relative_gap(flash.out, exact.out), relative_gap(flash.dq, exact.dq),
                            relative_gap(flash.dk, exact.dk), relative_gap(flash.dv, exact.dv)};
  CAPTURE(gaps[0], gaps[1], gaps[2], gaps[3], to_fp32[0], to_fp32[1], to_fp32[2], to_fp32[3]);
  for (double g : gaps) CHECK(g < bound);
  for (double g : to_fp32) CHECK(g < 2 * bound);
  CHECK(flash.out != exact.out);  // the rounding is really there
  CHECK(flash.dq == again.dq);
}
