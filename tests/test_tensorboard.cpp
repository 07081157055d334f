// TensorBoard event encoding (src/io/tensorboard.*): varints, the masked
// CRC-32C, TFRecord framing and Event bytes against values worked out by hand
// (and by Python's crc32c module); RunLog's event files; write errors.
// tests/tensorboard_read.py reads real runs' files back independently.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include "core/crc32c.h"
#include "io/log.h"
#include "io/tensorboard.h"
#include "temp_dir.h"

using namespace xx;

namespace {

std::string bytes(std::initializer_list<int> list) {
  std::string s;
  for (int b : list) s.push_back(static_cast<char>(b));
  return s;
}

std::string varint(uint64_t v) {
  std::string s;
  tb::put_varint(s, v);
  return s;
}

std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::vector<std::filesystem::path> event_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  if (!std::filesystem::exists(dir)) return files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

// The records of a file, each checked against its two masked CRCs.
std::vector<std::string> records(const std::string& file) {
  std::vector<std::string> out;
  size_t at = 0;
  auto u64 = [&](size_t p) { uint64_t v = 0; std::memcpy(&v, file.data() + p, 8); return v; };
  auto u32 = [&](size_t p) { uint32_t v = 0; std::memcpy(&v, file.data() + p, 4); return v; };
  while (at < file.size()) {
    REQUIRE(at + 12 <= file.size());
    const uint64_t n = u64(at);
    REQUIRE(u32(at + 8) == tb::masked_crc32c(file.data() + at, 8));
    REQUIRE(at + 12 + n + 4 <= file.size());
    const std::string data = file.substr(at + 12, n);
    REQUIRE(u32(at + 12 + n) == tb::masked_crc32c(data.data(), data.size()));
    out.push_back(data);
    at += 12 + n + 4;
  }
  return out;
}

}  // namespace

TEST_CASE("varints are little-endian groups of 7 bits", "[tensorboard]") {
  CHECK(varint(0) == bytes({0x00}));
  CHECK(varint(1) == bytes({0x01}));
  CHECK(varint(127) == bytes({0x7f}));
  CHECK(varint(128) == bytes({0x80, 0x01}));
  CHECK(varint(300) == bytes({0xac, 0x02}));
  CHECK(varint(16384) == bytes({0x80, 0x80, 0x01}));
  // int64 -1 as protobuf writes it: ten bytes
  CHECK(varint(static_cast<uint64_t>(int64_t{-1})) ==
        bytes({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}));
}

TEST_CASE("masked CRC-32C matches known values", "[tensorboard]") {
  // crc32c("123456789") = 0xE3069283 (the standard check value); masked:
  // rotate right 15 -> 0x2507C60D, plus 0xa282ead8 -> 0xC78AB0E5
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  CHECK(tb::masked_crc32c("123456789", 9) == 0xC78AB0E5u);
  CHECK(tb::masked_crc32c("", 0) == 0xa282ead8u);  // crc of nothing is 0
  const std::string zeros(8, '\0');                // the length field of an empty record
  CHECK(tb::masked_crc32c(zeros.data(), 8) == 0x07980329u);  // Python: crc32c.crc32c
}

TEST_CASE("CRC-32C of pieces combines into the whole's", "[tensorboard][ckpt]") {
  CHECK(crc32c_combine(crc32c("1234", 4), crc32c("56789", 5), 5) == 0xE3069283u);
  std::mt19937 gen(7);
  std::vector<unsigned char> bytes(100003);
  for (auto& b : bytes) b = static_cast<unsigned char>(gen());
  const uint32_t whole = crc32c(bytes.data(), bytes.size());
  for (size_t cut : {size_t(0), size_t(1), size_t(4096), size_t(77777), bytes.size()}) {
    INFO("cut at " << cut);
    const uint32_t a = crc32c(bytes.data(), cut), b = crc32c(bytes.data() + cut, bytes.size() - cut);
    CHECK(crc32c_combine(a, b, bytes.size() - cut) == whole);
    if (cut > 0) CHECK(crc32c_combine(a, b, bytes.size() - cut + 1) != whole);  // the length matters (but after nothing)
  }
  // Three pieces, left to right, as a tensor's ranks are combined.
  uint32_t crc = 0;
  for (auto [at, n] : {std::pair<size_t, size_t>{0, 10}, {10, 50000}, {50010, bytes.size() - 50010}})
    crc = crc32c_combine(crc, crc32c(bytes.data() + at, n), n);
  CHECK(crc == whole);
}

TEST_CASE("a TFRecord is length, its masked CRC, data, the data's masked CRC", "[tensorboard]") {
  const std::string empty = tb::frame_record("");
  CHECK(empty == std::string(8, '\0') + bytes({0x29, 0x03, 0x98, 0x07}) + bytes({0xd8, 0xea, 0x82, 0xa2}));
  const std::string r = tb::frame_record("123456789");
  REQUIRE(r.size() == 8 + 4 + 9 + 4);
  CHECK(r.substr(0, 8) == bytes({9, 0, 0, 0, 0, 0, 0, 0}));
  CHECK(r.substr(12, 9) == "123456789");
  CHECK(r.substr(21) == bytes({0xe5, 0xb0, 0x8a, 0xc7}));
}

TEST_CASE("Event bytes: wall_time, step, file_version, summary", "[tensorboard]") {
  const std::string wall = bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f});  // field 1, fixed64: 1.5
  CHECK(tb::file_version_event(1.5) == wall + bytes({0x10, 0x00, 0x1a, 13}) + "brain.Event:2");
  // Summary { value { tag "a" simple_value 0.25 } } at step 300
  const std::string value = bytes({0x0a, 0x01}) + "a" + bytes({0x15, 0x00, 0x00, 0x80, 0x3e});
  const std::string summary = bytes({0x0a, 0x08}) + value;
  CHECK(tb::scalars_event(1.5, 300, {{"a", 0.25}}) == wall + bytes({0x10, 0xac, 0x02, 0x2a, 0x0a}) + summary);
  // values are stored as float: 0.1 becomes float(0.1)
  const std::string e = tb::scalars_event(1.5, 1, {{"x", 0.1}});
  float f = 0;
  std::memcpy(&f, e.data() + e.size() - 4, 4);
  CHECK(f == 0.1f);
}

TEST_CASE("RunLog writes run and rank event files under RUN_DIR/tb", "[tensorboard]") {
  test::TempDir tmp("tb");
  const auto dir = tmp.dir.string();
  {
    RunLog log(dir, 0, false, true, true);
    log.metrics({{"step", 3}, {"loss", 2.5}, {"val_loss", 2.75}, {"lossagg_weights", {1.0, 2.0}},
                 {"grad_norm", std::nan("")}});
    log.rank_scalars(3, {{"loss", 1.25}});
  }
  const auto run_files = event_files(tmp.dir / "tb");
  REQUIRE(run_files.size() == 1);
  auto recs = records(read_all(run_files[0]));
  REQUIRE(recs.size() == 2);
  CHECK(recs[0].find("brain.Event:2") != std::string::npos);
  CHECK(recs[1].find("train/loss") != std::string::npos);
  CHECK(recs[1].find("val/loss") != std::string::npos);
  CHECK(recs[1].find("step") == std::string::npos);             // the step is the event's, not a scalar
  CHECK(recs[1].find("lossagg_weights") == std::string::npos);  // lists are left out
  CHECK(recs[1].find("grad_norm") == std::string::npos);        // and NaN, null in metrics.jsonl
  const auto rank_files = event_files(tmp.dir / "tb" / "rank0");
  REQUIRE(rank_files.size() == 1);
  recs = records(read_all(rank_files[0]));
  REQUIRE(recs.size() == 2);
  CHECK(recs[1].find("rank0/loss") != std::string::npos);

  SECTION("rank 1 writes only its own file") {
    test::TempDir other("tb1");
    {
      RunLog log(other.dir.string(), 1, false, true, true);
      log.metrics({{"step", 1}, {"loss", 1.0}});
      log.rank_scalars(1, {{"comm_bytes", 4096}});
    }
    CHECK(event_files(other.dir / "tb").empty());
    const auto files = event_files(other.dir / "tb" / "rank1");
    REQUIRE(files.size() == 1);
    recs = records(read_all(files[0]));
    REQUIRE(recs.size() == 2);
    CHECK(recs[1].find("rank1/comm_bytes") != std::string::npos);
  }
  SECTION("a resumed run starts new files beside the old ones") {
    { RunLog log(dir, 0, true, true, true); }
    CHECK(event_files(tmp.dir / "tb").size() == 2);
    CHECK(event_files(tmp.dir / "tb" / "rank0").size() == 2);
  }
  SECTION("tensorboard off writes no events") {
    test::TempDir off("tboff");
    {
      RunLog log(off.dir.string(), 0, false, true, false);
      log.metrics({{"step", 1}, {"loss", 1.0}});
      log.rank_scalars(1, {{"loss", 1.0}});
    }
    CHECK(!std::filesystem::exists(off.dir / "tb"));
  }
}

TEST_CASE("a write error warns once and training goes on", "[tensorboard]") {
  // /dev/full accepts the open and fails every write (ENOSPC)
  std::vector<std::string> warnings;
  EventWriter writer("/dev/full", [&](const std::string& w) { warnings.push_back(w); });
  CHECK_FALSE(writer.ok());
  REQUIRE_NOTHROW(writer.scalars(1, {{"loss", 1.0}}));
  REQUIRE_NOTHROW(writer.scalars(2, {{"loss", 1.0}}));
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("cannot write /dev/full") != std::string::npos);

  test::TempDir tmp("tbbad");
  tmp.write("tb", "a file where the tb folder should be");
  std::vector<std::string> more;
  EventWriter blocked(tmp.dir / "tb" / "rank0" / "events.out.tfevents.1.host",
                      [&](const std::string& w) { more.push_back(w); });
  CHECK_FALSE(blocked.ok());
  REQUIRE(more.size() == 1);
  CHECK(more[0].find("cannot create") != std::string::npos);
}

TEST_CASE("text summaries are valid UTF-8: a bad byte becomes U+FFFD", "[tensorboard]") {
  CHECK(tb::valid_utf8("plain") == "plain");
  CHECK(tb::valid_utf8("h\xc3\xa9llo \xe2\x96\x81 \xf0\x9f\x98\x80") == "h\xc3\xa9llo \xe2\x96\x81 \xf0\x9f\x98\x80");
  CHECK(tb::valid_utf8("a\xc3") == "a\xef\xbf\xbd");            // cut mid-character
  CHECK(tb::valid_utf8("\xff\xfe") == "\xef\xbf\xbd\xef\xbf\xbd");  // never UTF-8
  CHECK(tb::valid_utf8("\xc0\xaf") == "\xef\xbf\xbd\xef\xbf\xbd");  // overlong '/'
  CHECK(tb::valid_utf8("\xed\xa0\x80") == "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // a surrogate
  // The event: tag, the text as a DT_STRING tensor, plugin "text".
  const std::string e = tb::text_event(1.5, 7, "samples/text", "hi\xff");
  CHECK(e.find("samples/text") != std::string::npos);
  CHECK(e.find("hi\xef\xbf\xbd") != std::string::npos);
  CHECK(e.find("text") != std::string::npos);
}
