// Corpus loading (bytes and shard formats), shard writing, and the window split.
// The shard layout is documented in docs/DATA.md; all integers are little-endian
// and decoded byte by byte so the reader does not depend on the host.
#include "data/corpus.h"
#include <fcntl.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include "core/error.h"

namespace xx {

namespace {

constexpr char kMagic[] = "XXTOKENS";  // 8 bytes, no terminator in the file
constexpr uint32_t kVersion = 1;
constexpr int64_t kHeaderBytes = 32;

std::vector<unsigned char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) input_error("{}: cannot open for reading ({})", path, std::strerror(errno));
  std::vector<unsigned char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) input_error("{}: read failed ({})", path, std::strerror(errno));
  return data;
}

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

}  // namespace

Corpus Corpus::load(const std::string& path, const std::string& format) {
  if (format != "bytes" && format != "shard")
    input_error("{}: unknown corpus format '{}' (expected 'bytes' or 'shard'){}", path, format,
                did_you_mean(format, {"bytes", "shard"}));
  const std::vector<unsigned char> data = read_file(path);
  Corpus c;
  c.path_ = path;

  if (format == "bytes") {
    if (data.empty()) input_error("{}: offset 0: empty file (expected at least one byte of text)", path);
    c.vocab_ = 256;
    c.tokens_.assign(data.begin(), data.end());
    return c;
  }

  const int64_t file_bytes = int64_t(data.size());
  if (file_bytes < kHeaderBytes)
    input_error("{}: offset {}: file ends after {} bytes (expected a {}-byte shard header)", path, file_bytes,
                file_bytes, kHeaderBytes);
  const unsigned char* h = data.data();
  if (std::memcmp(h, kMagic, 8) != 0)
    input_error("{}: offset 0: bad magic '{}' (expected '{}'; is this a shard from tools/prepare-data?)", path,
                printable(h, 8), kMagic);
  const uint32_t version = uint32_t(get_le(h + 8, 4));
  if (version != kVersion) input_error("{}: offset 8: shard version {} (expected {})", path, version, kVersion);
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

  // Compare in tokens so a huge count cannot overflow count * width.
  const uint64_t held = uint64_t(file_bytes - kHeaderBytes) / width;
  if (held < count) input_error("{}: offset {}: file holds {} tokens, header says {}", path, kHeaderBytes, held, count);
  const int64_t end = kHeaderBytes + int64_t(count) * width;
  if (end != file_bytes)
    input_error("{}: offset {}: {} bytes after the {} tokens the header announces (expected end of file)", path, end,
                file_bytes - end, count);

  c.vocab_ = int32_t(vocab);
  c.tokens_.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    const int64_t off = kHeaderBytes + int64_t(i) * width;
    const uint64_t t = get_le(h + off, int(width));
    if (t >= vocab) input_error("{}: offset {}: token {} is outside the vocab of {}", path, off, t, vocab);
    c.tokens_[i] = int32_t(t);
  }
  return c;
}

void write_shard(const std::string& path, const std::vector<int32_t>& tokens, int32_t vocab, int token_bytes) {
  if (token_bytes != 2 && token_bytes != 4)
    input_error("{}: token width {} bytes (expected 2 or 4)", path, token_bytes);
  if (tokens.empty()) input_error("{}: no tokens to write (expected a non-empty corpus)", path);
  if (vocab < 1 || (token_bytes == 2 && vocab > 65536))
    input_error("{}: vocab {} (expected 1 to {} for {}-byte tokens)", path, vocab, token_bytes == 2 ? 65536 : INT32_MAX,
                token_bytes);

  std::vector<unsigned char> out(kHeaderBytes + tokens.size() * token_bytes);
  std::memcpy(out.data(), kMagic, 8);
  put_le(&out[8], kVersion, 4);
  put_le(&out[12], uint32_t(token_bytes), 4);
  put_le(&out[16], tokens.size(), 8);
  put_le(&out[24], uint32_t(vocab), 4);
  put_le(&out[28], 0, 4);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab)
      input_error("{}: token {} at index {} is outside the vocab of {}", path, tokens[i], i, vocab);
    put_le(&out[kHeaderBytes + i * token_bytes], uint32_t(tokens[i]), token_bytes);
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
  const int64_t total = (corpus.size() - 1) / seq;
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
