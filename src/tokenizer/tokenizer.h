// Tokenizer for Gemma 3 and Gemma 4: text <-> token ids.
//
// Three vocabularies are understood:
//  * GGUF, tokenizer.ggml.model = "llama" (Gemma 3): SentencePiece pieces with scores. Encoding
//    is llama.cpp's SPM algorithm: spaces become "▁", the text is split into UTF-8 characters,
//    adjacent pairs whose concatenation is a piece are merged highest score first (ties: leftmost),
//    and a symbol with no piece falls back to <0xXX> byte tokens.
//  * GGUF, tokenizer.ggml.model = "gemma4" (Gemma 4): BPE with ranked merges over raw UTF-8
//    characters, spaces escaped to "▁", the only pre-split being runs of newlines versus
//    everything else (a newline run that is itself a token is emitted whole), byte fallback.
//    llama.cpp's LLAMA_VOCAB_PRE_TYPE_GEMMA4 behaviour (spec section 6.1).
//  * Hugging Face tokenizer.json with a BPE model (Gemma 3/4 repos): normalizer (Replace,
//    Prepend, Sequence), pre-tokenizer (Split on a string, Metaspace, Sequence, or none), BPE with
//    byte_fallback / fuse_unk / ignore_merges, and the added-tokens table.
//
// Special tokens written as text. GGUF vocabularies follow llama.cpp: CONTROL and UNKNOWN tokens
// are recognised only with parse_special; USER_DEFINED tokens (Gemma 3: runs of spaces, tabs and
// newlines, HTML tags, <start_of_image>) are always recognised; longer tokens are matched first
// over the whole text. tokenizer.json vocabularies follow HF: added tokens are matched
// leftmost-longest; with parse_special = false those marked "special" are left as plain text.
//
// Decoding renders each token as llama.cpp's token_to_piece does: "▁" -> " " in normal tokens,
// <0xXX> tokens -> that raw byte, control/unknown tokens -> their text (or nothing when skipped),
// user-defined tokens -> their text verbatim. For GGUF vocabularies Decode concatenates raw
// bytes, so decoding a partial character yields invalid UTF-8 (llama.cpp does the same; unlike
// llama.cpp, no "clean spaces" pass is applied to "gemma4" vocabularies, matching HF's Gemma
// decoder). For tokenizer.json vocabularies Decode follows HF's decoder Replace("▁", " ") ->
// ByteFallback -> Fuse: a run of byte tokens that is not valid UTF-8 becomes one U+FFFD per byte.
// IncrementalDetokenizer (detokenizer.h) is the streaming form.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace g4 {

class GgufFile;

namespace tokenizer_internal {
struct Model;
}

// Per-token attributes (a bit set; llama.cpp's llama_token_attr values).
enum TokenAttr : uint32_t {
  kTokenUndefined = 0,
  kTokenUnknown = 1u << 0,
  kTokenUnused = 1u << 1,
  kTokenNormal = 1u << 2,
  kTokenControl = 1u << 3,
  kTokenUserDefined = 1u << 4,
  kTokenByte = 1u << 5,
  kTokenNormalized = 1u << 6,  // HF added token matched against normalized text
  kTokenLstrip = 1u << 7,
  kTokenRstrip = 1u << 8,
  kTokenSingleWord = 1u << 9,
};

class Tokenizer {
 public:
  enum class Kind {
    kSentencePiece,  // GGUF "llama" (Gemma 3)
    kGemma4Bpe,      // GGUF "gemma4"
    kHfBpe,          // tokenizer.json, model type BPE
  };

  // Reads tokenizer.ggml.{model,tokens,scores,token_type,merges,bos_token_id,eos_token_id,
  // unknown_token_id,padding_token_id,add_bos_token}. Errors name the key: NotFound for a
  // missing key, InvalidArgument for a wrong type, counts that disagree with the token list, an
  // id out of range, or a malformed merge; Unimplemented for another tokenizer model.
  static StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& gguf);

  // Reads `dir`/tokenizer.json (and, if present, tokenizer_config.json for the bos/eos/pad
  // tokens and add_bos_token). Errors name the file and the JSON path.
  static StatusOr<std::unique_ptr<Tokenizer>> FromHfDirectory(const std::string& dir);
  // The same from the text of a tokenizer.json (and optionally a tokenizer_config.json; empty
  // when absent). `origin` names the source in error messages.
  static StatusOr<std::unique_ptr<Tokenizer>> FromHfJson(std::string_view tokenizer_json,
                                                         std::string_view tokenizer_config_json,
                                                         const std::string& origin);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids for `text`. add_bos prepends bos_id() (when the vocabulary has one).
  // parse_special: control tokens written as text (e.g. "<start_of_turn>", "<|turn>") become
  // their ids, as llama.cpp's tokenize(..., parse_special=true). Never fails: any byte sequence
  // (including invalid UTF-8) is encodable through byte fallback or <unk>.
  std::vector<int32_t> Encode(std::string_view text, bool add_bos, bool parse_special) const;
  // A lower bound on Encode's length (without BOS) for any text of `text_bytes` bytes, known
  // before encoding it: every input byte lands in a token and no token covers more than
  // max_bytes_per_token() of them. 0 where the vocabulary gives no such bound (a normalizer or
  // pre-tokenizer that deletes text, fused or dropped unknown characters, stripping added tokens).
  int64_t MinTokens(size_t text_bytes) const;
  int64_t max_bytes_per_token() const { return max_bytes_per_token_; }

  // The text one token renders to (special tokens as their text). "" for an id out of range.
  std::string TokenText(int32_t id) const;
  // Concatenated TokenText of `ids`; skip_special drops control and unknown tokens (llama.cpp
  // detokenize with unparse_special = false). Ids out of range render as nothing.
  std::string Decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The vocabulary entry as stored ("▁hello", "<0x0A>", "<start_of_turn>"), valid as long as
  // the tokenizer. "" if out of range.
  std::string_view Piece(int32_t id) const;
  // Id of the vocabulary entry equal to `piece` (exact, no escaping), if any.
  std::optional<int32_t> Find(std::string_view piece) const;

  int32_t vocab_size() const;
  int32_t bos_id() const;  // -1 if none
  int32_t eos_id() const;  // -1 if none
  int32_t unk_id() const;  // -1 if none
  int32_t pad_id() const;  // -1 if none
  // Whether the vocabulary asks for a BOS (tokenizer.ggml.add_bos_token / add_bos_token; forced
  // true for "gemma4" GGUFs as llama.cpp does). Encode only adds one when told to.
  bool add_bos_default() const;
  Kind kind() const;

  uint32_t Attributes(int32_t id) const;  // TokenAttr bits; 0 if out of range
  bool IsControl(int32_t id) const;
  bool IsByte(int32_t id) const;
  // Stop tokens: eos plus whichever of <end_of_turn> (Gemma 3), <turn|> and <|tool_response>
  // (Gemma 4) the vocabulary has (spec 6.3). Sorted.
  bool IsEndOfGeneration(int32_t id) const;
  const std::vector<int32_t>& end_of_generation_ids() const;

 private:
  explicit Tokenizer(std::unique_ptr<tokenizer_internal::Model> m);
  std::unique_ptr<tokenizer_internal::Model> m_;
  int64_t max_bytes_per_token_ = 0;  // 0: no bound (MinTokens)
};

}  // namespace g4
