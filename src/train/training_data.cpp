#include "train/training_data.h"
#include <algorithm>
#include <fmt/format.h>
#include "core/error.h"
#include "core/rng.h"
#include "data/seeding.h"
#include "comm/agree.h"
#include "train/transfer.h"

namespace xx {
using namespace transfer;

namespace {

void copy_tokens(Kokkos::View<int32_t*, MemSpace>& dst, const std::vector<int32_t>& src) {
  Kokkos::deep_copy(dst, Kokkos::View<const int32_t*, Kokkos::HostSpace, Unmanaged>(src.data(), src.size()));
}

// data ... noise_rank R: tokens drawn uniformly from the vocabulary.
std::vector<int32_t> random_tokens(size_t n, int vocab, uint64_t stream) {
  std::vector<int32_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = int32_t(uniform01(stream, i) * vocab) % vocab;
  return out;
}

}  // namespace

TrainingData::TrainingData(MPI_Comm job, MPI_Comm replicas, const Program& program)
    : job_(job), comm_(replicas), cfg_(program.phases.front().config), where_(program.phases.front().where) {
  MPI_Comm_rank(job, &job_rank_);
  MPI_Comm_rank(replicas, &rank_);
  MPI_Comm_size(replicas, &world_);
  const DataConfig& d = cfg_.data;
  const int64_t seq = cfg_.model.seq;
  auto load = [&](bool check) {
    corpus_ = Corpus::load(d.path, d.format, check);
    if (!d.valid_path.empty()) valid_corpus_ = std::make_unique<Corpus>(Corpus::load(d.valid_path, d.format, check));
    tokenizer_ = load_tokenizer(d.tokenizer);
  };
  auto split = [&] {
    split_ = valid_corpus_ ? WindowSplit{seq, corpus_.windows(seq), valid_corpus_->windows(seq)}
                           : split_windows(corpus_, seq, d.valid_fraction);
  };
  on_rank0_or_throw(job_, job_rank_, [&] {
    load(true);
    for (const Corpus* c : {&corpus_, valid_corpus_.get()}) {
      if (!c) continue;
      check_tokenizer(*c, d.tokenizer, *tokenizer_, cfg_.model.vocab, where_);
      if (c->vocab() > cfg_.model.vocab)
        input_error("{}: corpus vocabulary {} exceeds the model's vocab {} (expected model vocab >= {})", c->path(),
                    c->vocab(), cfg_.model.vocab, c->vocab());
    }
    if (valid_corpus_)
      for (const Corpus* c : {&corpus_, valid_corpus_.get()})
        if (c->windows(seq) < 1)
          input_error("{}: {} tokens in {} file(s), too few for one window of seq {} (expected at least {} tokens "
                      "in one file)", c->path(), c->size(), c->files().size(), seq, seq + 1);
    split();
    // A sample's prompt must leave room for what it generates.
    for (const auto& phase : program.phases) {
      const SampleConfig& s = phase.config.sample;
      if (s.every == 0) continue;
      const auto prompt = tokenizer_->encode(s.prompt);
      if (prompt.empty() || int64_t(prompt.size()) >= seq)
        input_error("{}: sample prompt '{}' encodes to {} tokens (expected 1 to {}, below the model's seq {})",
                    phase.where, s.prompt, prompt.size(), seq - 1, seq);
      for (int32_t t : prompt)
        if (t >= cfg_.model.vocab)
          input_error("{}: sample prompt '{}' has token {}, outside the model's vocab {}", phase.where, s.prompt, t,
                      cfg_.model.vocab);
    }
  });
  // Rank 0 checked all of it; the others map the same files.
  if (job_rank_ != 0) load(false), split();
  // Bits per byte: what each token stands for in bytes of text. A shard
  // without a named tokenizer has it only for bytes (vocab 256).
  bytes_known_ = !d.tokenizer.empty() || corpus_.vocab() <= 256;
  note_ = fmt::format("data: {} file(s), {} tokens; validation {}; tokenizer {}", corpus_.files().size(),
                      corpus_.size(),
                      valid_corpus_ ? fmt::format("{} ({} tokens)", d.valid_path, valid_corpus_->size())
                                    : fmt::format("the last {} of the windows", d.valid_fraction),
                      tokenizer_->describe());
  inputs = Kokkos::View<int32_t*, MemSpace>("TrainingData::inputs", int64_t(d.batch) * seq);
  targets = Kokkos::View<int32_t*, MemSpace>("TrainingData::targets", inputs.extent(0));
}

// Where this world's data streams began (an epoch left by another world size).
void TrainingData::register_state(StateRegistry& registry) {
  StateEntry data{"data_start", StatePlace::shared_series};
  data.save_doubles = [this] { return std::vector<double>{double(start_.epoch), double(start_.position)}; };
  data.load_doubles = [this](const std::vector<double>& v) {
    if (v.size() == 2) start_ = Continuation{int64_t(v[0]), int64_t(v[1])};
  };
  registry.add(std::move(data));
}

// The same world continues its own counter; another world continues the
// epoch where the old ranks left it, counting from zero.
std::string TrainingData::resume(uint64_t chaos_seed, int64_t batches, int old_world) {
  chaos_seed_ = chaos_seed;  // start_stream checks it against the deck
  start_batch_ = batches;
  if (old_world == world_) return "";
  SamplerOptions old = sampler_options(cfg_.data, cfg_.seed, chaos_seed_);
  old.start = start_;
  start_ = DistributedSampler(split_.train_windows, old_world, 0, old).after(start_batch_ * cfg_.data.batch);
  start_batch_ = 0;
  return fmt::format("resumed {} ranks on {}: epoch {} continues at position {} of {}", old_world, world_,
                     start_.epoch, start_.position, split_.train_windows);
}

// The training stream: chaos seed (a resume may have set it), sampler, common pool, loader.
void TrainingData::start_stream(const std::string& resume_path, const std::function<void(const std::string&)>& say,
                                const std::function<void(const std::string&)>& say_rank) {
  say(note_);
  chaos_seed_ = choose_chaos_seed(job_, cfg_.data, resume_path, chaos_seed_, where_);
  SamplerOptions sampling = sampler_options(cfg_.data, cfg_.seed, chaos_seed_);
  sampling.start = start_;  // a resume on another world size continues the epoch
  DistributedSampler sampler = training_sampler(split_.train_windows, world_, rank_, sampling, where_);
  if (!sampler.pool_windows().empty())
    pool_ = std::make_unique<CommonPool>(comm_, corpus_, sampler.pool_windows(), cfg_.model.seq);
  if (cfg_.data.shuffle != Shuffle::fixed || pool_ || cfg_.data.partition != Partition::shuffled)
    say("data: " + describe_sampling(cfg_.data, chaos_seed_, sampler));
  if (job_rank_ == 0)
    write_run_metadata(cfg_.output.dir, cfg_.data, cfg_.seed, chaos_seed_, int64_t(sampler.pool_windows().size()),
                       world_);
  say_rank(fmt::format("rank {} of {}: {} train windows, {} valid windows, {} samples per epoch", rank_, world_,
                       split_.train_windows, split_.valid_windows, sampler.per_rank_per_epoch()));
  loader_ = std::make_unique<BatchLoader>(corpus_, std::move(sampler), 0, cfg_.data.batch, cfg_.model.seq,
                                          cfg_.data.workers, cfg_.data.queue, start_batch_,
                                          pool_ ? pool_->tokens() : PoolTokens{});
}

int64_t TrainingData::epoch() const {
  return cfg_.data.batch * loader_->position() / std::max<int64_t>(1, split_.train_windows);
}

void TrainingData::load_training_batch(int64_t index) {
  const Batch batch = loader_->next();
  copy_tokens(inputs, batch.inputs);
  copy_tokens(targets, batch.targets);
  if (rank_ != cfg_.data.noise_rank) return;
  const uint64_t stream = mix_seed(cfg_.seed, 0xbad, uint64_t(index));
  copy_tokens(inputs, random_tokens(batch.inputs.size(), cfg_.model.vocab, stream));
  copy_tokens(targets, random_tokens(batch.targets.size(), cfg_.model.vocab, stream + 1));
}

// Batch j of rank r takes validation windows ((j*W + r)*B + b) mod V, so
// the ranks' K batches together cover K*W*B windows.
std::vector<int32_t> TrainingData::load_validation_batch(int j) {
  const int64_t B = cfg_.data.batch;
  const Corpus& valid = valid_corpus_ ? *valid_corpus_ : corpus_;
  const int64_t first = valid_corpus_ ? 0 : split_.train_windows;
  std::vector<int64_t> windows(B);
  for (int64_t b = 0; b < B; ++b) windows[b] = ((int64_t(j) * world_ + rank_) * B + b) % split_.valid_windows;
  const Batch batch = make_batch(valid, windows, first, cfg_.model.seq, j);
  copy_tokens(inputs, batch.inputs);
  copy_tokens(targets, batch.targets);
  return batch.targets;
}

}  // namespace xx
