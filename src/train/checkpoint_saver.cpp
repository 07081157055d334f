#include "train/checkpoint_saver.h"
#include <filesystem>
#include <fmt/format.h>

namespace xx {
namespace fs = std::filesystem;

CheckpointSaver::CheckpointSaver(MPI_Comm comm, const Frame& frame, Say say)
    : comm_(comm), frame_(frame), say_(std::move(say)) {
  MPI_Comm_rank(comm, &rank_);
}

CheckpointSaver::~CheckpointSaver() {
  if (writer_.joinable()) writer_.join();
  if (error_) try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      fmt::print(stderr, "xuanxue: rank {}: background checkpoint write failed: {}\n", rank_, e.what());
    }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && writer_comm_ != MPI_COMM_NULL) MPI_Comm_free(&writer_comm_);
}

void CheckpointSaver::save(const CheckpointConfig& settings, const std::string& dir,
                           const std::function<CheckpointData(RankState&)>& take) {
  const double t0 = MPI_Wtime();
  finish();  // one write at a time: the previous one is on disk before this one starts
  const double waited = MPI_Wtime() - t0;
  RankState mine;
  const CheckpointData data = take(mine);
  CheckpointFormat format;
  format.mode = settings.mode;
  format.codec.kind = settings.codec;
  format.codec.ratio = settings.ratio;
  format.codec.block = settings.block;
  format.base_every = settings.base_every;
  const auto encoded = encode_checkpoint(comm_, frame_, data, &mine, format, &chain_);
  last_ = {};
  last_.waited = waited;
  last_.kind = chain_kind_of(*encoded) == ChainKind::delta ? "delta of " + chain_.name : "base";
  last_.how = data.slabs              ? "each rank its own slabs"
              : format.mode == CheckpointMode::diff ? fmt::format("diff {}", settings.codec)
                                      : "full copies";
  const auto writer = settings.writer;
  last_.writer = writer == CheckpointWriter::rank0 ? "rank 0 writes" : "collective";
  const int64_t keep = settings.keep;
  if (settings.async && async_possible()) {
    if (writer_comm_ == MPI_COMM_NULL) MPI_Comm_dup(comm_, &writer_comm_);
    last_.async = true;
    last_.stall = MPI_Wtime() - t0;
    // (rank0: the gather runs here too, on the writer's own communicator)
    writer_ = std::thread([this, dir, encoded, writer, keep] {
      try {
        write_now(writer_comm_, dir, *encoded, writer, keep);
      } catch (const CheckpointWriteError&) {
        error_ = std::current_exception();
        failed_ = true;
      } catch (...) {
        error_ = std::current_exception();
      }
    });
    return;
  }
  write_now(comm_, dir, *encoded, writer, keep);
  last_.stall = MPI_Wtime() - t0;
  log();
}

bool CheckpointSaver::async_possible() {
  if (async_ok_ < 0) {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    async_ok_ = provided == MPI_THREAD_MULTIPLE;
    if (!async_ok_)
      say_("warning: checkpoint async on needs MPI_THREAD_MULTIPLE, which this MPI does not provide: checkpoints "
           "are written synchronously");
  }
  return async_ok_;
}

// The HDF5 part of a checkpoint, on the training thread or the writer's.
void CheckpointSaver::write_now(MPI_Comm comm, const std::string& dir, const EncodedCheckpoint& encoded,
                                CheckpointWriter writer, int64_t keep) {
  const double t0 = MPI_Wtime();
  last_.path = write_encoded(comm, dir, encoded, writer);
  if (rank_ == 0 && keep > 0) prune_checkpoints(dir, keep);
  last_.write_s = MPI_Wtime() - t0;
}

void CheckpointSaver::finish() {
  if (!writer_.joinable()) return;
  writer_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  log();
}

// stall is what the training thread spent in save; write is the whole write
// (rank0: the gather included).
void CheckpointSaver::log() {
  const auto& w = last_;
  const double mb = rank_ == 0 && fs::exists(w.path) ? double(fs::file_size(w.path)) / 1e6 : 0.0;
  say_(fmt::format("checkpoint {} ({}, {}, {}, {:.2f} MB, write {:.3f} s{}, stall {:.3f} s, of which waiting for the "
                   "previous write {:.3f} s)",
                   w.path, w.how, w.kind, w.writer, mb, w.write_s, w.async ? " in background" : "", w.stall,
                   w.waited));
}

}  // namespace xx
