// The run's data, as the Trainer uses it: the corpora and tokenizer (rank 0
// checks every token first), the train/validation split, and the training
// stream (the chaos seed, where this world's epoch began, the common pool,
// the loader), with the batch the model reads. Its place in a checkpoint is
// the loader's position, the chaos seed and the stream's start.
#pragma once
#include <mpi.h>
#include <cstdint>
#include <memory>
#include <string>
#include "core/state.h"
#include "core/views.h"
#include "data/common_pool.h"
#include "data/corpus.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "data/tokenizer.h"
#include "deck/deck.h"

namespace xx {

class TrainingData {
 public:
  // Collective over job: loads the deck's data and tokenizer. Rank 0 checks
  // them, and the sample prompts, first, so a bad file stops every rank
  // alike (InputError); the others then map what they read. `replicas`
  // splits the data: the job's ranks, or under pipeline stages a stage's
  // data-parallel replicas (replica r of every stage reads the same).
  TrainingData(MPI_Comm job, MPI_Comm replicas, const Program& program);

  const std::string& note() const { return note_; }  // the start-up line about the data
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  bool bytes_known() const { return bytes_known_; }  // bits per byte can be reported
  int64_t train_windows() const { return split_.train_windows; }

  // The stream's checkpointed state (restore sets it before start_stream).
  void register_state(StateRegistry& registry);  // /train/data_start
  uint64_t chaos_seed() const { return chaos_seed_; }
  Continuation start() const { return start_; }  // where this world's data streams began
  // A checkpoint's stream: its chaos seed and this rank's loader position,
  // written by `old_world` ranks. Another world continues the old ranks'
  // epoch where they left it; returns what to say about that, else "".
  std::string resume(uint64_t chaos_seed, int64_t batches, int old_world);

  // Collective: the training stream from where a checkpoint (if any) left
  // it; `say` prints its start-up lines on the console, `say_rank` in this
  // rank's log.
  void start_stream(const std::string& resume_path, const std::function<void(const std::string&)>& say,
                    const std::function<void(const std::string&)>& say_rank);
  int64_t position() const { return loader_->position(); }  // training batches handed out
  int64_t epoch() const;                                     // of the next sample (informational)

  // The batch the model reads: training batch `index` (data ... noise_rank:
  // random tokens on that rank), or validation batch j of this rank; the
  // latter returns its targets on the host.
  Kokkos::View<int32_t*, MemSpace> inputs, targets;
  void load_training_batch(int64_t index);
  std::vector<int32_t> load_validation_batch(int j);

 private:
  MPI_Comm job_, comm_;  // every rank; those splitting the data (rank_ of world_ of them)
  int job_rank_ = 0, rank_ = 0, world_ = 1;
  const Config& cfg_;  // the first phase's: data settings are per job
  std::string where_;
  Corpus corpus_;
  std::unique_ptr<Corpus> valid_corpus_;  // data ... valid FILE; else validation is the end of corpus_
  std::unique_ptr<Tokenizer> tokenizer_;  // data ... tokenizer MODEL, else bytes
  bool bytes_known_ = true;
  std::string note_;
  WindowSplit split_;
  uint64_t chaos_seed_ = 0;  // shuffle chaos|independent: the run's seed (checkpointed), else 0
  Continuation start_;       // where this world's streams begin (another world size left an epoch)
  int64_t start_batch_ = 0;  // loader position to resume from
  std::unique_ptr<CommonPool> pool_;  // data common F: the node's shared copy; outlives loader_
  std::unique_ptr<BatchLoader> loader_;
};

}  // namespace xx
