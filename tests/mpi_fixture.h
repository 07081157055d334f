// Shared set-up for the multi-rank tests: a scratch directory agreed by all
// ranks, a small deterministic corpus, and decks built from text.
#pragma once
#include <mpi.h>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>
#include "core/device_memory.h"
#include "deck/deck.h"
#include "train/trainer.h"

namespace xx::test {

inline int mpi_rank() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int mpi_size() {
  int s;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// A fresh directory, named by rank 0 and shared with every rank; rank 0
// removes it at exit.
inline std::string shared_scratch(const std::string& tag) {
  std::string path;
  if (mpi_rank() == 0) {
    auto p = std::filesystem::temp_directory_path() /
             ("xx_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(mpi_size()));
    std::filesystem::remove_all(p);
    std::filesystem::create_directories(p);
    path = p.string();
    // removed when the process exits (some hold hundreds of MB; a killed run still leaves its own)
    static std::vector<std::filesystem::path> made;
    if (made.empty())
      std::atexit([] {
        for (const auto& d : made) {
          std::error_code ignored;
          std::filesystem::remove_all(d, ignored);
        }
      });
    made.push_back(p);
  }
  int n = int(path.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  path.resize(n);
  MPI_Bcast(path.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  return path;
}

// Pseudo-English text from a fixed word list, written by rank 0.
inline std::string make_corpus(const std::string& dir, int64_t bytes = 40000) {
  const std::string path = dir + "/corpus.txt";
  if (mpi_rank() == 0) {
    const std::vector<std::string> words = {"the", "rank", "sends", "a", "gradient", "to", "every", "other",
                                            "node", "and", "waits", "for", "its", "turn", "while", "loss",
                                            "falls", "slowly", "over", "many", "steps", "."};
    std::ofstream out(path);
    uint64_t x = 12345;
    int64_t written = 0;
    while (written < bytes) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      const auto& w = words[(x >> 33) % words.size()];
      out << w << ' ';
      written += int64_t(w.size()) + 1;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

// A deck from text, written to dir/name and parsed like the real thing.
inline Program make_program(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name + ".deck";
  if (mpi_rank() == 0) std::ofstream(path) << text;
  MPI_Barrier(MPI_COMM_WORLD);
  return build_program(read_deck(path, {}), true);
}

// A small model that trains in well under a second per step.
inline std::string small_deck(const std::string& corpus, const std::string& out_dir, int steps,
                              const std::string& extra = "") {
  return "seed 99\n"
         "model dense vocab 256 dim 32 layers 2 heads 2 ffn 64 seq 32\n"
         "data bytes " + corpus + " valid 0.1 batch 4 workers 2\n"
         "optimizer adamw lr 3e-3 weight_decay 0.1 clip 1.0\n"
         "schedule cosine warmup 2 min_lr 3e-4 total 12\n"
         "peak_gflops 50\n"
         "output dir " + out_dir + " log_every 1\n"
         "eval every 3 batches 2\n"
         "checkpoint every 0\n" + extra +
         "run " + std::to_string(steps) + "\n";
}

// FNV-1a over the bits of a buffer: equal fingerprints, equal bits.
inline uint64_t fingerprint(const Buffer<float>& b) {
  auto h = xx::host_copy(b);
  uint64_t x = 1469598103934665603ULL;
  const auto* bytes = reinterpret_cast<const unsigned char*>(h.data());
  for (size_t i = 0; i < h.extent(0) * sizeof(float); ++i) x = (x ^ bytes[i]) * 1099511628211ULL;
  return x;
}

inline std::vector<uint64_t> all_fingerprints(const Buffer<float>& params) {
  const uint64_t mine = fingerprint(params);
  std::vector<uint64_t> all(mpi_size());
  MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  return all;
}

inline bool all_equal(const std::vector<uint64_t>& v) {
  return std::adjacent_find(v.begin(), v.end(), std::not_equal_to<>()) == v.end();
}

// Every phase of a deck, quietly (from `resume` if given); what `take` reads
// of the trained Trainer, for the test to compare.
template <class Take>
auto run_trainer(const Program& program, const std::string& resume, Take&& take) {
  RunOptions options;
  options.quiet = true;
  options.resume = resume;
  Trainer trainer(MPI_COMM_WORLD, program, options);
  trainer.run();
  return take(trainer);
}

// Every phase of a deck, quietly; the global mean loss of each step.
inline std::vector<double> run_deck(const Program& program, const std::string& resume = "") {
  return run_trainer(program, resume, [](Trainer& t) { return t.losses(); });
}

}  // namespace xx::test
