// Prefetching batch loader. Protocol between workers and the trainer:
//   1. a worker waits until fewer than `queue` batches are claimed but not yet
//      taken (next_claim_ - next_take_ < queue_), or until stop_;
//   2. it claims index i = next_claim_++ and asks the sampler for the samples
//      of batch i, both under mu_ (the sampler caches one epoch, not thread-safe);
//   3. it fills the batch without the lock and files it under done_[i];
//   4. next() waits for done_[next_take_], removes it and frees a slot.
// The content of batch i depends only on i, so thread timing cannot change it.
#include "data/loader.h"
#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace xx {

namespace {

// inputs and targets of one window: its seq+1 tokens, the targets shifted by one.
void fill_window(const Corpus& corpus, int64_t w, int64_t seq, int32_t* inputs, int32_t* targets) {
  std::vector<int32_t> tokens(seq + 1);
  corpus.read_window(w, seq, tokens.data());
  std::copy(tokens.begin(), tokens.end() - 1, inputs);
  std::copy(tokens.begin() + 1, tokens.end(), targets);
}

}  // namespace

Batch make_batch(const Corpus& corpus, const std::vector<int64_t>& windows, int64_t first_window, int64_t seq,
                 int64_t index) {
  Batch b;
  b.index = index;
  b.inputs.resize(windows.size() * seq);   // (B*T)
  b.targets.resize(windows.size() * seq);  // (B*T)
  for (size_t i = 0; i < windows.size(); ++i) {
    if (windows[i] < 0 || first_window < 0 || first_window + windows[i] >= corpus.windows(seq))
      throw std::out_of_range("make_batch: window " + std::to_string(first_window) + "+" +
                              std::to_string(windows[i]) + " of " + std::to_string(seq) + "+1 tokens is past the " +
                              std::to_string(corpus.windows(seq)) + " windows of " + corpus.path());
    fill_window(corpus, first_window + windows[i], seq, b.inputs.data() + i * seq, b.targets.data() + i * seq);
  }
  return b;
}

BatchLoader::BatchLoader(const Corpus& corpus, DistributedSampler sampler, int64_t first_window, int batch,
                         int64_t seq, int workers, int queue, int64_t start_batch, PoolTokens pool)
    : corpus_(corpus),
      sampler_(std::move(sampler)),
      pool_(pool),
      first_window_(first_window),
      batch_(batch),
      seq_(seq),
      queue_(queue),
      next_claim_(start_batch),
      next_take_(start_batch) {
  if (batch < 1 || seq < 1 || workers < 0 || (workers > 0 && queue < 1) || start_batch < 0 || first_window < 0)
    throw std::invalid_argument("BatchLoader: batch " + std::to_string(batch) + ", seq " + std::to_string(seq) +
                                ", workers " + std::to_string(workers) + ", queue " + std::to_string(queue) +
                                ", start_batch " + std::to_string(start_batch) +
                                " (expected batch, seq >= 1, workers >= 0, queue >= 1 with workers)");
  // Fail here rather than in a worker: the last window's last target must exist.
  if (first_window + sampler_.windows() > corpus.windows(seq))
    throw std::out_of_range("BatchLoader: windows " + std::to_string(first_window) + ".." +
                            std::to_string(first_window + sampler_.windows()) + " of " + std::to_string(seq) +
                            "+1 tokens need more than the " + std::to_string(corpus.windows(seq)) + " windows of " +
                            corpus.path());
  if (pool.tokens && (pool.seq != seq || pool.windows != int64_t(sampler_.pool_windows().size())))
    throw std::invalid_argument("BatchLoader: pool of " + std::to_string(pool.windows) + " windows of seq " +
                                std::to_string(pool.seq) + " (expected the sampler's " +
                                std::to_string(sampler_.pool_windows().size()) + " of seq " + std::to_string(seq) + ")");
  try {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
  } catch (...) {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    space_.notify_all();
    for (auto& t : threads_) t.join();
    throw;
  }
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  // Wake workers blocked on a full queue; a worker mid-batch finishes it, then sees stop_.
  space_.notify_all();
  for (auto& t : threads_) t.join();
}

std::vector<Sample> BatchLoader::samples_of(int64_t index) {
  std::vector<Sample> samples(batch_);
  for (int64_t j = 0; j < batch_; ++j) samples[j] = sampler_.sample(index * batch_ + j);
  return samples;
}

// Pool samples come from the node's shared copy when there is one; the
// constructor checked that every sampler window lies inside the corpus.
Batch BatchLoader::build(const std::vector<Sample>& samples, int64_t index) const {
  Batch b;
  b.index = index;
  b.inputs.resize(samples.size() * seq_);   // (B*T)
  b.targets.resize(samples.size() * seq_);  // (B*T)
  for (size_t i = 0; i < samples.size(); ++i) {
    int32_t* inputs = b.inputs.data() + i * seq_;
    int32_t* targets = b.targets.data() + i * seq_;
    if (pool_.tokens && samples[i].pool_slot >= 0) {
      const int32_t* w = pool_.window(samples[i].pool_slot);  // seq+1 tokens
      std::copy(w, w + seq_, inputs);
      std::copy(w + 1, w + seq_ + 1, targets);
      continue;
    }
    fill_window(corpus_, first_window_ + samples[i].window, seq_, inputs, targets);
  }
  return b;
}

void BatchLoader::work() {
  try {
    for (;;) {
      int64_t index;
      std::vector<Sample> samples;
      {
        std::unique_lock lock(mu_);
        space_.wait(lock, [&] { return stop_ || next_claim_ - next_take_ < queue_; });
        if (stop_) return;
        index = next_claim_++;
        samples = samples_of(index);
      }
      Batch b = build(samples, index);
      {
        std::lock_guard lock(mu_);
        done_.emplace(index, std::move(b));
      }
      ready_.notify_all();
    }
  } catch (...) {
    {
      std::lock_guard lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
    ready_.notify_all();
  }
}

Batch BatchLoader::next() {
  if (threads_.empty()) {
    Batch b = build(samples_of(next_take_), next_take_);
    ++next_take_;
    return b;
  }
  Batch b;
  {
    std::unique_lock lock(mu_);
    ready_.wait(lock, [&] { return error_ || done_.count(next_take_) > 0; });
    auto it = done_.find(next_take_);
    if (it == done_.end()) std::rethrow_exception(error_);
    b = std::move(it->second);
    done_.erase(it);
    ++next_take_;
  }
  space_.notify_all();
  return b;
}

}  // namespace xx
