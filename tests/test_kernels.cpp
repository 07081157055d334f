// Every kernel's backward against central finite differences, in double.
#include "core/device_memory.h"
#include "fd.h"
#include "kernels/attention_packed.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

using namespace xx;
using namespace xx::test;
namespace k = xx::kernels;

TEST_CASE("linear backward matches finite differences", "[kernels]") {
  const int64_t N = 7, IN = 5, OUT = 6;
  auto x = random_buffer(N * IN, 1), w = random_buffer(OUT * IN, 2), r = random_buffer(N * OUT, 3);
  Buffer<double> y("y", N * OUT), dx("dx", N * IN), dw("dw", OUT * IN);
  auto loss = [&] {
    k::linear_forward<double>(M(y, N, OUT), M(x, N, IN), M(w, OUT, IN));
    return dot(y, r);
  };
  loss();
  Kokkos::deep_copy(dw, 0.5);  // parameter gradients accumulate: start from a non-zero value
  k::linear_backward<double>(M(dx, N, IN), M(dw, OUT, IN), M(r, N, OUT), M(x, N, IN), M(w, OUT, IN));
  check_gradient("linear dx", x, dx, loss);
  auto dw_only = random_buffer(OUT * IN, 0, 0.0);
  Kokkos::parallel_for(OUT * IN, KOKKOS_LAMBDA(int64_t i) { dw_only(i) = dw(i) - 0.5; });
  check_gradient("linear dw", w, dw_only, loss);

  SECTION("beta = 1 adds into the output") {
    Buffer<double> y2("y2", N * OUT);
    Kokkos::deep_copy(y2, 1.0);
    k::linear_forward<double>(M(y2, N, OUT), M(x, N, IN), M(w, OUT, IN), 1.0);
    REQUIRE(get(y2, 3) == Approx(get(y, 3) + 1.0).epsilon(1e-12));
  }
}

TEST_CASE("embedding backward accumulates per token", "[kernels]") {
  const int64_t N = 9, C = 4, Vn = 5;
  std::vector<int32_t> host_tokens = {0, 3, 3, 1, 4, 0, 3, 2, 2};
  Kokkos::View<int32_t*, MemSpace> tok("tok", N);
  auto ht = xx::host_staging(tok);
  for (int64_t i = 0; i < N; ++i) ht(i) = host_tokens[i];
  Kokkos::deep_copy(tok, ht);
  auto w = random_buffer(Vn * C, 4), r = random_buffer(N * C, 5);
  Buffer<double> y("y", N * C), dw("dw", Vn * C);
  auto loss = [&] {
    k::embedding_forward<double>(M(y, N, C), Tokens(tok.data(), N), M(w, Vn, C));
    return dot(y, r);
  };
  loss();
  k::embedding_backward<double>(M(dw, Vn, C), M(r, N, C), Tokens(tok.data(), N));
  check_gradient("embedding dw", w, dw, loss);
}

TEST_CASE("rmsnorm backward matches finite differences", "[kernels]") {
  const int64_t N = 6, C = 8;
  auto x = random_buffer(N * C, 6), w = random_buffer(C, 7), r = random_buffer(N * C, 8);
  Buffer<double> y("y", N * C), rstd("rstd", N), dx("dx", N * C), dw("dw", C);
  auto loss = [&] {
    k::rmsnorm_forward<double>(M(y, N, C), V(rstd), M(x, N, C), V(w), 1e-5);
    return dot(y, r);
  };
  loss();
  k::rmsnorm_backward<double>(M(dx, N, C), V(dw), M(r, N, C), M(x, N, C), V(w), V(rstd));
  check_gradient("rmsnorm dx", x, dx, loss);
  check_gradient("rmsnorm dw", w, dw, loss);
}

TEST_CASE("swiglu backward matches finite differences", "[kernels]") {
  const int64_t N = 5, F = 7;
  auto h = random_buffer(N * 2 * F, 9, 2.0), r = random_buffer(N * F, 10);
  Buffer<double> a("a", N * F), dh("dh", N * 2 * F);
  auto loss = [&] {
    k::swiglu_forward<double>(M(a, N, F), M(h, N, 2 * F));
    return dot(a, r);
  };
  loss();
  k::swiglu_backward<double>(M(dh, N, 2 * F), M(r, N, F), M(h, N, 2 * F));
  check_gradient("swiglu dh", h, dh, loss);
}

TEST_CASE("cross entropy backward matches finite differences", "[kernels]") {
  const int64_t N = 4, Vn = 11;
  Kokkos::View<int32_t*, MemSpace> tgt("tgt", N);
  auto ht = xx::host_staging(tgt);
  for (int64_t i = 0; i < N; ++i) ht(i) = int32_t((i * 7 + 3) % Vn);
  Kokkos::deep_copy(tgt, ht);
  auto logits = random_buffer(N * Vn, 11, 3.0), r = random_buffer(N, 12);
  Buffer<double> losses("losses", N), dlogits("dlogits", N * Vn);
  auto loss = [&] {
    k::cross_entropy_forward<double>(V(losses), M(logits, N, Vn), Tokens(tgt.data(), N));
    return dot(losses, r);
  };
  loss();
  // With a per-row weight r(i), dL/dlogits = (p - onehot) * r(i); the kernel
  // takes one scalar, so check row by row.
  for (int64_t i = 0; i < N; ++i) {
    auto row_logits = Kokkos::subview(logits, Kokkos::make_pair(i * Vn, (i + 1) * Vn));
    auto row_d = Kokkos::subview(dlogits, Kokkos::make_pair(i * Vn, (i + 1) * Vn));
    k::cross_entropy_backward<double>(Mat<double>(row_d.data(), 1, Vn), Mat<const double>(row_logits.data(), 1, Vn),
                                      Tokens(tgt.data() + i, 1), get(r, i));
  }
  check_gradient("cross entropy dlogits", logits, dlogits, loss);

  SECTION("loss of a uniform distribution is log V") {
    Kokkos::deep_copy(logits, 0.25);
    k::cross_entropy_forward<double>(V(losses), M(logits, N, Vn), Tokens(tgt.data(), N));
    REQUIRE(get(losses, 2) == Approx(std::log(double(Vn))).epsilon(1e-12));
  }
}

TEST_CASE("rope split backward matches finite differences and preserves norms", "[kernels]") {
  const int64_t B = 2, T = 5, H = 2, D = 4, C = H * D;
  Buffer<double> cs("cos", T * D / 2), sn("sin", T * D / 2);
  k::rope_tables<double>(M(cs, T, D / 2), M(sn, T, D / 2), {k::rope_inverse_frequencies(10000.0, D)});
  auto qkv = random_buffer(B * T * 3 * C, 13);
  auto rq = random_buffer(B * H * T * D, 14), rk = random_buffer(B * H * T * D, 15), rv = random_buffer(B * H * T * D, 16);
  Buffer<double> q("q", B * H * T * D), kk("k", B * H * T * D), v("v", B * H * T * D), dqkv("dqkv", B * T * 3 * C);
  auto loss = [&] {
    k::split_heads_rope_forward<double>(M(q, B * H * T, D), M(kk, B * H * T, D), M(v, B * H * T, D),
                                        M(qkv, B * T, 3 * C), M(cs, T, D / 2), M(sn, T, D / 2), B, T, H);
    return dot(q, rq) + dot(kk, rk) + dot(v, rv);
  };
  loss();
  k::split_heads_rope_backward<double>(M(dqkv, B * T, 3 * C), M(rq, B * H * T, D), M(rk, B * H * T, D),
                                       M(rv, B * H * T, D), M(cs, T, D / 2), M(sn, T, D / 2), B, T, H);
  check_gradient("rope dqkv", qkv, dqkv, loss, 200);
  // A rotation keeps the norm of q.
  double nq = dot(q, q), nqkv = 0;
  auto h = xx::host_copy(qkv);
  for (int64_t row = 0; row < B * T; ++row)
    for (int64_t c = 0; c < C; ++c) nqkv += h(row * 3 * C + c) * h(row * 3 * C + c);
  REQUIRE(nq == Approx(nqkv).epsilon(1e-12));
}


TEST_CASE("merge heads is a permutation and its backward the inverse", "[kernels]") {
  const int64_t B = 2, T = 3, H = 2, D = 2;
  auto heads = random_buffer(B * H * T * D, 21), r = random_buffer(B * T * H * D, 22);
  Buffer<double> out("out", B * T * H * D), dheads("dheads", B * H * T * D);
  auto loss = [&] {
    k::merge_heads_forward<double>(M(out, B * T, H * D), M(heads, B * H * T, D), B, T, H);
    return dot(out, r);
  };
  loss();
  k::merge_heads_backward<double>(M(dheads, B * H * T, D), M(r, B * T, H * D), B, T, H);
  check_gradient("merge dheads", heads, dheads, loss, 100);
  loss();  // the check leaves the last perturbed output behind
  REQUIRE(get(out, (1 * T + 2) * H * D + 1 * D + 1) == get(heads, ((1 * H + 1) * T + 2) * D + 1));
}
