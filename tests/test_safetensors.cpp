// The safetensors reader (src/hf/safetensors.h): every 16-bit and 8-bit
// pattern against an independent conversion, element ranges, a sharded
// set through its index, and one InputError naming the file for each bad
// file, including a valid one cut and flipped at many offsets.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include "core/error.h"
#include "hf/safetensors.h"
#include "safetensors_file.h"

using xx::InputError;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Dir {
  std::string path;
  Dir() {
    char t[] = "/tmp/xx-st.XXXXXX";
    REQUIRE(mkdtemp(t));
    path = t;
  }
  ~Dir() { fs::remove_all(path); }
};

using Entry = xx::test::StEntry;
std::string file_bytes(const std::vector<Entry>& entries, json extra = json::object()) {
  return xx::test::safetensors_bytes(entries, extra);
}
using xx::test::write_bytes;
template <class T>
std::string raw(const std::vector<T>& v) {
  return xx::test::raw_bytes(v);
}

bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0; }

}  // namespace

TEST_CASE("safetensors: every 16- and 8-bit pattern converts as an independent reference does", "[hf][safetensors]") {
  // fp16: the compiler's _Float16.
  for (uint32_t b = 0; b < 65536; ++b) {
    _Float16 h;
    const uint16_t bits = uint16_t(b);
    std::memcpy(&h, &bits, 2);
    INFO("fp16 bits " << b);
    REQUIRE(same(xx::f16_to_float(bits), float(h)));
  }
  // bf16: the high half of a float32.
  REQUIRE(xx::bf16_to_float(0x3f80) == 1.0f);
  REQUIRE(xx::bf16_to_float(0xc0a0) == -5.0f);
  REQUIRE(std::isinf(xx::bf16_to_float(0x7f80)));
  // FP8 e4m3fn, from its definition: bias 7, subnormals at 2^-6, no infinity, S.1111.111 is NaN, max 448.
  REQUIRE(xx::f8_e4m3_to_float(0x38) == 1.0f);
  REQUIRE(xx::f8_e4m3_to_float(0xb8) == -1.0f);
  REQUIRE(xx::f8_e4m3_to_float(0x7e) == 448.0f);
  REQUIRE(xx::f8_e4m3_to_float(0x01) == std::ldexp(1.0f, -9));
  REQUIRE(xx::f8_e4m3_to_float(0x08) == std::ldexp(1.0f, -6));
  REQUIRE(xx::f8_e4m3_to_float(0x80) == 0.0f);
  REQUIRE(std::signbit(xx::f8_e4m3_to_float(0x80)));
  REQUIRE(std::isnan(xx::f8_e4m3_to_float(0x7f)));
  REQUIRE(std::isnan(xx::f8_e4m3_to_float(0xff)));
  for (int b = 0; b < 256; ++b) {  // every finite pattern: sign * 2^(e-7) * (1 + m/8), or m/8 * 2^-6
    const int e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) continue;
    const double v = (e ? std::ldexp(1.0 + m / 8.0, e - 7) : std::ldexp(m / 8.0, -6)) * (b & 0x80 ? -1 : 1);
    REQUIRE(xx::f8_e4m3_to_float(uint8_t(b)) == float(v));
  }
}

TEST_CASE("safetensors: tensors by name, element ranges, metadata", "[hf][safetensors]") {
  Dir d;
  const std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -8.5f};
  const std::vector<uint16_t> bf16 = {0x3f80, 0xc0a0, 0x4000};
  const std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x7bff, 0x0001};
  const std::vector<uint8_t> f8 = {0x38, 0xb8, 0x7e, 0x01};
  const std::vector<int64_t> i64 = {1, 2};
  write_bytes(d.path + "/model.safetensors",
        file_bytes({{"a.weight", "F32", {2, 3}, raw(f32)},
                    {"b", "BF16", {3}, raw(bf16)},
                    {"c", "F16", {2, 2}, raw(f16)},
                    {"d", "F8_E4M3", {4}, raw(f8)},
                    {"ids", "I64", {2}, raw(i64)},
                    {"empty", "F32", {0, 4}, ""}},
                   {{"__metadata__", {{"format", "pt"}}}}));
  xx::SafetensorsFile f(d.path + "/model.safetensors");
  REQUIRE(f.tensors().size() == 6);
  REQUIRE(f.metadata().at("format") == "pt");
  REQUIRE(f.read_all(*f.find("a.weight")) == f32);
  REQUIRE(f.find("a.weight")->shape == std::vector<int64_t>{2, 3});
  REQUIRE(f.read_all(*f.find("b")) == std::vector<float>{1.0f, -5.0f, 2.0f});
  REQUIRE(f.read_all(*f.find("c")) == std::vector<float>{1.0f, -2.0f, 65504.0f, std::ldexp(1.0f, -24)});
  REQUIRE(f.read_all(*f.find("d")) == std::vector<float>{1.0f, -1.0f, 448.0f, std::ldexp(1.0f, -9)});
  REQUIRE(f.read_all(*f.find("empty")).empty());
  std::vector<float> part(3);
  f.read(*f.find("a.weight"), 2, 3, part.data());  // a rank's piece: elements [2, 5)
  REQUIRE(part == std::vector<float>{3.25f, 0.0f, 7.0f});
  REQUIRE_THROWS_AS(f.read(*f.find("a.weight"), 4, 3, part.data()), std::out_of_range);
  REQUIRE_THROWS_WITH(f.read_all(*f.find("ids")), Catch::Contains("'ids' is I64") && Catch::Contains(d.path));
  REQUIRE(f.find("nothing") == nullptr);
  // The one file as a set.
  xx::SafetensorsSet set(d.path);
  REQUIRE(set.names() == std::vector<std::string>{"a.weight", "b", "c", "d", "empty", "ids"});
  REQUIRE(set.find("c").second->count == 4);
  REQUIRE_THROWS_WITH(set.find("nothing"), Catch::Contains("no tensor 'nothing'"));
}

TEST_CASE("safetensors: a sharded set through its index", "[hf][safetensors]") {
  Dir d;
  write_bytes(d.path + "/model-00001-of-00002.safetensors",
              file_bytes({{"x", "F32", {2}, raw(std::vector<float>{1, 2})}}));
  write_bytes(d.path + "/model-00002-of-00002.safetensors",
              file_bytes({{"y", "BF16", {1}, raw(std::vector<uint16_t>{0x4040})}}));
  json index = {{"metadata", {{"total_size", 10}}},
                {"weight_map", {{"x", "model-00001-of-00002.safetensors"}, {"y", "model-00002-of-00002.safetensors"}}}};
  write_bytes(d.path + "/model.safetensors.index.json", index.dump());
  xx::SafetensorsSet set(d.path);
  REQUIRE(set.names() == std::vector<std::string>{"x", "y"});
  const auto [fy, y] = set.find("y");
  REQUIRE(fy->read_all(*y) == std::vector<float>{3.0f});
  // A missing shard, a tensor its shard lacks, a path in the index: each named.
  index["weight_map"]["z"] = "model-00003-of-00002.safetensors";
  index["weight_map"]["w"] = "model-00001-of-00002.safetensors";
  write_bytes(d.path + "/model.safetensors.index.json", index.dump());
  xx::SafetensorsSet broken(d.path);
  REQUIRE_THROWS_AS(broken.find("z"), InputError);
  REQUIRE_THROWS_WITH(broken.find("z"), Catch::Contains("model-00003-of-00002.safetensors"));
  REQUIRE_THROWS_WITH(broken.find("w"), Catch::Contains("no tensor 'w'") && Catch::Contains("index"));
  index["weight_map"]["v"] = "../etc/passwd";
  write_bytes(d.path + "/model.safetensors.index.json", index.dump());
  REQUIRE_THROWS_WITH(xx::SafetensorsSet(d.path), Catch::Contains("'../etc/passwd'") && Catch::Contains("without a path"));
  write_bytes(d.path + "/model.safetensors.index.json", "{\"weight_map\": [");
  REQUIRE_THROWS_WITH(xx::SafetensorsSet(d.path), Catch::Contains("not JSON"));
  fs::remove(d.path + "/model.safetensors.index.json");
  REQUIRE_THROWS_WITH(xx::SafetensorsSet(d.path), Catch::Contains("neither model.safetensors"));
}

TEST_CASE("safetensors: each bad file is one InputError naming it", "[hf][safetensors]") {
  Dir d;
  const std::string path = d.path + "/bad.safetensors";
  auto refused = [&](const std::string& bytes, const std::string& what) {
    INFO(what);
    write_bytes(path, bytes);
    REQUIRE_THROWS_AS(xx::SafetensorsFile(path), InputError);
    REQUIRE_THROWS_WITH(xx::SafetensorsFile(path), Catch::Contains(path) && Catch::Contains(what));
  };
  const std::string two = raw(std::vector<float>{1, 2});
  refused("abc", "expected at least 8");
  refused(std::string("\xff\xff\xff\xff\x00\x00\x00\x00", 8) + "{}", "header length");
  refused(file_bytes({{"x", "F32", {2}, two}}).replace(8, 1, "["), "not JSON");
  refused(file_bytes({{"x", "F48", {2}, two}}), "dtype 'F48'");
  refused(file_bytes({{"x", "F32", {3}, two}}), "hold 8 bytes, but 3 elements");
  refused(file_bytes({{"x", "F32", {-2}, two}}), "shape");
  refused(file_bytes({{"x", "F32", {int64_t(1) << 40, int64_t(1) << 40}, two}}), "more than the file");
  {
    std::string b = file_bytes({{"x", "F32", {2}, two}, {"y", "F32", {2}, two}});
    json h = json::parse(b.substr(8, b.size() - 8 - 16));
    h["y"]["data_offsets"] = {4, 12};  // into x
    const std::string s = h.dump();
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[size_t(i)] = char((uint64_t(s.size()) >> (8 * i)) & 0xff);
    refused(out + s + b.substr(b.size() - 16), "overlap");
  }
  refused(file_bytes({{"x", "F32", {2}, two}}).substr(0, 40), "");  // cut inside the header
  REQUIRE_THROWS_WITH(xx::SafetensorsFile(d.path + "/absent.safetensors"), Catch::Contains("absent.safetensors"));

  // A valid file cut and flipped: read (and read back) or refused, never worse.
  const std::string good = file_bytes({{"model.embed_tokens.weight", "BF16", {4, 3}, std::string(24, '\x3f')},
                                       {"model.norm.weight", "F32", {3}, raw(std::vector<float>{1, 1, 1})},
                                       {"w", "F8_E4M3", {2, 2}, "\x38\x38\x7e\x01"}});
  int ok = 0, bad = 0;
  auto attempt = [&](const std::string& bytes) {
    write_bytes(path, bytes);
    try {
      xx::SafetensorsFile f(path);
      for (const auto& t : f.tensors())
        if (t.dtype != xx::StDtype::other) f.read_all(t);
      ++ok;
    } catch (const InputError& e) {
      REQUIRE(std::string(e.what()).find(path) != std::string::npos);
      ++bad;
    }
  };
  for (size_t cut = 0; cut < good.size(); cut += 3) attempt(good.substr(0, cut));
  for (size_t at = 0; at < good.size(); ++at)
    for (char c : {'\0', '9', '"', '\xff'}) {
      std::string b = good;
      b[at] = c;
      attempt(b);
    }
  attempt(good);
  REQUIRE(ok >= 1);
  REQUIRE(bad > int(good.size() / 3));
}
