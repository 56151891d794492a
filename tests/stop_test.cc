// StopMatcher: stop strings on streamed text pieces (split across pieces, several stops,
// overlapping prefixes, a stop at the very start, UTF-8 content, no stop), and the invariant that
// the emitted text does not depend on how the text was cut into pieces.
#include "runtime/stop.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace g4 {
namespace {

StopMatcher Make(std::vector<std::string> stops) {
  auto m = StopMatcher::Create(std::move(stops));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(m).value();
}

struct Streamed {
  std::vector<std::string> deltas;  // one per Feed, then Flush's
  bool stopped = false;
  int stop_index = -1;
  std::string Joined() const {
    std::string s;
    for (const auto& d : deltas) s += d;
    return s;
  }
};

Streamed Stream(StopMatcher& m, const std::vector<std::string>& pieces) {
  Streamed out;
  for (const auto& p : pieces) {
    auto r = m.Feed(p);
    out.deltas.push_back(r.text);
    out.stopped = r.stopped;
    out.stop_index = r.stop_index;
  }
  auto f = m.Flush();
  out.deltas.push_back(f.text);
  EXPECT_EQ(f.stopped, out.stopped);
  return out;
}

// Every delta must be valid UTF-8 on its own when the whole text is.
bool IsValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

TEST(StopMatcherTest, NoStopEmitsEverything) {
  StopMatcher m = Make({"</answer>"});
  auto s = Stream(m, {"Hello", ", ", "world", "!"});
  EXPECT_FALSE(s.stopped);
  EXPECT_EQ(s.stop_index, -1);
  EXPECT_EQ(s.Joined(), "Hello, world!");
  EXPECT_EQ(s.deltas[0], "Hello");  // nothing in it could start the stop string
}

TEST(StopMatcherTest, EmptyStopListPassesTextThrough) {
  StopMatcher m = Make({});
  EXPECT_EQ(m.Feed("abc").text, "abc");
  EXPECT_EQ(m.Flush().text, "");
}

TEST(StopMatcherTest, StopSplitAcrossPieces) {
  StopMatcher m = Make({"</answer>"});
  auto r1 = m.Feed("The result is 4</");
  EXPECT_EQ(r1.text, "The result is 4");  // "</" held back
  EXPECT_FALSE(r1.stopped);
  EXPECT_EQ(m.held(), "</");
  auto r2 = m.Feed("ans");
  EXPECT_EQ(r2.text, "");
  EXPECT_EQ(m.held(), "</ans");
  auto r3 = m.Feed("wer> and more text");
  EXPECT_TRUE(r3.stopped);
  EXPECT_EQ(r3.stop_index, 0);
  EXPECT_EQ(r3.text, "");  // the stop string and everything after it are dropped
  EXPECT_TRUE(m.Feed("ignored").stopped);
  EXPECT_EQ(m.Feed("ignored").text, "");
  auto f = m.Flush();
  EXPECT_TRUE(f.stopped);
  EXPECT_EQ(f.text, "");
}

TEST(StopMatcherTest, StopInsidePieceEmitsTextBeforeIt) {
  StopMatcher m = Make({"STOP"});
  auto r = m.Feed("abcSTOPdef");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "abc");
}

TEST(StopMatcherTest, FalseStartIsReleased) {
  StopMatcher m = Make({"</answer>"});
  EXPECT_EQ(m.Feed("a </an").text, "a ");
  auto r = m.Feed("chor>");  // "</anchor>" is not the stop string
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.text, "</anchor>");
  EXPECT_EQ(m.held(), "");
}

TEST(StopMatcherTest, PartialPrefixAtEndIsFlushed) {
  StopMatcher m = Make({"</answer>"});
  auto s = Stream(m, {"tail </ans"});
  EXPECT_FALSE(s.stopped);
  EXPECT_EQ(s.deltas[0], "tail ");
  EXPECT_EQ(s.deltas[1], "</ans");  // end of generation: the held prefix is ordinary text
}

TEST(StopMatcherTest, MultipleStopStringsFirstCompletedWins) {
  StopMatcher m = Make({"\nUser:", "###", "<end>"});
  auto s = Stream(m, {"Answer: 42#", "#", "# then \nUser: hi"});
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.stop_index, 1);
  EXPECT_EQ(s.Joined(), "Answer: 42");

  StopMatcher m2 = Make({"\nUser:", "###", "<end>"});
  auto s2 = Stream(m2, {"x\nUs", "er: ### <end>"});
  EXPECT_EQ(s2.stop_index, 0);
  EXPECT_EQ(s2.Joined(), "x");
}

TEST(StopMatcherTest, OverlappingPrefixes) {
  // "ab" completes before "abc": the shorter one wins, the text before both is emitted.
  StopMatcher m = Make({"abc", "ab"});
  auto s = Stream(m, {"xa", "bc"});
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.stop_index, 1);
  EXPECT_EQ(s.Joined(), "x");

  // Completed first beats listed first: "b" ends before "abc".
  StopMatcher m2 = Make({"abc", "b"});
  auto s2 = Stream(m2, {"1a", "bcd"});
  EXPECT_EQ(s2.stop_index, 1);
  EXPECT_EQ(s2.Joined(), "1a");

  // Same end: the longer (earlier start) wins.
  StopMatcher m3 = Make({"ab", "xab"});
  auto s3 = Stream(m3, {"1x", "a", "b"});
  EXPECT_EQ(s3.stop_index, 1);
  EXPECT_EQ(s3.Joined(), "1");

  // Self-overlapping stop: "aab" inside "aaab" is found after holding "aa".
  StopMatcher m4 = Make({"aab"});
  EXPECT_EQ(m4.Feed("a").text, "");
  EXPECT_EQ(m4.Feed("a").text, "");
  EXPECT_EQ(m4.Feed("a").text, "a");
  EXPECT_EQ(m4.held(), "aa");
  auto r = m4.Feed("b");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
}

TEST(StopMatcherTest, StopAtVeryStart) {
  StopMatcher m = Make({"<eot>"});
  auto r = m.Feed("<eot>rest");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  StopMatcher m2 = Make({"<eot>"});
  auto s = Stream(m2, {"<", "eo", "t>", "x"});
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.Joined(), "");
}

TEST(StopMatcherTest, Utf8ContentAndStops) {
  // "世界" (E4 B8 96 E7 95 8C) as stop; text split in the middle of characters.
  StopMatcher m = Make({"世界"});
  const std::string text = "héllo 世界!";
  std::vector<std::string> pieces = {text.substr(0, 2), text.substr(2, 5), text.substr(7, 4), text.substr(11)};
  auto s = Stream(m, pieces);
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.Joined(), "héllo ");
  for (const auto& d : s.deltas) EXPECT_TRUE(IsValidUtf8(d)) << d;
  EXPECT_EQ(s.deltas[0], "h");  // the first byte of "é" is held until its second byte arrives
}

TEST(StopMatcherTest, IncompleteUtf8IsHeldUntilComplete) {
  StopMatcher m = Make({});
  const std::string smile = "\xF0\x9F\x99\x82";  // U+1F642
  const std::string a_and_first_byte = std::string("a") + smile[0];  // (not "a" + substr: GCC 12 -Wrestrict false positive)
  EXPECT_EQ(m.Feed(a_and_first_byte).text, "a");
  EXPECT_EQ(m.Feed(smile.substr(1, 2)).text, "");
  EXPECT_EQ(m.Feed(smile.substr(3)).text, smile);
  // Truncated at the end of generation: the bytes are passed on by Flush.
  EXPECT_EQ(m.Feed("\xE4\xB8").text, "");
  EXPECT_EQ(m.Flush().text, "\xE4\xB8");
}

TEST(StopMatcherTest, OutputIndependentOfChunking) {
  const std::vector<std::string> stops = {"</s>", "\n\nUser:", "ß世", "aab"};
  const std::vector<std::string> texts = {
      "Plain text with nothing special in it, 世界 and emoji \xF0\x9F\x99\x82.",
      "It ends </s> right here and continues",
      "Almost </ s> but not, then \n\nUser: hello",
      "grüß世界 aaab",
      "aaaaab",
      "</s",
  };
  uint64_t state = 12345;
  auto next = [&state](uint64_t mod) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (state >> 33) % mod;
  };
  for (const std::string& text : texts) {
    StopMatcher whole = Make(stops);
    const Streamed expect = Stream(whole, {text});
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<std::string> pieces;
      for (size_t i = 0; i < text.size();) {
        const size_t len = 1 + next(6);
        pieces.push_back(text.substr(i, len));
        i += len;
      }
      StopMatcher m = Make(stops);
      const Streamed got = Stream(m, pieces);
      ASSERT_EQ(got.Joined(), expect.Joined()) << "text: " << text << " trial " << trial;
      ASSERT_EQ(got.stopped, expect.stopped);
      ASSERT_EQ(got.stop_index, expect.stop_index);
      for (const auto& d : got.deltas) ASSERT_TRUE(IsValidUtf8(d)) << text;
    }
  }
}

TEST(StopMatcherTest, RejectsEmptyStopString) {
  auto m = StopMatcher::Create({"ok", ""});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("stop[1]"), std::string::npos);
}

}  // namespace
}  // namespace g4
