// TensorBoard event files, encoded by hand (no TensorFlow, no protobuf
// library): a file is a sequence of TFRecords, each record one Event
// protobuf. docs/OBSERVABILITY.md lists the tags we write.
//
// TFRecord framing, all integers little-endian:
//   uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
//   masked_crc32c(x) = rotate_right(crc32c(x), 15) + 0xa282ead8
// Event (tensorflow/core/util/event.proto), the fields we use:
//   double wall_time = 1; int64 step = 2; string file_version = 3;
//   Summary summary = 5;
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; TensorProto tensor = 8;
//             SummaryMetadata metadata = 9; }   (tensor, metadata: text summaries)
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace xx {

using Scalars = std::vector<std::pair<std::string, double>>;  // (tag, value)

namespace tb {
// The encoding pieces, apart so the tests can check them byte by byte.
void put_varint(std::string& out, uint64_t value);
uint32_t masked_crc32c(const void* data, size_t size);
std::string frame_record(const std::string& data);  // one TFRecord around `data`
std::string file_version_event(double wall_time);   // the first event of every file
std::string scalars_event(double wall_time, int64_t step, const Scalars& values);  // values stored as float
std::string valid_utf8(const std::string& text);  // bad bytes as U+FFFD
// A text summary (TensorBoard's text plugin): a scalar DT_STRING tensor, valid UTF-8.
std::string text_event(double wall_time, int64_t step, const std::string& tag, const std::string& text);
}  // namespace tb

// DIR/events.out.tfevents.<unix time>.<hostname>; `.1`, `.2`, ... appended
// when that name is taken (a resume within the same second).
std::filesystem::path event_file_path(const std::filesystem::path& dir);

// Writes one event file. A write error never stops training: the first one
// is reported through `warn` and the writer goes quiet.
class EventWriter {
 public:
  using Warn = std::function<void(const std::string&)>;
  // Creates the file's folder and the file, and writes the file_version event.
  EventWriter(const std::filesystem::path& file, Warn warn);

  // One event holding every value, flushed before returning, so a killed job
  // loses at most the step it was writing.
  void scalars(int64_t step, const Scalars& values);
  void text(int64_t step, const std::string& tag, const std::string& text);  // flushed, like scalars

  const std::filesystem::path& path() const { return path_; }
  bool ok() const { return ok_; }

 private:
  void write(const std::string& event);
  void give_up(const std::string& why);

  std::filesystem::path path_;
  Warn warn_;
  std::ofstream out_;
  bool ok_ = true;
};

}  // namespace xx
