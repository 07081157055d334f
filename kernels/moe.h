// DeepSeekMoE routing: gate scores, top-k selection, token dispatch to
// per-expert batches and the weighted combine back, each with its backward.
// Nothing loops over tokens on the host and nothing uses atomics: positions
// are assigned expert by expert in token order, and every token gathers its
// own k contributions in slot order, so results are deterministic.
// Activation gradients are written (=).
// Team-shaped (kernels/team.h): the router (a team row per token, its experts
// in the vector lanes), the positions (a team row per expert), the dispatch
// and combine (a row per token, channels in its vector lanes), the score
// means (column sums); the sequence-wise balance loss (counts: a team row
// per (sequence, expert); means: column sums; backward: a team row per token).
// Group-limited routing (GateKind::groups > 1; DeepSeek-V2's
// group_limited_greedy, V3's noaux_tc): the experts fall into G groups of E/G
// in index order, a token first keeps its best topk_groups groups (softmax:
// by a group's largest score + bias; sigmoid: by the sum of its two largest)
// and picks its k experts inside them. G == 1 runs the plain top-k.
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
  int groups = 1;           // G expert groups (router_topk); 1: no grouping
  int topk_groups = 1;      // the groups a token keeps, 1 .. G
};

// The most groups router_topk takes: a token's kept groups are one 64-bit mask.
constexpr int kMaxRouterGroups = 64;

// scores (N, E) = softmax or sigmoid of logits (N, E)
template <class T>
void router_scores_forward(Mat<T> scores, Mat<const T> logits, GateKind g) {
  const int64_t N = logits.extent(0), E = logits.extent(1);
  const bool sig = g.sigmoid;
  Kokkos::parallel_for(
      "moe::router_scores", row_policy(N), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, N, [&](int64_t t) {
          if (sig) {
            row_for(m, E, [&](int64_t e) { scores(t, e) = sigmoid_of(logits(t, e)); });
            return;
          }
          const T top = row_max(m, E, [&](int64_t e) { return logits(t, e); });
          const T z = row_sum_ordered(m, E, [&](int64_t e) { return scores(t, e) = exp_of(logits(t, e) - top); });
          row_for(m, E, [&](int64_t e) { scores(t, e) /= z; });
        });
      });
}

// The first K items of [0, n) in the order (value descending, index
// ascending) among those open(i) admits, K at most their number: pick(j, i)
// for the j-th, on every lane. value(i) is never NaN. The one selection loop
// of both routers (router_topk, router_topk_grouped): slot j takes the item
// that follows slot j - 1's in the order (a max over the open items after it,
// then the first open item holding that max), and every lane keeps the
// previous pick, so no lane reads what another wrote.
template <class T, class Member, class Value, class Open, class Pick>
KOKKOS_FORCEINLINE_FUNCTION void pick_in_order(const Member& m, int64_t n, int64_t K, const Value& value,
                                               const Open& open, const Pick& pick) {
  T prev_v = kmath::infinity<T>();
  int64_t prev_i = -1;
  const auto after_prev = [&](int64_t i, T v) { return open(i) && (v < prev_v || (v == prev_v && i > prev_i)); };
  for (int64_t j = 0; j < K; ++j) {
    const T top = row_max(m, n, [&](int64_t i) {
      const T v = value(i);
      return after_prev(i, v) ? v : -kmath::infinity<T>();
    });
    const int64_t best = row_first(m, n, [&](int64_t i) {
      const T v = value(i);
      return v == top && after_prev(i, v);
    });
    prev_v = top, prev_i = best;
    pick(j, best);
  }
}

// router_topk under G = g.groups > 1 groups of P = E / G experts (expert e in
// group e / P): each token ranks the groups by a group value (softmax gate:
// the largest score + bias of its experts, DeepSeek-V2's; sigmoid gate: the
// sum of its two largest, DeepSeek-V3's; a NaN sum ranks as -inf), keeps the
// first g.topk_groups in the order (value descending, index ascending), then
// picks its k experts as router_topk does, among the kept groups' only. The
// deck guarantees k <= topk_groups x P and G <= kMaxRouterGroups. A lane
// computes a group's value alone (P is small: 20 in V2, 32 in V3), the lanes
// share the groups.
// Backward: router_backward as it is. Which groups are kept, like which
// experts are picked, is a step function of the logits (its derivative is zero
// wherever it is defined); the weights are the picked experts' scores (or
// their normalised shares), the same functions of the scores as without groups.
template <class T>
void router_topk_grouped(Index2 idx, Mat<T> weights, Mat<const T> scores, Vec<const float> bias, GateKind g) {
  const int64_t N = scores.extent(0), E = scores.extent(1), K = idx.extent(1);
  const int64_t G = g.groups, kept_groups = g.topk_groups, P = E / G;
  const bool normalize = g.normalize, top_two = g.sigmoid;
  const T scale = T(g.route_scale);
  Kokkos::parallel_for(
      "moe::router_topk_grouped", row_policy(N), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, N, [&](int64_t t) {
          const auto value = [&](int64_t e) {
            const T v = scores(t, e) + T(bias(e));
            return v == v ? v : -kmath::infinity<T>();
          };
          const auto group_value = [&](int64_t q) {
            T first = -kmath::infinity<T>(), second = -kmath::infinity<T>();
            for (int64_t e = q * P; e < (q + 1) * P; ++e) {
              const T v = value(e);
              if (v > first) second = first, first = v;
              else if (v > second) second = v;
            }
            const T s = top_two ? first + second : first;
            return s == s ? s : -kmath::infinity<T>();  // inf + -inf
          };
          uint64_t kept = 0;  // bit q: group q kept
          pick_in_order<T>(
              m, G, kept_groups, group_value, [](int64_t) { return true; },
              [&](int64_t, int64_t q) { kept |= uint64_t(1) << q; });
          T sum = 0;
          pick_in_order<T>(
              m, E, K, value, [&](int64_t e) { return ((kept >> (e / P)) & 1) != 0; },
              [&](int64_t j, int64_t best) {
                const T s = scores(t, best);
                sum += s;
                row_single(m, [&] { idx(t, j) = int32_t(best), weights(t, j) = s; });
              });
          row_single(m, [&] {  // the lane that wrote the weights rescales them
            for (int64_t j = 0; j < K; ++j) weights(t, j) = (normalize ? weights(t, j) / sum : weights(t, j)) * scale;
          });
        });
      });
}

// idx (N, k): the k experts with the largest score + bias (ties: lower index;
// a NaN ranks as -inf); weights (N, k): their combine weights (bias never
// enters a weight). The selection is pick_in_order over every expert: slot j
// takes the expert that follows slot j - 1's in the order (value descending,
// index ascending). With g.groups > 1, only inside the token's best groups
// (router_topk_grouped).
template <class T>
void router_topk(Index2 idx, Mat<T> weights, Mat<const T> scores, Vec<const float> bias, GateKind g) {
  if (g.groups > 1) return router_topk_grouped<T>(idx, weights, scores, bias, g);
  const int64_t N = scores.extent(0), E = scores.extent(1), K = idx.extent(1);
  const bool normalize = g.normalize;
  const T scale = T(g.route_scale);
  Kokkos::parallel_for(
      "moe::router_topk", row_policy(N), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, N, [&](int64_t t) {
          const auto value = [&](int64_t e) {
            const T v = scores(t, e) + T(bias(e));
            return v == v ? v : -kmath::infinity<T>();
          };
          T sum = 0;
          pick_in_order<T>(
              m, E, K, value, [](int64_t) { return true; },
              [&](int64_t j, int64_t best) {
                const T s = scores(t, best);
                sum += s;
                row_single(m, [&] { idx(t, j) = int32_t(best), weights(t, j) = s; });
              });
          row_single(m, [&] {  // the lane that wrote the weights rescales them
            for (int64_t j = 0; j < K; ++j) weights(t, j) = (normalize ? weights(t, j) / sum : weights(t, j)) * scale;
          });
        });
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
// score_grad(t, e), a gradient added to token t's score e (the balance loss).
template <class T, class ScoreGrad>
void router_backward_with(Mat<T> dlogits, Mat<const T> dweights, Mat<const T> scores, Index2 idx,
                          ScoreGrad score_grad, GateKind g) {
  const int64_t N = scores.extent(0), E = scores.extent(1), K = idx.extent(1);
  const bool sig = g.sigmoid, normalize = g.normalize;
  const T scale = T(g.route_scale);
  Kokkos::parallel_for(
      "moe::router_backward", row_policy(N), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, N, [&](int64_t t) {
          // every lane sums the k selected slots itself (k is small)
          T sum = 0, dot = 0;  // selected scores, and sum_j dw_j s_j
          for (int64_t j = 0; j < K; ++j) sum += scores(t, idx(t, j)), dot += dweights(t, j) * scores(t, idx(t, j));
          // ds = score_grad + the selected slot's term (the k experts are distinct)
          const auto ds = [&](int64_t e) {
            T d = score_grad(t, e);
            for (int64_t j = 0; j < K; ++j)
              if (idx(t, j) == e)
                d += normalize ? scale * (dweights(t, j) / sum - dot / (sum * sum)) : scale * dweights(t, j);
            return d;
          };
          if (sig) {
            row_for(m, E, [&](int64_t e) { dlogits(t, e) = ds(e) * (scores(t, e) * (T(1) - scores(t, e))); });
          } else {
            // each lane reads back only the experts it wrote (same lane split in row_for and row_sum)
            row_for(m, E, [&](int64_t e) { dlogits(t, e) = ds(e); });
            const T sd = row_sum_ordered(m, E, [&](int64_t e) { return scores(t, e) * dlogits(t, e); });
            row_for(m, E, [&](int64_t e) { dlogits(t, e) = scores(t, e) * (dlogits(t, e) - sd); });
          }
        });
      });
}

// The balance loss's gradient at token t's score e, as router_backward_with
// reads it (plain functors: a kernel's lambda captures them on every backend).
template <class T>
struct ScoreGradPerExpert {  // the batch-level loss: the same (E) for every token
  Vec<const T> grad;
  KOKKOS_INLINE_FUNCTION T operator()(int64_t, int64_t e) const { return grad(e); }
};
template <class T>
struct ScoreGradPerToken {  // the sequence-wise loss: (N, E), each token its own
  Mat<const T> grad;
  KOKKOS_INLINE_FUNCTION T operator()(int64_t t, int64_t e) const { return grad(t, e); }
};

// The batch-level balance loss: score_grad (E) added to every token's scores.
template <class T>
void router_backward(Mat<T> dlogits, Mat<const T> dweights, Mat<const T> scores, Index2 idx, Vec<const T> score_grad,
                     GateKind g) {
  router_backward_with<T>(dlogits, dweights, scores, idx, ScoreGradPerExpert<T>{score_grad}, g);
}

// The sequence-wise balance loss: score_grad (N, E), its own gradient per token.
template <class T>
void router_backward(Mat<T> dlogits, Mat<const T> dweights, Mat<const T> scores, Index2 idx, Mat<const T> score_grad,
                     GateKind g) {
  router_backward_with<T>(dlogits, dweights, scores, idx, ScoreGradPerToken<T>{score_grad}, g);
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

// ---------------------------------------------------------------------------
// The sequence-wise balance loss (DeepSeek-V2's seq_aux, DeepSeek-V3's
// complementary loss). The N = B*T rows are B sequences of T tokens (row
// b*T + t). Per sequence b and routed expert e, with k experts per token,
//   f(b, e) = E / (k T) * (the tokens of b whose k chosen include e)
//   P(b, e) = 1/T * sum_t s'(t, e),  s' = s / sum_j s_j under the sigmoid
//             gate (softmax scores already sum to one: s' = s)
//   L = alpha / B * sum_b sum_e f(b, e) P(b, e)
// f holds counts: the gradient reaches the scores through P alone. The host
// forms L and coef(b, e) = alpha * f(b, e) / B (times the loss scale) from
// counts and means; the backward turns coef into every token's score gradient.

// counts (B, E) = how many of sequence b's tokens chose expert e, from idx
// (N, k): a team row per (sequence, expert), its lanes count the sequence's slots.
inline void sequence_expert_counts(Index2 counts, Index2 idx) {
  const int64_t N = idx.extent(0), K = idx.extent(1), B = counts.extent(0), E = counts.extent(1);
  const int64_t slots = N / B * K;   // a sequence's slots: [b * slots, (b + 1) * slots)
  const int32_t* slot = idx.data();  // (N*k)
  Kokkos::parallel_for(
      "moe::sequence_counts", row_policy(B * E), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, B * E, [&](int64_t be) {
          const int64_t b = be / E, e = be % E;
          const int32_t c = row_sum(m, slots, [&](int64_t s) { return int32_t(slot[b * slots + s] == e); });
          row_single(m, [&] { counts(b, e) = c; });
        });
      });
}

// mean (B, E) = P(b, e) from scores (N, E); normalize: each token's scores
// divided by their sum first (sums (N) keeps those sums). Each (sequence,
// expert) sums its tokens in order.
template <class T>
void sequence_score_means(Mat<T> mean, Vec<T> sums, Mat<const T> scores, bool normalize) {
  const int64_t N = scores.extent(0), E = scores.extent(1), B = mean.extent(0), seq = N / B;
  if (normalize)
    Kokkos::parallel_for(
        "moe::score_sums", row_policy(N), KOKKOS_LAMBDA(const TeamMember& m) {
          for_rows(m, N, [&](int64_t t) {
            const T s = row_sum_ordered(m, E, [&](int64_t e) { return scores(t, e); });
            row_single(m, [&] { sums(t) = s; });
          });
        });
  // the B*E (sequence, expert) pairs as columns c = b*E + e, each over its seq tokens
  Kokkos::parallel_for(
      "moe::sequence_score_means", column_sum_policy<T>(B * E), KOKKOS_LAMBDA(const TeamMember& m) {
        column_sums(
            m, seq, B * E,
            [&](int64_t t, int64_t c) {
              const int64_t row = (c / E) * seq + t;
              return normalize ? scores(row, c % E) / sums(row) : scores(row, c % E);
            },
            [&](int64_t c, T s) { mean(c / E, c % E) = s / T(seq); });
      });
}

// score_grad (N, E) = dL/ds of every token's scores, from coef (B, E), with
// seq = N / B tokens per sequence and S_t = sum_j s(t, j):
//   softmax (s' = s):    coef(b, e) / seq
//   normalize (sigmoid): (coef(b, e) / S_t - sum_i coef(b, i) s(t, i) / S_t^2) / seq
template <class T>
void sequence_balance_backward(Mat<T> score_grad, Mat<const T> coef, Mat<const T> scores, bool normalize) {
  const int64_t N = scores.extent(0), E = scores.extent(1), B = coef.extent(0), seq = N / B;
  Kokkos::parallel_for(
      "moe::sequence_balance_backward", row_policy(N), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, N, [&](int64_t t) {
          const int64_t b = t / seq;
          if (!normalize) {
            row_for(m, E, [&](int64_t e) { score_grad(t, e) = coef(b, e) / T(seq); });
            return;
          }
          const T sum = row_sum_ordered(m, E, [&](int64_t e) { return scores(t, e); });
          const T dot = row_sum_ordered(m, E, [&](int64_t e) { return coef(b, e) * scores(t, e); });
          row_for(m, E, [&](int64_t e) { score_grad(t, e) = (coef(b, e) - dot / sum) / (sum * T(seq)); });
        });
      });
}

}  // namespace xx::kernels
