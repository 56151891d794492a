// StopMatcher: OpenAI `stop` strings on streamed text.
//
// The detokenizer hands over one decoded text piece per generated token; a stop string may be
// split across pieces ("</" + "answer>"). Feed() returns the text that is safe to show now and
// holds back (a) the longest tail that is a proper prefix of some stop string, since the next
// piece may complete it, and (b) a trailing incomplete UTF-8 sequence, so a delta never ends
// inside a character (../shared/spec/serving.md, streaming rules). When a stop string matches, the
// text before it is emitted and nothing from the stop string on (OpenAI, vLLM and llama-server
// all exclude the stop string from the output); later Feed() calls return nothing.
//
// Which stop wins: the one that is COMPLETED first in the text (smallest end offset), and among
// stops completed at the same offset the longest (earliest start). This depends only on the text,
// not on how it was cut into pieces, so the concatenation of all Feed() outputs plus Flush() is the
// same for every chunking of the same text (tested), i.e. streamed output equals non-streamed
// output. Example: stops {"abc", "b"} on "abcd" stop at "b" and emit "a".
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace g4 {

class StopMatcher {
 public:
  // What Feed()/Flush() hand back.
  struct Result {
    std::string text;      // safe to emit now (may be empty); valid UTF-8 if the input was
    bool stopped = false;  // a stop string matched (now or earlier): generation should end
    int stop_index = -1;   // index into the stop list of the string that matched, else -1
  };

  // stops: the stop strings, any bytes but each non-empty. An empty list never stops (Feed()
  // still holds back incomplete UTF-8). Errors: InvalidArgument naming the index of an empty
  // string ("stop[1] is empty").
  static StatusOr<StopMatcher> Create(std::vector<std::string> stops);

  // Appends `piece` (bytes of decoded text) and returns what may be emitted. O(|held| + |piece|)
  // per stop string for the search, plus O(L^2) for the hold-back with L = longest stop length.
  Result Feed(std::string_view piece);

  // End of generation (length limit or stop token): returns everything still held back (a partial
  // stop-string prefix is ordinary text then, incomplete UTF-8 bytes are passed on as they are).
  // After a stop it returns an empty text with stopped = true. Idempotent.
  Result Flush();

  bool stopped() const { return stop_index_ >= 0; }
  int stop_index() const { return stop_index_; }
  // Bytes currently held back.
  const std::string& held() const { return held_; }

 private:
  explicit StopMatcher(std::vector<std::string> stops);

  std::vector<std::string> stops_;
  std::string held_;
  int stop_index_ = -1;
};

}  // namespace g4
