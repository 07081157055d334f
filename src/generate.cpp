// xuanxue generate: sample text from a checkpoint on one rank, with the KV
// cache of src/model/decoder.h. The checkpoint's own deck rebuilds the model;
// the tokenizer is the one its data line names, unless -tokenizer says otherwise.
#include "generate.h"
#include <unistd.h>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <fmt/format.h>
#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "deck/deck.h"
#include "model/decoder.h"

namespace xx {

namespace {

constexpr const char* kUsage =
    "usage: xuanxue generate -ckpt FILE -prompt TEXT [-tokenizer MODEL] [-tokens N] [-temperature T]\n"
    "                        [-top_k K] [-top_p P] [-seed S] [-logits FILE]\n"
    "  -ckpt FILE|DIR    a checkpoint (RUN_DIR/ckpt/step_N.h5), or RUN_DIR or RUN_DIR/ckpt: its newest;\n"
    "                    the checkpoint's deck gives the model\n"
    "  -prompt TEXT      the text to continue\n"
    "  -tokenizer MODEL  SentencePiece model or tokenizer.json (default: the deck's data ... tokenizer, else bytes)\n"
    "  -tokens N         tokens to generate (default 128; never past the model's seq)\n"
    "  -temperature T    0: greedy; default 1\n"
    "  -top_k K          sample among the K likeliest (default 0: all)\n"
    "  -top_p P          sample within the smallest set of probability P (default 1)\n"
    "  -seed S           the same seed gives the same text (default 0)\n"
    "  -logits FILE      also write the logits at every prompt position (text: a header line naming the\n"
    "                    tokens, then one row of vocab values per position), for other tools to compare\n";

struct GenerateArgs {
  std::string ckpt, prompt, tokenizer, logits;
  bool has_prompt = false, has_tokenizer = false;
  int64_t tokens = 128;
  SamplingOptions sampling;
};

template <class T>
T number(const std::string& flag, const std::string& word, double lo, double hi) {
  char* end = nullptr;
  const double v = std::strtod(word.c_str(), &end);
  if (word.empty() || *end != '\0' || !(v >= lo && v <= hi) ||
      (std::is_integral_v<T> && v != double(static_cast<int64_t>(v))))
    input_error("command line: bad value '{}' for {} (expected {} in [{}, {}])\n{}", word, flag,
                std::is_integral_v<T> ? "an integer" : "a number", lo, hi, kUsage);
  return static_cast<T>(v);
}

GenerateArgs parse(int argc, char** argv) {
  GenerateArgs a;
  a.sampling.temperature = 1.0;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "-help" || arg == "--help") input_error("{}", kUsage);
    if (i + 1 >= argc) input_error("command line: '{}' needs a value\n{}", arg, kUsage);
    const std::string v = argv[++i];
    if (arg == "-ckpt") a.ckpt = v;
    else if (arg == "-prompt") a.prompt = v, a.has_prompt = true;
    else if (arg == "-tokenizer") a.tokenizer = v, a.has_tokenizer = true;
    else if (arg == "-tokens") a.tokens = number<int64_t>(arg, v, 1, 1e9);
    else if (arg == "-temperature") a.sampling.temperature = number<double>(arg, v, 0, 1e6);
    else if (arg == "-top_k") a.sampling.top_k = number<int>(arg, v, 0, 1e9);
    else if (arg == "-top_p") a.sampling.top_p = number<double>(arg, v, 1e-9, 1);
    else if (arg == "-seed") a.sampling.seed = number<uint64_t>(arg, v, 0, 9e15);
    else if (arg == "-logits") a.logits = v;
    else
      input_error("command line: unknown option '{}'{}\n{}", arg,
                  did_you_mean(arg, {"-ckpt", "-prompt", "-tokenizer", "-tokens", "-temperature", "-top_k", "-top_p",
                                     "-seed", "-logits"}),
                  kUsage);
  }
  if (a.ckpt.empty() || !a.has_prompt) input_error("command line: generate needs -ckpt and -prompt\n{}", kUsage);
  return a;
}

// The checkpoint's deck as a Program (written to a temp file: the deck reader reads files).
Program checkpoint_program(const std::string& ckpt) {
  const std::string text = read_checkpoint_deck(ckpt);
  char path[] = "/tmp/xuanxue-generate-deck.XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) throw std::runtime_error("generate: cannot make a temp file for the checkpoint's deck");
  ::close(fd);
  std::ofstream(path) << text;
  try {
    Program p = build_program(read_deck(path, {}), false);
    std::remove(path);
    return p;
  } catch (...) {
    std::remove(path);
    throw;
  }
}

// The logits at every prompt position, as text (9 significant digits: a float's round trip).
void write_prompt_logits(Decoder& decoder, const std::vector<int32_t>& prompt, const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f)
    input_error("{}: cannot write the logits ({}) (expected a writable path for -logits)", path, std::strerror(errno));
  std::string text = "# tokens";
  for (int32_t t : prompt) text += fmt::format(" {}", t);
  text += "\n";
  decoder.reset();
  for (int32_t t : prompt) {
    const std::vector<float> logits = decoder.step(t);
    for (size_t i = 0; i < logits.size(); ++i) text += fmt::format("{}{:.9g}", i ? " " : "", logits[i]);
    text += "\n";
  }
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error(fmt::format("{}: writing the logits failed", path));
}

}  // namespace

// FILE, or the newest complete checkpoint of RUN_DIR or RUN_DIR/ckpt.
static std::string resolve_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) return path;
  for (const fs::path& dir : {fs::path(path), fs::path(path) / "ckpt"})
    if (const std::string newest = latest_checkpoint(dir.string()); !newest.empty()) return newest;
  input_error("{}: no complete checkpoint in this directory or its ckpt/ (expected a run directory, or a "
              "step_N.h5 file)", path);
}

int run_generate(MPI_Comm comm, int argc, char** argv) {
  int world = 1;
  MPI_Comm_size(comm, &world);
  GenerateArgs a = parse(argc, argv);
  a.ckpt = resolve_checkpoint(a.ckpt);
  if (world != 1) input_error("generate runs on one rank, not {} (expected no launcher, or -n 1)", world);
  const Program program = checkpoint_program(a.ckpt);
  const Config& cfg = program.phases.front().config;
  ModelConfig m = cfg.model;
  m.moe.ep = 1;  // one rank holds every expert (the file holds them all, whatever ep wrote it)
  const std::string tok_path = a.has_tokenizer ? a.tokenizer : cfg.data.tokenizer;
  const auto tokenizer = load_tokenizer(tok_path);
  if (tokenizer->vocab() != m.vocab && !(tok_path.empty() && m.vocab >= 256))
    input_error("{}: vocab {}, but the tokenizer {} has vocab {} (expected the tokenizer the model was trained with)",
                a.ckpt, m.vocab, tok_path.empty() ? "bytes" : tok_path, tokenizer->vocab());
  const std::vector<int32_t> prompt = tokenizer->encode(a.prompt);
  if (prompt.empty()) input_error("command line: -prompt is empty (expected at least one token of text)");
  if (int64_t(prompt.size()) >= m.seq)
    input_error("command line: -prompt encodes to {} tokens, the model's context is {} (expected fewer than {})",
                prompt.size(), m.seq, m.seq);

  Transformer<float> model(m, 1);
  std::map<std::string, int64_t> buffers;
  for (auto& [prefix, ffn] : model.moe_layers()) buffers[prefix + "ffn.gate_bias"] = int64_t(ffn->bias().extent(0));
  const CheckpointData data = read_checkpoint(a.ckpt, whole_frame(model.layout()), buffers);
  Kokkos::deep_copy(model.params(), Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                                        data.params.data(), data.params.size()));
  for (auto& [prefix, ffn] : model.moe_layers()) {
    const auto& b = data.buffers.at(prefix + "ffn.gate_bias");
    Kokkos::deep_copy(ffn->bias(), Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(b.data(), b.size()));
  }
  Decoder decoder(model, m.seq);
  if (!a.logits.empty()) write_prompt_logits(decoder, prompt, a.logits);
  const int64_t room = m.seq - int64_t(prompt.size()) + 1;
  const int64_t count = std::min(a.tokens, room);
  const auto t0 = MPI_Wtime();
  const std::vector<int32_t> out = generate(decoder, prompt, count, a.sampling);
  const double seconds = MPI_Wtime() - t0;
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), out.begin(), out.end());
  fmt::print("{}\n", tokenizer->decode(all));
  const auto& at = m.attention;
  fmt::print(stderr,
             "# generate: {} prompt + {} new tokens in {:.3f} s ({:.0f} tok/s, prompt included), step {} of {}\n"
             "# tokenizer: {}\n"
             "# kv cache: {} bytes per token ({}), MHA of the same width: {} bytes ({:.1f}x)\n",
             prompt.size(), out.size(), seconds, double(prompt.size() + out.size()) / std::max(seconds, 1e-9),
             data.state.step, a.ckpt, tokenizer->describe(), Decoder::cache_bytes_per_token(m),
             at.mla() ? fmt::format("MLA: latent {} + rope key {} per layer", at.kv_lora_rank, at.rope_dim)
                      : fmt::format("MHA: {} heads x (keys {} + values {}) per layer", m.heads, m.qk_dim(), m.v_dim()),
             Decoder::mha_bytes_per_token(m),
             double(Decoder::mha_bytes_per_token(m)) / double(Decoder::cache_bytes_per_token(m)));
  if (a.tokens > count)
    fmt::print(stderr, "# stopped at the model's context of {} tokens ({} asked)\n", m.seq, a.tokens);
  return 0;
}

}  // namespace xx
