// The checkpoint reader (src/ckpt/reader.cpp) on untrusted bytes: every
// read a real resume makes (Trainer::restore and the setup before it), in
// its order, on one file. Built two ways from this one source:
//  - fuzz_checkpoint (-DXX_LIBFUZZER, clang, tools/lab/fuzz): a libFuzzer
//    target; the input bytes become a file, an InputError is the expected
//    outcome of bad bytes, anything else (another exception, a crash, a
//    sanitizer report, a hang, a huge allocation) is a finding.
//  - xx_ckpt_read FILE... (gcc, the normal build): reads each file the
//    same way and prints "read<TAB>FILE" or "refused<TAB>FILE<TAB>MESSAGE"
//    (the message also on stderr, as a resume prints it); exit 2 when one
//    was refused. Anything else escapes (terminate: a signal). What
//    tests/fuzz/replay.sh runs on the mutants of the seed corpus.
// The model is fixed: the one tests/fuzz/make_corpus.sh trains (the cli
// test deck's), as a resume takes its model from its own deck, not the file.
#include <mpi.h>
#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <Kokkos_Core.hpp>
#include "ckpt/checkpoint.h"  // read_checkpoint, read_rank_state, read_slabs, ...
#include "ckpt/state_io.h"    // merged_rank_state
#include "core/error.h"       // InputError
#include "model/params.h"     // ParamLayout

namespace {
namespace fs = std::filesystem;

// make_corpus.sh's model: model dense vocab 256 dim 8 layers 1 heads 2 ffn 16 seq 16.
xx::Frame fuzz_frame() {
  xx::ModelConfig m;
  m.vocab = 256, m.dim = 8, m.layers = 1, m.heads = 2, m.ffn = 16, m.seq = 16;
  return xx::whole_frame(xx::ParamLayout(m));
}

// The reads of a resume at one rank, as Trainer::restore makes them: the
// layout, the deck, the base (or the slabs of a sharded file), every old
// rank's own state, then this rank's merged from them. Throws InputError.
void resume_reads(const std::string& path, const xx::Frame& frame) {
  xx::read_checkpoint_layout(path);
  xx::read_checkpoint_deck(path);
  const bool by_slabs = xx::written_by_slabs(path);
  xx::CheckpointData data = xx::read_checkpoint(path, frame, {}, !by_slabs);
  if (xx::has_rank_state(path)) {
    const int old_world = data.state.world_size;
    for (int r = 0; r < old_world; ++r) xx::read_rank_state(path, frame, data, r);
    xx::merged_rank_state(path, frame, data, old_world, 1, 0, {});
  }
  if (by_slabs) {  // one rank reads every tensor whole
    std::array<xx::TensorSlabs, 3> slabs;
    for (size_t t = 0; t < frame.size(); ++t) {
      const auto& info = frame[t];
      for (auto& s : slabs) s.slabs.push_back({t, 0, info.size, info.offset});
    }
    xx::read_slabs(MPI_COMM_WORLD, path, frame, slabs);
  }
  xx::read_chain_link(path);
}

}  // namespace

#ifdef XX_LIBFUZZER
#include <sanitizer/lsan_interface.h>

namespace {
std::string g_path;  // the file each input is written to
}

// MPI (one rank) and Kokkos once; a work directory holding the chain base a
// delta of the corpus names (XX_FUZZ_CHAIN_BASE), so deltas read their base.
// What Open MPI's start-up keeps for good is not a leak of any input.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  __lsan_disable();
  MPI_Init(argc, argv);
  Kokkos::initialize();
  __lsan_enable();
  char dir[] = "/tmp/xx-fuzz-ckpt.XXXXXX";
  if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
  g_path = std::string(dir) + "/step_00000004.h5";
  std::atexit([] { std::error_code ignored; fs::remove_all(fs::path(g_path).parent_path(), ignored); });
  if (const char* base = std::getenv("XX_FUZZ_CHAIN_BASE"); base && *base)
    fs::copy_file(base, fs::path(dir) / fs::path(base).filename());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  static const xx::Frame frame = fuzz_frame();
  {
    std::ofstream out(g_path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes), std::streamsize(size));
  }
  try {
    resume_reads(g_path, frame);
  } catch (const xx::InputError&) {
    // bad input, reported as such: the expected outcome
  }
  return 0;
}

#else

// One process for many files: MPI's start-up costs more than a read.
int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: xx_ckpt_read FILE... (reads each as a resume does; exit 2 when one is bad input)\n");
    return 1;
  }
  MPI_Init(&argc, &argv);
  int code = 0;
  {
    Kokkos::ScopeGuard kokkos;
    const xx::Frame frame = fuzz_frame();
    for (int i = 1; i < argc; ++i) {
      try {
        resume_reads(argv[i], frame);
        std::printf("read\t%s\n", argv[i]);
      } catch (const xx::InputError& e) {
        std::printf("refused\t%s\t%s\n", argv[i], e.what());
        std::fprintf(stderr, "%s\n", e.what());
        code = xx::kExitBadInput;
      }
      std::fflush(stdout);  // a crash on the next file leaves this one's line
    }
  }
  MPI_Finalize();
  return code;
}

#endif
