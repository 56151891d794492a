// IncrementalDetokenizer: streaming id by id reproduces Tokenizer::Decode for every golden case
// (Gemma 3 GGUF, tiny Gemma 4 tokenizer.json and GGUF), and a multi-byte character delivered by
// byte-fallback tokens is never emitted in part.

#include "tokenizer/detokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/gguf.h"
#include "model/model.h"
#include "tokenizer/utf8.h"

namespace g4 {
namespace {

using json = nlohmann::json;

const std::string kDataDir = std::string(GEMMA4RT_TEST_DATA_DIR) + "/data";

json LoadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

std::string Stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special, bool* all_valid) {
  IncrementalDetokenizer detok(tok, skip_special);
  std::string out;
  for (int32_t id : ids) {
    const std::string piece = detok.Push(id);
    if (!utf8::IsValid(piece)) *all_valid = false;
    out += piece;
  }
  const std::string rest = detok.Flush();
  if (!utf8::IsValid(rest)) *all_valid = false;
  return out + rest;
}

// Every encoding of every golden case, streamed with special tokens rendered and skipped.
int CheckStreaming(const Tokenizer& tok, const json& cases) {
  int n = 0;
  for (const json& c : cases) {
    for (const json& e : c["encodings"]) {
      SCOPED_TRACE("case '" + c["name"].get<std::string>() + "'");
      const auto ids = e["ids"].get<std::vector<int32_t>>();
      for (bool skip : {false, true}) {
        bool valid = true;
        EXPECT_EQ(Stream(tok, ids, skip, &valid), tok.Decode(ids, skip));
        EXPECT_TRUE(valid);
        ++n;
      }
    }
  }
  return n;
}

std::unique_ptr<Tokenizer> LoadTinyHf() {
  auto t = Tokenizer::FromHfDirectory(kDataDir + "/tokenizer_gemma4_tiny");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

TEST(DetokenizerGolden, StreamingReproducesDecodeGemma3) {
  const std::string path = DefaultModelFile();
  ASSERT_TRUE(std::filesystem::exists(path)) << "Gemma 3 model not found at " << path
                                             << "; run scripts/fetch-default-model.sh (or set GEMMA4RT_DEFAULT_MODEL)";
  auto gguf = GgufFile::Open(path);
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  auto tok = Tokenizer::FromGguf(**gguf);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const json golden = LoadJson(kDataDir + "/tokenizer_gemma3_golden.json");
  EXPECT_GE(CheckStreaming(**tok, golden["cases"]), 200);

  // Byte fallback in the real vocabulary: U+10FFFD has no piece, so it is 4 byte tokens; none
  // of the first three pushes may emit anything.
  const std::vector<int32_t> ids = (*tok)->Encode("\xF4\x8F\xBF\xBD", false, false);
  ASSERT_EQ(ids.size(), 4u);
  IncrementalDetokenizer d(**tok);
  for (int k = 0; k < 3; ++k) {
    EXPECT_TRUE((*tok)->IsByte(ids[k]));
    EXPECT_EQ(d.Push(ids[k]), "");
  }
  EXPECT_EQ(d.Push(ids[3]), "\xF4\x8F\xBF\xBD");
  EXPECT_EQ(d.Flush(), "");
}

TEST(DetokenizerGolden, StreamingReproducesDecodeGemma4Tiny) {
  const json golden = LoadJson(kDataDir + "/tokenizer_gemma4_tiny_golden.json");
  auto hf = LoadTinyHf();
  ASSERT_NE(hf, nullptr);
  EXPECT_GE(CheckStreaming(*hf, golden["cases"]), 200);
  auto gguf = GgufFile::Open(kDataDir + "/tokenizer_gemma4_tiny/tokenizer_gemma4_tiny.gguf");
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  auto tok = Tokenizer::FromGguf(**gguf);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_GE(CheckStreaming(**tok, golden["llama_cpp_gguf"]), 200);
}

TEST(Detokenizer, MultiByteCharacterIsNeverSplit) {
  auto tok = LoadTinyHf();
  ASSERT_NE(tok, nullptr);
  // "€" = E2 82 AC and "🦙" = F0 9F A6 99 are not in the tiny vocabulary: byte fallback.
  const std::string text = "a\xE2\x82\xAC b\xF0\x9F\xA6\x99!";
  const std::vector<int32_t> ids = tok->Encode(text, false, false);
  IncrementalDetokenizer d(*tok);
  std::string out;
  int bytes_seen = 0;
  for (int32_t id : ids) {
    const std::string piece = d.Push(id);
    EXPECT_TRUE(utf8::IsValid(piece));
    if (tok->IsByte(id)) {
      ++bytes_seen;
      // Only the last byte of a character completes it.
      const bool completes = bytes_seen == 3 || bytes_seen == 7;
      EXPECT_EQ(piece.empty(), !completes) << "byte token #" << bytes_seen;
      if (completes) {
        EXPECT_EQ(piece, bytes_seen == 3 ? "\xE2\x82\xAC" : "\xF0\x9F\xA6\x99");
      }
    }
    out += piece;
  }
  EXPECT_EQ(bytes_seen, 7);
  EXPECT_EQ(out + d.Flush(), text);
}

TEST(Detokenizer, InvalidAndTruncatedBytesBecomeReplacementCharacters) {
  auto tok = LoadTinyHf();
  ASSERT_NE(tok, nullptr);
  const auto byte = [&](int b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    return *tok->Find(buf);
  };
  IncrementalDetokenizer d(*tok);
  EXPECT_EQ(d.Push(byte(0xE4)), "");
  EXPECT_EQ(d.Push(byte(0xB8)), "");
  EXPECT_EQ(d.pending_bytes(), 2u);
  // A byte that cannot continue the sequence: the truncated prefix is one U+FFFD, then "a".
  EXPECT_EQ(d.Push(*tok->Find("a")),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(d.Push(byte(0xFF)), "\xEF\xBF\xBD");  // never valid anywhere
  EXPECT_EQ(d.Push(byte(0xF0)), "");
  EXPECT_EQ(d.Flush(), "\xEF\xBF\xBD");  // truncated at the end
  EXPECT_EQ(d.Flush(), "");
}

TEST(Detokenizer, SkipSpecialDropsControlTokens) {
  auto tok = LoadTinyHf();
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> ids = tok->Encode("<|turn>user\nhello<turn|>", true, true);
  IncrementalDetokenizer keep(*tok, false), skip(*tok, true);
  std::string a, b;
  for (int32_t id : ids) {
    a += keep.Push(id);
    b += skip.Push(id);
  }
  EXPECT_EQ(a + keep.Flush(), "<bos><|turn>user\nhello<turn|>");
  EXPECT_EQ(b + skip.Flush(), "user\nhello");
}

}  // namespace
}  // namespace g4
