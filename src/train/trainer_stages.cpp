// The trainer under pipeline stages (deck: pipeline stages P ... micro M;
// docs/SCALING.md, "Pipeline parallelism"): a step's passes on this stage
// in its schedule's order (train/pipeline.h), and the embedding the first
// and last stage share. The loop that calls them is trainer.cpp's.
#include "train/trainer.h"
#include <algorithm>
#include "comm/agree.h"
#include "train/transfer.h"

namespace xx {

// Pipeline stages: this stage's passes over the step's M micro-batches (the
// batch's sequences in M runs of batch / M) in its schedule's order, fed by
// its neighbours (train/pipeline.h). The losses (the last stage's, and each
// stage's own MoE layers' aux) are summed over the chain; the gradients are
// all final at the end, checked, then handed to the strategy at once.
LossParts Trainer::stage_passes() {
  data_->load_training_batch(step_);
  const StageCut& cut = stages_->cut();
  const int M = cfg_.pipeline.micro, last_chunk = cut.chunks - 1;
  const int64_t n = int64_t(micro_) * cfg_.model.seq, width = n * cfg_.model.dim;
  auto tokens = [n](const auto& all, int m) { return Tokens(all.data() + m * n, n); };
  auto host = [width](const float* p) { return transfer::host_view(const_cast<float*>(p), size_t(width)); };
  LossParts sum;
  StagePasses passes;
  passes.width = width;
  passes.forward = [&](int r, int m, const float* in, float* out) {
    const LayerRun& run = cut.runs[size_t(r)];
    model_->use_activations(r, stage_sets_[size_t(r)].take(m));  // kept there until m's backward
    Buffer<float>& stage_in = stage_in_[size_t(r)];
    Buffer<float>& stage_out = stage_out_[size_t(r)];
    if (in) Kokkos::deep_copy(stage_in, host(in));
    const LossParts l = model_->forward_stage(run.begin, run.end, tokens(data_->inputs, m),
                                              tokens(data_->targets, m), stage_in.data(), stage_out.data());
    count_expert_load(r);
    sum.main += l.main / M, sum.mtp += l.mtp / M, sum.aux += l.aux / M;
    if (out) Kokkos::deep_copy(host(out), stage_out);
  };
  passes.backward = [&](int r, int m, const float* dout, float* din) {
    const LayerRun& run = cut.runs[size_t(r)];
    model_->use_activations(r, stage_sets_[size_t(r)].release(m));
    Buffer<float>& stage_in = stage_in_[size_t(r)];
    Buffer<float>& stage_out = stage_out_[size_t(r)];
    if (dout) Kokkos::deep_copy(stage_out, host(dout));
    // MTP across stages: the last chunk's lookups of the embedding reach chunk 0's gradient (Transformer::mtp_lookups)
    if (mtp_travels_ && run.chunk == 0) {  // before its own lookup's, as the unsplit backward adds them
      stages_->recv_lookups(m, stage_lookups_.data(), int64_t(stage_lookups_.size()));
      Kokkos::deep_copy(lookups_, transfer::host_view(stage_lookups_));
      model_->add_mtp_lookups(tokens(data_->targets, m), lookups_.data());
    }
    model_->backward_stage(run.begin, run.end, tokens(data_->inputs, m), tokens(data_->targets, m),
                           stage_out.data(), stage_in.data());
    if (din) Kokkos::deep_copy(host(din), stage_in);
    if (mtp_travels_ && run.chunk == last_chunk) {
      Kokkos::deep_copy(transfer::host_view(stage_lookups_), model_->mtp_lookups());
      stages_->send_lookups(m, stage_lookups_.data(), int64_t(stage_lookups_.size()));
    }
  };
  const PipelineStepTimes times = pipeline_->step(passes);
  // A tied head on another stage than the embedding's: its gradient (the head's, in the last stage's copy) and
  // the first stage's (the lookups') are one tensor's, summed on both; the unsplit model adds them per
  // micro-batch, so the sum rounds otherwise (within 1e-6 of it, not the same bits)
  if (cfg_.model.tie_embeddings && cut.first() != cut.last()) {
    const Vec<float> g = model_->grad("embed");
    std::vector<float> h(g.extent(0));
    Kokkos::deep_copy(transfer::host_view(h), g);
    stages_->sum_first_last(h.data(), int64_t(h.size()));
    Kokkos::deep_copy(g, transfer::host_view(h));
  }
  double parts[3] = {sum.main, sum.mtp, sum.aux};
  sum_over_ranks(parts, stages_->chain());
  sum = {.total = parts[0] + cfg_.model.mtp.weight * parts[1] + parts[2], .main = parts[0], .mtp = parts[1], .aux = parts[2]};
  // each stage's bubble, for rank 0's record (replica 0's chain)
  last_.bubble.assign(size_t(cut.stages), 0.0);
  last_.bubble[size_t(cut.stage)] = times.bubble();
  sum_over_ranks(last_.bubble, stages_->chain());
  last_.bubble_theory = times.theory;
  const int64_t total = model_->layout().total();
  for (auto& check : on_gradients_) check(0, total);
  strategy_->gradients_ready(0);
  return sum;
}

// Pipeline stages with MTP or a tied head: the last stage reads the
// embedding too (unless, under dualpipev, it is stage 0 itself). Stage 0's
// gradient, which holds its lookups too (stage_passes; a tied head's
// gradient summed in), averaged over the replicas, is the last stage's as
// well: the two copies stay equal.
// Under shard gradients `reduced` holds only this rank's pieces: stage 0's
// replicas put the tensor together, and each last-stage rank takes its own.
void Trainer::share_embedding(Vec<float> reduced) {
  const StageCut& cut = stages_->cut();
  if ((!mtp_travels_ && !cfg_.model.tie_embeddings) || cut.first() == cut.last())
    return;  // (a V-shape's stage 0 holds the one embedding)
  if (placement_.gradients_sharded()) {
    const Frame& frame = placement_.frame();
    const auto embed = size_t(std::find_if(frame.begin(), frame.end(), [](const FrameTensor& t) {
                                return t.name == "embed";
                              }) - frame.begin());
    std::vector<float> h = cut.first() ? placed_->gather_tensor(reduced, embed)
                                       : std::vector<float>(size_t(frame.at(embed).size));
    stages_->first_to_last(h.data(), int64_t(h.size()));
    if (cut.last()) placed_->put_tensor(h, reduced, embed);
    return;
  }
  const Vec<float> g = model_->grad("embed");
  std::vector<float> h(g.extent(0));
  Kokkos::deep_copy(transfer::host_view(h), g);
  stages_->first_to_last(h.data(), int64_t(h.size()));
  Kokkos::deep_copy(g, transfer::host_view(h));
}

}  // namespace xx
