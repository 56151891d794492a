// Small UTF-8 helpers shared by the tokenizer and the streaming detokenizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace g4::utf8 {

// Length of the sequence a lead byte announces, the way llama.cpp splits text into symbols:
// 0x00-0xBF -> 1 (continuation bytes stand alone), 0xC0-0xDF -> 2, 0xE0-0xEF -> 3, 0xF0-0xFF -> 4.
// Callers clamp to the bytes that remain.
inline size_t SeqLen(unsigned char lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 when the bytes there are not
// a valid sequence (overlong forms, surrogates, > U+10FFFF and stray continuation bytes are
// invalid), or -1 when they are a valid but truncated prefix of a sequence (more bytes needed).
int ValidSeqLen(std::string_view s, size_t i);

// Where ValidSeqLen(s, i) == 0: the number of bytes of the maximal invalid subpart starting at
// s[i] (at least 1), i.e. the well-formed prefix of a sequence before the offending byte.
size_t InvalidRun(std::string_view s, size_t i);

// Appends the UTF-8 encoding of code point `cp` (must be <= 0x10FFFF).
void AppendCodePoint(uint32_t cp, std::string* out);

// The replacement character U+FFFD, encoded.
inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Copies `s`, replacing every maximal invalid subsequence (Unicode "substitution of maximal
// subparts", as Python's errors="replace") with U+FFFD.
std::string Sanitize(std::string_view s);

// True if `s` is entirely valid UTF-8.
bool IsValid(std::string_view s);

// Replaces every occurrence of `from` in `s` with `to`.
std::string ReplaceAll(std::string_view s, std::string_view from, std::string_view to);

// "▁" (U+2581), SentencePiece's escaped space.
inline constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";

}  // namespace g4::utf8
