// The tokenizer.json reader (src/data/hf_tokenizer.cpp): the BPE's merge
// order, the splits, added tokens, exact round trips (invalid UTF-8 too),
// and one InputError naming the file and the JSON path for each bad file,
// including the fixture cut and flipped at many offsets. The ids of the
// fixture on a multilingual text are checked against the independent
// Python reference by ctest hf_tokenizer_reference.
#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include "core/error.h"
#include "data/hf_tokenizer.h"

using xx::InputError;
using json = nlohmann::json;

namespace {

std::string fixture_path() { return std::string(XX_SOURCE_DIR) + "/tests/data/hf_tokenizer/tokenizer.json"; }

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// GPT-2's byte-level character of byte b, as UTF-8.
std::string byte_char(int b) {
  int n = 0;
  for (int x = 0; x < b; ++x)
    if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
  const bool itself = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  const uint32_t cp = itself ? uint32_t(b) : uint32_t(256 + n);
  std::string s;
  if (cp < 0x80) s += char(cp);
  else s += char(0xc0 | (cp >> 6)), s += char(0x80 | (cp & 0x3f));
  return s;
}
std::string bl(const std::string& raw) {
  std::string s;
  for (unsigned char c : raw) s += byte_char(c);
  return s;
}

// A small tokenizer: the 256 bytes (id = byte), then each merge's result.
json small(const std::vector<std::pair<std::string, std::string>>& merges, json pre_tokenizer = nullptr) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  json list = json::array();
  for (const auto& [a, b] : merges) {
    list.push_back(bl(a) + " " + bl(b));
    if (!vocab.contains(bl(a + b))) vocab[bl(a + b)] = int(vocab.size());
  }
  if (pre_tokenizer.is_null())
    pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  return {{"version", "1.0"},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", list}}}};
}

std::unique_ptr<xx::Tokenizer> parse(const json& j) { return xx::parse_hf_tokenizer(j.dump(), "t.json"); }

// The ids of `text` as the strings they decode to.
std::vector<std::string> pieces(const xx::Tokenizer& tok, const std::string& text) {
  std::vector<std::string> out;
  for (int32_t id : tok.encode(text)) out.push_back(tok.decode({id}));
  return out;
}

json split(const std::string& regex, const std::string& behavior, bool invert = false) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", behavior}, {"invert", invert}};
}
json sequence(std::vector<json> steps) {
  steps.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}});
  return {{"type", "Sequence"}, {"pretokenizers", steps}};
}

}  // namespace

TEST_CASE("tokenizer.json: merges by rank, leftmost first, on the bytes", "[data][hf_tokenizer]") {
  auto tok = parse(small({{"a", "b"}, {"b", "c"}}));
  REQUIRE(pieces(*tok, "abc") == std::vector<std::string>{"ab", "c"});  // rank 0 first
  tok = parse(small({{"b", "c"}, {"a", "b"}}));
  REQUIRE(pieces(*tok, "abc") == std::vector<std::string>{"a", "bc"});
  tok = parse(small({{"a", "a"}}));
  REQUIRE(pieces(*tok, "aaa") == std::vector<std::string>{"aa", "a"});  // leftmost of equals
  tok = parse(small({{"a", "a"}, {"aa", "aa"}}));
  REQUIRE(pieces(*tok, "aaaaa") == std::vector<std::string>{"aaaa", "a"});
  // A merge of multi-byte characters, and bytes no merge touches.
  tok = parse(small({{"\xe7", "\x8e"}, {"\xe7\x8e", "\x84"}}));
  REQUIRE(pieces(*tok, "\xe7\x8e\x84!") == std::vector<std::string>{"\xe7\x8e\x84", "!"});
  // A long word (a run of spaces): every pair merges in order.
  tok = parse(small({{" ", " "}, {"  ", "  "}}));
  const std::string spaces(10001, ' ');
  const auto ids = tok->encode(spaces);
  REQUIRE(ids.size() == 2500 + 1);
  REQUIRE(tok->decode(ids) == spaces);
}

TEST_CASE("tokenizer.json: the splits and their behaviours", "[data][hf_tokenizer]") {
  // \p{N}{1,3} isolated: digits in threes; merges never cross a split.
  auto tok = parse(small({{"1", "2"}, {"12", "3"}, {"3", "4"}}, sequence({split("\\p{N}{1,3}", "Isolated")})));
  REQUIRE(pieces(*tok, "1234567") == std::vector<std::string>{"123", "4", "5", "6", "7"});
  auto words = [&](const std::string& behavior, bool invert = false) {
    // Merges that make each expected piece one token (and no merge crosses a piece).
    const std::vector<std::pair<std::string, std::string>> m = {{"a", "-"}, {"-", "-"}, {"--", "a"},
                                                                {"-", "a"}, {"-a", "a"}, {"a", "a"}};
    return pieces(*parse(small(m, sequence({split("-", behavior, invert)}))), "a--a-aa");
  };
  // runs of "a--a-aa" against the pattern "-": a | - | - | a | - | aa
  REQUIRE(words("Isolated") == std::vector<std::string>{"a", "-", "-", "a", "-", "aa"});
  REQUIRE(words("Removed") == std::vector<std::string>{"a", "a", "aa"});
  REQUIRE(words("MergedWithPrevious") == std::vector<std::string>{"a-", "-", "a-", "aa"});
  REQUIRE(words("MergedWithNext") == std::vector<std::string>{"a", "--a", "-aa"});
  REQUIRE(words("Contiguous") == std::vector<std::string>{"a", "--", "a", "-", "aa"});
  REQUIRE(words("Isolated", true) == std::vector<std::string>{"a", "-", "-", "a", "-", "aa"});
  REQUIRE(words("Removed", true) == std::vector<std::string>{"-", "-", "-"});
  // \s is Unicode's White_Space: U+0085 and U+3000 are, U+001C is not.
  tok = parse(small({}, sequence({split("\\s+", "Removed")})));
  REQUIRE(pieces(*tok, "a\xc2\x85" "b\xe3\x80\x80" "c\x1c" "d") ==
          std::vector<std::string>{"a", "b", "c", "\x1c", "d"});
}

TEST_CASE("tokenizer.json: added tokens, and exact round trips", "[data][hf_tokenizer]") {
  json j = small({{"<", "|"}});
  const int n = int(j["model"]["vocab"].size());
  j["added_tokens"] = json::array({{{"id", n}, {"content", "<|end|>"}, {"special", true}},
                                   {{"id", n + 1}, {"content", "<|end|>x"}, {"special", false}}});
  auto tok = parse(j);
  REQUIRE(tok->vocab() == n + 2);
  // The longest content at a place; the text around goes through the BPE.
  REQUIRE(tok->encode("a<|end|>xb<|end|>") == std::vector<int32_t>{'a', n + 1, 'b', n});
  REQUIRE(pieces(*tok, "<|e") == std::vector<std::string>{"<|", "e"});
  REQUIRE(tok->bytes_of(n) == 7);      // what decode gives: its text, special or not
  REQUIRE(tok->bytes_of(n + 1) == 8);
  REQUIRE(tok->bytes_of('a') == 1);
  // Invalid UTF-8 and every byte value come back exactly.
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  all += "\xff\xfe\xc3 \xe7\x8e";
  REQUIRE(tok->decode(tok->encode(all)) == all);
  // The committed fixture on its multilingual text.
  const auto fixture = xx::load_hf_tokenizer(fixture_path());
  const std::string text = read(std::string(XX_SOURCE_DIR) + "/tests/data/hf_tokenizer/multilingual.txt");
  const auto ids = fixture->encode(text);
  REQUIRE(ids.size() < text.size() * 3 / 4);  // the merges act (0.64 tokens per byte: a small BPE on new text)
  REQUIRE(fixture->decode(ids) == text);
}

TEST_CASE("tokenizer.json: each bad file is one InputError naming the file and the place", "[data][hf_tokenizer]") {
  auto refused = [](const json& j, const std::string& what) {
    INFO(what);
    REQUIRE_THROWS_AS(parse(j), InputError);
    REQUIRE_THROWS_WITH(parse(j), Catch::Contains("t.json") && Catch::Contains(what));
  };
  json j = small({{"a", "b"}});
  refused(json::array(), "expected the tokenizer.json object");
  auto with = [&](const json::json_pointer& at, const json& value) {
    json k = j;
    k[at] = value;
    return k;
  };
  refused(with("/normalizer"_json_pointer, {{"type", "NFC"}}), "/normalizer");
  refused(with("/pre_tokenizer"_json_pointer, {{"type", "Whitespace"}}), "'Whitespace'");
  refused(with("/pre_tokenizer"_json_pointer, sequence({split("(", "Isolated")})),
          "/pre_tokenizer/pretokenizers/0/pattern/Regex");
  refused(with("/pre_tokenizer"_json_pointer, sequence({split("a", "Sideways")})), "/behavior");
  refused(with("/pre_tokenizer/add_prefix_space"_json_pointer, true), "add_prefix_space");
  refused(with("/decoder"_json_pointer, {{"type", "WordPiece"}}), "/decoder/type");
  refused(with("/model/type"_json_pointer, "Unigram"), "/model/type");
  refused(with("/model/dropout"_json_pointer, 0.1), "/model/dropout");
  refused(with("/model/merges/0"_json_pointer, "a z"), "/model/merges/0");  // "az" is not in the vocab
  refused(with("/model/merges/0"_json_pointer, 7), "/model/merges/0");
  refused(with("/model/vocab/a"_json_pointer, 1 << 30), "/model/vocab/a");  // beyond one id per entry
  refused(with("/model/vocab/a"_json_pointer, -1), "/model/vocab/a");
  refused(with("/model/vocab/a"_json_pointer, 98), "repeats id 98");
  {
    json k = j;
    k["model"]["vocab"].erase(byte_char(0x20));
    k["model"]["vocab"][bl("ab")] = 0x20;  // no gap in the ids
    refused(k, "byte 0x20");
  }
  refused(with("/added_tokens"_json_pointer, json::array({{{"id", 257}, {"content", "<x>"}, {"lstrip", true}}})),
          "/added_tokens/0/lstrip");
  refused(with("/added_tokens"_json_pointer, json::array({{{"id", 3}, {"content", "<x>"}}})), "/added_tokens/0/id");
  REQUIRE_THROWS_WITH(xx::parse_hf_tokenizer("{\"model\": [1, 2", "t.json"),
                      Catch::Contains("t.json") && Catch::Contains("byte ") && Catch::Contains("not JSON"));
  REQUIRE_THROWS_WITH(xx::load_hf_tokenizer("/nonexistent/tokenizer.json"),
                      Catch::Contains("/nonexistent/tokenizer.json"));
}

TEST_CASE("tokenizer.json: the fixture cut and flipped reads or is refused, never worse", "[data][hf_tokenizer]") {
  const std::string good = read(fixture_path());
  REQUIRE(good.size() > 1000);
  int read_ok = 0, refused = 0;
  auto attempt = [&](const std::string& bytes) {
    try {
      auto tok = xx::parse_hf_tokenizer(bytes, "m.json");
      tok->decode(tok->encode("a 123 \xe7\x8e\x84\xe5\xad\xa6 \xf0\x9f\x91\xa9 \xff"));
      ++read_ok;
    } catch (const InputError& e) {
      REQUIRE(std::string(e.what()).find("m.json") != std::string::npos);
      ++refused;
    }
  };
  for (size_t cut = 0; cut < good.size(); cut += good.size() / 97 + 1) attempt(good.substr(0, cut));
  for (size_t at = 7; at < good.size(); at += good.size() / 211 + 1)
    for (char c : {'"', '9', '[', '\xff', '-'}) {
      std::string bad = good;
      bad[at] = c;
      attempt(bad);
    }
  attempt(good);
  REQUIRE(read_ok >= 1);
  REQUIRE(refused > 90);  // the cuts at least
}
