// Block dequantisation (src/tensor/dequant.cc) against the gguf Python package.
//
// tests/data/dequant_golden.json (tools/make_dequant_golden.py) holds raw ggml blocks -- real
// ones from the default model, random data quantised by gguf.quants.quantize, random bytes, and
// special F16/BF16 values -- with the f32 values gguf.quants.dequantize returns for them. Our
// arithmetic is the package's, in the same order and in f32, so the comparison is bit-exact: no
// tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace g4 {

bool DequantizeRow(DType t, const void* src, float* dst, size_t n);  // dequant.cc

namespace {

using json = nlohmann::json;

std::vector<uint8_t> FromHex(const std::string& hex) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    ADD_FAILURE() << "bad hex digit " << c;
    return 0;
  };
  EXPECT_EQ(hex.size() % 2, 0u);
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<uint8_t>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  }
  return out;
}

std::vector<uint32_t> F32Bits(const std::string& hex) {
  std::vector<uint8_t> b = FromHex(hex);
  std::vector<uint32_t> out(b.size() / 4);
  std::memcpy(out.data(), b.data(), out.size() * 4);
  return out;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bool ParseType(const std::string& s, DType* t) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                  DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ4_K, DType::kQ5_K,
                  DType::kQ6_K}) {
    if (DTypeName(d) == s) {
      *t = d;
      return true;
    }
  }
  return false;
}

json LoadGolden() {
  const std::string path = std::string(GEMMA4RT_TEST_DATA_DIR) + "/data/dequant_golden.json";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path << " (regenerate with "
                         << "tools/make_dequant_golden.py)";
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

TEST(DequantGolden, EveryCaseBitExact) {
  const json golden = LoadGolden();
  ASSERT_TRUE(golden.contains("cases"));
  std::set<std::string> types_seen;
  int n_cases = 0;
  for (const json& c : golden["cases"]) {
    const std::string type = c["type"];
    const std::string source = c["source"];
    SCOPED_TRACE(type + " (" + source + ")");
    DType t;
    ASSERT_TRUE(ParseType(type, &t)) << "unknown type in golden file: " << type;
    const std::vector<uint8_t> raw = FromHex(c["bytes"]);
    const std::vector<uint32_t> want = F32Bits(c["f32"]);
    const size_t n = c["n"];
    ASSERT_EQ(want.size(), n);
    ASSERT_EQ(raw.size(), DTypeRowBytes(t, static_cast<int64_t>(n)));

    std::vector<float> got(n, -12345.0f);
    ConvertToF32(t, raw.data(), got.data(), n);
    int mismatches = 0;
    for (size_t i = 0; i < n; ++i) {
      if (Bits(got[i]) != want[i] && ++mismatches <= 5) {
        ADD_FAILURE() << "element " << i << " (block " << i / DTypeBlockElems(t) << "): got "
                      << got[i] << " (0x" << std::hex << Bits(got[i]) << "), want "
                      << FromBits(want[i]) << " (0x" << want[i] << std::dec << ")";
      }
    }
    EXPECT_EQ(mismatches, 0);

    // Block types also through DequantizeRow directly, one block at a time (a row may start at
    // any block boundary).
    if (DTypeBlockElems(t) > 1) {
      const size_t qk = DTypeBlockElems(t);
      std::vector<float> one(qk);
      for (size_t b = 0; b < n / qk; ++b) {
        ASSERT_TRUE(DequantizeRow(t, raw.data() + b * DTypeBlockBytes(t), one.data(), qk));
        for (size_t i = 0; i < qk; ++i) ASSERT_EQ(Bits(one[i]), want[b * qk + i]) << b << ":" << i;
      }
    }
    types_seen.insert(type);
    ++n_cases;
  }
  // Every format the engine reads is covered, the four of the default model by real blocks.
  for (const char* t : {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "BF16",
                        "F16"}) {
    EXPECT_TRUE(types_seen.count(t)) << "golden file has no " << t << " case";
  }
  int real = 0;
  for (const json& c : golden["cases"]) {
    if (c["source"].get<std::string>().rfind("real:", 0) == 0) ++real;
  }
  EXPECT_EQ(real, 4);
  EXPECT_GE(n_cases, 20);
}

// Hand-built blocks: the layout facts the golden file relies on, spelled out.
uint16_t H(float f) { return F32ToF16(f); }
void PutHalf(uint8_t* p, float f) {
  const uint16_t h = H(f);
  p[0] = h & 0xff;
  p[1] = h >> 8;
}

TEST(DequantTest, Q8_0Layout) {
  uint8_t b[34];
  PutHalf(b, 0.5f);
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j * 8 - 128));
  float y[32];
  ASSERT_TRUE(DequantizeRow(DType::kQ8_0, b, y, 32));
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 0.5f * (j * 8 - 128)) << j;
}

// Tensor::GetF32 on a block-quantised tensor decodes the block that holds the element (it used
// to fall through the switch and return 0).
TEST(DequantTest, TensorGetF32ReadsQuantisedElements) {
  uint8_t b[2 * 34];
  for (int blk = 0; blk < 2; ++blk) {
    PutHalf(b + 34 * blk, blk == 0 ? 0.5f : 0.25f);
    for (int j = 0; j < 32; ++j) b[34 * blk + 2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j * 8 - 128));
  }
  Tensor t;
  t.dtype = DType::kQ8_0;
  t.shape = {64};
  t.data = b;
  t.nbytes = sizeof(b);
  EXPECT_EQ(t.GetF32(3), 0.5f * (3 * 8 - 128));
  EXPECT_EQ(t.GetF32(32 + 31), 0.25f * (31 * 8 - 128));
}

TEST(DequantTest, Q4_0NibbleOrder) {
  // Byte j holds element j (low nibble) and element j + 16 (high nibble), offset by 8.
  uint8_t b[18];
  PutHalf(b, 2.0f);
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  ASSERT_TRUE(DequantizeRow(DType::kQ4_0, b, y, 32));
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * (j - 8)) << j;
    EXPECT_EQ(y[j + 16], 2.0f * (15 - j - 8)) << j;
  }
}

TEST(DequantTest, Q4_1AddsMin) {
  uint8_t b[20];
  PutHalf(b, 0.25f);
  PutHalf(b + 2, -1.0f);
  for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<uint8_t>(j | (j << 4));
  float y[32];
  ASSERT_TRUE(DequantizeRow(DType::kQ4_1, b, y, 32));
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.25f * j - 1.0f);
    EXPECT_EQ(y[j + 16], 0.25f * j - 1.0f);
  }
}

TEST(DequantTest, Q5_0HighBitsFromQh) {
  // Bit i of the little-endian u32 qh is the fifth bit of element i.
  uint8_t b[22] = {};
  PutHalf(b, 1.0f);
  const uint32_t qh = 0x80000001u;  // elements 0 and 31
  std::memcpy(b + 2, &qh, 4);
  for (int j = 0; j < 16; ++j) b[6 + j] = 0x33;
  float y[32];
  ASSERT_TRUE(DequantizeRow(DType::kQ5_0, b, y, 32));
  for (int j = 0; j < 32; ++j) {
    const int q = 3 + ((j == 0 || j == 31) ? 16 : 0);
    EXPECT_EQ(y[j], static_cast<float>(q - 16)) << j;
  }
}

TEST(DequantTest, Q5_1HighBitsFromQh) {
  uint8_t b[24] = {};
  PutHalf(b, 0.5f);
  PutHalf(b + 2, 10.0f);
  const uint32_t qh = 0x00010002u;  // elements 1 and 16
  std::memcpy(b + 4, &qh, 4);
  float y[32];
  ASSERT_TRUE(DequantizeRow(DType::kQ5_1, b, y, 32));
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(y[j], (j == 1 || j == 16) ? 0.5f * 16 + 10.0f : 10.0f) << j;
  }
}

TEST(DequantTest, Q4_KScalesAndMins) {
  // Sub-block s uses scale sc[s] and min m[s]: x = d * sc[s] * q - dmin * m[s]. Scales/mins 0-3
  // are the low 6 bits of bytes 0-3 / 4-7; 4-7 are nibbles of bytes 8-11 plus the top 2 bits of
  // bytes 0-3 / 4-7.
  uint8_t b[144] = {};
  PutHalf(b, 1.0f);
  PutHalf(b + 2, 0.5f);
  uint8_t* sc = b + 4;
  const int scale[8] = {1, 2, 3, 63, 17, 33, 48, 5};
  const int mins[8] = {0, 4, 62, 1, 49, 2, 16, 63};
  for (int s = 0; s < 4; ++s) {
    sc[s] = static_cast<uint8_t>(scale[s] | ((scale[s + 4] >> 4) << 6));
    sc[s + 4] = static_cast<uint8_t>(mins[s] | ((mins[s + 4] >> 4) << 6));
    sc[s + 8] = static_cast<uint8_t>((scale[s + 4] & 15) | ((mins[s + 4] & 15) << 4));
  }
  uint8_t* qs = b + 16;
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) qs[32 * g + l] = static_cast<uint8_t>((l % 16) | ((15 - l % 16) << 4));
  }
  float y[256];
  ASSERT_TRUE(DequantizeRow(DType::kQ4_K, b, y, 256));
  for (int s = 0; s < 8; ++s) {
    for (int l = 0; l < 32; ++l) {
      const int q = (s % 2 == 0) ? l % 16 : 15 - l % 16;
      EXPECT_EQ(y[32 * s + l], 1.0f * scale[s] * q - 0.5f * mins[s]) << s << ":" << l;
    }
  }
}

TEST(DequantTest, Q6_KLayout) {
  // Element e = 128 h + r: low nibble r / 64 of ql[64 h + r % 64], 2-bit field r / 32 of
  // qh[32 h + r % 32], minus 32, times d * scales[e / 16].
  uint8_t b[210] = {};
  for (int i = 0; i < 128; ++i) b[i] = static_cast<uint8_t>(i * 37 + 11);
  for (int i = 0; i < 64; ++i) b[128 + i] = static_cast<uint8_t>(i * 91 + 5);
  for (int i = 0; i < 16; ++i) b[192 + i] = static_cast<uint8_t>(static_cast<int8_t>(i * 9 - 70));
  PutHalf(b + 208, 0.125f);
  float y[256];
  ASSERT_TRUE(DequantizeRow(DType::kQ6_K, b, y, 256));
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, r = e % 128;
    const int lo = (b[64 * h + r % 64] >> (4 * (r / 64))) & 15;
    const int hi = (b[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
    const float d = 0.125f * static_cast<float>(static_cast<int8_t>(b[192 + e / 16]));
    EXPECT_EQ(y[e], d * static_cast<float>((lo | hi << 4) - 32)) << e;
  }
}

TEST(DequantTest, SeveralBlocksInOneCall) {
  std::vector<uint8_t> raw(3 * 176);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>(i * 131 + 7);
  for (int b = 0; b < 3; ++b) PutHalf(raw.data() + 176 * b, 0.01f * (b + 1));
  for (int b = 0; b < 3; ++b) PutHalf(raw.data() + 176 * b + 2, 0.02f * (b + 1));
  std::vector<float> all(768), one(256);
  ASSERT_TRUE(DequantizeRow(DType::kQ5_K, raw.data(), all.data(), 768));
  for (int b = 0; b < 3; ++b) {
    ASSERT_TRUE(DequantizeRow(DType::kQ5_K, raw.data() + 176 * b, one.data(), 256));
    for (int i = 0; i < 256; ++i) ASSERT_EQ(Bits(all[256 * b + i]), Bits(one[i]));
  }
}

TEST(DequantTest, NonBlockTypesAreNotHandled) {
  float src[4] = {1, 2, 3, 4}, dst[4];
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64}) {
    EXPECT_FALSE(DequantizeRow(t, src, dst, 2)) << DTypeName(t);
  }
}

}  // namespace
}  // namespace g4
