// Streaming detokenizer: turns token ids into text as they are generated, one id at a time.
//
// Push returns only whole UTF-8 characters: when byte-fallback tokens (<0xE4><0xB8><0xAD>)
// deliver a character in pieces, nothing is returned until its last byte arrives. Bytes that can
// never form a valid character are emitted as U+FFFD as soon as that is certain. For ids whose
// decoded text is valid UTF-8, the concatenation of every Push plus Flush equals
// Tokenizer::Decode(ids, skip_special).
#pragma once

#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace g4 {

class IncrementalDetokenizer {
 public:
  // `tokenizer` must outlive this object. skip_special as in Tokenizer::Decode.
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special = false);

  // Appends one token; returns the text completed by it (possibly empty).
  std::string Push(int32_t id);
  // Returns whatever is still held back (an incomplete trailing sequence, as U+FFFD) and resets.
  std::string Flush();
  // Drops any held-back bytes.
  void Reset() { pending_.clear(); }
  // Bytes held back waiting for the rest of a character.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace g4
