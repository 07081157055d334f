// Hugging Face tokenizer.json byte-level BPE (interface in hf_tokenizer.h).
#include "data/hf_tokenizer.h"
#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <queue>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include "core/error.h"
#ifdef XX_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

namespace xx {

#ifdef XX_HAVE_PCRE2
namespace {

using json = nlohmann::json;

// ---- the file, read with every field checked -------------------------------------------------------------------

// Where a value sits in the file, for errors: "PATH: /model/merges/12".
struct At {
  const std::string& path;
  std::string pointer;
  At operator/(std::string_view key) const { return {path, pointer + "/" + std::string(key)}; }
  At operator/(size_t index) const { return {path, pointer + "/" + std::to_string(index)}; }
  [[noreturn]] void fail(std::string_view what) const {
    input_error("{}: {} {} (tokenizer.json)", path, pointer.empty() ? "/" : pointer, what);
  }
};

const char* kind_of(const json& v) { return v.type_name(); }

const json& member(const json& obj, const char* key, const At& at) {
  if (!obj.is_object()) at.fail(fmt::format("is {} (expected an object)", kind_of(obj)));
  const auto it = obj.find(key);
  if (it == obj.end()) at.fail(fmt::format("has no '{}'", key));
  return *it;
}
const json* optional_member(const json& obj, const char* key) {
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}
const std::string& text_of(const json& v, const At& at) {
  if (!v.is_string()) at.fail(fmt::format("is {} (expected a string)", kind_of(v)));
  return v.get_ref<const std::string&>();
}
bool flag_of(const json& obj, const char* key, const At& at, bool absent = false) {
  const json* v = optional_member(obj, key);
  if (!v) return absent;
  if (!v->is_boolean()) (at / key).fail(fmt::format("is {} (expected true or false)", kind_of(*v)));
  return v->get<bool>();
}
int64_t id_of(const json& v, const At& at, int64_t limit) {
  if (!v.is_number_integer()) at.fail(fmt::format("is {} (expected a token id)", kind_of(v)));
  const int64_t id = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? -1 : v.get<int64_t>();
  if (id < 0 || id >= limit)
    at.fail(fmt::format("is {} (expected an id in [0, {}): one per vocab entry and added token)", v.dump(), limit));
  return id;
}
// A setting that must have the one value this reader implements.
void require(const json& obj, const char* key, const At& at, const std::function<bool(const json*)>& ok,
             std::string_view expected) {
  if (!ok(optional_member(obj, key)))
    (at / key).fail(fmt::format("is {} (expected {}; other values change the ids and are not supported)",
                                obj.contains(key) ? obj.at(key).dump() : "absent", expected));
}

// ---- the byte-level alphabet -------------------------------------------------------------------------------------

// GPT-2's map of the 256 bytes onto printable characters: the printable
// Latin-1 bytes stand for themselves, the other 68 for U+0100 onwards.
struct ByteAlphabet {
  std::array<char32_t, 256> of_byte{};
  std::unordered_map<char32_t, uint8_t> byte_of;
  ByteAlphabet() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool itself = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      of_byte[size_t(b)] = itself ? char32_t(b) : next++;
      byte_of[of_byte[size_t(b)]] = uint8_t(b);
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// The code points of valid UTF-8 (nlohmann checks the file's strings are).
std::u32string code_points(std::string_view s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    char32_t cp = n == 1 ? c : n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
    for (int k = 1; k < n && i + size_t(k) < s.size(); ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out += cp;
    i += size_t(n);
  }
  return out;
}

// A vocab entry's bytes: each character of its text read back through the
// alphabet; nullopt for text outside it (no byte-level BPE makes that token).
std::optional<std::string> token_bytes(const std::string& text) {
  std::string out;
  for (char32_t cp : code_points(text)) {
    const auto it = alphabet().byte_of.find(cp);
    if (it == alphabet().byte_of.end()) return std::nullopt;
    out += char(it->second);
  }
  return out;
}

// ---- pre-tokenization ---------------------------------------------------------------------------------------------

struct Regex {
  std::shared_ptr<pcre2_code> code;
  Regex(const std::string& pattern, const At& at) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
    if (!c) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error, message.data(), message.size());
      at.fail(fmt::format("is not a regex PCRE2 compiles: {} at offset {} of {}", reinterpret_cast<char*>(message.data()),
                          offset, json(pattern).dump()));
    }
    pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);  // where JIT is missing, pcre2_match interprets
    code.reset(c, pcre2_code_free);
  }
};

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

// One Split: a regex or a literal string, what becomes of a match.
struct Split {
  std::optional<Regex> regex;
  std::string literal;
  Behavior behavior = Behavior::isolated;
  bool invert = false;
};

// A piece of the text: [begin, end) of the segment being encoded.
struct Piece {
  size_t begin, end;
};

// The runs of `piece` that `split` matches (true) and the runs between (false), in order.
void find_runs(const Split& split, std::string_view text, Piece piece, pcre2_match_data* md,
               std::vector<std::pair<Piece, bool>>& runs) {
  runs.clear();
  size_t at = piece.begin, from = piece.begin;
  const char* subject = text.data() + piece.begin;
  const size_t length = piece.end - piece.begin;
  while (from < piece.end) {
    size_t m0 = 0, m1 = 0;
    if (split.regex) {
      const int rc = pcre2_match(split.regex->code.get(), reinterpret_cast<PCRE2_SPTR>(subject), length,
                                 from - piece.begin, 0, md, nullptr);
      if (rc < 0) break;  // no match (or a matching limit): the rest is one run
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      m0 = piece.begin + ov[0], m1 = piece.begin + ov[1];
    } else {
      const size_t f = split.literal.empty() ? std::string_view::npos
                                             : text.substr(0, piece.end).find(split.literal, from);
      if (f == std::string_view::npos) break;
      m0 = f, m1 = f + split.literal.size();
    }
    if (m1 == m0) {  // an empty match splits nothing: step over one character
      from = m0 + 1;
      while (from < piece.end && (static_cast<unsigned char>(text[from]) & 0xc0) == 0x80) ++from;
      continue;
    }
    if (m0 > at) runs.push_back({{at, m0}, false});
    runs.push_back({{m0, m1}, true});
    at = from = m1;
  }
  if (at < piece.end) runs.push_back({{at, piece.end}, false});
}

// The pieces `split` makes of `piece`, appended to `out`.
void apply_split(const Split& split, std::string_view text, Piece piece, pcre2_match_data* md,
                 std::vector<std::pair<Piece, bool>>& runs, std::vector<Piece>& out) {
  find_runs(split, text, piece, md, runs);
  if (split.invert)
    for (auto& r : runs) r.second = !r.second;
  bool previous_match = false;
  const size_t first = out.size();
  for (const auto& [run, matched] : runs) {
    const bool has_last = out.size() > first;
    bool merge = false;  // into the last piece this split made of `piece`
    switch (split.behavior) {
      case Behavior::removed:
        if (matched) continue;
        break;
      case Behavior::isolated: break;
      case Behavior::merged_with_previous: merge = matched && !previous_match && has_last; break;
      case Behavior::merged_with_next: merge = previous_match && has_last; break;
      case Behavior::contiguous: merge = matched && previous_match && has_last; break;
    }
    if (merge) out.back().end = run.end;
    else out.push_back(run);
    previous_match = matched;
  }
}

// GPT-2's split, which ByteLevel applies with use_regex true.
constexpr const char* kGpt2Split = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Behavior behavior_of(const json& v, const At& at) {
  const std::string& name = text_of(v, at);
  static const std::pair<const char*, Behavior> names[] = {
      {"Removed", Behavior::removed}, {"Isolated", Behavior::isolated},
      {"MergedWithPrevious", Behavior::merged_with_previous}, {"MergedWithNext", Behavior::merged_with_next},
      {"Contiguous", Behavior::contiguous}};
  for (const auto& [n, b] : names)
    if (name == n) return b;
  at.fail(fmt::format("is '{}' (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)", name));
}

// The pre-tokenizer as a list of Splits. ByteLevel's byte mapping is left to
// the BPE, which works on the bytes themselves (the vocab is read back to
// bytes), so it must come last.
void read_pre_tokenizer(const json& v, const At& at, std::vector<Split>& splits, bool& byte_level) {
  const std::string& type = text_of(member(v, "type", at), at / "type");
  if (byte_level) at.fail(fmt::format("is a {} after ByteLevel (expected ByteLevel last: its splits would see "
                                      "byte-level characters)", type));
  if (type == "Sequence") {
    const json& list = member(v, "pretokenizers", at);
    if (!list.is_array()) (at / "pretokenizers").fail(fmt::format("is {} (expected a list)", kind_of(list)));
    for (size_t i = 0; i < list.size(); ++i) read_pre_tokenizer(list[i], at / "pretokenizers" / i, splits, byte_level);
  } else if (type == "Split") {
    Split s;
    const At p = at / "pattern";
    const json& pattern = member(v, "pattern", at);
    if (const json* r = pattern.is_object() ? optional_member(pattern, "Regex") : nullptr)
      s.regex.emplace(text_of(*r, p / "Regex"), p / "Regex");
    else if (const json* l = pattern.is_object() ? optional_member(pattern, "String") : nullptr)
      s.literal = text_of(*l, p / "String");
    else
      p.fail("has neither 'Regex' nor 'String' (expected one of them)");
    s.behavior = behavior_of(member(v, "behavior", at), at / "behavior");
    s.invert = flag_of(v, "invert", at);
    splits.push_back(std::move(s));
  } else if (type == "ByteLevel") {
    require(v, "add_prefix_space", at, [](const json* x) { return !x || (x->is_boolean() && !x->get<bool>()); },
            "false, as DeepSeek's and Llama 3's files have");
    if (flag_of(v, "use_regex", at, true)) {
      Split s;
      s.regex.emplace(kGpt2Split, at / "use_regex");
      splits.push_back(std::move(s));
    }
    byte_level = true;
  } else {
    (at / "type").fail(fmt::format("is '{}' (expected Sequence, Split or ByteLevel)", type));
  }
}

// ---- the tokenizer -----------------------------------------------------------------------------------------------

struct AddedToken {
  std::string content;
  int32_t id = 0;
};

struct Merge {
  int32_t rank, merged;
};

// The key of an adjacent pair of ids in the merge table.
uint64_t pair_key(int32_t left, int32_t right) { return uint64_t(uint32_t(left)) << 32 | uint32_t(right); }

struct ViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(const std::string& text, const std::string& path);
  std::string describe() const override {
    return fmt::format("tokenizer.json: {}, byte-level BPE, vocab {} ({} merges, {} added tokens)", path_,
                       vocab(), merges_.size(), added_.size());
  }
  int32_t vocab() const override { return int32_t(pieces_.size()); }
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& tokens) const override;
  // What decode gives for it: an added token's text counts (it was in the text it was encoded from).
  int32_t bytes_of(int32_t t) const override {
    return t >= 0 && size_t(t) < pieces_.size() ? int32_t(pieces_[size_t(t)].size()) : 0;
  }

 private:
  void read_model(const json& model, const At& at, int64_t limit);
  void read_added(const json& list, const At& at, int64_t limit);
  void encode_plain(std::string_view text, pcre2_match_data* md, std::vector<int32_t>& out) const;
  void bpe(std::string_view word, std::vector<int32_t>& out) const;

  std::string path_;
  std::vector<std::string> pieces_;  // what each id decodes to (bytes)
  std::vector<char> known_;          // an id the file names
  std::unordered_map<std::string, int32_t, ViewHash, std::equal_to<>> ids_;  // the vocab, by bytes
  std::array<int32_t, 256> byte_ids_{};                                     // each byte's token (-1: unk)
  int32_t unk_ = -1;
  bool ignore_merges_ = false;
  std::unordered_map<uint64_t, Merge> merges_;  // (left << 32 | right) -> rank and result
  std::vector<AddedToken> added_;               // longest first at each first byte
  std::array<bool, 256> added_starts_{};        // bytes an added token begins with
  std::vector<Split> splits_;
  // Words seen before, and their ids (a text repeats its words).
  mutable std::mutex cache_lock_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, ViewHash, std::equal_to<>> cache_;
};

HfTokenizer::HfTokenizer(const std::string& text, const std::string& path) : path_(path) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    input_error("{}: byte {}: not JSON ({}) (expected a Hugging Face tokenizer.json)", path, e.byte, e.what());
  }
  const At root{path_, ""};
  if (!doc.is_object()) root.fail(fmt::format("is {} (expected the tokenizer.json object)", kind_of(doc)));
  const json& model = member(doc, "model", root);
  const json* added = optional_member(doc, "added_tokens");
  // Ids are dense: at most one per vocab entry and added token (so no size in the file allocates anything).
  const json& vocab = member(model, "vocab", root / "model");
  if (!vocab.is_object()) (root / "model" / "vocab").fail(fmt::format("is {} (expected an object)", kind_of(vocab)));
  const int64_t limit = int64_t(vocab.size()) + (added && added->is_array() ? int64_t(added->size()) : 0);
  pieces_.reserve(size_t(limit));
  read_model(model, root / "model", limit);
  if (added) read_added(*added, root / "added_tokens", limit);
  for (size_t id = 0; id < known_.size(); ++id)
    if (!known_[id]) root.fail(fmt::format("names no token with id {} (expected ids 0 to {} without a gap)", id,
                                           known_.size() - 1));

  if (const json* n = optional_member(doc, "normalizer")) {
    const At at = root / "normalizer";
    const std::string& type = text_of(member(*n, "type", at), at / "type");
    const json* list = optional_member(*n, "normalizers");
    if (type != "Sequence" || !list || !list->is_array() || !list->empty())
      at.fail(fmt::format("is {} (expected none, or an empty Sequence: a normalizer changes the text before "
                          "the ids and is not supported)", n->dump().substr(0, 200)));
  }
  bool byte_level = false;
  if (const json* p = optional_member(doc, "pre_tokenizer"))
    read_pre_tokenizer(*p, root / "pre_tokenizer", splits_, byte_level);
  if (!byte_level) root.fail("has no ByteLevel pre-tokenizer (expected a byte-level BPE, as DeepSeek's)");
  const json& decoder = member(doc, "decoder", root);
  const At d = root / "decoder";
  if (text_of(member(decoder, "type", d), d / "type") != "ByteLevel")
    (d / "type").fail(fmt::format("is {} (expected ByteLevel)", decoder.at("type").dump()));
}

void HfTokenizer::read_model(const json& model, const At& at, int64_t limit) {
  if (const json* type = optional_member(model, "type"); type && text_of(*type, at / "type") != "BPE")
    (at / "type").fail(fmt::format("is {} (expected BPE)", type->dump()));
  require(model, "dropout", at, [](const json* x) { return !x; }, "null");
  require(model, "byte_fallback", at, [](const json* x) { return !x || (x->is_boolean() && !x->get<bool>()); },
          "false");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    require(model, key, at, [](const json* x) { return !x || (x->is_string() && x->get_ref<const std::string&>().empty()); },
            "null");
  ignore_merges_ = flag_of(model, "ignore_merges", at);

  const json& vocab = model.at("vocab");
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int64_t id = id_of(it.value(), at / "vocab" / it.key(), limit);
    if (size_t(id) >= pieces_.size()) pieces_.resize(size_t(id) + 1), known_.resize(size_t(id) + 1);
    if (known_[size_t(id)])
      (at / "vocab" / it.key()).fail(fmt::format("repeats id {} (expected one token per id)", id));
    known_[size_t(id)] = 1;
    if (auto bytes = token_bytes(it.key())) {
      pieces_[size_t(id)] = *bytes;
      ids_.emplace(std::move(*bytes), int32_t(id));
    } else {
      pieces_[size_t(id)] = it.key();  // not byte-level: no merge makes it; it decodes to its text
    }
  }
  const json* unk = optional_member(model, "unk_token");
  if (unk) {
    const auto bytes = token_bytes(text_of(*unk, at / "unk_token"));
    const auto it = bytes ? ids_.find(*bytes) : ids_.end();
    if (it == ids_.end()) (at / "unk_token").fail(fmt::format("is {} (expected a token of the vocab)", unk->dump()));
    unk_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = ids_.find(std::string(1, char(b)));
    byte_ids_[size_t(b)] = it != ids_.end() ? it->second : unk_;
    if (byte_ids_[size_t(b)] < 0)
      (at / "vocab").fail(fmt::format("has no token for byte {:#04x} (expected all 256 byte-level characters, or an "
                                      "unk_token)", b));
  }

  const json& merges = member(model, "merges", at);
  if (!merges.is_array()) (at / "merges").fail(fmt::format("is {} (expected a list)", kind_of(merges)));
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const At m = at / "merges" / rank;
    const json& e = merges[rank];
    std::string left, right;
    if (e.is_string() && e.get_ref<const std::string&>().rfind("#version", 0) == 0) {
      continue;  // merges.txt's header line, in files converted from one
    } else if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        m.fail(fmt::format("is {} (expected two tokens separated by one space)", e.dump()));
      left = s.substr(0, space), right = s.substr(space + 1);
    } else if (e.is_array() && e.size() == 2) {
      left = text_of(e[0], m / 0), right = text_of(e[1], m / 1);
    } else {
      m.fail(fmt::format("is {} (expected \"A B\" or [\"A\", \"B\"])", e.dump().substr(0, 200)));
    }
    const auto lb = token_bytes(left), rb = token_bytes(right);
    const auto li = lb ? ids_.find(*lb) : ids_.end(), ri = rb ? ids_.find(*rb) : ids_.end();
    const auto mi = lb && rb ? ids_.find(*lb + *rb) : ids_.end();
    if (li == ids_.end() || ri == ids_.end() || mi == ids_.end())
      m.fail(fmt::format("merges {} and {}, but {} is not in the vocab (expected merges of vocab tokens into one)",
                         json(left).dump(), json(right).dump(),
                         li == ids_.end() ? json(left).dump() : ri == ids_.end() ? json(right).dump()
                                                                 : json(left + right).dump()));
    // A repeated pair takes its later rank, as HF's map keeps it.
    merges_.insert_or_assign(pair_key(li->second, ri->second), Merge{int32_t(rank), mi->second});
  }
}

void HfTokenizer::read_added(const json& list, const At& at, int64_t limit) {
  if (!list.is_array()) at.fail(fmt::format("is {} (expected a list)", kind_of(list)));
  for (size_t i = 0; i < list.size(); ++i) {
    const At a = at / i;
    AddedToken t;
    t.content = text_of(member(list[i], "content", a), a / "content");
    if (t.content.empty()) (a / "content").fail("is empty (expected the token's text)");
    const int64_t id = id_of(member(list[i], "id", a), a / "id", limit);
    t.id = int32_t(id);
    flag_of(list[i], "special", a);  // checked, not used: every added token decodes to its text
    for (const char* key : {"lstrip", "rstrip", "single_word"})
      require(list[i], key, a, [](const json* x) { return !x || (x->is_boolean() && !x->get<bool>()); }, "false");
    if (size_t(id) >= pieces_.size()) pieces_.resize(size_t(id) + 1), known_.resize(size_t(id) + 1);
    // An added token may repeat a vocab entry with its id (GPT-2's <|endoftext|>), nothing else.
    if (known_[size_t(id)] && pieces_[size_t(id)] != t.content && token_bytes(t.content) != pieces_[size_t(id)])
      (a / "id").fail(fmt::format("is {}, which the vocab gives another token (expected a free id)", id));
    known_[size_t(id)] = 1;
    // HF's ByteLevel decoder reads a token of byte-level characters back to bytes, whatever its kind.
    pieces_[size_t(id)] = token_bytes(t.content).value_or(t.content);
    added_starts_[static_cast<unsigned char>(t.content[0])] = true;
    added_.push_back(std::move(t));
  }
  // At one place the longest content wins (then the first listed).
  std::stable_sort(added_.begin(), added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
}

std::vector<int32_t> HfTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(pcre2_match_data_create(4, nullptr),
                                                                          pcre2_match_data_free);
  // The added tokens first: the leftmost occurrence, the longest at its place.
  const std::string_view all(text);
  size_t plain = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (!added_starts_[static_cast<unsigned char>(all[i])]) continue;
    for (const auto& t : added_) {
      if (all.compare(i, t.content.size(), t.content) != 0) continue;
      encode_plain(all.substr(plain, i - plain), md.get(), out);
      out.push_back(t.id);
      plain = i + t.content.size();
      i = plain - 1;
      break;
    }
  }
  encode_plain(all.substr(plain), md.get(), out);
  return out;
}

void HfTokenizer::encode_plain(std::string_view text, pcre2_match_data* md, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::vector<Piece> pieces{{0, text.size()}}, next;
  std::vector<std::pair<Piece, bool>> runs;
  for (const auto& split : splits_) {
    next.clear();
    for (const Piece& p : pieces) apply_split(split, text, p, md, runs, next);
    pieces.swap(next);
  }
  for (const Piece& p : pieces) bpe(text.substr(p.begin, p.end - p.begin), out);
}

// One word's BPE: from its bytes, the adjacent pair of the lowest merge rank
// (the leftmost of equals) merges until no pair has one. A heap of candidate
// pairs keeps it O(n log n) for a long word (a run of spaces).
void HfTokenizer::bpe(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_)
    if (const auto it = ids_.find(word); it != ids_.end()) return out.push_back(it->second);
  constexpr size_t kCached = 256;  // longer words are rare; caching them would only grow the table
  if (word.size() <= kCached) {
    std::lock_guard<std::mutex> lock(cache_lock_);
    if (const auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1: none
  };
  std::vector<Symbol> s(word.size());
  for (size_t i = 0; i < word.size(); ++i)
    s[i] = {byte_ids_[static_cast<unsigned char>(word[i])], int32_t(i) - 1, i + 1 < word.size() ? int32_t(i + 1) : -1};
  struct Candidate {
    int32_t rank, left, left_id, right_id, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int32_t left) {
    if (left < 0 || s[size_t(left)].next < 0) return;
    const int32_t a = s[size_t(left)].id, b = s[size_t(s[size_t(left)].next)].id;
    if (const auto it = merges_.find(pair_key(a, b)); it != merges_.end())
      heap.push({it->second.rank, left, a, b, it->second.merged});
  };
  for (int32_t i = 0; i + 1 < int32_t(word.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = s[size_t(c.left)];
    if (left.id != c.left_id || left.next < 0 || s[size_t(left.next)].id != c.right_id) continue;  // stale
    const Symbol right = s[size_t(left.next)];
    s[size_t(left.next)].id = -1;  // gone
    left.id = c.merged;
    left.next = right.next;
    if (right.next >= 0) s[size_t(right.next)].prev = c.left;
    consider(left.prev);
    consider(c.left);
  }
  const size_t first = out.size();
  for (int32_t i = 0; i >= 0; i = s[size_t(i)].next) out.push_back(s[size_t(i)].id);
  if (word.size() <= kCached) {
    std::lock_guard<std::mutex> lock(cache_lock_);
    if (cache_.size() > (size_t(1) << 20)) cache_.clear();  // bounded: a new corpus starts afresh
    cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + std::ptrdiff_t(first), out.end()));
  }
}

std::string HfTokenizer::decode(const std::vector<int32_t>& tokens) const {
  std::string text;
  for (int32_t t : tokens) {
    if (t < 0 || size_t(t) >= pieces_.size())
      throw std::runtime_error(fmt::format("{}: token id {} is outside the vocab of {}", path_, t, pieces_.size()));
    text += pieces_[size_t(t)];
  }
  return text;
}

}  // namespace

std::unique_ptr<Tokenizer> parse_hf_tokenizer(const std::string& json_text, const std::string& path) {
  return std::make_unique<HfTokenizer>(json_text, path);
}

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) input_error("{}: cannot open the tokenizer (expected a Hugging Face tokenizer.json)", path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_hf_tokenizer(text, path);
}

#else  // no PCRE2: the pre-tokenizer's Unicode classes cannot be matched

std::unique_ptr<Tokenizer> parse_hf_tokenizer(const std::string&, const std::string& path) {
  input_error("{}: this binary was built without PCRE2, which tokenizer.json's pre-tokenizer needs (expected "
              "libpcre2-dev at build time; tools/setup-deps installs it)", path);
}
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) { return parse_hf_tokenizer("", path); }

#endif

}  // namespace xx
