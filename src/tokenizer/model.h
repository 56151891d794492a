// Internal representation shared by the tokenizer loaders and algorithms (not a public API).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "tokenizer/tokenizer.h"

namespace g4::tokenizer_internal {

// text -> token id over a vocabulary it does not copy: an open-addressing table (linear probing,
// at most 3/4 full, any size: a slot is picked by multiplying the hash's high half by the size)
// whose keys are the tokens' own texts. A slot is 4 bytes: the id in the low kIdBits bits and 8
// bits of the text's hash above, so a probe compares texts only when those bits agree. 1.33 MiB
// for a 262144-entry vocabulary (2 MiB at most half full with power-of-two sizes until
// 2026-11-30; an unordered_map<string, int32> held a node and a key copy per token, ~20 MB). The
// texts must not change while the index is used. Vocabularies of kMaxTokens (2^24 - 1) tokens or
// more are refused (Vocab::Assign).
class TokenIndex {
 public:
  static constexpr int kIdBits = 24;
  static constexpr size_t kMaxTokens = (size_t{1} << kIdBits) - 1;  // ids < kMaxTokens
  // Indexes texts(0..n-1) (`texts(i)` returns a string_view that stays valid); the first id wins
  // for duplicated texts. n < 2^kIdBits (the loaders check).
  template <typename TextOf>
  void Build(size_t n, TextOf&& texts) {
    const size_t cap = std::max<size_t>(16, n + n / 3 + 1);
    slots_.assign(cap, kEmpty);
    for (size_t i = 0; i < n; ++i) {
      const std::string_view t = texts(i);
      const size_t h = Hash(t);
      for (size_t s = Start(h, cap);; s = s + 1 == cap ? 0 : s + 1) {
        if (slots_[s] == kEmpty) {
          slots_[s] = Tag(h) | static_cast<uint32_t>(i);
          break;
        }
        if ((slots_[s] & ~kIdMask) == Tag(h) && texts(slots_[s] & kIdMask) == t) break;  // duplicate: keep the first
      }
    }
  }
  // The id whose text is `s`, or -1.
  template <typename TextOf>
  int32_t Find(std::string_view s, TextOf&& texts) const {
    if (slots_.empty()) return -1;
    const size_t h = Hash(s), cap = slots_.size();
    for (size_t k = Start(h, cap);; k = k + 1 == cap ? 0 : k + 1) {
      const uint32_t slot = slots_[k];
      if (slot == kEmpty) return -1;
      if ((slot & ~kIdMask) == Tag(h) && texts(slot & kIdMask) == s) return static_cast<int32_t>(slot & kIdMask);
    }
  }

 private:
  static constexpr uint32_t kIdMask = (1u << kIdBits) - 1;
  static constexpr uint32_t kEmpty = ~0u;  // id kIdMask with tag 0xFF: never a real slot (ids < kIdMask)
  static size_t Hash(std::string_view s) { return std::hash<std::string_view>{}(s); }
  static size_t Start(size_t h, size_t cap) { return static_cast<size_t>((static_cast<uint64_t>(h >> 32) * cap) >> 32); }
  static uint32_t Tag(size_t h) { return static_cast<uint32_t>(h & 0xFF) << kIdBits; }
  std::vector<uint32_t> slots_;
};

// The vocabulary by token id, struct-of-arrays: every text in one buffer addressed by 32-bit
// offsets, scores as f32, attributes (kToken* bits, all below 1 << 16) as u16. For Gemma's 262144
// tokens that is ~2 MiB of text + 2.5 MiB of arrays; one std::string per token plus its score and
// attributes (48 bytes each, longer texts on the heap) held ~13.5 MiB, which put `generate` over
// its peak-RSS budget (docs/PERFORMANCE.md). Ids are 0 .. size() - 1; callers check ranges.
class Vocab {
  static_assert(kTokenSingleWord < (1u << 16), "attributes are stored in 16 bits");

 public:
  // Replaces the vocabulary by n tokens with texts text_of(0 .. n-1) (anything a string_view is
  // made from; taken in order, once each), score 0, attributes kTokenNormal. Fails with
  // InvalidArgument if the texts add up to 4 GiB or more.
  template <typename TextOf>
  Status Assign(size_t n, TextOf&& text_of) {
    if (n >= TokenIndex::kMaxTokens) {
      return InvalidArgument("a vocabulary of " + std::to_string(n) + " tokens: at most " +
                             std::to_string(TokenIndex::kMaxTokens - 1) + " are supported");
    }
    text_.clear();
    offsets_.assign(1, 0);
    offsets_.reserve(n + 1);
    for (size_t i = 0; i < n; ++i) {
      const auto& t = text_of(i);
      const std::string_view v(t);
      if (text_.size() + v.size() > UINT32_MAX) return InvalidArgument("the vocabulary's texts exceed 4 GiB");
      text_.append(v);
      offsets_.push_back(static_cast<uint32_t>(text_.size()));
    }
    text_.shrink_to_fit();
    scores_.assign(n, 0.0f);
    attrs_.assign(n, static_cast<uint16_t>(kTokenNormal));
    return OkStatus();
  }
  size_t size() const { return attrs_.size(); }
  std::string_view text(int32_t id) const {
    return std::string_view(text_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
  }
  float score(int32_t id) const { return scores_[id]; }
  void set_score(int32_t id, float s) { scores_[id] = s; }
  uint32_t attrs(int32_t id) const { return attrs_[id]; }
  void set_attrs(int32_t id, uint32_t a) { attrs_[id] = static_cast<uint16_t>(a); }

 private:
  std::string text_;               // all texts, concatenated
  std::vector<uint32_t> offsets_;  // size() + 1: text i is [offsets_[i], offsets_[i + 1])
  std::vector<float> scores_;
  std::vector<uint16_t> attrs_;
};

// A ranked BPE merge: left + right -> result.
struct Merge {
  int32_t rank;
  int32_t result;
};

// The byte strings of the tokens that may be written as text (special tokens), matched at a
// position of a text: one table sorted by bytes, texts in one buffer, walked a byte at a time as a
// trie would be by narrowing a range of entries with two binary searches per byte (in text
// without special tokens the first byte already empties it). Gemma's ~6K special tokens take
// ~0.1 MiB; a trie of one node per byte with a vector of children each held ~0.9 MiB of heap,
// part of `generate`'s peak RSS (docs/PERFORMANCE.md).
class SpecialTable {
 public:
  // Adds a token; the first id added wins for a text added twice; empty texts never match. Call
  // Finish before ForEachMatch.
  void Insert(std::string_view text, int32_t id);
  void Finish();
  // Calls fn(length, id) for every token that matches s at position pos, shortest first.
  template <typename Fn>
  void ForEachMatch(std::string_view s, size_t pos, Fn&& fn) const {
    auto lo = entries_.begin(), hi = entries_.end();
    for (size_t len = 1; pos + len <= s.size() && lo != hi; ++len) {
      // [lo, hi): the entries that start with s[pos, pos + len - 1), the one equal to it first.
      const unsigned char c = static_cast<unsigned char>(s[pos + len - 1]);
      lo = std::partition_point(lo, hi, [&](const Entry& e) { return e.len < len || Byte(e, len - 1) < c; });
      hi = std::partition_point(lo, hi, [&](const Entry& e) { return Byte(e, len - 1) == c; });
      if (lo != hi && lo->len == len) fn(len, lo->id);
    }
  }
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    uint32_t offset, len;  // bytes of text_
    int32_t id;
  };
  unsigned char Byte(const Entry& e, size_t i) const { return static_cast<unsigned char>(text_[e.offset + i]); }
  std::string text_;
  std::vector<Entry> entries_;
};

// One step of an HF normalizer (applied to the text between added tokens).
struct NormalizerStep {
  enum class Kind { kReplace, kPrepend };
  Kind kind;
  std::string pattern;  // kReplace: what to replace
  std::string content;  // the replacement, or the prefix for kPrepend
};

// One step of an HF pre-tokenizer.
struct PreTokenizerStep {
  enum class Kind { kSplit, kMetaspace };
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  Kind kind;
  std::string pattern;  // kSplit: the delimiter; kMetaspace: the replacement ("▁")
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  // kMetaspace
  enum class Prepend { kAlways, kFirst, kNever };
  Prepend prepend = Prepend::kAlways;
  bool split = true;
};

struct Model {
  Tokenizer::Kind kind = Tokenizer::Kind::kSentencePiece;
  Vocab tokens;
  TokenIndex index;  // text -> id (first id wins for duplicated strings); built by BuildIndex

  // BPE merges keyed by (left id << 32 | right id).
  std::unordered_map<uint64_t, Merge> merges;
  std::array<int32_t, 256> byte_tokens;  // id of <0xXX>, or -1

  int32_t bos = -1, eos = -1, unk = -1, pad = -1;
  bool add_bos = false;
  bool add_space_prefix = false;  // SentencePiece: " " before text that starts a fragment
  std::vector<int32_t> eog;

  // Tokens recognised in raw text. GGUF: llama.cpp's longest-first order, SpecialRank(id) = the
  // token's place in the order of length descending, then id. HF: leftmost-longest, two tables
  // (raw text, then normalized text).
  SpecialTable raw_specials;
  SpecialTable normalized_specials;
  // GGUF: the special tokens' ids in increasing order and, at the same index, their ranks (6414
  // of Gemma 3's 262144 tokens: 50 KB, where a rank per token id took 1 MiB).
  std::vector<int32_t> special_ids;
  std::vector<int32_t> special_ranks;
  size_t num_special() const { return special_ids.size(); }
  // The rank of special token `id` (one the trie returned); -1 for a token that is not special.
  int32_t SpecialRank(int32_t id) const {
    const auto it = std::lower_bound(special_ids.begin(), special_ids.end(), id);
    return it != special_ids.end() && *it == id ? special_ranks[it - special_ids.begin()] : -1;
  }

  // HF pipeline.
  std::vector<NormalizerStep> normalizer;
  std::vector<PreTokenizerStep> pre_tokenizer;
  bool ignore_merges = false;
  bool byte_fallback = true;
  bool fuse_unk = false;

  // Builds `index` (text -> id) from `tokens`; token texts must not change afterwards.
  void BuildIndex();
  // Finishes construction (after BuildIndex): byte table, special-token tries, EOG list.
  void Finalize();

  int32_t Lookup(std::string_view s) const {
    return index.Find(s, [this](size_t i) { return tokens.text(static_cast<int32_t>(i)); });
  }
  uint64_t static PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  // Segmentation of one chunk of already-escaped text (no special tokens inside).
  void EncodeSpm(std::string_view text, std::vector<int32_t>* out) const;
  void EncodeBpeWord(std::string_view word, std::vector<int32_t>* out) const;
  // HF: normalizes, pre-tokenizes and BPE-encodes a chunk of raw text.
  void EncodeHfChunk(std::string_view text, bool first_chunk, std::vector<int32_t>* out) const;
  std::string Normalize(std::string_view text) const;
};

}  // namespace g4::tokenizer_internal
