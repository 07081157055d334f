#include "model/transformer.h"
#include <algorithm>
#include <stdexcept>
#include <type_traits>
#include <fmt/format.h>
#include "core/device_memory.h"
#include "core/host_memory.h"
#include "core/rng.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/precision.h"
#include "kernels/rmsnorm.h"

namespace xx {
namespace k = kernels;

// ---------------------------------------------------------------------------
// Recompute

std::set<std::string> recomputed_activations(const ModelConfig& m) {
  if (m.recompute == Recompute::off) return {};
  // expert_in: the routed rows sent, gathered again (ep 1) or not read again (ep: the holders keep what they ran)
  std::set<std::string> names{"xn", "xn2", "ffn_a", "expert_a", "held_a", "expert_in"};
  if (m.attention.mla()) names.insert({"qan", "cn", "q", "k", "v"});
  if (m.moe.ep <= 1) names.insert("expert_out");  // the routed rows' outputs, multiplied again (under ep they came home)
  return names;  // (full shares every activation of a block: Workspace::share_kept)
}

std::string recompute_report(const ModelConfig& m) {
  switch (m.recompute) {
    case Recompute::selective:
      return std::string("selective: the backward remakes the RMSNorm outputs") +
             (m.attention.mla() ? ", MLA's normed latents and q, k, v from them (wq_b, wkv_b)" : "") +
             ", the SwiGLU outputs (from the kept gate/up; under 16 bits its GEMM again)" +
             (!m.moe.enabled() ? ""
              : m.moe.ep <= 1 ? " and the routed rows' inputs and outputs (gathered, down GEMM)"
                              : " and the routed rows sent (not read again)") +
             "; one set for all blocks";
    case Recompute::full:
      return "full: each block's input kept; its backward reruns its forward into one set shared by all blocks "
             "(MTP's too), balance loss and expert counts left as the forward set them";
    default:
      return "off: every activation kept for the backward";
  }
}

// ---------------------------------------------------------------------------
// Block

template <class T>
Block<T>::Block(const ModelConfig& m, const ParamStore<T>& store, const std::string& p, bool moe, int64_t batch,
                Workspace<T>& ws)
    : N_(batch * m.seq), C_(m.dim), eps_(m.norm_eps), ws_(ws), attn_norm_(store(p + "attn_norm")),
      ffn_norm_(store(p + "ffn_norm")), attn_(m, store, p, batch, ws), ffn_(m, store, p, moe, batch, ws) {
  restore_ = m.recompute == Recompute::full        ? &Block::restore_forward
             : m.recompute == Recompute::selective ? &Block::restore_norms
                                                   : &Block::restore_nothing;
  xn_ = KeptActivation<T>("xn", N_, C_, store.type, ws);
  rstd1_ = ws.activation("rstd1", N_);
  xmid_ = ws.activation("xmid", N_, C_);
  xn2_ = KeptActivation<T>("xn2", N_, C_, store.type, ws);
  rstd2_ = ws.activation("rstd2", N_);
}

// selective: the normed inputs again, from the block's input and the residual
// after attention, which it keeps (rstd comes out the same bits).
template <class T>
void Block<T>::restore_norms(Mat<const T> x_in) {
  norm_input(x_in);
  norm_middle();
}

// full: the forward again from the block's input, its output to scratch; the
// FFN replays without its side effects (balance loss and seeds; the expert
// counts it sets are the same). Under ep the replay's all-to-alls run again,
// on every rank of the group in the same block order (ExchangeStats counts them).
template <class T>
void Block<T>::restore_forward(Mat<const T> x_in) {
  attention_half(x_in);
  auto out = ws_.mat("block_replay_out", N_, C_);
  Kokkos::deep_copy(Buffer<T>(out.data(), N_ * C_), xmid_);
  ffn_.replay(out, xn2_.in());
}

template <class T>
void Block<T>::forward(Mat<T> x_out, Mat<const T> x_in) {
  attention_half(x_in);
  Kokkos::deep_copy(Buffer<T>(x_out.data(), N_ * C_), xmid_);
  ffn_.forward(x_out, xn2_.in());
}

// The block's two normed inputs (xn from x_in, xn2 from the residual after attention).
template <class T>
void Block<T>::norm_input(Mat<const T> x_in) {
  k::rmsnorm_forward<T>(xn_.target(), Vec<T>(rstd1_.data(), N_), x_in, attn_norm_.vec(C_), eps_);
  xn_.keep();
}

template <class T>
void Block<T>::norm_middle() {
  k::rmsnorm_forward<T>(xn2_.target(), Vec<T>(rstd2_.data(), N_), mat(xmid_, N_, C_), ffn_norm_.vec(C_), eps_);
  xn2_.keep();
}

// xmid = x_in + attention(norm(x_in)), and the FFN's normed input from it.
template <class T>
void Block<T>::attention_half(Mat<const T> x_in) {
  norm_input(x_in);
  Kokkos::deep_copy(xmid_, Buffer<T>(const_cast<T*>(x_in.data()), N_ * C_));  // residual: the branch adds into x
  attn_.forward(mat(xmid_, N_, C_), xn_.in());
  norm_middle();
}

template <class T>
void Block<T>::backward(Mat<T> dx, Mat<const T> x_in) {
  (this->*restore_)(x_in);
  auto dnorm = ws_.mat("block_dnorm", N_, C_), dbranch = ws_.mat("block_dbranch", N_, C_);
  Vec<T> dx_flat(dx.data(), N_ * C_);
  Vec<const T> dbranch_flat(dbranch.data(), N_ * C_);
  ffn_.backward(dnorm, dx, xn2_.in());
  k::rmsnorm_backward<T>(dbranch, ffn_norm_.dvec(C_), dnorm, mat(xmid_, N_, C_), ffn_norm_.vec(C_),
                         Vec<const T>(rstd2_.data(), N_));
  k::add_inplace<T>(dx_flat, dbranch_flat);
  attn_.backward(dnorm, dx, xn_.in());
  k::rmsnorm_backward<T>(dbranch, attn_norm_.dvec(C_), dnorm, x_in, attn_norm_.vec(C_), Vec<const T>(rstd1_.data(), N_));
  k::add_inplace<T>(dx_flat, dbranch_flat);
}

// ---------------------------------------------------------------------------
// Transformer

template <class T>
Transformer<T>::Transformer(const ModelConfig& config, int batch, kernels::Precision gemm_type, int ep_rank,
                            const StageCut& stage, const std::vector<int>& activation_sets, bool scratch_per_run)
    : cfg_(config), layout_(config, ep_rank, stage), B_(batch), T_(config.seq), N_(int64_t(batch) * config.seq) {
  const StageCut& cut = layout_.stage();
  if (!activation_sets.empty() &&
      (activation_sets.size() != cut.runs.size() || *std::min_element(activation_sets.begin(), activation_sets.end()) < 1))
    throw std::invalid_argument(fmt::format("Transformer: sets of activations {} for {} runs of layers (expected 1 or "
                                            "more per run)", fmt::join(activation_sets, ","), cut.runs.size()));
  if constexpr (!std::is_same_v<T, float>) gemm_type = kernels::Precision::fp32;  // gradient checks: T throughout
  gemm_type_ = gemm_type;
  // Not touched here: init writes them, and under sharding a rank never
  // touches the pages it will not keep (host memory is taken at first write).
  params_ = Buffer<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Transformer::params"), layout_.total());
  if (kernel_memory_on_host()) {
    // In huge pages: shard gradients hands it back to the kernel every step (core/host_memory.h).
    grads_memory_ = huge_page_memory(layout_.total() * int64_t(sizeof(T)));
    grads_ = Buffer<T>(static_cast<T*>(grads_memory_.get()), layout_.total());
  } else {
    grads_ = Buffer<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Transformer::grads"), layout_.total());
  }
  if (gemm_type != kernels::Precision::fp32)
    params_half_ = Buffer<uint16_t>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Transformer::params(16-bit)"),
                                    layout_.total());
  const ParamStore<T> store{&layout_, params_.data(), grads_.data(), params_half_.data(), gemm_type};
  units_ = layout_.weight_units();
  if (layout_.has("embed")) embed_ = store("embed");
  hold_embed_ = cfg_.mtp.depth > 0 || layout_.tied();
  if (!cut.whole() && cfg_.mtp.depth > 0) {  // the MTP lookups' gradients travel from the last stage to the first
    // (a V-shape's first stage holds both ends: its lookups take the same way, in the unsplit order)
    if (cut.first()) mtp_in_ = Kokkos::View<int32_t*, MemSpace>("Transformer::mtp_in", N_);
    if (cut.last()) lookups_elsewhere_ = true;
  }
  if (cut.last()) norm_ = store("norm"), head_ = store(layout_.head_name());  // tied: the embedding itself
  sets_.resize(cut.runs.size());
  for (size_t r = 0; r < cut.runs.size(); ++r) {
    if (r == 0 || scratch_per_run) scratch_.push_back(std::make_unique<Workspace<T>>());
    for (int k = 0; k < (activation_sets.empty() ? 1 : activation_sets[r]); ++k) {
      sets_[r].push_back(std::make_unique<Activations>());
      sets_[r].back()->ws = scratch_.back().get();
      build_activations(*sets_[r].back(), store, batch, cut.runs[r]);
    }
    // A MoE layer's selection bias is the layer's, whichever set runs it.
    const auto first = moe_layers(*sets_[r][0]);
    for (size_t k = 1; k < sets_[r].size(); ++k) {
      const auto layers = moe_layers(*sets_[r][k]);
      for (size_t l = 0; l < layers.size(); ++l) layers[l].second->bias() = first[l].second->bias();
    }
    in_use_.push_back(sets_[r][0].get());
  }
}

// One set of a micro-batch's activations in one run of blocks: its blocks,
// its residual streams, and in the last chunk the head's and the MTP modules'.
template <class T>
void Transformer<T>::build_activations(Activations& a, const ParamStore<T>& store, int batch, const LayerRun& run) {
  const StageCut& cut = layout_.stage();
  const int64_t C = cfg_.dim, V = cfg_.vocab;
  Workspace<T>& ws = *a.ws;
  // recompute: what every block remakes in its backward is one set for all
  // of them, and for every set of activations (it is remade before it is read)
  ws.share_kept(recomputed_activations(cfg_), cfg_.recompute == Recompute::full);
  a.blocks.resize(size_t(cfg_.layers));  // another run's blocks stay null
  for (int l = run.begin; l < run.end; ++l) {
    ws.begin_owner();
    a.blocks[size_t(l)] = std::make_unique<Block<T>>(cfg_, store, "layers." + std::to_string(l) + ".",
                                                     cfg_.moe.is_moe_layer(l), batch, ws);
  }
  ws.share_kept({});
  a.resid.resize(size_t(cfg_.layers) + 1);  // the run's blocks + 1 streams
  for (int l = run.begin; l <= run.end; ++l) a.resid[size_t(l)] = activation<T>("resid", N_, C);
  if (run.chunk != cut.chunks - 1) return;  // the head and the MTP modules are the last chunk's
  if (lookups_elsewhere_) a.mtp_lookups = activation<T>("mtp_lookups", mtp_lookups_size());
  a.xf = KeptActivation<T>("xf", N_, C, gemm_type_, ws);
  a.rstdf = activation<T>("rstdf", N_);
  a.logits = activation<T>("logits", N_, V);
  a.losses = activation<T>("losses", N_);
  for (int d = 0; d < cfg_.mtp.depth; ++d) {
    const std::string p = "mtp." + std::to_string(d) + ".";
    MtpModule mod;
    mod.hnorm = store(p + "hnorm");
    mod.enorm = store(p + "enorm");
    mod.proj = store(p + "proj");
    mod.norm = store(p + "norm");
    ws.share_kept(recomputed_activations(cfg_), cfg_.recompute == Recompute::full);  // the same set as the trunk's
    ws.begin_owner();
    mod.block = std::make_unique<Block<T>>(cfg_, store, p, cfg_.moe.is_moe_layer(cfg_.layers + d), batch, ws);
    ws.share_kept({});
    for (auto* b : {&mod.hn, &mod.e, &mod.en, &mod.x0, &mod.h}) *b = activation<T>("mtp", N_, C);
    for (auto* b : {&mod.rstd_h, &mod.rstd_e, &mod.rstd_f, &mod.losses}) *b = activation<T>("mtp", N_);
    mod.hf = KeptActivation<T>("mtp_hf", N_, C, gemm_type_, ws);
    mod.cat = KeptActivation<T>("mtp_cat", N_, 2 * C, gemm_type_, ws);
    mod.logits = activation<T>("mtp_logits", N_, V);
    mod.in = Kokkos::View<int32_t*, MemSpace>("mtp_in", N_);
    mod.target = Kokkos::View<int32_t*, MemSpace>("mtp_target", N_);
    mod.labelled = B_ * std::max<int64_t>(0, T_ - d - 1);
    a.mtp.push_back(std::move(mod));
  }
}

template <class T>
void Transformer<T>::use_activations(int run, int set) {
  if (run < 0 || run >= int(sets_.size()) || set < 0 || set >= activation_sets(run))
    throw std::invalid_argument(fmt::format("Transformer: activation set {} of run {} ({} runs; {} sets)", set, run,
                                            sets_.size(), run >= 0 && run < int(sets_.size()) ? activation_sets(run) : 0));
  in_use_[size_t(run)] = sets_[size_t(run)][size_t(set)].get();
}

template <class T>
const typename Transformer<T>::Activations& Transformer<T>::holding(int layer) const {
  const auto& runs = layout_.stage().runs;
  for (size_t r = 0; r < runs.size(); ++r)
    if (layer >= runs[r].begin && layer < runs[r].end) return *in_use_[r];
  return *in_use_.back();  // the head and the MTP modules: the last chunk's
}

template <class T>
Vec<T> Transformer<T>::window(Buffer<T>& b, const std::string& name) {
  const auto& t = layout_.at(name);
  return Vec<T>(b.data() + t.offset, t.size);
}

template <class T>
void Transformer<T>::write_weights(uint64_t seed, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  // On the host params_ itself: only the ranges' pages are touched (sharding).
  auto host = host_staging(params_);
  for (const auto& t : layout_.tensors()) {
    const uint64_t stream = mix_seed(seed, 0x1217, uint64_t(t.full_offset));  // the same weights at any ep
    for (const auto& [begin, end] : ranges)
      for (int64_t i = std::max(begin, t.offset) - t.offset; i < std::min(end, t.offset + t.size) - t.offset; ++i)
        host(t.offset + i) = t.is_norm ? T(1) : T(t.init_std * normal(stream, uint64_t(i)));
  }
  if (host.data() != params_.data())
    for (const auto& [begin, end] : ranges)
      Kokkos::deep_copy(Kokkos::subview(params_, std::pair(begin, end)), Kokkos::subview(host, std::pair(begin, end)));
}

template <class T>
void Transformer<T>::init(uint64_t seed) {
  write_weights(seed, {{0, layout_.total()}});
  refresh_half_weights();
  zero_grads();
}

template <class T>
void Transformer<T>::init_sharded(uint64_t seed, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  write_weights(seed, ranges);
  if (kernel_memory_on_host()) {
    ExecSpace().fence();
    zero_and_release(grads_.data(), int64_t(grads_.extent(0) * sizeof(T)));
  } else {
    zero_grads();
  }
}

template <class T>
void Transformer<T>::zero_grads() {
  Kokkos::deep_copy(grads_, T(0));
}

template <class T>
void Transformer<T>::set_loss_scale(double scale) {
  loss_scale_ = scale;
  for (auto& run : sets_)
    for (auto& a : run)
      for (auto& [name, f] : moe_layers(*a)) f->set_loss_scale(scale);
}

template <class T>
void Transformer<T>::refresh_half_weights() {
  if (half_source_) return half_source_->refresh_half_weights();
  if (params_half_.extent(0) > 0 && !gate_)
    k::pack_half(params_half_.data(), params_.data(), int64_t(params_.extent(0)), gemm_type_);
}

// Under a gate the 16-bit copy of a unit lives as long as its gathered
// weights: made after the gather, its pages returned with them.
template <class T>
void Transformer<T>::use(int unit, int next) {
  if (!gate_) return;
  gate_->need(unit, next);
  const WeightUnit& u = units_[unit];
  if (params_half_.extent(0) > 0)
    k::pack_half(params_half_.data() + u.begin, params_.data() + u.begin, u.end - u.begin, gemm_type_);
}

template <class T>
void Transformer<T>::let_go(int unit) {
  if (!gate_) return;
  const WeightUnit& u = units_[unit];
  if (kernel_memory_on_host() && params_half_.extent(0) > 0) {
    ExecSpace().fence();
    release_whole_pages(params_half_.data() + u.begin, (u.end - u.begin) * int64_t(sizeof(uint16_t)));
  }
  gate_->done(unit);
}

template <class T>
std::vector<std::pair<std::string, FeedForward<T>*>> Transformer<T>::moe_layers() {
  std::vector<std::pair<std::string, FeedForward<T>*>> out;
  for (Activations* a : in_use_)
    for (auto& layer : moe_layers(*a)) out.push_back(layer);
  return out;
}

template <class T>
std::vector<std::pair<std::string, FeedForward<T>*>> Transformer<T>::moe_layers(Activations& a) {
  std::vector<std::pair<std::string, FeedForward<T>*>> out;
  for (size_t l = 0; l < a.blocks.size(); ++l)
    if (a.blocks[l] && a.blocks[l]->ffn().is_moe()) out.emplace_back("layers." + std::to_string(l) + ".", &a.blocks[l]->ffn());
  for (size_t d = 0; d < a.mtp.size(); ++d)
    if (a.mtp[d].block->ffn().is_moe()) out.emplace_back("mtp." + std::to_string(d) + ".", &a.mtp[d].block->ffn());
  return out;
}

template <class T>
bool Transformer<T>::idle_expert(const TensorInfo& t) const {
  if (t.expert < 0) return false;
  const bool main = t.layer < cfg_.layers;
  const Activations& a = holding(t.layer);
  auto& ffn = main ? const_cast<Block<T>&>(*a.blocks[t.layer]).ffn() : a.mtp[t.layer - cfg_.layers].block->ffn();
  if (ffn.held() < cfg_.moe.routed) {  // ep: the rows of the whole group
    const int64_t x = t.expert - ffn.first_held();
    return main ? ffn.held_rows(x) == 0 : ffn.held_labelled_rows(x) == 0;
  }
  if (main) return ffn.expert_counts()[t.expert] == 0;
  // An MTP expert whose tokens all sit past the window's end (no label) gets
  // no gradient either: those positions reach no loss.
  const auto& m = a.mtp[t.layer - cfg_.layers];
  return ffn.labelled_expert_counts(Tokens(m.target.data(), N_))[t.expert] == 0;
}

template <class T>
void Transformer<T>::set_expert_exchange(ExpertExchange* exchange, int run) {
  for (size_t r = 0; r < sets_.size(); ++r)
    for (auto& a : sets_[r]) {
      if (run >= 0 && size_t(run) != r) continue;
      for (auto& [prefix, ffn] : moe_layers(*a)) ffn->set_exchange(exchange);
      for (auto& m : a->mtp)  // an MTP expert's rows past the window's end reach no loss: counted as they travel
        if (m.block->ffn().is_moe()) m.block->ffn().set_row_labels(Tokens(m.target.data(), N_));
    }
}

// The last stage's part of the forward: the final norm, the head and the MTP
// modules on the residual stream resid[L]; the main and MTP losses.
template <class T>
LossParts Transformer<T>::head_forward(Activations& a, Tokens targets) {
  const int64_t C = cfg_.dim, V = cfg_.vocab, L = cfg_.layers;
  LossParts loss;
  const int D = int(a.mtp.size());
  use(final_unit(), D > 0 ? mtp_unit(0) : -1);  // the head serves every MTP depth too
  k::rmsnorm_forward<T>(a.xf.target(), Vec<T>(a.rstdf.data(), N_), mat(a.resid[L], N_, C), norm_.vec(C), cfg_.norm_eps);
  a.xf.keep();
  k::linear_forward<T>(mat(a.logits, N_, V), a.xf.in(), head_.in(V, C));
  k::cross_entropy_forward<T>(Vec<T>(a.losses.data(), N_), mat(a.logits, N_, V), targets);
  loss.main = k::sum<T>(Vec<const T>(a.losses.data(), N_)) / double(N_);

  // Multi-token prediction: depth d sees the hidden state of depth d-1 and the
  // embedding of token t+d+1, and predicts token t+d+2.
  Buffer<T> h_prev = a.resid[L];
  for (size_t d = 0; d < a.mtp.size(); ++d) {
    auto& m = a.mtp[d];
    use(mtp_unit(int(d)), int(d) + 1 < D ? mtp_unit(int(d) + 1) : -1);
    k::shift_tokens(m.in, targets, T_, int64_t(d), 0);
    k::shift_tokens(m.target, targets, T_, int64_t(d) + 1, -1);
    Tokens in(m.in.data(), N_), target(m.target.data(), N_);
    k::rmsnorm_forward<T>(mat(m.hn, N_, C), Vec<T>(m.rstd_h.data(), N_), mat(h_prev, N_, C), m.hnorm.vec(C),
                          cfg_.norm_eps);
    k::embedding_forward<T>(mat(m.e, N_, C), in, embed_.mat(V, C));
    k::rmsnorm_forward<T>(mat(m.en, N_, C), Vec<T>(m.rstd_e.data(), N_), mat(m.e, N_, C), m.enorm.vec(C), cfg_.norm_eps);
    k::concat_columns_forward<T>(m.cat.target(), mat(m.hn, N_, C), mat(m.en, N_, C));
    m.cat.keep();
    k::linear_forward<T>(mat(m.x0, N_, C), m.cat.in(), m.proj.in(C, 2 * C));
    m.block->forward(mat(m.h, N_, C), mat(m.x0, N_, C));
    k::rmsnorm_forward<T>(m.hf.target(), Vec<T>(m.rstd_f.data(), N_), mat(m.h, N_, C), m.norm.vec(C), cfg_.norm_eps);
    m.hf.keep();
    k::linear_forward<T>(mat(m.logits, N_, V), m.hf.in(), head_.in(V, C));
    k::cross_entropy_forward<T>(Vec<T>(m.losses.data(), N_), mat(m.logits, N_, V), target);
    if (m.labelled > 0) loss.mtp += k::sum<T>(Vec<const T>(m.losses.data(), N_)) / double(m.labelled);
    h_prev = m.h;
    let_go(mtp_unit(int(d)));
  }
  let_go(final_unit());
  if (hold_embed_) let_go(0);
  if (!a.mtp.empty()) loss.mtp /= double(a.mtp.size());
  return loss;
}

template <class T>
LossParts Transformer<T>::forward(Tokens inputs, Tokens targets) {
  Activations& a = *in_use_[0];  // the set in use
  const int64_t C = cfg_.dim, V = cfg_.vocab, L = cfg_.layers;
  check_whole("forward");
  use(0, block_unit(0));  // the embedding, kept while MTP modules look tokens up, or while it is the head
  k::embedding_forward<T>(mat(a.resid[0], N_, C), inputs, embed_.mat(V, C));
  if (!hold_embed_) let_go(0);
  for (int l = 0; l < L; ++l) {
    use(block_unit(l), l + 1 < L ? block_unit(l + 1) : final_unit());
    a.blocks[l]->forward(mat(a.resid[l + 1], N_, C), mat(a.resid[l], N_, C));
    let_go(block_unit(l));
  }
  LossParts loss = head_forward(a, targets);
  for (auto& [name, f] : moe_layers()) loss.aux += f->aux_loss();
  loss.total = loss.main + cfg_.mtp.weight * loss.mtp + loss.aux;
  return loss;
}

// The last stage's part of the backward: the head, the final norm and the
// MTP modules, deepest first; d(loss)/d(resid[L]) into dresid.
template <class T>
void Transformer<T>::head_backward(Activations& a, Tokens targets, Mat<T> dresid) {
  const int64_t C = cfg_.dim, V = cfg_.vocab, L = cfg_.layers;
  // main head and final norm; dlogits overwrite the logits in place
  const int D = int(a.mtp.size());
  if (layout_.tied()) use(0, final_unit());  // the head's weights are the embedding's
  use(final_unit(), D > 0 ? mtp_unit(D - 1) : L > 0 ? block_unit(L - 1) : -1);
  auto dnorm = a.ws->mat("dnorm", N_, C);
  k::cross_entropy_backward<T>(mat(a.logits, N_, V), mat(a.logits, N_, V), targets,
                               T(loss_scale_ * loss_weights_.main / double(N_)));
  k::linear_backward<T>(dnorm, head_.dmat(V, C), mat(a.logits, N_, V), a.xf.in(), head_.in(V, C));
  k::rmsnorm_backward<T>(dresid, norm_.dvec(C), dnorm, mat(a.resid[L], N_, C), norm_.vec(C),
                         Vec<const T>(a.rstdf.data(), N_));

  // MTP modules, deepest first; each hands a gradient to the hidden state it read.
  auto dh = a.ws->mat("mtp_dh", N_, C), dh_prev = a.ws->mat("mtp_dh_prev", N_, C);
  for (int d = int(a.mtp.size()) - 1; d >= 0; --d) {
    auto& m = a.mtp[d];
    use(mtp_unit(d), d > 0 ? mtp_unit(d - 1) : L > 0 ? block_unit(L - 1) : -1);
    const Buffer<T>& h_prev = d == 0 ? a.resid[L] : a.mtp[d - 1].h;
    const double seed = loss_scale_ * loss_weights_.mtp * cfg_.mtp.weight;
    const T dloss = m.labelled > 0 ? T(seed / double(a.mtp.size()) / double(m.labelled)) : T(0);
    k::cross_entropy_backward<T>(mat(m.logits, N_, V), mat(m.logits, N_, V), Tokens(m.target.data(), N_), dloss);
    k::linear_backward<T>(dnorm, head_.dmat(V, C), mat(m.logits, N_, V), m.hf.in(), head_.in(V, C));
    auto dbranch = a.ws->mat("mtp_dbranch", N_, C);
    k::rmsnorm_backward<T>(dbranch, m.norm.dvec(C), dnorm, mat(m.h, N_, C), m.norm.vec(C),
                           Vec<const T>(m.rstd_f.data(), N_));
    if (d + 1 < int(a.mtp.size())) k::add_inplace<T>(Vec<T>(dbranch.data(), N_ * C), Vec<const T>(dh.data(), N_ * C));
    m.block->backward(dbranch, mat(m.x0, N_, C));  // dbranch is now d/dx0
    auto dcat = a.ws->mat("mtp_dcat", N_, 2 * C), dhn = a.ws->mat("mtp_dhn", N_, C), den = a.ws->mat("mtp_den", N_, C);
    k::linear_backward<T>(dcat, m.proj.dmat(C, 2 * C), dbranch, m.cat.in(), m.proj.in(C, 2 * C));
    k::concat_columns_backward<T>(dhn, den, dcat);
    auto de = a.ws->mat("mtp_de", N_, C);
    k::rmsnorm_backward<T>(de, m.enorm.dvec(C), den, mat(m.e, N_, C), m.enorm.vec(C), Vec<const T>(m.rstd_e.data(), N_));
    if (lookups_elsewhere_) Kokkos::deep_copy(Buffer<T>(a.mtp_lookups.data() + d * N_ * C, N_ * C), Buffer<T>(de.data(), N_ * C));
    else k::embedding_backward<T>(embed_.dmat(V, C), de, Tokens(m.in.data(), N_));
    k::rmsnorm_backward<T>(dh_prev, m.hnorm.dvec(C), dhn, mat(h_prev, N_, C), m.hnorm.vec(C),
                           Vec<const T>(m.rstd_h.data(), N_));
    if (d == 0) k::add_inplace<T>(Vec<T>(dresid.data(), N_ * C), Vec<const T>(dh_prev.data(), N_ * C));
    else Kokkos::deep_copy(Buffer<T>(dh.data(), N_ * C), Buffer<T>(dh_prev.data(), N_ * C));
    let_go(mtp_unit(d));
  }
  let_go(final_unit());
  if (layout_.tied()) let_go(0);  // the lookup's backward below reads no weight
}

template <class T>
void Transformer<T>::backward(Tokens inputs, Tokens targets, const std::function<void(int64_t)>& ready) {
  Activations& a = *in_use_[0];  // the set in use
  const int64_t C = cfg_.dim, V = cfg_.vocab, L = cfg_.layers;
  check_whole("backward");
  auto notify = [&](int64_t offset) {
    if (ready) ready(offset);
  };
  // lossagg: the balance loss's seed was set in the forward, before its weight was known
  if (loss_weights_.aux != 1)
    for (auto& [name, f] : moe_layers()) f->scale_balance_gradient(loss_weights_.aux);
  auto dresid = a.ws->mat("dresid", N_, C);
  head_backward(a, targets, dresid);
  notify(layout_.layer_begin(L));

  for (int l = L - 1; l >= 0; --l) {
    use(block_unit(l), l > 0 ? block_unit(l - 1) : -1);  // the embedding's backward reads no weight
    a.blocks[l]->backward(dresid, mat(a.resid[l], N_, C));
    let_go(block_unit(l));
    notify(layout_.layer_begin(l));
  }
  k::embedding_backward<T>(embed_.dmat(V, C), dresid, inputs);
  notify(0);
}

// Pipeline stages: one run of blocks [begin, end) of one micro-batch (on a
// whole model any blocks), the embedding where begin is 0 and the head where
// end is L. The weight gate is
// refused with stages (shard is: deck/commands.cpp).
template <class T>
int Transformer<T>::run_of(int begin, int end) const {
  const StageCut& cut = layout_.stage();
  if (cut.whole() && !gate_ && begin >= 0 && begin < end && end <= cfg_.layers) return 0;  // any cut of its one run
  for (size_t r = 0; r < cut.runs.size(); ++r)
    if (!gate_ && begin == cut.runs[r].begin && end == cut.runs[r].end) return int(r);
  throw std::invalid_argument(fmt::format("Transformer: stage blocks [{}, {}) of {}{}", begin, end, cfg_.layers,
                                          gate_ ? " under a weight gate" : ", not a run of this model's stage"));
}

template <class T>
void Transformer<T>::check_whole(const char* pass) const {
  if (!layout_.stage().whole())
    throw std::logic_error(fmt::format("Transformer: {} on a model of stage {} of {} (expected forward_stage and "
                                       "backward_stage)", pass, layout_.stage().stage, layout_.stage().stages));
}

template <class T>
LossParts Transformer<T>::forward_stage(int begin, int end, Tokens inputs, Tokens targets, const T* in, T* out) {
  Activations& a = *in_use_[size_t(run_of(begin, end))];  // its run's set in use
  const int64_t C = cfg_.dim, V = cfg_.vocab, L = cfg_.layers, NC = N_ * C;
  if (begin == 0) k::embedding_forward<T>(mat(a.resid[0], N_, C), inputs, embed_.mat(V, C));
  else Kokkos::deep_copy(Buffer<T>(a.resid[begin].data(), NC), Buffer<T>(const_cast<T*>(in), NC));
  for (int l = begin; l < end; ++l) a.blocks[l]->forward(mat(a.resid[l + 1], N_, C), mat(a.resid[l], N_, C));
  LossParts loss;
  if (end == L) loss = head_forward(a, targets);
  else Kokkos::deep_copy(Buffer<T>(out, NC), Buffer<T>(a.resid[end].data(), NC));
  for (int l = begin; l < end; ++l)
    if (a.blocks[l]->ffn().is_moe()) loss.aux += a.blocks[l]->ffn().aux_loss();
  if (end == L)
    for (auto& m : a.mtp)
      if (m.block->ffn().is_moe()) loss.aux += m.block->ffn().aux_loss();
  loss.total = loss.main + cfg_.mtp.weight * loss.mtp + loss.aux;
  return loss;
}

template <class T>
void Transformer<T>::backward_stage(int begin, int end, Tokens inputs, Tokens targets, const T* dout, T* din) {
  Activations& a = *in_use_[size_t(run_of(begin, end))];  // its run's set in use
  const int64_t C = cfg_.dim, V = cfg_.vocab, L = cfg_.layers, NC = N_ * C;
  if (loss_weights_.aux != 1) {
    for (int l = begin; l < end; ++l)
      if (a.blocks[l]->ffn().is_moe()) a.blocks[l]->ffn().scale_balance_gradient(loss_weights_.aux);
    if (end == L)
      for (auto& m : a.mtp)
        if (m.block->ffn().is_moe()) m.block->ffn().scale_balance_gradient(loss_weights_.aux);
  }
  auto dresid = a.ws->mat("dresid", N_, C);
  if (end == L) head_backward(a, targets, dresid);
  else Kokkos::deep_copy(Buffer<T>(dresid.data(), NC), Buffer<T>(const_cast<T*>(dout), NC));
  for (int l = end - 1; l >= begin; --l) a.blocks[l]->backward(dresid, mat(a.resid[l], N_, C));
  if (begin == 0) k::embedding_backward<T>(embed_.dmat(V, C), dresid, inputs);
  else Kokkos::deep_copy(Buffer<T>(din, NC), Buffer<T>(dresid.data(), NC));
}

template <class T>
void Transformer<T>::add_mtp_lookups(Tokens targets, const T* lookups) {
  const int64_t C = cfg_.dim, V = cfg_.vocab;
  if (mtp_in_.extent(0) == 0) throw std::logic_error("Transformer: add_mtp_lookups on a model that is not stage 0 of several");
  for (int d = cfg_.mtp.depth - 1; d >= 0; --d) {  // deepest first, as head_backward
    k::shift_tokens(mtp_in_, targets, T_, int64_t(d), 0);
    k::embedding_backward<T>(embed_.dmat(V, C), Mat<const T>(lookups + d * N_ * C, N_, C), Tokens(mtp_in_.data(), N_));
  }
}

template class Block<float>;
template class Block<double>;
template class Transformer<float>;
template class Transformer<double>;

}  // namespace xx
