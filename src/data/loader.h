// Prefetching batch loader: `workers` threads build batches ahead of the
// trainer into a bounded queue of `queue` slots. Batch i always holds the
// same windows, whatever the thread timing (workers claim batch indices in
// order; the trainer takes them in order).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>
#include "data/common_pool.h"
#include "data/corpus.h"
#include "data/sampler.h"

namespace xx {

struct Batch {
  int64_t index = 0;             // batch number in this rank's stream
  std::vector<int32_t> inputs;   // (B*T)
  std::vector<int32_t> targets;  // (B*T), inputs shifted by one
};

class BatchLoader {
 public:
  // Batches of `batch` windows of `seq`+1 tokens from `first_window` onwards;
  // the sampler picks windows in [0, sampler windows). Pool samples are read
  // from `pool` when given (the shared copy), else from the corpus: the
  // tokens are the same either way.
  BatchLoader(const Corpus& corpus, DistributedSampler sampler, int64_t first_window, int batch, int64_t seq,
              int workers, int queue, int64_t start_batch, PoolTokens pool = {});
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  Batch next();                                    // blocks until the next batch is ready
  int64_t position() const { return next_take_; }  // batches handed out so far (for checkpoints)

 private:
  void work();
  std::vector<Sample> samples_of(int64_t index);  // sampler samples of batch `index`; caller holds mu_
  Batch build(const std::vector<Sample>& samples, int64_t index) const;
  const Corpus& corpus_;
  DistributedSampler sampler_;  // guarded by mu_
  PoolTokens pool_;
  int64_t first_window_, batch_, seq_;
  int queue_;
  std::mutex mu_;
  std::condition_variable ready_, space_;
  std::map<int64_t, Batch> done_;
  int64_t next_claim_, next_take_;
  bool stop_ = false;
  std::exception_ptr error_;  // first failure in a worker, rethrown by next()
  std::vector<std::thread> threads_;
};

// Fills one batch directly (validation, tests): windows first_window + w for w in `windows`.
Batch make_batch(const Corpus& corpus, const std::vector<int64_t>& windows, int64_t first_window, int64_t seq,
                 int64_t index);

}  // namespace xx
