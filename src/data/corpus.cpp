// Corpus loading (bytes and shard formats, one file or many), shard writing,
// and the window split. The shard layout is documented in docs/DATA.md; all
// integers are little-endian and decoded byte by byte so the reader does not
// depend on the host.
#include "data/corpus.h"
#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include "core/error.h"

namespace xx {

namespace {

constexpr char kMagic[] = "XXTOKENS";  // 8 bytes, no terminator in the file
constexpr int64_t kHeaderV1 = 32, kHeaderV2 = 64;

uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void put_le(unsigned char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

// Magic bytes as text for a message; non-printable bytes as \xNN.
std::string printable(const unsigned char* p, int n) {
  std::string s;
  for (int i = 0; i < n; ++i)
    s += (p[i] >= 0x20 && p[i] < 0x7f) ? std::string(1, char(p[i])) : fmt::format("\\x{:02x}", p[i]);
  return s;
}

const int64_t kPage = ::sysconf(_SC_PAGESIZE);

}  // namespace

// A read-only mapping of a whole file, unmapped with its last TokenFile.
struct TokenFile::Mapping {
  const unsigned char* data = nullptr;
  int64_t bytes = 0;
  ~Mapping() {
    if (data) ::munmap(const_cast<unsigned char*>(data), size_t(bytes));
  }
  // Pages covering [begin, begin + n) go back to the page cache: a window
  // once copied costs no resident memory.
  void release(int64_t begin, int64_t n) const {
    const int64_t lo = begin / kPage * kPage, hi = std::min(bytes, begin + n);
    if (hi > lo) ::madvise(const_cast<unsigned char*>(data) + lo, size_t(hi - lo), MADV_DONTNEED);
  }
};

TokenFile TokenFile::open(const std::string& path, DataFormat format, bool check_tokens) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) input_error("{}: cannot open for reading ({})", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    input_error("{}: not a regular file (expected a {} file)", path, format == DataFormat::bytes ? "text" : "shard");
  }
  auto map = std::make_shared<Mapping>();
  map->bytes = int64_t(st.st_size);
  if (map->bytes > 0) {
    void* p = ::mmap(nullptr, size_t(map->bytes), PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      input_error("{}: cannot map for reading ({})", path, why);
    }
    map->data = static_cast<const unsigned char*>(p);
    ::madvise(p, size_t(map->bytes), MADV_RANDOM);  // windows are read in shuffled order: no read-ahead
  }
  ::close(fd);

  TokenFile f;
  f.path_ = path;
  f.map_ = map;
  const int64_t file_bytes = map->bytes;
  const unsigned char* h = map->data;
  if (format == DataFormat::bytes) {
    if (file_bytes == 0) input_error("{}: offset 0: empty file (expected at least one byte of text)", path);
    f.tokens_ = h, f.width_ = 1, f.count_ = file_bytes, f.vocab_ = 256;
    return f;
  }

  if (file_bytes < kHeaderV1)
    input_error("{}: offset {}: file ends after {} bytes (expected a {}-byte shard header)", path, file_bytes,
                file_bytes, kHeaderV1);
  if (std::memcmp(h, kMagic, 8) != 0)
    input_error("{}: offset 0: bad magic '{}' (expected '{}'; is this a shard from tools/prepare-data?)", path,
                printable(h, 8), kMagic);
  const uint32_t version = uint32_t(get_le(h + 8, 4));
  if (version != 1 && version != 2)
    input_error("{}: offset 8: shard version {} (expected 1 or 2)", path, version);
  const int64_t header = version == 1 ? kHeaderV1 : kHeaderV2;
  if (file_bytes < header)
    input_error("{}: offset {}: file ends after {} bytes (expected a {}-byte version-{} shard header)", path,
                file_bytes, file_bytes, header, version);
  const uint32_t width = uint32_t(get_le(h + 12, 4));
  if (width != 2 && width != 4) input_error("{}: offset 12: token width {} bytes (expected 2 or 4)", path, width);
  const uint64_t count = get_le(h + 16, 8);
  if (count == 0) input_error("{}: offset 16: token count 0 (expected a non-empty corpus)", path);
  const uint32_t vocab = uint32_t(get_le(h + 24, 4));
  const uint64_t max_vocab = width == 2 ? 65536 : uint64_t(std::numeric_limits<int32_t>::max());
  if (vocab == 0 || vocab > max_vocab)
    input_error("{}: offset 24: vocab {} (expected 1 to {} for {}-byte tokens)", path, vocab, max_vocab, width);
  const uint32_t reserved = uint32_t(get_le(h + 28, 4));
  if (reserved != 0) input_error("{}: offset 28: reserved field is {} (expected 0)", path, reserved);
  if (version == 2) {
    f.info_.tokenizer_hash = get_le(h + 32, 8);
    f.info_.text_bytes = get_le(h + 40, 8);
    for (int64_t at = 48; at < kHeaderV2; ++at)
      if (h[at] != 0) input_error("{}: offset {}: reserved byte is {} (expected 0)", path, at, h[at]);
  }

  // Compare in tokens so a huge count cannot overflow count * width.
  const uint64_t held = uint64_t(file_bytes - header) / width;
  if (held < count)
    input_error("{}: offset {}: file holds {} tokens, header says {} (a truncated shard?)", path,
                header + int64_t(held) * width, held, count);
  const int64_t end = header + int64_t(count) * width;
  if (end != file_bytes)
    input_error("{}: offset {}: {} bytes after the {} tokens the header announces (expected end of file)", path, end,
                file_bytes - end, count);

  f.tokens_ = h + header, f.width_ = int(width), f.count_ = int64_t(count), f.vocab_ = int32_t(vocab);
  f.version_ = int(version), f.header_ = header;
  if (check_tokens) {
    // In chunks, each released once checked: a scan of a big shard leaves no resident pages.
    std::vector<int32_t> chunk(1 << 22);
    for (int64_t at = 0; at < f.count_; at += int64_t(chunk.size()))
      f.read(at, std::min<int64_t>(int64_t(chunk.size()), f.count_ - at), chunk.data(), true);
  }
  return f;
}

void TokenFile::read(int64_t start, int64_t n, int32_t* out, bool release) const {
  const unsigned char* p = tokens_ + start * width_;
  for (int64_t i = 0; i < n; ++i, p += width_) {
    const uint64_t t = width_ == 1 ? *p : get_le(p, width_);
    if (t >= uint64_t(vocab_))
      input_error("{}: offset {}: token {} is outside the vocab of {}", path_, header_ + (start + i) * width_, t,
                  vocab_);
    out[i] = int32_t(t);
  }
  if (release) map_->release(header_ + start * width_, n * width_);
}

Corpus Corpus::load(const std::string& pattern, DataFormat format, bool check_tokens) {
  std::vector<std::string> paths;
  const bool wildcard = pattern.find_first_of("*?[") != std::string::npos;
  if (format == DataFormat::shard && wildcard) {
    glob_t g{};
    const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
    for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    if (rc == GLOB_NOMATCH || paths.empty())
      input_error("{}: the shard pattern matches no file (expected shards such as those tools/prepare-data writes, "
                  "e.g. 'DIR/train_*.bin')", pattern);
    if (rc != 0) input_error("{}: cannot list the shard pattern's directory ({})", pattern, std::strerror(errno));
    std::sort(paths.begin(), paths.end());  // byte order, whatever the locale: the same corpus everywhere
  } else {
    paths.push_back(pattern);
  }
  Corpus c;
  c.path_ = pattern;
  for (const auto& p : paths) {
    c.files_.push_back(TokenFile::open(p, format, check_tokens));
    c.first_.push_back(c.size_);
    c.size_ += c.files_.back().size();
    c.vocab_ = std::max(c.vocab_, c.files_.back().vocab());
  }
  return c;
}

int64_t Corpus::windows(int64_t seq) const {
  int64_t n = 0;
  for (const auto& f : files_) n += (f.size() - 1) / seq;
  return n;
}

// The file of window w and the window's number within it; {files, 0} past the end.
std::pair<size_t, int64_t> Corpus::locate(int64_t w, int64_t seq) const {
  for (size_t i = 0; i < files_.size(); ++i) {
    const int64_t here = (files_[i].size() - 1) / seq;
    if (w >= 0 && w < here) return {i, w};
    w -= here;
  }
  return {files_.size(), 0};
}

int64_t Corpus::window_start(int64_t w, int64_t seq) const {
  const auto [file, local] = locate(w, seq);
  return file < files_.size() ? first_[file] + local * seq : size_;  // past the end: callers check against windows()
}

void Corpus::read_window(int64_t w, int64_t seq, int32_t* out) const {
  const auto [file, local] = locate(w, seq);
  if (file == files_.size())
    throw std::out_of_range(fmt::format("{}: window {} of {}+1 tokens is past the {} windows of the corpus", path_,
                                        w, seq, windows(seq)));
  files_[file].read(local * seq, seq + 1, out, true);
}

int32_t Corpus::token(int64_t i) const {
  const size_t f = size_t(std::upper_bound(first_.begin(), first_.end(), i) - first_.begin()) - 1;
  int32_t t = 0;
  files_[f].read(i - first_[f], 1, &t, false);
  return t;
}

void write_shard(const std::string& path, const std::vector<int32_t>& tokens, int32_t vocab, int token_bytes,
                 const ShardInfo& info, int version) {
  if (token_bytes != 2 && token_bytes != 4)
    input_error("{}: token width {} bytes (expected 2 or 4)", path, token_bytes);
  if (tokens.empty()) input_error("{}: no tokens to write (expected a non-empty corpus)", path);
  if (vocab < 1 || (token_bytes == 2 && vocab > 65536))
    input_error("{}: vocab {} (expected 1 to {} for {}-byte tokens)", path, vocab, token_bytes == 2 ? 65536 : INT32_MAX,
                token_bytes);

  if (version != 1 && version != 2) input_error("{}: shard version {} (expected 1 or 2)", path, version);
  const int64_t header = version == 1 ? kHeaderV1 : kHeaderV2;
  std::vector<unsigned char> out(header + tokens.size() * token_bytes);
  std::memcpy(out.data(), kMagic, 8);
  put_le(&out[8], uint32_t(version), 4);
  put_le(&out[12], uint32_t(token_bytes), 4);
  put_le(&out[16], tokens.size(), 8);
  put_le(&out[24], uint32_t(vocab), 4);
  put_le(&out[28], 0, 4);
  if (version == 2) {
    put_le(&out[32], info.tokenizer_hash, 8);
    put_le(&out[40], info.text_bytes, 8);
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab)
      input_error("{}: token {} at index {} is outside the vocab of {}", path, tokens[i], i, vocab);
    put_le(&out[header + i * token_bytes], uint32_t(tokens[i]), token_bytes);
  }

  // Temp file in the same directory, so the rename is atomic and a crash never
  // leaves a half-written shard under the real name.
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  auto fail = [&](const char* what) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw std::runtime_error(fmt::format("{}: {} failed ({})", tmp, what, why));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("open");
  for (size_t done = 0; done < out.size();) {
    const ssize_t n = ::write(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      fail("write");
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail("fsync");
  }
  if (::close(fd) != 0) fail("close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename");
  // Persist the rename itself.
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

WindowSplit split_windows(const Corpus& corpus, int64_t seq, double valid_fraction) {
  if (seq < 1) input_error("{}: seq {} (expected at least 1)", corpus.path(), seq);
  if (!(valid_fraction >= 0.0 && valid_fraction < 1.0))
    input_error("{}: valid_fraction {} (expected 0 <= valid_fraction < 1)", corpus.path(), valid_fraction);
  auto valid_of = [&](int64_t total) { return std::max<int64_t>(1, std::llround(double(total) * valid_fraction)); };

  WindowSplit s;
  s.seq = seq;
  const int64_t total = corpus.windows(seq);
  s.valid_windows = valid_of(total);
  s.train_windows = total - s.valid_windows;
  if (s.train_windows < 1) {
    // Smallest window count that leaves a training window: round(T*f) <= T-1
    // needs T*(1-f) > 0.5, so start the search there (f near 1 would be slow).
    int64_t need = std::max<int64_t>(2, int64_t(0.5 / (1.0 - valid_fraction)));
    while (need - valid_of(need) < 1) ++need;
    input_error("{}: corpus has {} tokens, too few for seq {} with valid_fraction {} (need at least {} tokens: {} "
                "windows of {} tokens, plus one for the last target)",
                corpus.path(), corpus.size(), seq, valid_fraction, need * seq + 1, need, seq);
  }
  return s;
}

}  // namespace xx
