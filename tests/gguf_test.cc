// GGUF reader (src/model/gguf.cc): synthetic files written by the test, corrupt variants of them,
// and the real default model (Gemma 3 270M Q4_K_M).
#include "model/gguf.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tensor/quantize.h"

namespace g4 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// A little-endian GGUF writer for the tests.

// GGUF metadata value type ids.
enum : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kStr = 8,
  kArr = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
// ggml type ids.
enum : uint32_t {
  kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ4_0 = 2, kGgmlQ4_1 = 3, kGgmlQ5_0 = 6, kGgmlQ5_1 = 7,
  kGgmlQ8_0 = 8, kGgmlQ2_K = 10, kGgmlQ4_K = 12, kGgmlQ5_K = 13, kGgmlQ6_K = 14, kGgmlBF16 = 30,
};

struct W {
  std::string b;
  template <typename T>
  W& put(T v) {
    char tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.append(tmp, sizeof(T));
    return *this;
  }
  W& u8(uint8_t v) { return put(v); }
  W& u16(uint16_t v) { return put(v); }
  W& u32(uint32_t v) { return put(v); }
  W& u64(uint64_t v) { return put(v); }
  W& str(const std::string& s) {
    u64(s.size());
    b += s;
    return *this;
  }
  W& raw(const std::string& s) {
    b += s;
    return *this;
  }
};

// Encoded metadata values: the u32 type followed by the value.
template <typename T>
std::string Scalar(uint32_t type, T v) { return W().u32(type).put(v).b; }
std::string StrVal(const std::string& s) { return W().u32(kStr).str(s).b; }
// An array of `count` elements of `elem_type` whose encodings are `elems` concatenated.
std::string ArrVal(uint32_t elem_type, uint64_t count, const std::string& elems) {
  return W().u32(kArr).u32(elem_type).u64(count).raw(elems).b;
}
std::string StrArrVal(const std::vector<std::string>& v) {
  W w;
  for (const auto& s : v) w.str(s);
  return ArrVal(kStr, v.size(), w.b);
}

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type = kGgmlF32;
  std::string bytes;                    // its data
  std::optional<uint64_t> offset = std::nullopt;  // default: next aligned position in the data section
};

struct Spec {
  uint32_t version = 3;
  std::optional<uint64_t> tensor_count;  // overrides of the header counts
  std::optional<uint64_t> kv_count;
  std::vector<std::pair<std::string, std::string>> kvs;  // key, encoded value
  std::vector<TensorSpec> tensors;
  uint64_t alignment = 32;  // used to lay out the file (add general.alignment yourself)
};

std::string Serialize(const Spec& s) {
  W w;
  w.raw("GGUF").u32(s.version);
  w.u64(s.tensor_count.value_or(s.tensors.size()));
  w.u64(s.kv_count.value_or(s.kvs.size()));
  for (const auto& [k, v] : s.kvs) w.str(k).raw(v);
  std::string data;
  std::vector<uint64_t> offsets;
  for (const TensorSpec& t : s.tensors) {
    while (data.size() % s.alignment) data.push_back('\0');
    const uint64_t off = t.offset.value_or(data.size());
    offsets.push_back(off);
    if (!t.offset) data += t.bytes;
  }
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    const TensorSpec& t = s.tensors[i];
    w.str(t.name).u32(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t n : t.ne) w.u64(n);
    w.u32(t.type).u64(offsets[i]);
  }
  while (w.b.size() % s.alignment) w.b.push_back('\0');
  return w.b + data;
}

std::string Pattern(size_t n, int seed = 1) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 37 + seed * 101) & 0xff);
  return s;
}

std::string F32Bytes(std::initializer_list<float> v) {
  W w;
  for (float f : v) w.put(f);
  return w.b;
}

// A fresh, empty directory per test under ::testing::TempDir().
std::string TestDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(::testing::TempDir()) / "g4_gguf_test" /
                 (std::string(info->test_suite_name()) + "." + info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string WriteFile(const std::string& contents, const std::string& name = "model.gguf") {
  const std::string path = TestDir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  out.close();
  EXPECT_TRUE(out.good()) << path;
  return path;
}

std::unique_ptr<GgufFile> OpenOk(const std::string& contents) {
  const std::string path = WriteFile(contents);
  auto g = GgufFile::Open(path);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  if (!g.ok()) return nullptr;
  return std::move(g).value();
}

// Opens `contents` and expects `code` with a message naming the file and every `parts`.
void ExpectError(const std::string& contents, StatusCode code,
                 std::initializer_list<std::string> parts) {
  const std::string path = WriteFile(contents);
  auto g = GgufFile::Open(path);
  ASSERT_FALSE(g.ok()) << "opened a corrupt file";
  const std::string msg = g.status().message();
  EXPECT_EQ(g.status().code(), code) << g.status().ToString();
  EXPECT_NE(msg.find(path), std::string::npos) << "message does not name the file: " << msg;
  for (const std::string& p : parts) {
    EXPECT_NE(msg.find(p), std::string::npos) << "message lacks \"" << p << "\": " << msg;
  }
}

// A small valid file: metadata of a few types and two tensors.
Spec ValidSpec() {
  Spec s;
  s.kvs = {{"general.architecture", StrVal("gemma3")},
           {"gemma3.block_count", Scalar<uint32_t>(kU32, 18)},
           {"tokenizer.ggml.tokens", StrArrVal({"<pad>", "<eos>", "<bos>"})}};
  s.tensors = {{"a.weight", {4, 2}, kGgmlF32, F32Bytes({1, 2, 3, 4, 5, 6, 7, 8})},
               {"b.weight", {32, 2}, kGgmlQ8_0, Pattern(68)}};
  return s;
}

// ---------------------------------------------------------------------------------------------
// Valid files.

TEST(GgufTest, ParsesEveryMetadataTypeV2AndV3) {
  for (uint32_t version : {2u, 3u}) {
    SCOPED_TRACE("version " + std::to_string(version));
    Spec s;
    s.version = version;
    W nested;  // array of 2 arrays of strings
    nested.u32(kStr).u64(2).str("a").str("bc");
    nested.u32(kStr).u64(0);
    W ints;
    ints.put<int32_t>(-1).put<int32_t>(7).put<int32_t>(2147483647);
    W floats;
    floats.put<float>(0.5f).put<float>(-2.25f);
    W bools;
    bools.u8(1).u8(0);
    s.kvs = {{"u8", Scalar<uint8_t>(kU8, 200)},
             {"i8", Scalar<int8_t>(kI8, -100)},
             {"u16", Scalar<uint16_t>(kU16, 60000)},
             {"i16", Scalar<int16_t>(kI16, -30000)},
             {"u32", Scalar<uint32_t>(kU32, 4000000000u)},
             {"i32", Scalar<int32_t>(kI32, -2000000000)},
             {"f32", Scalar<float>(kF32, 1e-6f)},
             {"bool_t", Scalar<uint8_t>(kBool, 1)},
             {"bool_f", Scalar<uint8_t>(kBool, 0)},
             {"str", StrVal("héllo\nworld")},
             {"empty_str", StrVal("")},
             {"u64", Scalar<uint64_t>(kU64, 18000000000000000000ull)},
             {"i64", Scalar<int64_t>(kI64, -9000000000000000000ll)},
             {"f64", Scalar<double>(kF64, 3.141592653589793)},
             {"arr_str", StrArrVal({"x", "", "<bos>"})},
             {"arr_i32", ArrVal(kI32, 3, ints.b)},
             {"arr_f32", ArrVal(kF32, 2, floats.b)},
             {"arr_bool", ArrVal(kBool, 2, bools.b)},
             {"arr_empty", ArrVal(kU64, 0, "")},
             {"arr_nested", ArrVal(kArr, 2, nested.b)}};
    auto g = OpenOk(Serialize(s));
    ASSERT_TRUE(g);
    EXPECT_EQ(g->version(), version);
    EXPECT_EQ(g->metadata().size(), s.kvs.size());
    EXPECT_TRUE(g->Names().empty());

    auto meta = [&](const char* k) -> const GgufValue& {
      const GgufValue* v = g->FindMeta(k);
      EXPECT_NE(v, nullptr) << k;
      static const GgufValue kNone;
      return v ? *v : kNone;
    };
    EXPECT_EQ(meta("u8").type, GgufValue::Type::kUInt);
    EXPECT_EQ(meta("u8").gguf_type, kU8);
    EXPECT_EQ(meta("u8").u, 200u);
    EXPECT_EQ(meta("i8").type, GgufValue::Type::kInt);
    EXPECT_EQ(meta("i8").i, -100);
    EXPECT_EQ(meta("u16").u, 60000u);
    EXPECT_EQ(meta("i16").i, -30000);
    EXPECT_EQ(meta("u32").u, 4000000000u);
    EXPECT_EQ(meta("u32").gguf_type, kU32);
    EXPECT_EQ(meta("i32").i, -2000000000);
    EXPECT_EQ(meta("f32").type, GgufValue::Type::kFloat);
    EXPECT_EQ(meta("f32").f, static_cast<double>(1e-6f));
    EXPECT_EQ(meta("bool_t").type, GgufValue::Type::kBool);
    EXPECT_TRUE(meta("bool_t").b);
    EXPECT_FALSE(meta("bool_f").b);
    EXPECT_EQ(meta("str").type, GgufValue::Type::kString);
    EXPECT_EQ(meta("str").s, "héllo\nworld");
    EXPECT_EQ(meta("empty_str").s, "");
    EXPECT_EQ(meta("u64").u, 18000000000000000000ull);
    EXPECT_EQ(meta("u64").gguf_type, kU64);
    EXPECT_EQ(meta("i64").i, -9000000000000000000ll);
    EXPECT_EQ(meta("f64").f, 3.141592653589793);
    EXPECT_EQ(meta("f64").gguf_type, kF64);

    const GgufValue& as = meta("arr_str");
    EXPECT_EQ(as.type, GgufValue::Type::kArray);
    EXPECT_EQ(as.array_type, kStr);
    ASSERT_EQ(as.size(), 3u);
    EXPECT_EQ(as.StringAt(0), "x");
    EXPECT_EQ(as.StringAt(1), "");
    EXPECT_EQ(as.StringAt(2), "<bos>");
    EXPECT_EQ(as.Strings(), (std::vector<std::string>{"x", "", "<bos>"}));
    EXPECT_EQ(as.IntAt(0), 0);  // not a number
    const GgufValue& ai = meta("arr_i32");
    EXPECT_EQ(ai.array_type, kI32);
    ASSERT_EQ(ai.size(), 3u);
    EXPECT_EQ(ai.IntAt(0), -1);
    EXPECT_EQ(ai.IntAt(1), 7);
    EXPECT_EQ(ai.IntAt(2), 2147483647);
    EXPECT_EQ(ai.FloatAt(0), -1.0);
    EXPECT_TRUE(ai.BoolAt(0));
    EXPECT_EQ(ai.StringAt(0), "");  // not a string
    EXPECT_TRUE(ai.Strings().empty());
    const GgufValue& af = meta("arr_f32");
    ASSERT_EQ(af.size(), 2u);
    EXPECT_EQ(af.FloatAt(0), 0.5);
    EXPECT_EQ(af.FloatAt(1), -2.25);
    EXPECT_EQ(af.IntAt(1), -2);  // truncated toward zero
    const GgufValue& ab = meta("arr_bool");
    ASSERT_EQ(ab.size(), 2u);
    EXPECT_TRUE(ab.BoolAt(0));
    EXPECT_FALSE(ab.BoolAt(1));
    EXPECT_EQ(ab.IntAt(0), 1);
    EXPECT_EQ(meta("arr_empty").array_type, kU64);
    EXPECT_EQ(meta("arr_empty").size(), 0u);
    EXPECT_EQ(meta("str").size(), 0u);  // a scalar string is not an array
    const GgufValue& an = meta("arr_nested");
    EXPECT_EQ(an.array_type, kArr);
    ASSERT_EQ(an.size(), 2u);
    EXPECT_EQ(an.ArrayAt(0).type, GgufValue::Type::kArray);
    EXPECT_EQ(an.ArrayAt(0).array_type, kStr);
    EXPECT_EQ(an.ArrayAt(0).Strings(), (std::vector<std::string>{"a", "bc"}));
    EXPECT_EQ(an.ArrayAt(1).size(), 0u);
    EXPECT_EQ(ai.ArrayAt(0).size(), 0u);  // not an array of arrays
  }
}

// The tokenizer arrays, as llama.cpp's converter writes them: string tokens, float32 scores,
// int32 token types. Elements are views into the mapping, valid after the metadata pages are
// released (they are read back from the file).
TEST(GgufTest, VocabularyArraysHoldEveryElement) {
  const std::vector<std::string> tokens = {"<pad>", "<eos>", "<bos>", "", "\xe2\x96\x81the",
                                           "a token longer than the small-string buffer", "<0x0A>"};
  W scores, types;
  for (size_t k = 0; k < tokens.size(); ++k) {
    scores.put<float>(-0.25f * static_cast<float>(k) - 1.0f);
    types.put<int32_t>(k < 3 ? 3 : k == 6 ? 6 : 1);
  }
  // A second, larger vocabulary checks offsets far from the array start.
  std::vector<std::string> many;
  for (int k = 0; k < 5000; ++k) {
    many.emplace_back("t");  // appended, not "t" + ...: GCC 12 warns -Wrestrict on that (a false positive)
    many.back() += std::to_string(k * 7919);
  }
  Spec s;
  s.kvs = {{"tokenizer.ggml.tokens", StrArrVal(tokens)},
           {"tokenizer.ggml.scores", ArrVal(kF32, tokens.size(), scores.b)},
           {"tokenizer.ggml.token_type", ArrVal(kI32, tokens.size(), types.b)},
           {"many", StrArrVal(many)}};
  s.tensors = {{"a.weight", {4, 2}, kGgmlF32, F32Bytes({1, 2, 3, 4, 5, 6, 7, 8})}};
  auto g = OpenOk(Serialize(s));
  ASSERT_TRUE(g);
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE(pass == 0 ? "as opened" : "after ReleaseMetadataPages");
    const GgufValue* t = g->FindMeta("tokenizer.ggml.tokens");
    const GgufValue* sc = g->FindMeta("tokenizer.ggml.scores");
    const GgufValue* ty = g->FindMeta("tokenizer.ggml.token_type");
    const GgufValue* m = g->FindMeta("many");
    ASSERT_TRUE(t && sc && ty && m);
    EXPECT_EQ(t->array_type, kStr);
    EXPECT_EQ(sc->array_type, kF32);
    EXPECT_EQ(ty->array_type, kI32);
    ASSERT_EQ(t->size(), tokens.size());
    ASSERT_EQ(sc->size(), tokens.size());
    ASSERT_EQ(ty->size(), tokens.size());
    for (size_t k = 0; k < tokens.size(); ++k) {
      EXPECT_EQ(t->StringAt(k), tokens[k]) << k;
      EXPECT_EQ(sc->FloatAt(k), -0.25 * static_cast<double>(k) - 1.0) << k;
      EXPECT_EQ(ty->IntAt(k), k < 3 ? 3 : k == 6 ? 6 : 1) << k;
    }
    EXPECT_EQ(t->Strings(), tokens);
    ASSERT_EQ(m->size(), many.size());
    for (size_t k = 0; k < many.size(); k += 997) EXPECT_EQ(m->StringAt(k), many[k]) << k;
    // Every element, last first (StringAt walks from the offset kept per kStringStride elements;
    // the lengths differ: "t0", "t7919", ...).
    for (size_t k = many.size(); k-- > 0;) ASSERT_EQ(m->StringAt(k), many[k]) << k;
    EXPECT_EQ(m->StringAt(many.size() - 1), many.back());
    // Tensor data is untouched by the release.
    EXPECT_EQ(g->Find("a.weight")->GetF32(7), 8.0f);
    g->ReleaseMetadataPages();
  }
}

TEST(GgufTest, TypedGetters) {
  Spec s;
  s.kvs = {{"arch", StrVal("gemma3")},
           {"n", Scalar<uint32_t>(kU32, 18)},
           {"neg", Scalar<int8_t>(kI8, -3)},
           {"big", Scalar<uint64_t>(kU64, 1ull << 63)},
           {"eps", Scalar<float>(kF32, 1e-6f)},
           {"flag", Scalar<uint8_t>(kBool, 1)},
           {"list", StrArrVal({"a"})}};
  auto g = OpenOk(Serialize(s));
  ASSERT_TRUE(g);
  EXPECT_EQ(g->GetString("arch").value(), "gemma3");
  EXPECT_EQ(g->GetInt("n").value(), 18);
  EXPECT_EQ(g->GetInt("neg").value(), -3);
  EXPECT_EQ(g->GetFloat("eps").value(), static_cast<double>(1e-6f));
  EXPECT_EQ(g->GetFloat("n").value(), 18.0);  // floats accept ints
  EXPECT_EQ(g->GetFloat("neg").value(), -3.0);
  EXPECT_TRUE(g->GetBool("flag", false));
  EXPECT_TRUE(g->GetBool("absent", true));
  EXPECT_EQ(g->GetInt("absent", 7), 7);
  EXPECT_EQ(g->GetInt("n", 7), 18);
  EXPECT_EQ(g->GetFloat("absent", 0.5), 0.5);

  auto missing = g->GetInt("absent");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("'absent'"), std::string::npos);
  EXPECT_EQ(g->GetString("absent").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(g->GetFloat("absent").status().code(), StatusCode::kNotFound);

  auto big = g->GetInt("big");  // 2^63 does not fit int64
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("'big'"), std::string::npos);
  for (const char* k : {"arch", "eps", "flag", "list"}) {
    auto r = g->GetInt(k);
    ASSERT_FALSE(r.ok()) << k;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << k;
    EXPECT_NE(r.status().message().find(std::string("'") + k + "'"), std::string::npos);
  }
  EXPECT_EQ(g->GetString("n").status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g->GetString("n").status().message().find("uint32"), std::string::npos);
  EXPECT_EQ(g->GetFloat("arch").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g->GetInt("arch", 5), 5);  // wrong type with a default: the default
}

TEST(GgufTest, TensorsEveryTypeShapeAndBytes) {
  struct T {
    uint32_t ggml;
    DType dtype;
    std::vector<uint64_t> ne;
    size_t nbytes;
  };
  const std::vector<T> types = {
      {kGgmlF32, DType::kF32, {3, 2}, 24},
      {kGgmlF16, DType::kF16, {5}, 10},
      {kGgmlBF16, DType::kBF16, {2, 1, 3}, 12},
      {kGgmlQ8_0, DType::kQ8_0, {64, 3}, 3 * 2 * 34},
      {kGgmlQ4_0, DType::kQ4_0, {32, 2, 2}, 4 * 18},
      {kGgmlQ4_1, DType::kQ4_1, {32}, 20},
      {kGgmlQ5_0, DType::kQ5_0, {96, 1}, 3 * 22},
      {kGgmlQ5_1, DType::kQ5_1, {32, 2}, 2 * 24},
      {kGgmlQ4_K, DType::kQ4_K, {256, 2}, 2 * 144},
      {kGgmlQ5_K, DType::kQ5_K, {512, 1, 1, 2}, 4 * 176},
      {kGgmlQ6_K, DType::kQ6_K, {256, 3}, 3 * 210},
  };
  Spec s;
  for (size_t i = 0; i < types.size(); ++i) {
    s.tensors.push_back({std::string("t") + std::to_string(i), types[i].ne, types[i].ggml,
                         Pattern(types[i].nbytes, static_cast<int>(i))});
  }
  s.tensors.push_back({"scalar", {}, kGgmlF32, F32Bytes({42.0f})});
  s.tensors.push_back({"empty", {0, 4}, kGgmlQ8_0, ""});
  const std::string path = WriteFile(Serialize(s));
  auto opened = GgufFile::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const GgufFile& g = **opened;
  ASSERT_EQ(g.Names().size(), types.size() + 2);
  for (size_t i = 0; i < types.size(); ++i) {
    SCOPED_TRACE(DTypeName(types[i].dtype));
    const Tensor* t = g.Find(std::string("t") + std::to_string(i));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->name, std::string("t") + std::to_string(i));
    EXPECT_EQ(t->dtype, types[i].dtype);
    std::vector<int64_t> want_shape(types[i].ne.rbegin(), types[i].ne.rend());
    EXPECT_EQ(t->shape, want_shape);
    EXPECT_EQ(t->nbytes, types[i].nbytes);
    EXPECT_EQ(t->file, path);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(t->data), t->nbytes),
              Pattern(types[i].nbytes, static_cast<int>(i)));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % 32, 0u);  // page-aligned map + aligned offset
  }
  const Tensor* scalar = g.Find("scalar");
  ASSERT_NE(scalar, nullptr);
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->nbytes, 4u);
  EXPECT_EQ(scalar->GetF32(0), 42.0f);
  const Tensor* empty = g.Find("empty");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->shape, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(empty->nbytes, 0u);
  EXPECT_EQ(g.Find("nope"), nullptr);
  // Names() is sorted.
  auto names = g.Names();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
}

// LoadOptions::pack_q4_0 through GgufFile::PackQ4_0x4: only bytes copied into memory are
// rewritten (MappedFile::Rewrite), never the file mapping; only 2-D Q4_0 with rows % 4 == 0.
TEST(GgufTest, PacksQ4_0OnlyInTheCopiedData) {
  const int M = 8, K = 64;
  const std::string q = Pattern(static_cast<size_t>(M) * 2 * 18, 3);
  Spec s;
  s.tensors.push_back({"w", {static_cast<uint64_t>(K), static_cast<uint64_t>(M)}, kGgmlQ4_0, q});
  s.tensors.push_back({"odd", {static_cast<uint64_t>(K), 6}, kGgmlQ4_0, Pattern(6 * 2 * 18, 4)});
  s.tensors.push_back({"f", {4}, kGgmlF32, F32Bytes({1, 2, 3, 4})});
  const std::string path = WriteFile(Serialize(s));
  {
    auto g = GgufFile::Open(path);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    const Tensor* w = (*g)->Find("w");
    EXPECT_FALSE((*g)->PackQ4_0x4(*w)) << "mapped from the file";
    EXPECT_EQ(w->dtype, DType::kQ4_0);
    EXPECT_EQ(std::memcmp(w->data, q.data(), q.size()), 0);
  }
  auto g = GgufFile::Open(path);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE((*g)->ReadDataIntoMemory().ok());
  const Tensor* w = (*g)->Find("w");
  ASSERT_TRUE((*g)->PackQ4_0x4(*w));
  EXPECT_EQ(w->dtype, DType::kQ4_0x4);
  std::string want = q;
  PackQ4_0x4InPlace(reinterpret_cast<uint8_t*>(want.data()), M, K);
  EXPECT_NE(want, q);
  EXPECT_EQ(std::memcmp(w->data, want.data(), want.size()), 0);
  EXPECT_FALSE((*g)->PackQ4_0x4(*w)) << "already packed";
  EXPECT_FALSE((*g)->PackQ4_0x4(*(*g)->Find("odd"))) << "6 rows";
  EXPECT_FALSE((*g)->PackQ4_0x4(*(*g)->Find("f"))) << "F32";
  Tensor copy = *w;  // not the file's own tensor
  EXPECT_FALSE((*g)->PackQ4_0x4(copy));
  // The file itself is unchanged.
  std::ifstream in(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(file.find(q), std::string::npos);
}

TEST(GgufTest, CustomAlignment) {
  Spec s = ValidSpec();
  s.alignment = 256;
  s.kvs.push_back({"general.alignment", Scalar<uint32_t>(kU32, 256)});
  const std::string bytes = Serialize(s);
  auto g = OpenOk(bytes);
  ASSERT_TRUE(g);
  const Tensor* a = g->Find("a.weight");
  const Tensor* b = g->Find("b.weight");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(a->GetF32(5), 6.0f);
  EXPECT_EQ(b->data - a->data, 256);
  EXPECT_EQ(b->dtype, DType::kQ8_0);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{2, 32}));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b->data), b->nbytes), Pattern(68));
}

TEST(GgufTest, HeaderOnlyFile) {
  auto g = OpenOk(W().raw("GGUF").u32(3).u64(0).u64(0).b);
  ASSERT_TRUE(g);
  EXPECT_TRUE(g->metadata().empty());
  EXPECT_TRUE(g->Names().empty());
}

TEST(GgufTest, MissingFileIsNotFound) {
  const std::string path = TestDir() + "/nope.gguf";
  auto g = GgufFile::Open(path);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kNotFound);
  EXPECT_NE(g.status().message().find(path), std::string::npos);
}

TEST(GgufTest, UnsupportedVersions) {
  for (uint32_t v : {0u, 1u, 4u, 0x03000000u}) {
    SCOPED_TRACE(v);
    Spec s = ValidSpec();
    s.version = v;
    ExpectError(Serialize(s), StatusCode::kUnimplemented,
                {v == 0x03000000u ? "big-endian" : "version " + std::to_string(v)});
  }
}

// The fuzz seeds are written by the gguf Python package (tools/make_gguf_fuzz_seeds.py): they
// must all load. Other files in the corpus (inputs that once crashed) must fail or load cleanly.
TEST(GgufTest, OpensFilesWrittenByGgufPackage) {
  const fs::path dir = fs::path(GEMMA4RT_TEST_DATA_DIR) / ".." / "fuzz" / "corpus" / "gguf";
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  int seeds = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    auto g = GgufFile::Open(entry.path().string());
    if (name.rfind("seed-", 0) != 0) continue;
    ++seeds;
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    if (name == "seed-meta.gguf") {
      EXPECT_EQ((*g)->GetString("general.architecture").value(), "test");
      EXPECT_EQ((*g)->GetInt("test.u8").value(), 200);
      EXPECT_EQ((*g)->GetInt("test.i8").value(), -100);
      EXPECT_EQ((*g)->GetInt("test.u64", -1), -1);  // 1.8e19 does not fit int64: the default
      EXPECT_EQ((*g)->FindMeta("test.u64")->u, 18000000000000000000ull);
      EXPECT_EQ((*g)->GetInt("test.i64").value(), -9000000000000000000ll);
      EXPECT_EQ((*g)->GetFloat("test.f64").value(), 3.141592653589793);
      EXPECT_EQ((*g)->GetFloat("test.f32").value(), 0.125);
      EXPECT_TRUE((*g)->GetBool("test.bool", false));
      EXPECT_EQ((*g)->GetString("test.str").value(), "h\xc3\xa9llo");
      const GgufValue* nested = (*g)->FindMeta("test.arr_nested");
      ASSERT_NE(nested, nullptr);
      ASSERT_EQ(nested->size(), 2u);
      EXPECT_EQ(nested->ArrayAt(0).Strings(), (std::vector<std::string>{"x", "yz"}));
      EXPECT_EQ(nested->ArrayAt(1).Strings(), (std::vector<std::string>{"w"}));
      const GgufValue* nested_int = (*g)->FindMeta("test.arr_nested_int");
      ASSERT_NE(nested_int, nullptr);
      ASSERT_EQ(nested_int->size(), 2u);
      ASSERT_EQ(nested_int->ArrayAt(0).size(), 2u);
      EXPECT_EQ(nested_int->ArrayAt(0).IntAt(1), 2);
    } else if (name == "seed-tensors.gguf") {
      const std::pair<const char*, DType> want[] = {
          {"t.f32", DType::kF32},   {"t.f16", DType::kF16},   {"t.bf16", DType::kBF16},
          {"t.q8_0", DType::kQ8_0}, {"t.q4_0", DType::kQ4_0}, {"t.q4_1", DType::kQ4_1},
          {"t.q5_0", DType::kQ5_0}, {"t.q5_1", DType::kQ5_1}, {"t.q4_k", DType::kQ4_K},
          {"t.q5_k", DType::kQ5_K}, {"t.q6_k", DType::kQ6_K}};
      for (const auto& [tname, dtype] : want) {
        const Tensor* t = (*g)->Find(tname);
        ASSERT_NE(t, nullptr) << tname;
        EXPECT_EQ(t->dtype, dtype) << tname;
      }
      EXPECT_EQ((*g)->Find("t.f16")->shape, (std::vector<int64_t>{2, 1, 6}));
      EXPECT_EQ((*g)->Find("t.q5_1")->shape, (std::vector<int64_t>{1, 1, 1, 32}));
      EXPECT_EQ((*g)->Find("t.q6_k")->nbytes, 2u * 210);
    } else if (name == "seed-align64-v2.gguf") {
      EXPECT_EQ((*g)->version(), 2u);
      const Tensor* a = (*g)->Find("a");
      const Tensor* b = (*g)->Find("b");
      ASSERT_TRUE(a && b);
      EXPECT_EQ(b->data - a->data, 64);
      EXPECT_EQ(a->GetF32(2), 2.0f);
      EXPECT_EQ(b->GetF32(4), 4.0f);
    } else if (name == "seed-gemma3.gguf") {
      EXPECT_EQ((*g)->GetString("general.architecture").value(), "gemma3");
      EXPECT_EQ((*g)->FindMeta("tokenizer.ggml.tokens")->StringAt(2), "<bos>");
      EXPECT_EQ((*g)->Find("token_embd.weight")->shape, (std::vector<int64_t>{16, 64}));
    }
  }
  EXPECT_EQ(seeds, 4);
}

// ---------------------------------------------------------------------------------------------
// Corrupt files: each asserts the code and that the message names the problem.

TEST(GgufCorrupt, BadMagic) {
  std::string b = Serialize(ValidSpec());
  b[3] = 'G';
  ExpectError(b, StatusCode::kDataLoss, {"bad magic", "'GGUG'"});
  ExpectError("GG", StatusCode::kDataLoss, {"bad magic"});
  ExpectError("", StatusCode::kDataLoss, {"bad magic"});
}

TEST(GgufCorrupt, TruncatedHeader) {
  const std::string b = Serialize(ValidSpec());
  ExpectError(b.substr(0, 6), StatusCode::kDataLoss, {"truncated header", "version"});
  ExpectError(b.substr(0, 12), StatusCode::kDataLoss, {"truncated header", "tensor_count"});
  ExpectError(b.substr(0, 20), StatusCode::kDataLoss, {"truncated header", "kv_count"});
}

TEST(GgufCorrupt, TruncatedAnywhereIsDataLoss) {
  // Every proper prefix of a valid file fails cleanly with DataLoss (never crashes).
  const std::string b = Serialize(ValidSpec());
  for (size_t n = 0; n < b.size(); ++n) {
    auto g = GgufFile::Open(WriteFile(b.substr(0, n)));
    ASSERT_FALSE(g.ok()) << "prefix of " << n << " bytes opened";
    EXPECT_EQ(g.status().code(), StatusCode::kDataLoss) << n << ": " << g.status().ToString();
  }
}

TEST(GgufCorrupt, TensorCountLargerThanFile) {
  Spec s = ValidSpec();
  s.tensor_count = 1ull << 40;
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"tensor_count 1099511627776"});
  s.tensor_count = ~0ull;
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"tensor_count"});
}

TEST(GgufCorrupt, KvCountLargerThanFile) {
  Spec s = ValidSpec();
  s.kv_count = 1ull << 50;
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"kv_count 1125899906842624"});
  s.kv_count = ~0ull;
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"kv_count"});
}

TEST(GgufCorrupt, StringLengthPastTheEnd) {
  Spec s = ValidSpec();
  s.kvs[0].second = W().u32(kStr).u64(1000000).raw("gemma3").b;
  ExpectError(Serialize(s), StatusCode::kDataLoss,
              {"'general.architecture'", "string length 1000000", "past the end"});
  s.kvs[0].second = W().u32(kStr).u64(~0ull).b;
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"'general.architecture'", "string length"});
}

TEST(GgufCorrupt, KeyLengthPastTheEnd) {
  std::string b = W().raw("GGUF").u32(3).u64(0).u64(1).u64(1ull << 40).raw(std::string(20, 'x')).b;
  ExpectError(b, StatusCode::kDataLoss, {"metadata entry 0 key", "string length"});
}

TEST(GgufCorrupt, StringInArrayPastTheEnd) {
  Spec s = ValidSpec();
  s.kvs[2].second = ArrVal(kStr, 2, W().str("<pad>").u64(500).raw("xx").b);
  ExpectError(Serialize(s), StatusCode::kDataLoss,
              {"'tokenizer.ggml.tokens'[1]", "string length 500"});
}

TEST(GgufCorrupt, ArrayCountAbsurd) {
  Spec s = ValidSpec();
  s.kvs[2].second = W().u32(kArr).u32(kStr).u64(1ull << 61).b;
  ExpectError(Serialize(s), StatusCode::kDataLoss,
              {"'tokenizer.ggml.tokens'", "array count 2305843009213693952"});
  s.kvs[2].second = W().u32(kArr).u32(kU8).u64(~0ull).b;
  ExpectError(Serialize(s), StatusCode::kDataLoss,
              {"'tokenizer.ggml.tokens'", "array count 18446744073709551615"});
  // Just one more element than the bytes left (no tensors, so no padding after the metadata).
  ExpectError(W().raw("GGUF").u32(3).u64(0).u64(1).str("k").u32(kArr).u32(kF64).u64(3)
                  .put(1.0).put(2.0).b,
              StatusCode::kDataLoss, {"'k'", "array count 3"});
}

TEST(GgufCorrupt, ArraysNestedTooDeep) {
  std::string v = W().u32(kU8).u64(0).b;
  for (int i = 0; i < 20; ++i) v = W().u32(kArr).u64(1).raw(v).b;
  Spec s;
  s.kvs = {{"deep", W().u32(kArr).raw(v).b}};
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"'deep'", "nested"});
}

TEST(GgufCorrupt, UnknownMetadataType) {
  Spec s = ValidSpec();
  s.kvs[1].second = W().u32(13).u32(18).b;
  ExpectError(Serialize(s), StatusCode::kUnimplemented,
              {"'gemma3.block_count'", "unknown metadata type 13"});
  s.kvs[1].second = W().u32(kArr).u32(99).u64(1).u32(0).b;
  ExpectError(Serialize(s), StatusCode::kUnimplemented,
              {"'gemma3.block_count'", "unknown metadata type 99"});
}

TEST(GgufCorrupt, BadBool) {
  Spec s = ValidSpec();
  s.kvs.push_back({"flag", Scalar<uint8_t>(kBool, 2)});
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"'flag'", "bool value 2"});
}

TEST(GgufCorrupt, DuplicateKey) {
  Spec s = ValidSpec();
  s.kvs.push_back({"gemma3.block_count", Scalar<uint32_t>(kU32, 1)});
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"'gemma3.block_count'", "twice"});
}

TEST(GgufCorrupt, UnknownTensorType) {
  Spec s = ValidSpec();
  s.tensors[1].type = kGgmlQ2_K;
  s.tensors[1].bytes = Pattern(84);
  s.tensors[1].ne = {256};
  ExpectError(Serialize(s), StatusCode::kUnimplemented, {"'b.weight'", "ggml type 10", "Q2_K"});
  s.tensors[1].type = 1234;
  ExpectError(Serialize(s), StatusCode::kUnimplemented,
              {"'b.weight'", "ggml type 1234 (unknown)"});
}

TEST(GgufCorrupt, TensorOffsetPastTheEnd) {
  Spec s = ValidSpec();
  s.tensors[1].offset = 1 << 20;
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"'b.weight'", "past the end"});
  s.tensors[1].offset = ~0ull << 5;  // aligned, and offset + data start overflows
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"'b.weight'", "past the end"});
  // The data runs off the end by one block.
  Spec t = ValidSpec();
  t.tensors[1].ne = {32, 3};
  ExpectError(Serialize(t), StatusCode::kDataLoss, {"'b.weight'", "102 bytes", "past the end"});
}

TEST(GgufCorrupt, MisalignedOffset) {
  Spec s = ValidSpec();
  s.tensors[1].offset = 40;
  ExpectError(Serialize(s), StatusCode::kDataLoss,
              {"'b.weight'", "offset 40", "not a multiple of the alignment 32"});
}

TEST(GgufCorrupt, OverlappingTensors) {
  Spec s = ValidSpec();
  s.tensors.push_back({"c.weight", {32}, kGgmlQ8_0, "", 64});  // b.weight is bytes [32, 100)
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"'c.weight'", "overlaps", "'b.weight'"});
  Spec t = ValidSpec();
  t.tensors.push_back({"c.weight", {4}, kGgmlF32, "", 0});  // same start as a.weight
  ExpectError(Serialize(t), StatusCode::kDataLoss, {"overlaps", "'a.weight'", "'c.weight'"});
}

TEST(GgufCorrupt, DuplicateTensorName) {
  Spec s = ValidSpec();
  s.tensors.push_back({"a.weight", {4}, kGgmlF32, F32Bytes({1, 2, 3, 4})});
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"'a.weight'", "twice"});
}

TEST(GgufCorrupt, NeProductOverflow) {
  Spec s = ValidSpec();
  s.tensors[0].ne = {1ull << 32, 1ull << 32};
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"'a.weight'", "overflows"});
  s.tensors[0].ne = {1ull << 63};  // not an int64
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"'a.weight'", "2^63-1"});
  s.tensors[0].ne = {1ull << 62};  // elements fit, bytes do not
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"'a.weight'", "overflow"});
  s.tensors[0].ne = {3, 5, 1ull << 61, 2};
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"'a.weight'", "overflows"});
  // A zero dimension makes the element count 0, but the others still may not overflow (their
  // partial products would, e.g. in Tensor::numel). Found by the fuzzer.
  s.tensors[0].ne = {0, 1ull << 40, 1ull << 40};
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"'a.weight'", "overflows"});
  s.tensors[0].ne = {4, 1ull << 32, 0, 1ull << 32};
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"'a.weight'", "overflows"});
}

TEST(GgufCorrupt, TooManyDims) {
  Spec s = ValidSpec();
  s.tensors[0].ne = {1, 1, 1, 2, 4};
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"'a.weight'", "n_dims 5"});
}

TEST(GgufCorrupt, Ne0NotAMultipleOfTheBlockSize) {
  Spec s = ValidSpec();
  s.tensors[1].ne = {33, 2};
  ExpectError(Serialize(s), StatusCode::kDataLoss,
              {"'b.weight'", "ne[0] = 33", "Q8_0 block size 32"});
  s.tensors[1].type = kGgmlQ4_K;
  s.tensors[1].ne = {128, 1};
  ExpectError(Serialize(s), StatusCode::kDataLoss,
              {"'b.weight'", "ne[0] = 128", "Q4_K block size 256"});
}

TEST(GgufCorrupt, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u}) {
    SCOPED_TRACE(a);
    Spec s = ValidSpec();
    s.kvs.push_back({"general.alignment", Scalar<uint32_t>(kU32, a)});
    ExpectError(Serialize(s), StatusCode::kDataLoss,
                {"'general.alignment'", "is " + std::to_string(a), "not a power of two"});
  }
  Spec s = ValidSpec();
  s.kvs.push_back({"general.alignment", StrVal("32")});
  ExpectError(Serialize(s), StatusCode::kDataLoss, {"'general.alignment'", "string"});
}

TEST(GgufCorrupt, TruncatedTensorInfo) {
  const Spec s = ValidSpec();
  std::string b = Serialize(s);
  // Cut inside the second tensor info (before the data section).
  const size_t cut = b.find("b.weight") + 10;
  ExpectError(b.substr(0, cut), StatusCode::kDataLoss, {"'b.weight'", "past the end"});
}

// ---------------------------------------------------------------------------------------------
// The real default model.

std::string DefaultModelPath() {
  if (const char* p = std::getenv("GEMMA4RT_DEFAULT_MODEL"); p && *p) return p;
  const char* name = "gemma-3-270m-q4_k_m.gguf";
  if (const char* c = std::getenv("GEMMA4RT_CACHE"); c && *c) {
    const std::string p = std::string(c) + "/" + name;
    if (fs::exists(p)) return p;
  }
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/gemma4rt/" + name;
}

class GgufRealModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(DefaultModelPath());
    if (!fs::exists(*path_)) return;
    auto g = GgufFile::Open(*path_);
    if (g.ok()) {
      file_ = std::move(g).value().release();
    } else {
      error_ = new std::string(g.status().ToString());
    }
  }
  static void TearDownTestSuite() {
    delete file_;
    delete path_;
    delete error_;
    file_ = nullptr;
    path_ = error_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(fs::exists(*path_))
        << "the default model is not at " << *path_
        << ": run scripts/fetch-default-model.sh (or set GEMMA4RT_DEFAULT_MODEL to its path)";
    ASSERT_EQ(error_, nullptr) << *error_;
    ASSERT_NE(file_, nullptr);
  }
  static GgufFile* file_;
  static std::string* path_;
  static std::string* error_;
};
GgufFile* GgufRealModel::file_ = nullptr;
std::string* GgufRealModel::path_ = nullptr;
std::string* GgufRealModel::error_ = nullptr;

TEST_F(GgufRealModel, Metadata) {
  const GgufFile& g = *file_;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.path(), *path_);
  EXPECT_EQ(g.metadata().size(), 33u);
  EXPECT_EQ(g.GetString("general.architecture").value(), "gemma3");
  EXPECT_EQ(g.GetInt("gemma3.block_count").value(), 18);
  EXPECT_EQ(g.GetInt("gemma3.embedding_length").value(), 640);
  EXPECT_EQ(g.GetInt("gemma3.feed_forward_length").value(), 2048);
  EXPECT_EQ(g.GetInt("gemma3.attention.head_count").value(), 4);
  EXPECT_EQ(g.GetInt("gemma3.attention.head_count_kv").value(), 1);
  EXPECT_EQ(g.GetInt("gemma3.attention.key_length").value(), 256);
  EXPECT_EQ(g.GetInt("gemma3.attention.sliding_window").value(), 512);
  EXPECT_EQ(g.GetInt("gemma3.context_length").value(), 32768);
  EXPECT_EQ(g.GetFloat("gemma3.rope.freq_base").value(), 1000000.0);
  EXPECT_EQ(g.GetFloat("gemma3.attention.layer_norm_rms_epsilon").value(),
            static_cast<double>(1e-6f));
  EXPECT_EQ(g.GetInt("tokenizer.ggml.bos_token_id").value(), 2);
  EXPECT_EQ(g.GetInt("tokenizer.ggml.eos_token_id").value(), 1);
  EXPECT_TRUE(g.GetBool("tokenizer.ggml.add_bos_token", false));
  EXPECT_FALSE(g.GetBool("tokenizer.ggml.add_eos_token", true));
  EXPECT_EQ(g.GetString("tokenizer.ggml.model").value(), "llama");

  const GgufValue* tokens = g.FindMeta("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->type, GgufValue::Type::kArray);
  EXPECT_EQ(tokens->array_type, 8u);
  ASSERT_EQ(tokens->size(), 262144u);
  EXPECT_EQ(tokens->StringAt(0), "<pad>");
  EXPECT_EQ(tokens->StringAt(1), "<eos>");
  EXPECT_EQ(tokens->StringAt(2), "<bos>");
  EXPECT_EQ(tokens->StringAt(106), "<end_of_turn>");
  EXPECT_EQ(tokens->StringAt(1000), "put");
  EXPECT_EQ(tokens->StringAt(262143), "<unused6241>");
  // Values as read by the gguf Python package (GGUFReader).
  const GgufValue* scores = g.FindMeta("tokenizer.ggml.scores");
  ASSERT_NE(scores, nullptr);
  EXPECT_EQ(scores->array_type, 6u);
  ASSERT_EQ(scores->size(), 262144u);
  EXPECT_EQ(scores->FloatAt(0), -1000.0);
  EXPECT_EQ(scores->FloatAt(1000), -506.0);
  EXPECT_EQ(scores->FloatAt(262143), -1000.0);
  const GgufValue* types = g.FindMeta("tokenizer.ggml.token_type");
  ASSERT_NE(types, nullptr);
  EXPECT_EQ(types->array_type, 5u);
  ASSERT_EQ(types->size(), 262144u);
  EXPECT_EQ(types->IntAt(2), 3);       // control
  EXPECT_EQ(types->IntAt(236), 4);     // user-defined ("</iframe>")
  EXPECT_EQ(types->IntAt(1000), 1);    // normal
  EXPECT_EQ(types->IntAt(256000), 4);  // "<end_of_image>"
  const GgufValue* tags = g.FindMeta("general.tags");
  ASSERT_NE(tags, nullptr);
  EXPECT_EQ(tags->Strings(),
            (std::vector<std::string>{"gemma3", "gemma", "google", "text-generation"}));
}

TEST_F(GgufRealModel, Tensors) {
  const GgufFile& g = *file_;
  EXPECT_EQ(g.Names().size(), 236u);
  const Tensor* emb = g.Find("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{262144, 640}));
  EXPECT_EQ(emb->dtype, DType::kQ8_0);
  EXPECT_EQ(emb->nbytes, 178257920u);
  EXPECT_EQ(emb->file, *path_);
  const Tensor* down = g.Find("blk.0.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->shape, (std::vector<int64_t>{640, 2048}));
  EXPECT_EQ(down->dtype, DType::kQ6_K);
  EXPECT_EQ(down->nbytes, 1075200u);
  const Tensor* q = g.Find("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->shape, (std::vector<int64_t>{1024, 640}));
  EXPECT_EQ(q->dtype, DType::kQ5_0);
  const Tensor* o = g.Find("blk.17.attn_output.weight");
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->shape, (std::vector<int64_t>{640, 1024}));
  EXPECT_EQ(o->dtype, DType::kQ4_K);
  const Tensor* norm = g.Find("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->shape, (std::vector<int64_t>{640}));
  EXPECT_EQ(norm->dtype, DType::kF32);
  EXPECT_EQ(norm->nbytes, 2560u);

  int counts[5] = {};
  for (const std::string& name : g.Names()) {
    const Tensor* t = g.Find(name);
    ASSERT_NE(t, nullptr);
    switch (t->dtype) {
      case DType::kF32: ++counts[0]; break;
      case DType::kQ5_0: ++counts[1]; break;
      case DType::kQ4_K: ++counts[2]; break;
      case DType::kQ8_0: ++counts[3]; break;
      case DType::kQ6_K: ++counts[4]; break;
      default: ADD_FAILURE() << name << " has unexpected dtype " << DTypeName(t->dtype);
    }
  }
  EXPECT_EQ(counts[0], 109);
  EXPECT_EQ(counts[1], 81);
  EXPECT_EQ(counts[2], 27);
  EXPECT_EQ(counts[3], 10);
  EXPECT_EQ(counts[4], 9);
}

TEST_F(GgufRealModel, Q4KFirstRowMatchesGgufPackage) {
  const std::string golden_path = std::string(GEMMA4RT_TEST_DATA_DIR) + "/data/dequant_golden.json";
  std::ifstream in(golden_path);
  ASSERT_TRUE(in.good()) << golden_path;
  std::stringstream ss;
  ss << in.rdbuf();
  const json golden = json::parse(ss.str());
  const json& row = golden["first_row"];
  const std::string name = row["tensor"];
  const Tensor* t = file_->Find(name);
  ASSERT_NE(t, nullptr) << name;
  ASSERT_EQ(t->dtype, DType::kQ4_K);
  const int64_t n = t->shape.back();
  ASSERT_EQ(n, row["n"].get<int64_t>());
  ASSERT_GE(t->nbytes, DTypeRowBytes(t->dtype, n));

  std::vector<float> got(static_cast<size_t>(n));
  ConvertToF32(t->dtype, t->data, got.data(), got.size());
  const std::string hex = row["f32"];
  ASSERT_EQ(hex.size(), static_cast<size_t>(n) * 8);
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t want = 0;
    for (int k = 3; k >= 0; --k) {  // little-endian bytes
      want = (want << 8) | static_cast<uint32_t>(std::stoul(hex.substr(8 * i + 2 * k, 2), nullptr, 16));
    }
    uint32_t bits;
    std::memcpy(&bits, &got[i], 4);
    if (bits != want && ++bad <= 5) {
      float w;
      std::memcpy(&w, &want, 4);
      ADD_FAILURE() << "element " << i << ": got " << got[i] << ", want " << w;
    }
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace g4
