// DeepSeekMoE routing: gate scores, top-k selection, token dispatch to
// per-expert batches and the weighted combine back, each with its backward.
// Nothing loops over tokens on the host and nothing uses atomics: positions
// are assigned expert by expert in token order, and every token gathers its
// own k contributions in slot order, so results are deterministic.
// Activation gradients are written (=).
// Team-shaped (kernels/team.h): the positions (a team row per expert), the
// dispatch and combine (a row per token, channels in its vector lanes), the
// score means (column sums). The router kernels stay one thread per token:
// their work per token is over E experts and k slots, small and sequential.
#pragma once
#include "core/views.h"
#include "kernels/elementwise.h"
#include "kernels/math.h"
#include "kernels/team.h"

namespace xx::kernels {

using Index2 = Kokkos::View<int32_t**, Kokkos::LayoutRight, MemSpace>;  // (N, k)
using Index1 = Kokkos::View<int32_t*, Kokkos::LayoutRight, MemSpace>;

struct GateKind {
  bool sigmoid = false;     // false: softmax over experts (V2); true: sigmoid (V3)
  bool normalize = false;   // renormalise the k selected scores to sum to one (V3)
  double route_scale = 1.0;
};

// scores (N, E) = softmax or sigmoid of logits (N, E)
template <class T>
void router_scores_forward(Mat<T> scores, Mat<const T> logits, GateKind g) {
  const int64_t E = logits.extent(1);
  const bool sig = g.sigmoid;
  Kokkos::parallel_for(
      "moe::router_scores", Kokkos::RangePolicy<ExecSpace>(0, logits.extent(0)), KOKKOS_LAMBDA(int64_t t) {
        if (sig) {
          for (int64_t e = 0; e < E; ++e) scores(t, e) = sigmoid_of(logits(t, e));
          return;
        }
        T m = logits(t, 0);
        for (int64_t e = 1; e < E; ++e) m = logits(t, e) > m ? logits(t, e) : m;
        T z = 0;
        for (int64_t e = 0; e < E; ++e) z += (scores(t, e) = exp_of(logits(t, e) - m));
        for (int64_t e = 0; e < E; ++e) scores(t, e) /= z;
      });
}

// idx (N, k): the k experts with the largest score + bias (ties: lower index);
// weights (N, k): their combine weights (bias never enters a weight).
template <class T>
void router_topk(Index2 idx, Mat<T> weights, Mat<const T> scores, Vec<const float> bias, GateKind g) {
  const int64_t E = scores.extent(1), K = idx.extent(1);
  const bool normalize = g.normalize;
  const T scale = T(g.route_scale);
  Kokkos::parallel_for(
      "moe::router_topk", Kokkos::RangePolicy<ExecSpace>(0, scores.extent(0)), KOKKOS_LAMBDA(int64_t t) {
        T sum = 0;
        for (int64_t j = 0; j < K; ++j) {
          int32_t best = -1;
          T best_v = 0;
          for (int64_t e = 0; e < E; ++e) {
            bool taken = false;
            for (int64_t i = 0; i < j; ++i) taken |= idx(t, i) == e;
            const T v = scores(t, e) + T(bias(e));
            if (!taken && (best < 0 || v > best_v)) best = int32_t(e), best_v = v;
          }
          idx(t, j) = best;
          weights(t, j) = scores(t, best);
          sum += scores(t, best);
        }
        for (int64_t j = 0; j < K; ++j) weights(t, j) = (normalize ? weights(t, j) / sum : weights(t, j)) * scale;
      });
}

// counts (E), offsets (E+1), pos (N, k): where slot (t, j) lands in the
// expert-sorted batch, token_of (N*k): the token at each position.
inline void route_positions(Index1 counts, Index1 offsets, Index2 pos, Index1 token_of, Index2 idx) {
  const int64_t N = idx.extent(0), K = idx.extent(1), E = counts.extent(0), S = N * K;
  const int32_t* slot = idx.data();  // (N*k) slot t*k + j
  // A team row per expert; its lanes count, then scan, the slots in token order.
  Kokkos::parallel_for(
      "moe::count", row_policy(E), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, E, [&](int64_t e) {
          const int32_t c = row_sum(m, S, [&](int64_t s) { return int32_t(slot[s] == e); });
          row_single(m, [&] { counts(e) = c; });
        });
      });
  Kokkos::parallel_scan(
      "moe::offsets", Kokkos::RangePolicy<ExecSpace>(0, E + 1), KOKKOS_LAMBDA(int64_t e, int32_t& acc, bool final) {
        if (final) offsets(e) = acc;
        if (e < E) acc += counts(e);
      });
  Kokkos::parallel_for(
      "moe::positions", row_policy(E), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, E, [&](int64_t e) {
          const int32_t base = offsets(e);
          row_scan<int32_t>(m, S, [&](int64_t s, int32_t& before, bool final) {
            if (slot[s] != e) return;
            if (final) {
              pos(s / K, s % K) = base + before;
              token_of(base + before) = int32_t(s / K);
            }
            ++before;
          });
        });
      });
}

// xe (N*k, C): row p = x(token_of(p))
template <class T>
void dispatch_forward(Mat<T> xe, Mat<const T> x, Index1 token_of) {
  gather_rows<T>("moe::dispatch", xe, x, token_of);
}

// dx (N, C) = sum over the token's slots of dxe(pos(t, j)), in slot order
template <class T>
void dispatch_backward(Mat<T> dx, Mat<const T> dxe, Index2 pos) {
  const int64_t N = dx.extent(0), C = dx.extent(1), K = pos.extent(1);
  Kokkos::parallel_for(
      "moe::dispatch_backward", row_policy(N), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, N, [&](int64_t t) {
          row_for(m, C, [&](int64_t c) {
            T acc = 0;
            for (int64_t j = 0; j < K; ++j) acc += dxe(pos(t, j), c);
            dx(t, c) = acc;
          });
        });
      });
}

// out (N, C) += sum_j weights(t, j) * ye(pos(t, j))
template <class T>
void combine_forward(Mat<T> out, Mat<const T> ye, Mat<const T> weights, Index2 pos) {
  const int64_t N = out.extent(0), C = out.extent(1), K = pos.extent(1);
  Kokkos::parallel_for(
      "moe::combine", row_policy(N), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, N, [&](int64_t t) {
          row_for(m, C, [&](int64_t c) {
            T acc = 0;
            for (int64_t j = 0; j < K; ++j) acc += weights(t, j) * ye(pos(t, j), c);
            out(t, c) += acc;
          });
        });
      });
}

// dye (N*k, C) = weights * dout of the slot's token; dweights (N, k) = <dout(t), ye(pos(t, j))>
template <class T>
void combine_backward(Mat<T> dye, Mat<T> dweights, Mat<const T> dout, Mat<const T> ye, Mat<const T> weights,
                      Index2 pos) {
  const int64_t N = dout.extent(0), C = dout.extent(1), K = pos.extent(1);
  Kokkos::parallel_for(
      "moe::combine_backward", row_policy(N), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, N, [&](int64_t t) {
          for (int64_t j = 0; j < K; ++j) {
            const int64_t p = pos(t, j);
            // in channel order on the host, as the scalar loop this replaced
            const T dot = row_sum_ordered(m, C, [&](int64_t c) {
              const T d = dout(t, c) * ye(p, c);
              dye(p, c) = weights(t, j) * dout(t, c);
              return d;
            });
            row_single(m, [&] { dweights(t, j) = dot; });
          }
        });
      });
}

// dlogits (N, E) from the combine-weight gradients dweights (N, k) plus
// score_grad (E), a gradient added to every token's scores (the balance loss).
template <class T>
void router_backward(Mat<T> dlogits, Mat<const T> dweights, Mat<const T> scores, Index2 idx, Vec<const T> score_grad,
                     GateKind g) {
  const int64_t E = scores.extent(1), K = idx.extent(1);
  const bool sig = g.sigmoid, normalize = g.normalize;
  const T scale = T(g.route_scale);
  Kokkos::parallel_for(
      "moe::router_backward", Kokkos::RangePolicy<ExecSpace>(0, scores.extent(0)), KOKKOS_LAMBDA(int64_t t) {
        // ds into dlogits first, then through the gate function in place.
        for (int64_t e = 0; e < E; ++e) dlogits(t, e) = score_grad(e);
        T sum = 0, dot = 0;  // selected scores, and sum_j dw_j s_j
        for (int64_t j = 0; j < K; ++j) sum += scores(t, idx(t, j)), dot += dweights(t, j) * scores(t, idx(t, j));
        for (int64_t j = 0; j < K; ++j) {
          const int32_t e = idx(t, j);
          dlogits(t, e) += normalize ? scale * (dweights(t, j) / sum - dot / (sum * sum)) : scale * dweights(t, j);
        }
        if (sig) {
          for (int64_t e = 0; e < E; ++e) dlogits(t, e) *= scores(t, e) * (T(1) - scores(t, e));
        } else {
          T sd = 0;
          for (int64_t e = 0; e < E; ++e) sd += scores(t, e) * dlogits(t, e);
          for (int64_t e = 0; e < E; ++e) dlogits(t, e) = scores(t, e) * (dlogits(t, e) - sd);
        }
      });
}

// mean (E) = column means of scores (N, E): P_i of the balance loss; each
// expert's tokens summed in order
template <class T>
void score_means(Vec<T> mean, Mat<const T> scores) {
  const int64_t N = scores.extent(0), E = scores.extent(1);
  Kokkos::parallel_for(
      "moe::score_means", column_sum_policy<T>(E), KOKKOS_LAMBDA(const TeamMember& m) {
        column_sums(
            m, N, E, [&](int64_t t, int64_t e) { return scores(t, e); }, [&](int64_t e, T s) { mean(e) = s / T(N); });
      });
}

}  // namespace xx::kernels
