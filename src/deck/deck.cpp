// Reading a deck: comments, '&' continuation, variables, include, and the
// encoding used to broadcast the resolved lines. The commands themselves are
// checked in commands.cpp.
#include "deck/deck.h"
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include "core/error.h"

namespace xx {
namespace fs = std::filesystem;

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }

// Words split at white space; '...' or "..." quotes a part of a word (a
// shard glob, a prompt with spaces) and is removed.
std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  bool any = false;  // a word is open (an empty quoted word counts)
  char quote = 0;
  for (char c : text) {
    if (quote) {
      if (c == quote) quote = 0;
      else word += c;
    } else if (c == '\'' || c == '"') {
      quote = c, any = true;
    } else if (is_space(c)) {
      if (any) words.push_back(std::move(word)), word.clear(), any = false;
    } else {
      word += c, any = true;
    }
  }
  if (any) words.push_back(std::move(word));
  return words;
}

// The words as a line that splits back into them: a word with white space
// (or none at all) in quotes.
std::string quoted_join(const std::vector<std::string>& words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    const auto& w = words[i];
    const bool plain = !w.empty() && std::none_of(w.begin(), w.end(), is_space) && w.find_first_of("'\"") == std::string::npos;
    const char q = w.find('\'') == std::string::npos ? '\'' : '"';
    out += (i ? " " : "") + (plain ? w : q + w + q);
  }
  return out;
}

std::string join(const std::vector<std::string>& words, size_t from) {
  std::string out;
  for (size_t i = from; i < words.size(); ++i) out += (i > from ? " " : "") + words[i];
  return out;
}

// Drops a '#' comment; a '#' inside ${...} is part of the name, not a comment.
std::string strip_comment(const std::string& line) {
  int depth = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '$' && i + 1 < line.size() && line[i + 1] == '{') ++depth, ++i;
    else if (line[i] == '}' && depth > 0) --depth;
    else if (line[i] == '#' && depth == 0) return line.substr(0, i);
  }
  return line;
}

std::string trim_right(std::string s) {
  while (!s.empty() && is_space(s.back())) s.pop_back();
  return s;
}

bool valid_name(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

struct Reader {
  std::map<std::string, std::string> vars;
  std::map<std::string, std::string> overrides;
  std::vector<std::string> stack;  // canonical paths of the decks being read, for cycles
  std::vector<DeckLine> out;

  std::string substitute(const std::string& text, const std::string& where) const {
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] != '$' || i + 1 >= text.size() || text[i + 1] != '{') {
        out += text[i];
        continue;
      }
      const size_t close = text.find('}', i + 2);
      if (close == std::string::npos)
        input_error("{}: unterminated '${{' in '{}' (expected ${{NAME}})", where, text);
      const std::string name = text.substr(i + 2, close - i - 2);
      auto it = vars.find(name);
      if (it == vars.end()) {
        std::vector<std::string> names;
        for (const auto& [k, v] : vars) names.push_back(k);
        input_error("{}: undefined variable '{}' (expected a 'variable {} VALUE' line above it or -var {} VALUE){}",
                    where, name, name, name, did_you_mean(name, names));
      }
      out += it->second;
      i = close;
    }
    return out;
  }

  // Reads one deck file; `from` is "FILE:LINE" of the include, empty for the top deck.
  void read(const std::string& path, const std::string& from) {
    std::error_code ec;
    std::ifstream in(path);
    if (!in || fs::is_directory(path, ec)) {
      if (from.empty()) input_error("{}: cannot open deck (expected a readable file)", path);
      input_error("{}: cannot open included deck '{}' (expected a readable file)", from, path);
    }
    std::string canon = fs::weakly_canonical(path, ec).string();
    if (ec) canon = path;
    for (const auto& p : stack)
      if (p == canon) input_error("{}: include cycle: '{}' is already being read (expected no deck to include itself)", from, path);
    stack.push_back(canon);

    std::string raw, command;
    int number = 0, start = 0;
    bool continued = false;
    while (std::getline(in, raw)) {
      ++number;
      std::string text = trim_right(strip_comment(raw));
      if (!continued) start = number, command.clear();
      continued = !text.empty() && text.back() == '&';
      if (continued) text.pop_back();
      command += text + " ";
      if (!continued) execute(path, start, command);
    }
    if (continued) execute(path, start, command);  // a '&' on the last line ends the command
    stack.pop_back();
  }

  void execute(const std::string& file, int line, const std::string& command) {
    const std::string where = fmt::format("{}:{}", file, line);
    std::vector<std::string> words = split_words(substitute(command, where));
    if (words.empty()) return;
    if (words[0] == "variable") {
      if (words.size() < 3) input_error("{}: 'variable' needs a name and a value (expected variable NAME VALUE)", where);
      if (!valid_name(words[1]))
        input_error("{}: bad variable name '{}' (expected letters, digits and '_', not starting with a digit)", where, words[1]);
      if (!overrides.count(words[1])) vars[words[1]] = join(words, 2);  // a -var wins over the deck
      return;
    }
    if (words[0] == "include") {
      if (words.size() != 2) input_error("{}: 'include' takes one file name (expected include FILE)", where);
      fs::path target(words[1]);
      if (target.is_relative()) target = fs::path(file).parent_path() / target;
      read(target.lexically_normal().string(), where);
      return;
    }
    out.push_back(DeckLine{file, line, quoted_join(words), std::move(words)});
  }
};

// Length-prefixed fields: "<size>:<bytes>" so any character survives.
void put(std::string& blob, const std::string& field) {
  blob += std::to_string(field.size());
  blob += ':';
  blob += field;
}

std::string take(const std::string& blob, size_t& pos) {
  const size_t colon = blob.find(':', pos);
  if (colon == std::string::npos) throw InputError("deck blob: truncated (expected SIZE:BYTES)");
  size_t size = 0;
  try {
    size = std::stoull(blob.substr(pos, colon - pos));
  } catch (const std::exception&) {
    throw InputError("deck blob: bad field size (expected SIZE:BYTES)");
  }
  if (size > blob.size() - colon - 1) throw InputError("deck blob: field runs past the end (expected SIZE:BYTES)");
  pos = colon + 1 + size;
  return blob.substr(colon + 1, size);
}

size_t take_number(const std::string& blob, size_t& pos) {
  const std::string s = take(blob, pos);
  size_t n = 0;
  try {
    n = std::stoull(s);
  } catch (const std::exception&) {
    throw InputError("deck blob: bad count '" + s + "' (expected an integer)");
  }
  return n;
}

// Every counted item takes at least two bytes ("0:"), so a larger count is corrupt.
size_t take_count(const std::string& blob, size_t& pos) {
  const size_t n = take_number(blob, pos);
  if (n > blob.size() - pos) throw InputError("deck blob: count exceeds the blob (expected a valid blob)");
  return n;
}

}  // namespace

std::vector<DeckLine> read_deck(const std::string& path, const std::map<std::string, std::string>& overrides) {
  Reader reader;
  reader.overrides = overrides;
  reader.vars = overrides;
  reader.read(path, "");
  return std::move(reader.out);
}

std::string serialize(const std::vector<DeckLine>& lines) {
  std::string blob;
  put(blob, std::to_string(lines.size()));
  for (const auto& l : lines) {
    put(blob, l.file);
    put(blob, std::to_string(l.line));
    put(blob, l.text);
    put(blob, std::to_string(l.words.size()));
    for (const auto& w : l.words) put(blob, w);
  }
  return blob;
}

std::vector<DeckLine> deserialize(const std::string& blob) {
  size_t pos = 0;
  std::vector<DeckLine> lines(take_count(blob, pos));
  for (auto& l : lines) {
    l.file = take(blob, pos);
    l.line = int(take_number(blob, pos));
    l.text = take(blob, pos);
    l.words.resize(take_count(blob, pos));
    for (auto& w : l.words) w = take(blob, pos);
  }
  if (pos != blob.size()) throw InputError("deck blob: trailing bytes (expected the end)");
  return lines;
}

}  // namespace xx
