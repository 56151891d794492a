#include "tokenizer/detokenizer.h"

#include "tokenizer/utf8.h"

namespace g4 {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special)
    : tok_(tokenizer), skip_special_(skip_special) {}

std::string IncrementalDetokenizer::Push(int32_t id) {
  // Raw bytes of the token (Decode of a lone id would already judge a partial character).
  if (!(skip_special_ && (tok_.Attributes(id) & (kTokenControl | kTokenUnknown)))) {
    pending_ += tok_.TokenText(id);
  }
  // Emit everything up to a trailing sequence that is valid so far but incomplete.
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const int n = utf8::ValidSeqLen(pending_, i);
    if (n < 0) break;  // wait for more bytes
    if (n > 0) {
      out.append(pending_, i, static_cast<size_t>(n));
      i += static_cast<size_t>(n);
      continue;
    }
    // Certainly invalid: one U+FFFD for the maximal invalid subpart, as Sanitize does.
    out += utf8::kReplacement;
    i += utf8::InvalidRun(pending_, i);
  }
  pending_.erase(0, i);
  return out;
}

std::string IncrementalDetokenizer::Flush() {
  std::string out = utf8::Sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace g4
