// xx_tokenize: a tokenizer (data/tokenizer.h: a tokenizer.json, a
// SentencePiece model, or bytes) on text files, for tools and tests.
//
// usage: xx_tokenize TOKENIZER encode FILE      the ids of FILE's bytes, as one JSON list
//        xx_tokenize TOKENIZER decode IDS.json  the bytes the ids (a JSON list) decode to
//        xx_tokenize TOKENIZER bench FILE [--seconds S] [--trials N]
//                                               encode speed on one thread: FILE's bytes
//                                               encoded whole, repeatedly for S seconds (default
//                                               2) per trial; prints MB/s of each trial and the
//                                               best, and the tokens per byte (`tools/bench tokenize`)
//        xx_tokenize TOKENIZER describe         the start-up line a run prints for it
//        xx_tokenize TOKENIZER lengths          the text bytes each id stands for, as one JSON list
//        xx_tokenize TOKENIZER stream OUT.raw TOKEN_BYTES FILE...
//                                               tools/prepare-data's encode: the files' ids, in order,
//                                               as little-endian integers of TOKEN_BYTES (2 or 4) bytes,
//                                               checking that they decode to the text exactly; prints
//                                               "TOKENS TEXT_BYTES". Each file is encoded in chunks of
//                                               about 1 MiB cut before a line that starts with a
//                                               non-space character (no pre-token of DeepSeek's or
//                                               GPT-2's pre-tokenizer crosses that point, so the ids are
//                                               those of the whole file).
// TOKENIZER "bytes" is the byte tokenizer. Exit status: 0 OK, 2 bad usage or input.
#include <fmt/format.h>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include "core/error.h"
#include "data/tokenizer.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) xx::input_error("{}: cannot open (expected a readable file)", path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

int usage() {
  std::cerr << "usage: xx_tokenize TOKENIZER encode FILE | decode IDS.json | bench FILE [--seconds S] [--trials N] "
               "| describe | lengths | stream OUT.raw TOKEN_BYTES FILE...\n";
  return 2;
}

// Where to cut `text` near `want`: just before a line that starts with a
// character other than whitespace (text.size() when there is none after `want`).
size_t chunk_end(const std::string& text, size_t want) {
  for (size_t at = std::min(want, text.size()); at < text.size(); ++at) {
    if (text[at - 1] != '\n') continue;
    const char c = text[at];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\v' && c != '\f') return at;
  }
  return text.size();
}

int stream(const xx::Tokenizer& tok, const std::string& out_path, int token_bytes, const std::vector<std::string>& files) {
  if (token_bytes != 2 && token_bytes != 4) xx::input_error("TOKEN_BYTES {} (expected 2 or 4)", token_bytes);
  if (token_bytes == 2 && tok.vocab() > 65536)
    xx::input_error("TOKEN_BYTES 2, but the tokenizer's vocab is {} (expected 4 above 65536)", tok.vocab());
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  if (!out) xx::input_error("{}: cannot write (expected a writable path)", out_path);
  uint64_t tokens = 0, bytes = 0;
  std::vector<unsigned char> raw;
  for (const auto& path : files) {
    const std::string text = read_file(path);
    for (size_t begin = 0; begin < text.size();) {
      const size_t end = chunk_end(text, begin + (size_t(1) << 20));
      const std::string chunk = text.substr(begin, end - begin);
      const auto ids = tok.encode(chunk);
      const std::string back = tok.decode(ids);
      if (back != chunk) {
        size_t d = 0;
        while (d < back.size() && d < chunk.size() && back[d] == chunk[d]) ++d;
        xx::input_error("{}: byte offset {}: the tokenizer does not give back the text (expected decode(encode(text)) "
                        "== text)", path, begin + d);
      }
      raw.clear();
      for (int32_t id : ids)
        for (int b = 0; b < token_bytes; ++b) raw.push_back(static_cast<unsigned char>(uint32_t(id) >> (8 * b)));
      out.write(reinterpret_cast<const char*>(raw.data()), std::streamsize(raw.size()));
      tokens += ids.size();
      bytes += chunk.size();
      begin = end;
    }
  }
  out.flush();
  if (!out) xx::input_error("{}: write failed (expected space for the token stream)", out_path);
  fmt::print("{} {}\n", tokens, bytes);
  return 0;
}

int bench(const xx::Tokenizer& tok, const std::string& text, double seconds, int trials) {
  using clock = std::chrono::steady_clock;
  size_t tokens = tok.encode(text).size();  // untimed: the first pass fills the word cache, as a corpus soon does
  double best = 0;
  for (int t = 0; t < trials; ++t) {
    size_t bytes = 0;
    const auto start = clock::now();
    double elapsed = 0;
    while (elapsed < seconds) {
      tokens = tok.encode(text).size();
      bytes += text.size();
      elapsed = std::chrono::duration<double>(clock::now() - start).count();
    }
    const double rate = double(bytes) / elapsed / 1e6;
    best = std::max(best, rate);
    fmt::print("trial {}: {:.2f} MB/s ({} bytes in {:.2f} s)\n", t + 1, rate, bytes, elapsed);
  }
  fmt::print("encode: best {:.2f} MB/s on one thread; {} tokens for {} bytes ({:.3f} tokens per byte)\n", best, tokens,
             text.size(), double(tokens) / double(std::max<size_t>(1, text.size())));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return usage();
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    const auto tok = xx::load_tokenizer(args[0] == "bytes" ? "" : args[0]);
    const std::string& mode = args[1];
    if (mode == "describe" && args.size() == 2) {
      fmt::print("{}\n", tok->describe());
    } else if (mode == "lengths" && args.size() == 2) {
      std::vector<int32_t> lengths;
      for (int32_t t = 0; t < tok->vocab(); ++t) lengths.push_back(tok->bytes_of(t));
      fmt::print("{}\n", nlohmann::json(lengths).dump());
    } else if (mode == "stream" && args.size() >= 5) {
      return stream(*tok, args[2], std::atoi(args[3].c_str()), {args.begin() + 4, args.end()});
    } else if (mode == "encode" && args.size() == 3) {
      fmt::print("{}\n", nlohmann::json(tok->encode(read_file(args[2]))).dump());
    } else if (mode == "decode" && args.size() == 3) {
      const auto ids = nlohmann::json::parse(read_file(args[2]), nullptr, false);
      if (!ids.is_array()) xx::input_error("{}: not a JSON list (expected the token ids)", args[2]);
      std::vector<int32_t> tokens;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (!ids[i].is_number_integer() || ids[i].get<int64_t>() < 0 || ids[i].get<int64_t>() >= tok->vocab())
          xx::input_error("{}: item {} is {} (expected a token id below the vocab, {})", args[2], i, ids[i].dump(),
                          tok->vocab());
        tokens.push_back(ids[i].get<int32_t>());
      }
      const std::string text = tok->decode(tokens);
      std::cout.write(text.data(), std::streamsize(text.size()));
    } else if (mode == "bench" && args.size() >= 3) {
      double seconds = 2;
      int trials = 3;
      for (size_t i = 3; i + 1 < args.size(); i += 2) {
        if (args[i] == "--seconds") seconds = std::stod(args[i + 1]);
        else if (args[i] == "--trials") trials = std::stoi(args[i + 1]);
        else return usage();
      }
      return bench(*tok, read_file(args[2]), seconds, trials);
    } else {
      return usage();
    }
  } catch (const xx::InputError& e) {
    std::cerr << "xx_tokenize: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "xx_tokenize: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
