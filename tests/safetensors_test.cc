#include "model/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace g4 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// One tensor to write: its header entry is built from these, with contiguous data_offsets.
struct Spec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

template <typename T>
std::string Bytes(std::initializer_list<T> values) {
  std::string s(values.size() * sizeof(T), '\0');
  size_t i = 0;
  for (T v : values) std::memcpy(&s[sizeof(T) * i++], &v, sizeof(T));
  return s;
}

// A fresh, empty directory per test under ::testing::TempDir().
std::string TestDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(::testing::TempDir()) / "g4_safetensors_test" /
                 (std::string(info->test_suite_name()) + "." + info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// 8-byte little-endian length + header + data. The header is padded with spaces to a multiple
// of 8 (as the reference writer does) unless `pad` is false.
std::string Serialize(const std::string& header, const std::string& data, bool pad = true) {
  std::string h = header;
  if (pad) {
    while ((8 + h.size()) % 8 != 0) h += ' ';
  }
  std::string out(8, '\0');
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + h + data;
}

// The header JSON and concatenated data for `specs`, plus optional metadata.
std::pair<json, std::string> Build(const std::vector<Spec>& specs, const json& metadata = {}) {
  json header = json::object();
  std::string data;
  for (const Spec& s : specs) {
    header[s.name] = {{"dtype", s.dtype},
                      {"shape", s.shape},
                      {"data_offsets", {data.size(), data.size() + s.bytes.size()}}};
    data += s.bytes;
  }
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  return {header, data};
}

std::string WriteRaw(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  out.close();
  EXPECT_TRUE(out.good()) << path;
  return path;
}

std::string WriteFile(const std::string& path, const json& header, const std::string& data) {
  return WriteRaw(path, Serialize(header.dump(), data));
}

std::string WriteSpecs(const std::string& path, const std::vector<Spec>& specs,
                       const json& metadata = {}) {
  auto [header, data] = Build(specs, metadata);
  return WriteFile(path, header, data);
}

// Asserts `s` failed with `code` and that its message mentions every string in `parts`.
void ExpectError(const Status& s, StatusCode code, std::initializer_list<std::string> parts) {
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s.ToString();
  for (const std::string& p : parts) {
    EXPECT_NE(s.message().find(p), std::string::npos)
        << "message lacks \"" << p << "\": " << s.ToString();
  }
}

Status OpenStatus(const std::string& path) { return SafetensorsStore::OpenFile(path).status(); }

// A minimal valid file: one F32 tensor "w" of shape [2].
Spec SmallF32(const std::string& name = "w") { return {name, "F32", {2}, Bytes<float>({1, 2})}; }

// --- reading valid files ---------------------------------------------------------------------

TEST(SafetensorsTest, ReadsF32Values) {
  const std::string path = WriteSpecs(TestDir() + "/a.safetensors",
                                      {{"m", "F32", {2, 3}, Bytes<float>({1, -2, 3.5f, 0, 1e-30f, -7})}});
  auto store = SafetensorsStore::OpenFile(path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const Tensor* t = (*store)->Find("m");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->name, "m");
  EXPECT_EQ(t->dtype, DType::kF32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->numel(), 6);
  EXPECT_EQ(t->nbytes, 24u);
  EXPECT_EQ(t->file, path);
  const float want[] = {1, -2, 3.5f, 0, 1e-30f, -7};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t->GetF32(i), want[i]) << i;
}

TEST(SafetensorsTest, ReadsF16ValuesIncludingSubnormal) {
  // 1.0, -2.0, smallest subnormal 2^-24, largest finite 65504, 0.5
  const std::string path = WriteSpecs(
      TestDir() + "/a.safetensors",
      {{"h", "F16", {5}, Bytes<uint16_t>({0x3C00, 0xC000, 0x0001, 0x7BFF, 0x3800})}});
  auto store = SafetensorsStore::OpenFile(path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const Tensor* t = (*store)->Find("h");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kF16);
  EXPECT_EQ(t->nbytes, 10u);
  EXPECT_EQ(t->GetF32(0), 1.0f);
  EXPECT_EQ(t->GetF32(1), -2.0f);
  EXPECT_EQ(t->GetF32(2), std::ldexp(1.0f, -24));
  EXPECT_EQ(t->GetF32(3), 65504.0f);
  EXPECT_EQ(t->GetF32(4), 0.5f);
}

TEST(SafetensorsTest, ReadsBf16Values) {
  // 1.0, -1.0, 39.25 (0x421D), 3.140625 (0x4049)
  const std::string path = WriteSpecs(
      TestDir() + "/a.safetensors",
      {{"b", "BF16", {2, 2}, Bytes<uint16_t>({0x3F80, 0xBF80, 0x421D, 0x4049})}});
  auto store = SafetensorsStore::OpenFile(path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const Tensor* t = (*store)->Find("b");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kBF16);
  EXPECT_EQ(t->GetF32(0), 1.0f);
  EXPECT_EQ(t->GetF32(1), -1.0f);
  EXPECT_EQ(t->GetF32(2), 39.25f);
  EXPECT_EQ(t->GetF32(3), 3.140625f);
}

TEST(SafetensorsTest, ReadsI64AndI32Values) {
  const std::string path = WriteSpecs(
      TestDir() + "/a.safetensors",
      {{"ids", "I64", {3}, Bytes<int64_t>({0, -5, int64_t{1} << 40})},
       {"pos", "I32", {2}, Bytes<int32_t>({7, -123456})}});
  auto store = SafetensorsStore::OpenFile(path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const Tensor* ids = (*store)->Find("ids");
  ASSERT_NE(ids, nullptr);
  EXPECT_EQ(ids->dtype, DType::kI64);
  EXPECT_EQ(ids->nbytes, 24u);
  int64_t v[3];
  std::memcpy(v, ids->data, sizeof(v));
  EXPECT_EQ(v[0], 0);
  EXPECT_EQ(v[1], -5);
  EXPECT_EQ(v[2], int64_t{1} << 40);
  const Tensor* pos = (*store)->Find("pos");
  ASSERT_NE(pos, nullptr);
  EXPECT_EQ(pos->dtype, DType::kI32);
  EXPECT_EQ(pos->GetF32(0), 7.0f);
  EXPECT_EQ(pos->GetF32(1), -123456.0f);
}

TEST(SafetensorsTest, TensorsAreViewsIntoOneMapping) {
  const std::string path = WriteSpecs(TestDir() + "/a.safetensors",
                                      {{"a", "F32", {2}, Bytes<float>({1, 2})},
                                       {"b", "F32", {3}, Bytes<float>({3, 4, 5})}});
  auto store = SafetensorsStore::OpenFile(path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const Tensor* a = (*store)->Find("a");
  const Tensor* b = (*store)->Find("b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  // b's data_offsets begin at 8: both point into the same buffer, 8 bytes apart (no copies).
  EXPECT_EQ(b->data - a->data, 8);
  EXPECT_EQ(b->GetF32(2), 5.0f);
}

TEST(SafetensorsTest, UnpaddedHeaderAndUnusualLayoutWork) {
  // Header not padded to 8 bytes; data stored in reverse order of the header entries; an empty
  // tensor and a scalar.
  json header = {
      {"first", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {4, 8}}}},
      {"second", {{"dtype", "F32"}, {"shape", json::array()}, {"data_offsets", {0, 4}}}},
      {"empty", {{"dtype", "BF16"}, {"shape", {0, 16}}, {"data_offsets", {4, 4}}}},
  };
  const std::string path = WriteRaw(TestDir() + "/a.safetensors",
                                    Serialize(header.dump(), Bytes<float>({2.5f, -1.5f}), false));
  auto store = SafetensorsStore::OpenFile(path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->Find("first")->GetF32(0), -1.5f);
  const Tensor* scalar = (*store)->Find("second");
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->numel(), 1);
  EXPECT_EQ(scalar->GetF32(0), 2.5f);
  const Tensor* empty = (*store)->Find("empty");
  EXPECT_EQ(empty->numel(), 0);
  EXPECT_EQ(empty->nbytes, 0u);
}

TEST(SafetensorsTest, NamesSortedFindMissingAndMetadata) {
  const std::string path =
      WriteSpecs(TestDir() + "/a.safetensors",
                 {SmallF32("z.weight"), SmallF32("a.weight"), SmallF32("m.bias")},
                 json{{"format", "pt"}, {"note", "hello"}});
  auto store = SafetensorsStore::OpenFile(path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->Names(), (std::vector<std::string>{"a.weight", "m.bias", "z.weight"}));
  EXPECT_EQ((*store)->Find("nope"), nullptr);
  EXPECT_EQ((*store)->Find("__metadata__"), nullptr);
  EXPECT_EQ((*store)->metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"note", "hello"}}));
}

TEST(SafetensorsTest, EmptyHeaderObjectIsAnEmptyStore) {
  const std::string path = WriteRaw(TestDir() + "/a.safetensors", Serialize("{}", ""));
  auto store = SafetensorsStore::OpenFile(path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_TRUE((*store)->Names().empty());
}

// --- directories -----------------------------------------------------------------------------

TEST(SafetensorsTest, OpenDirectorySingleFile) {
  const std::string dir = TestDir();
  WriteSpecs(dir + "/model.safetensors", {SmallF32("w")});
  auto store = SafetensorsStore::OpenDirectory(dir);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->Names(), std::vector<std::string>{"w"});
  EXPECT_EQ((*store)->Find("w")->GetF32(1), 2.0f);
}

TEST(SafetensorsTest, OpenDirectoryShardedWithIndex) {
  const std::string dir = TestDir();
  WriteSpecs(dir + "/model-00001-of-00002.safetensors",
             {{"a", "BF16", {2}, Bytes<uint16_t>({0x3F80, 0x4000})},
              {"b", "F32", {1}, Bytes<float>({3})}},
             json{{"format", "pt"}, {"shard", "1"}});
  WriteSpecs(dir + "/model-00002-of-00002.safetensors",
             {{"c", "F16", {1}, Bytes<uint16_t>({0x3C00})},
              {"extra", "I64", {1}, Bytes<int64_t>({42})}},  // not in the index: still loaded
             json{{"shard", "2"}});
  json index = {{"metadata", {{"total_size", 18}}},
                {"weight_map",
                 {{"a", "model-00001-of-00002.safetensors"},
                  {"b", "model-00001-of-00002.safetensors"},
                  {"c", "model-00002-of-00002.safetensors"}}}};
  WriteRaw(dir + "/model.safetensors.index.json", index.dump(2));
  // A stray single-file checkpoint must be ignored when an index exists.
  WriteSpecs(dir + "/model.safetensors", {SmallF32("stray")});

  auto store = SafetensorsStore::OpenDirectory(dir);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->Names(), (std::vector<std::string>{"a", "b", "c", "extra"}));
  EXPECT_EQ((*store)->Find("a")->GetF32(1), 2.0f);
  EXPECT_EQ((*store)->Find("b")->GetF32(0), 3.0f);
  EXPECT_EQ((*store)->Find("c")->GetF32(0), 1.0f);
  EXPECT_EQ((*store)->Find("extra")->GetF32(0), 42.0f);
  EXPECT_NE((*store)->Find("a")->file.find("model-00001-of-00002.safetensors"), std::string::npos);
  EXPECT_NE((*store)->Find("c")->file.find("model-00002-of-00002.safetensors"), std::string::npos);
  // Merged; shards are opened in name order, so shard 2's "shard" wins.
  EXPECT_EQ((*store)->metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"shard", "2"}}));
}

TEST(SafetensorsTest, OpenDirectoryWithNoCheckpointIsNotFound) {
  const std::string dir = TestDir();
  ExpectError(SafetensorsStore::OpenDirectory(dir).status(), StatusCode::kNotFound, {dir});
  ExpectError(SafetensorsStore::OpenDirectory(dir + "/does_not_exist").status(),
              StatusCode::kNotFound, {dir + "/does_not_exist"});
}

TEST(SafetensorsTest, MissingShardIsNotFound) {
  const std::string dir = TestDir();
  WriteSpecs(dir + "/s1.safetensors", {SmallF32("a")});
  json index = {{"weight_map", {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}}}};
  WriteRaw(dir + "/model.safetensors.index.json", index.dump());
  ExpectError(SafetensorsStore::OpenDirectory(dir).status(), StatusCode::kNotFound,
              {"s2.safetensors", "'b'"});
}

TEST(SafetensorsTest, IndexNamesTensorAbsentFromItsShardIsDataLoss) {
  const std::string dir = TestDir();
  WriteSpecs(dir + "/s1.safetensors", {SmallF32("a")});
  WriteSpecs(dir + "/s2.safetensors", {SmallF32("c")});
  json index = {{"weight_map",
                 {{"a", "s1.safetensors"}, {"b", "s1.safetensors"}, {"c", "s2.safetensors"}}}};
  WriteRaw(dir + "/model.safetensors.index.json", index.dump());
  ExpectError(SafetensorsStore::OpenDirectory(dir).status(), StatusCode::kDataLoss,
              {"s1.safetensors", "'b'", "model.safetensors.index.json"});
}

TEST(SafetensorsTest, IndexNamesWrongShardIsDataLoss) {
  const std::string dir = TestDir();
  WriteSpecs(dir + "/s1.safetensors", {SmallF32("a")});
  WriteSpecs(dir + "/s2.safetensors", {SmallF32("c")});
  json index = {{"weight_map", {{"a", "s2.safetensors"}, {"c", "s2.safetensors"},
                                {"x", "s1.safetensors"}}}};
  WriteRaw(dir + "/model.safetensors.index.json", index.dump());
  ExpectError(SafetensorsStore::OpenDirectory(dir).status(), StatusCode::kDataLoss,
              {"'a'", "s2.safetensors"});
}

TEST(SafetensorsTest, MalformedIndexIsDataLoss) {
  const std::string dir = TestDir();
  WriteSpecs(dir + "/s1.safetensors", {SmallF32("a")});
  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::vector<std::string> bad = {
      "{not json",
      "[1, 2]",
      R"({"metadata": {}})",
      R"({"weight_map": []})",
      R"({"weight_map": {}})",
      R"({"weight_map": {"a": 3}})",
      R"({"weight_map": {"a": "/etc/passwd"}})",
      R"({"weight_map": {"a": "../s1.safetensors"}})",
  };
  for (const std::string& text : bad) {
    WriteRaw(index_path, text);
    ExpectError(SafetensorsStore::OpenDirectory(dir).status(), StatusCode::kDataLoss,
                {index_path});
  }
}

TEST(SafetensorsTest, DuplicateTensorAcrossShardsIsDataLoss) {
  const std::string dir = TestDir();
  WriteSpecs(dir + "/s1.safetensors", {SmallF32("a"), SmallF32("dup")});
  WriteSpecs(dir + "/s2.safetensors", {SmallF32("b"), SmallF32("dup")});
  json index = {{"weight_map", {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}}}};
  WriteRaw(dir + "/model.safetensors.index.json", index.dump());
  ExpectError(SafetensorsStore::OpenDirectory(dir).status(), StatusCode::kDataLoss,
              {"'dup'", "s1.safetensors", "s2.safetensors"});
}

TEST(SafetensorsTest, ShardErrorsPropagateFromDirectory) {
  const std::string dir = TestDir();
  WriteSpecs(dir + "/s1.safetensors", {SmallF32("a")});
  WriteRaw(dir + "/s2.safetensors", "1234");
  json index = {{"weight_map", {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}}}};
  WriteRaw(dir + "/model.safetensors.index.json", index.dump());
  ExpectError(SafetensorsStore::OpenDirectory(dir).status(), StatusCode::kDataLoss,
              {"s2.safetensors"});
}

// --- corrupt single files --------------------------------------------------------------------

TEST(SafetensorsTest, MissingFileIsNotFound) {
  const std::string path = TestDir() + "/absent.safetensors";
  ExpectError(OpenStatus(path), StatusCode::kNotFound, {path});
}

TEST(SafetensorsTest, TruncatedFileShorterThan8BytesIsDataLoss) {
  const std::string dir = TestDir();
  ExpectError(OpenStatus(WriteRaw(dir + "/empty.safetensors", "")), StatusCode::kDataLoss,
              {"empty.safetensors"});
  ExpectError(OpenStatus(WriteRaw(dir + "/short.safetensors", std::string(7, '\0'))),
              StatusCode::kDataLoss, {"short.safetensors"});
}

TEST(SafetensorsTest, HeaderLengthPastEndOfFileIsDataLoss) {
  // A valid file with its last bytes cut off inside the header.
  auto [header, data] = Build({SmallF32("w")});
  std::string full = Serialize(header.dump(), data);
  const std::string header_only = full.substr(0, full.size() - data.size());
  ExpectError(OpenStatus(WriteRaw(TestDir() + "/cut.safetensors",
                                  header_only.substr(0, header_only.size() - 3))),
              StatusCode::kDataLoss, {"cut.safetensors", "header length"});
}

TEST(SafetensorsTest, AbsurdHeaderLengthIsDataLoss) {
  std::string contents(8, '\0');
  uint64_t n = 0xFFFFFFFFFFFFFFF0ull;  // would overflow 8 + n
  std::memcpy(&contents[0], &n, 8);
  contents += "{}";
  const std::string dir = TestDir();
  ExpectError(OpenStatus(WriteRaw(dir + "/huge.safetensors", contents)), StatusCode::kDataLoss,
              {"huge.safetensors"});
  n = 200'000'000;  // > 100 MB
  std::memcpy(&contents[0], &n, 8);
  ExpectError(OpenStatus(WriteRaw(dir + "/big.safetensors", contents)), StatusCode::kDataLoss,
              {"big.safetensors"});
}

TEST(SafetensorsTest, HeaderNotJsonIsDataLoss) {
  const std::string dir = TestDir();
  const std::vector<std::string> bad = {
      "", "{", "{\"w\": {\"dtype\": \"F32\",}}", "not json at all", "{\"a\": 1} trailing",
      std::string("{\"\xff\xfe\": 1}")  // invalid UTF-8
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    const std::string path = WriteRaw(dir + "/bad" + std::to_string(i) + ".safetensors",
                                      Serialize(bad[i], ""));
    ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "JSON"});
  }
}

TEST(SafetensorsTest, HeaderNotObjectIsDataLoss) {
  const std::string dir = TestDir();
  for (const std::string h : {"[1, 2]", "42", "\"str\"", "null"}) {
    const std::string path = WriteRaw(dir + "/a.safetensors", Serialize(h, ""));
    ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "object"});
  }
}

TEST(SafetensorsTest, EntryMissingFieldsIsDataLoss) {
  const std::string dir = TestDir();
  for (const std::string field : {"dtype", "shape", "data_offsets"}) {
    auto [header, data] = Build({SmallF32("my.tensor")});
    header["my.tensor"].erase(field);
    const std::string path = WriteFile(dir + "/a.safetensors", header, data);
    ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "'my.tensor'", field});
  }
}

TEST(SafetensorsTest, EntryWithWrongJsonTypesIsDataLoss) {
  const std::string dir = TestDir();
  const std::vector<std::pair<std::string, json>> cases = {
      {"", json(5)},  // entry itself is not an object
      {"dtype", json(32)},
      {"dtype", json::array({"F32"})},
      {"shape", json("2")},
      {"shape", json::array({2.0})},
      {"shape", json::array({"2"})},
      {"shape", json::array({true})},
      {"data_offsets", json("0,8")},
      {"data_offsets", json::array({0})},
      {"data_offsets", json::array({0, 8, 8})},
      {"data_offsets", json::array({0.0, 8.0})},
      {"data_offsets", json::array({-8, 0})},
      {"data_offsets", json::array({"0", "8"})},
  };
  for (const auto& [field, value] : cases) {
    auto [header, data] = Build({SmallF32("t")});
    if (field.empty()) {
      header["t"] = value;
    } else {
      header["t"][field] = value;
    }
    const std::string path = WriteFile(dir + "/a.safetensors", header, data);
    SCOPED_TRACE(header.dump());
    ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "'t'"});
  }
}

TEST(SafetensorsTest, MetadataNotStringsIsDataLoss) {
  const std::string dir = TestDir();
  for (const json& md : {json{{"format", 1}}, json::array({"pt"}), json("pt")}) {
    auto [header, data] = Build({SmallF32("t")});
    header["__metadata__"] = md;
    const std::string path = WriteFile(dir + "/a.safetensors", header, data);
    ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "__metadata__"});
  }
}

TEST(SafetensorsTest, NegativeDimIsDataLoss) {
  auto [header, data] = Build({SmallF32("neg")});
  header["neg"]["shape"] = {-2, -1};
  header["neg"]["data_offsets"] = {0, 8};
  const std::string path = WriteFile(TestDir() + "/a.safetensors", header, data);
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "'neg'", "negative"});
}

TEST(SafetensorsTest, NumelTimesSizeOverflowIsDataLoss) {
  const std::string dir = TestDir();
  // numel itself overflows int64.
  auto [h1, d1] = Build({SmallF32("big")});
  h1["big"]["shape"] = {uint64_t{1} << 32, uint64_t{1} << 32};
  std::string path = WriteFile(dir + "/a.safetensors", h1, d1);
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "'big'", "overflow"});
  // numel fits in int64 but numel * 4 does not fit in 64 bits.
  auto [h2, d2] = Build({SmallF32("big")});
  h2["big"]["shape"] = {uint64_t{1} << 62};
  path = WriteFile(dir + "/b.safetensors", h2, d2);
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "'big'", "overflow"});
  // A single dim above INT64_MAX.
  auto [h3, d3] = Build({SmallF32("big")});
  h3["big"]["shape"] = {uint64_t{1} << 63};
  path = WriteFile(dir + "/c.safetensors", h3, d3);
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "'big'"});
}

TEST(SafetensorsTest, OffsetsBeginAfterEndIsDataLoss) {
  auto [header, data] = Build({SmallF32("rev")});
  header["rev"]["data_offsets"] = {8, 0};
  const std::string path = WriteFile(TestDir() + "/a.safetensors", header, data);
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "'rev'"});
}

TEST(SafetensorsTest, OffsetsPastEndOfFileIsDataLoss) {
  const std::string dir = TestDir();
  // Data truncated: the header promises 8 bytes, the file holds 4.
  auto [header, data] = Build({SmallF32("w")});
  std::string path = WriteFile(dir + "/a.safetensors", header, data.substr(0, 4));
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "'w'", "past the end"});
  // Offsets far beyond the file (and near 2^64).
  header["w"]["data_offsets"] = {uint64_t{0xFFFFFFFFFFFFFFF8ull}, uint64_t{0xFFFFFFFFFFFFFFFFull}};
  header["w"]["shape"] = {0};
  path = WriteFile(dir + "/b.safetensors", header, data);
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "'w'"});
}

TEST(SafetensorsTest, OverlappingOffsetsIsDataLoss) {
  const std::string dir = TestDir();
  json header = {
      {"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
      {"b", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {4, 12}}}},
  };
  std::string path = WriteFile(dir + "/a.safetensors", header, Bytes<float>({1, 2, 3}));
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "'a'", "'b'", "overlap"});
  // Identical ranges.
  header["b"]["data_offsets"] = {0, 8};
  path = WriteFile(dir + "/b.safetensors", header, Bytes<float>({1, 2}));
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "overlap"});
  // One range nested inside a longer earlier one.
  header["a"] = {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}};
  header["b"] = {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {8, 12}}};
  path = WriteFile(dir + "/c.safetensors", header, Bytes<float>({1, 2, 3, 4}));
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "'a'", "'b'", "overlap"});
}

TEST(SafetensorsTest, WrongByteCountIsDataLoss) {
  const std::string dir = TestDir();
  // [3] F32 needs 12 bytes; the offsets give 8.
  json header = {{"w", {{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 8}}}}};
  std::string path = WriteFile(dir + "/a.safetensors", header, Bytes<float>({1, 2, 3}));
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "'w'", "12"});
  // [2] BF16 needs 4 bytes; the offsets give 8.
  header = {{"w", {{"dtype", "BF16"}, {"shape", {2}}, {"data_offsets", {0, 8}}}}};
  path = WriteFile(dir + "/b.safetensors", header, Bytes<float>({1, 2}));
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "'w'"});
}

TEST(SafetensorsTest, UnknownDtypeIsUnimplemented) {
  const std::string dir = TestDir();
  for (const std::string dtype : {"F64", "I8", "U8", "BOOL", "F8_E4M3", "Q4_K", "f32", ""}) {
    auto [header, data] = Build({SmallF32("odd.tensor")});
    header["odd.tensor"]["dtype"] = dtype;
    const std::string path = WriteFile(dir + "/a.safetensors", header, data);
    SCOPED_TRACE(dtype);
    ExpectError(OpenStatus(path), StatusCode::kUnimplemented, {path, "'odd.tensor'", dtype});
  }
}

TEST(SafetensorsTest, DuplicateNameInOneHeaderIsDataLoss) {
  auto [header, data] = Build({SmallF32("w")});
  std::string entry = header["w"].dump();
  const std::string text = "{\"w\": " + entry + ", \"w\": " + entry + "}";
  const std::string path = WriteRaw(TestDir() + "/a.safetensors", Serialize(text, data));
  ExpectError(OpenStatus(path), StatusCode::kDataLoss, {path, "'w'"});
}

}  // namespace
}  // namespace g4
