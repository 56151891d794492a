// Segmentation algorithms: SentencePiece-by-score merging (GGUF "llama"), ranked BPE merging
// (GGUF "gemma4" and tokenizer.json), and the HF normalizer / pre-tokenizer steps.
//
// Both merge loops keep the text's symbols in a doubly linked list over one array and a heap of
// candidate pairs, so a word of n characters costs O(n log n) whatever its length.

#include <algorithm>
#include <queue>

#include "tokenizer/model.h"
#include "tokenizer/utf8.h"

namespace g4::tokenizer_internal {

namespace {

struct Symbol {
  int32_t prev;
  int32_t next;
  uint32_t start;  // byte offset in the text
  uint32_t n;      // byte length; 0 once merged into its left neighbour
  int32_t id;      // BPE only: current token id, -1 if the text is not a token
};

// Splits `text` into one symbol per UTF-8 character (llama.cpp's unicode_len_utf8 rule).
std::vector<Symbol> SplitChars(std::string_view text) {
  std::vector<Symbol> syms;
  syms.reserve(text.size());
  size_t off = 0;
  while (off < text.size()) {
    const size_t len = std::min(utf8::SeqLen(static_cast<unsigned char>(text[off])), text.size() - off);
    const int32_t idx = static_cast<int32_t>(syms.size());
    syms.push_back(
        {idx - 1, off + len == text.size() ? -1 : idx + 1, static_cast<uint32_t>(off), static_cast<uint32_t>(len), -1});
    off += len;
  }
  return syms;
}

}  // namespace

void SpecialTable::Insert(std::string_view text, int32_t id) {
  if (text.empty()) return;
  entries_.push_back({static_cast<uint32_t>(text_.size()), static_cast<uint32_t>(text.size()), id});
  text_.append(text);
}

void SpecialTable::Finish() {
  auto view = [this](const Entry& e) { return std::string_view(text_).substr(e.offset, e.len); };
  std::stable_sort(entries_.begin(), entries_.end(), [&](const Entry& a, const Entry& b) { return view(a) < view(b); });
  // Equal texts are adjacent in the order they were added: keep the first.
  entries_.erase(std::unique(entries_.begin(), entries_.end(), [&](const Entry& a, const Entry& b) { return view(a) == view(b); }),
                 entries_.end());
  entries_.shrink_to_fit();
  text_.shrink_to_fit();
}

// ---------------------------------------------------------------------------------------------
// SentencePiece by score (llama.cpp llm_tokenizer_spm_session): repeatedly merge the adjacent
// pair whose concatenation is a vocabulary entry with the highest score; ties go to the leftmost
// pair. Every merged symbol is a vocabulary entry by construction; a single character that is
// not one becomes <0xXX> byte tokens.

void Model::EncodeSpm(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  std::vector<Symbol> syms = SplitChars(text);

  struct Bigram {
    float score;
    int32_t left;
    int32_t right;
    uint32_t size;
  };
  const auto lower = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(lower)> queue(lower);

  const auto try_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const uint32_t size = syms[l].n + syms[r].n;
    const int32_t id = Lookup(text.substr(syms[l].start, size));
    if (id < 0) return;
    queue.push({tokens.score(id), l, r, size});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(syms.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram bg = queue.top();
    queue.pop();
    Symbol& l = syms[bg.left];
    Symbol& r = syms[bg.right];
    // Stale: one side was merged away or has grown since the pair was queued.
    if (l.n == 0 || r.n == 0 || l.n + r.n != bg.size) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = bg.left;
    try_add(l.prev, bg.left);
    try_add(bg.left, l.next);
  }

  for (int32_t i = 0; i != -1; i = syms[i].next) {
    const std::string_view piece = text.substr(syms[i].start, syms[i].n);
    const int32_t id = Lookup(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    for (char c : piece) {
      const int32_t b = byte_tokens[static_cast<uint8_t>(c)];
      if (b >= 0) {
        out->push_back(b);
      } else {
        // llama.cpp falls back to the byte as a one-character piece; <unk> if there is none.
        const int32_t single = Lookup(std::string_view(&c, 1));
        if (single >= 0) {
          out->push_back(single);
        } else if (unk >= 0) {
          out->push_back(unk);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Ranked BPE (llama.cpp llm_tokenizer_bpe_session with byte_encode = false, and HF's BPE model):
// merge the adjacent pair with the lowest merge rank, ties to the leftmost pair. A symbol left
// that is not a token becomes <0xXX> byte tokens; without byte tokens, GGUF drops the bytes
// (llama.cpp) and tokenizer.json uses <unk> (fused when fuse_unk).

void Model::EncodeBpeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    const int32_t whole = Lookup(word);
    if (whole >= 0) {
      out->push_back(whole);
      return;
    }
  }
  std::vector<Symbol> syms = SplitChars(word);
  for (Symbol& s : syms) s.id = Lookup(word.substr(s.start, s.n));

  struct Bigram {
    int32_t rank;
    int32_t left;
    int32_t right;
    int32_t left_id;
    int32_t right_id;
    int32_t result;
  };
  const auto lower = [](const Bigram& a, const Bigram& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(lower)> queue(lower);
  const auto try_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0 || syms[l].id < 0 || syms[r].id < 0) return;
    auto it = merges.find(PairKey(syms[l].id, syms[r].id));
    if (it == merges.end()) return;
    queue.push({it->second.rank, l, r, syms[l].id, syms[r].id, it->second.result});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(syms.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram bg = queue.top();
    queue.pop();
    Symbol& l = syms[bg.left];
    Symbol& r = syms[bg.right];
    if (l.n == 0 || r.n == 0 || l.next != bg.right || l.id != bg.left_id || r.id != bg.right_id) {
      continue;  // stale
    }
    l.n += r.n;
    l.id = bg.result;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = bg.left;
    try_add(l.prev, bg.left);
    try_add(bg.left, l.next);
  }

  const bool hf = kind == Tokenizer::Kind::kHfBpe;
  bool prev_unk = false;
  for (int32_t i = 0; i != -1; i = syms[i].next) {
    if (syms[i].id >= 0) {
      out->push_back(syms[i].id);
      prev_unk = false;
      continue;
    }
    const std::string_view piece = word.substr(syms[i].start, syms[i].n);
    bool all_bytes = byte_fallback;
    for (char c : piece) all_bytes = all_bytes && byte_tokens[static_cast<uint8_t>(c)] >= 0;
    if (all_bytes) {
      for (char c : piece) out->push_back(byte_tokens[static_cast<uint8_t>(c)]);
      prev_unk = false;
    } else if (hf) {
      if (unk >= 0 && !(fuse_unk && prev_unk)) out->push_back(unk);
      prev_unk = unk >= 0;
    } else {
      for (char c : piece) {
        const int32_t b = byte_tokens[static_cast<uint8_t>(c)];
        if (b >= 0) out->push_back(b);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// HF normalizer and pre-tokenizer.

std::string Model::Normalize(std::string_view text) const {
  std::string s(text);
  for (const NormalizerStep& step : normalizer) {
    switch (step.kind) {
      case NormalizerStep::Kind::kReplace:
        s = utf8::ReplaceAll(s, step.pattern, step.content);
        break;
      case NormalizerStep::Kind::kPrepend:
        if (!s.empty()) s.insert(0, step.content);
        break;
    }
  }
  return s;
}

namespace {

// Applies one Split step (string delimiter) to `piece`, appending the resulting pieces.
void SplitOnString(std::string_view piece, const PreTokenizerStep& step, std::vector<std::string>* out) {
  using B = PreTokenizerStep::Behavior;
  const std::string_view pat = step.pattern;
  // (begin, end, is_delimiter) spans covering the piece.
  std::vector<std::tuple<size_t, size_t, bool>> spans;
  size_t pos = 0;
  while (pos < piece.size()) {
    const size_t hit = pat.empty() ? std::string_view::npos : piece.find(pat, pos);
    if (hit == std::string_view::npos) {
      spans.emplace_back(pos, piece.size(), false);
      break;
    }
    if (hit > pos) spans.emplace_back(pos, hit, false);
    spans.emplace_back(hit, hit + pat.size(), true);
    pos = hit + pat.size();
  }
  std::vector<std::pair<size_t, size_t>> pieces;
  for (size_t k = 0; k < spans.size(); ++k) {
    auto [b, e, delim] = spans[k];
    if (!delim) {
      pieces.emplace_back(b, e);
      continue;
    }
    switch (step.behavior) {
      case B::kRemoved:
        break;
      case B::kIsolated:
        pieces.emplace_back(b, e);
        break;
      case B::kContiguous:
        if (!pieces.empty() && k > 0 && std::get<2>(spans[k - 1])) {
          pieces.back().second = e;
        } else {
          pieces.emplace_back(b, e);
        }
        break;
      case B::kMergedWithPrevious:
        // Joins the piece before it, unless that was a delimiter too (HF's rule).
        if (!pieces.empty() && k > 0 && !std::get<2>(spans[k - 1])) {
          pieces.back().second = e;
        } else {
          pieces.emplace_back(b, e);
        }
        break;
      case B::kMergedWithNext:
        if (k + 1 < spans.size() && !std::get<2>(spans[k + 1])) {
          std::get<0>(spans[k + 1]) = b;
        } else {
          pieces.emplace_back(b, e);
        }
        break;
    }
  }
  for (auto [b, e] : pieces) {
    if (e > b) out->emplace_back(piece.substr(b, e - b));
  }
}

}  // namespace

void Model::EncodeHfChunk(std::string_view text, bool first_chunk, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  std::vector<std::string> pieces{std::string(text)};
  for (const PreTokenizerStep& step : pre_tokenizer) {
    std::vector<std::string> next;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (step.kind == PreTokenizerStep::Kind::kSplit) {
        SplitOnString(pieces[i], step, &next);
        continue;
      }
      // Metaspace: spaces -> replacement, optional prefix, then split before each replacement.
      std::string s = utf8::ReplaceAll(pieces[i], " ", step.pattern);
      const bool prefix = step.prepend == PreTokenizerStep::Prepend::kAlways ||
                          (step.prepend == PreTokenizerStep::Prepend::kFirst && first_chunk && i == 0);
      if (prefix && !s.starts_with(step.pattern)) s.insert(0, step.pattern);
      if (step.split) {
        PreTokenizerStep split{PreTokenizerStep::Kind::kSplit, step.pattern,
                               PreTokenizerStep::Behavior::kMergedWithNext};
        SplitOnString(s, split, &next);
      } else if (!s.empty()) {
        next.push_back(std::move(s));
      }
    }
    pieces = std::move(next);
  }
  for (const std::string& p : pieces) EncodeBpeWord(p, out);
}

}  // namespace g4::tokenizer_internal
