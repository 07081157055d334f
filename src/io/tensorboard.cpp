#include "io/tensorboard.h"
#include <unistd.h>
#include <bit>
#include <chrono>
#include <cstdio>
#include <fmt/format.h>
#include "core/crc32c.h"

namespace xx {

namespace {

// Protobuf wire types: 0 varint, 1 fixed 64-bit, 2 length-delimited, 5 fixed 32-bit.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

void put_key(std::string& out, uint32_t field, WireType type) { tb::put_varint(out, (field << 3) | type); }

void put_fixed(std::string& out, uint64_t bits, int bytes) {  // little-endian
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
}

void put_bytes_field(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kBytes);
  tb::put_varint(out, bytes.size());
  out += bytes;
}

// Event fields 1 (wall_time) and 2 (step), which every event starts with.
std::string event_head(double wall_time, int64_t step) {
  std::string event;
  put_key(event, 1, kFixed64);
  put_fixed(event, std::bit_cast<uint64_t>(wall_time), 8);
  put_key(event, 2, kVarint);
  tb::put_varint(event, static_cast<uint64_t>(step));  // negative steps: 10 bytes, as protobuf does
  return event;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

namespace tb {

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string frame_record(const std::string& data) {
  std::string record, length;
  put_fixed(length, data.size(), 8);
  record += length;
  put_fixed(record, masked_crc32c(length.data(), length.size()), 4);
  record += data;
  put_fixed(record, masked_crc32c(data.data(), data.size()), 4);
  return record;
}

std::string file_version_event(double wall_time) {
  std::string event = event_head(wall_time, 0);
  put_bytes_field(event, 3, "brain.Event:2");
  return event;
}

std::string scalars_event(double wall_time, int64_t step, const Scalars& values) {
  std::string summary;
  for (const auto& [tag, value] : values) {
    std::string v;
    put_bytes_field(v, 1, tag);
    put_key(v, 2, kFixed32);
    put_fixed(v, std::bit_cast<uint32_t>(static_cast<float>(value)), 4);
    put_bytes_field(summary, 1, v);
  }
  std::string event = event_head(wall_time, step);
  put_bytes_field(event, 5, summary);
  return event;
}

// Invalid UTF-8 (a byte-level model's sample can end mid-character) as
// U+FFFD, one per bad byte: TensorBoard reads text as UTF-8.
std::string valid_utf8(const std::string& in) {
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  const size_t n = in.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xc0) == 0x80;
    if (ok && len == 2) ok = c >= 0xc2;                                                    // no overlong
    if (ok && len == 3) ok = !(c == 0xe0 && p[i + 1] < 0xa0) && !(c == 0xed && p[i + 1] >= 0xa0);  // no surrogates
    if (ok && len == 4) ok = !(c == 0xf0 && p[i + 1] < 0x90) && !(c == 0xf4 && p[i + 1] >= 0x90) && c <= 0xf4;
    if (ok) {
      out.append(in, i, size_t(len));
      i += size_t(len);
    } else {
      out += "\xef\xbf\xbd";
      ++i;
    }
  }
  return out;
}

// Value { tag = 1; metadata = 9 { plugin_data = 1 { plugin_name = 1: "text" } };
//         tensor = 8 { dtype = 1: DT_STRING (7); tensor_shape = 2: {} (a scalar); string_val = 8 } }
std::string text_event(double wall_time, int64_t step, const std::string& tag, const std::string& text) {
  std::string plugin, metadata, tensor, value, summary;
  put_bytes_field(plugin, 1, "text");
  put_bytes_field(metadata, 1, plugin);
  put_key(tensor, 1, kVarint);
  put_varint(tensor, 7);
  put_bytes_field(tensor, 2, "");
  put_bytes_field(tensor, 8, valid_utf8(text));
  put_bytes_field(value, 1, tag);
  put_bytes_field(value, 8, tensor);
  put_bytes_field(value, 9, metadata);
  put_bytes_field(summary, 1, value);
  std::string event = event_head(wall_time, step);
  put_bytes_field(event, 5, summary);
  return event;
}

}  // namespace tb

std::filesystem::path event_file_path(const std::filesystem::path& dir) {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof(host), "localhost");
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch()).count();
  const auto base = dir / fmt::format("events.out.tfevents.{}.{}", seconds, host);
  auto path = base;
  for (int n = 1; std::filesystem::exists(path); ++n) path = base.string() + "." + std::to_string(n);
  return path;
}

EventWriter::EventWriter(const std::filesystem::path& file, Warn warn) : path_(file), warn_(std::move(warn)) {
  std::error_code ec;
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ec);
  if (ec) {
    give_up(fmt::format("cannot create {}: {}", file.parent_path().string(), ec.message()));
    return;
  }
  out_.open(file, std::ios::out | std::ios::binary | std::ios::trunc);
  if (!out_) {
    give_up("cannot open " + file.string());
    return;
  }
  write(tb::file_version_event(now_seconds()));
}

void EventWriter::scalars(int64_t step, const Scalars& values) {
  if (ok_ && !values.empty()) write(tb::scalars_event(now_seconds(), step, values));
}

void EventWriter::text(int64_t step, const std::string& tag, const std::string& text) {
  if (ok_) write(tb::text_event(now_seconds(), step, tag, text));
}

void EventWriter::write(const std::string& event) {
  const std::string record = tb::frame_record(event);
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
  out_.flush();
  if (!out_) give_up("cannot write " + path_.string());
}

void EventWriter::give_up(const std::string& why) {
  if (!ok_) return;
  ok_ = false;
  if (warn_) warn_(fmt::format("warning: tensorboard: {}; no more events there (training goes on)", why));
}

}  // namespace xx
