#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "tokenizer/model.h"
#include "tokenizer/utf8.h"

namespace g4 {

using tokenizer_internal::Model;

namespace tokenizer_internal {

namespace {

// Token texts llama.cpp's vocabulary loader treats as end-of-generation, forcing them CONTROL
// (GGUF only). This changes how they encode without parse_special and decode with skip_special;
// e.g. Gemma 3's user-defined "</s>" becomes control.
constexpr std::string_view kLlamaCppEogTexts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "\xEF\xBD\x9C"
    "end\xE2\x96\x81of\xE2\x96\x81sentence"
    "\xEF\xBD\x9C",
    "[e~[",
};

// Stop tokens besides eos (spec 6.3 / 6.5): Gemma 3 <end_of_turn>, Gemma 4 <turn|> and
// <|tool_response>.
constexpr std::string_view kStopTexts[] = {"<end_of_turn>", "<turn|>", "<|tool_response>"};

bool IsByteText(std::string_view t, uint8_t* value) {
  if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return false;
  unsigned v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = t[k];
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= c - '0';
    else if (c >= 'A' && c <= 'F')
      v |= c - 'A' + 10;
    else if (c >= 'a' && c <= 'f')
      v |= c - 'a' + 10;
    else
      return false;
  }
  *value = static_cast<uint8_t>(v);
  return true;
}

}  // namespace

void Model::BuildIndex() {
  index.Build(tokens.size(), [this](size_t i) { return tokens.text(static_cast<int32_t>(i)); });
}

void Model::Finalize() {
  const int32_t n = static_cast<int32_t>(tokens.size());

  byte_tokens.fill(-1);
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    const int32_t id = Lookup(buf);
    if (id >= 0) byte_tokens[b] = id;
  }
  // A token typed BYTE must spell <0xXX>; one that does not is treated as a normal token.
  for (int32_t i = 0; i < n; ++i) {
    uint8_t v;
    if ((tokens.attrs(i) & kTokenByte) && !IsByteText(tokens.text(i), &v))
      tokens.set_attrs(i, (tokens.attrs(i) & ~kTokenByte) | kTokenNormal);
  }

  if (kind != Tokenizer::Kind::kHfBpe) {
    for (std::string_view t : kLlamaCppEogTexts) {
      const int32_t id = Lookup(t);
      if (id >= 0) tokens.set_attrs(id, tokens.attrs(id) | kTokenControl);
    }
    // llama.cpp's Gemma 4 workaround: with <|tool_response> present, "</s>" is a normal token.
    const int32_t s = Lookup("</s>");
    if (s >= 0 && Lookup("<|tool_response>") >= 0) tokens.set_attrs(s, kTokenNormal);
  }
  eog.clear();
  if (eos >= 0) eog.push_back(eos);
  for (std::string_view t : kStopTexts) {
    const int32_t id = Lookup(t);
    if (id >= 0 && std::find(eog.begin(), eog.end(), id) == eog.end()) eog.push_back(id);
  }
  std::sort(eog.begin(), eog.end());

  raw_specials = SpecialTable();
  normalized_specials = SpecialTable();
  special_ids.clear();
  special_ranks.clear();
  if (kind == Tokenizer::Kind::kHfBpe) {
    for (int32_t i = 0; i < n; ++i) {
      const uint32_t a = tokens.attrs(i);
      if (!(a & (kTokenControl | kTokenUserDefined))) continue;
      if (a & kTokenNormalized) {
        normalized_specials.Insert(Normalize(tokens.text(i)), i);
      } else {
        raw_specials.Insert(tokens.text(i), i);
      }
    }
    raw_specials.Finish();
    normalized_specials.Finish();
    return;
  }
  // llama.cpp: every CONTROL / USER_DEFINED / UNKNOWN token, longest first.
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < n; ++i) {
    if (tokens.attrs(i) & (kTokenControl | kTokenUserDefined | kTokenUnknown)) ids.push_back(i);
  }
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return tokens.text(a).size() > tokens.text(b).size(); });
  std::vector<std::pair<int32_t, int32_t>> by_id(ids.size());  // (id, rank)
  for (size_t r = 0; r < ids.size(); ++r) {
    by_id[r] = {ids[r], static_cast<int32_t>(r)};
    raw_specials.Insert(tokens.text(ids[r]), ids[r]);
  }
  raw_specials.Finish();
  std::sort(by_id.begin(), by_id.end());
  special_ids.resize(by_id.size());
  special_ranks.resize(by_id.size());
  for (size_t k = 0; k < by_id.size(); ++k) {
    special_ids[k] = by_id[k].first;
    special_ranks[k] = by_id[k].second;
  }
}

}  // namespace tokenizer_internal

namespace {

struct Fragment {
  int32_t id;  // >= 0: a token; -1: text [begin, end)
  size_t begin;
  size_t end;
};

bool IsAsciiSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

// llama.cpp's tokenizer_st_partition: special tokens are taken longest first (over the whole
// text), each one's occurrences left to right within the text not yet claimed. Two equivalent
// implementations, picked by estimated cost: scanning the free text once per distinct token that
// occurs (cheap when few distinct tokens occur many times, e.g. long runs of spaces), or sorting
// all occurrences by (rank, position) and accepting those that do not overlap an earlier one
// (cheap when many distinct tokens occur a few times). llama.cpp's own loop is the first form
// over every special token of the vocabulary.
std::vector<Fragment> PartitionLongestFirst(const Model& m, std::string_view text, bool parse_special) {
  std::vector<Fragment> frags{{-1, 0, text.size()}};
  if (m.raw_specials.empty() || text.empty()) return frags;
  const auto allowed = [&](int32_t id) {
    return parse_special || !(m.tokens.attrs(id) & (kTokenControl | kTokenUnknown));
  };
  // Which tokens occur, and how often in all.
  std::vector<uint8_t> seen;  // by rank, allocated on the first match
  std::vector<int32_t> found;
  size_t total = 0;
  for (size_t pos = 0; pos < text.size(); ++pos) {
    m.raw_specials.ForEachMatch(text, pos, [&](size_t, int32_t id) {
      if (!allowed(id)) return;
      ++total;
      if (seen.empty()) seen.assign(m.num_special(), 0);
      const int32_t rank = m.SpecialRank(id);
      if (!seen[rank]) {
        seen[rank] = 1;
        found.push_back(id);
      }
    });
  }
  if (found.empty()) return frags;
  std::sort(found.begin(), found.end(), [&](int32_t a, int32_t b) { return m.SpecialRank(a) < m.SpecialRank(b); });

  if (total * 16 > found.size() * text.size()) {
    for (int32_t id : found) {
      const std::string_view t = m.tokens.text(id);
      std::vector<Fragment> next;
      next.reserve(frags.size() + 16);
      for (const Fragment& f : frags) {
        if (f.id >= 0) {
          next.push_back(f);
          continue;
        }
        const std::string_view region = text.substr(0, f.end);
        size_t pos = f.begin;
        for (size_t hit; (hit = region.find(t, pos)) != std::string_view::npos;) {
          if (hit > pos) next.push_back({-1, pos, hit});
          next.push_back({id, hit, hit + t.size()});
          pos = hit + t.size();
        }
        if (pos < f.end) next.push_back({-1, pos, f.end});
      }
      frags.swap(next);
    }
    return frags;
  }

  struct Occ {
    int32_t rank;
    uint32_t pos;
    uint32_t len;
    int32_t id;
  };
  std::vector<Occ> occ;
  occ.reserve(total);
  for (size_t pos = 0; pos < text.size(); ++pos) {
    m.raw_specials.ForEachMatch(text, pos, [&](size_t len, int32_t id) {
      if (allowed(id)) {
        occ.push_back({m.SpecialRank(id), static_cast<uint32_t>(pos), static_cast<uint32_t>(len), id});
      }
    });
  }
  std::sort(occ.begin(), occ.end(),
            [](const Occ& a, const Occ& b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; });
  std::map<size_t, std::pair<size_t, int32_t>> taken;  // begin -> (end, id)
  for (const Occ& o : occ) {
    const size_t b = o.pos, e = o.pos + o.len;
    auto it = taken.upper_bound(b);
    if (it != taken.end() && it->first < e) continue;
    if (it != taken.begin() && std::prev(it)->second.first > b) continue;
    taken.emplace(b, std::make_pair(e, o.id));
  }
  frags.clear();
  size_t pos = 0;
  for (const auto& [b, v] : taken) {
    if (b > pos) frags.push_back({-1, pos, b});
    frags.push_back({v.second, b, v.first});
    pos = v.first;
  }
  if (pos < text.size()) frags.push_back({-1, pos, text.size()});
  return frags;
}

bool IsWordByte(unsigned char c) {
  return c >= 0x80 || c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// HF AddedVocabulary::find_matches: leftmost-longest matches; a "special" match is left as text
// when parse_special is false (tokenizers' encode_special_tokens); lstrip / rstrip absorb the
// whitespace around a match; single_word matches need non-word characters on both sides.
std::vector<Fragment> PartitionLeftmostLongest(const Model& m, const tokenizer_internal::SpecialTable& specials,
                                               std::string_view text, bool parse_special) {
  std::vector<Fragment> out;
  size_t start = 0;  // end of the last emitted piece
  size_t pos = 0;
  while (pos < text.size()) {
    size_t best_len = 0;
    int32_t best_id = -1;
    specials.ForEachMatch(text, pos, [&](size_t len, int32_t id) {
      best_len = len;
      best_id = id;
    });
    if (best_id < 0) {
      ++pos;
      continue;
    }
    size_t b = pos, e = pos + best_len;
    pos = e;
    const uint32_t a = m.tokens.attrs(best_id);
    if (!parse_special && (a & kTokenControl)) continue;
    if (a & kTokenSingleWord) {
      const bool left_ok = b == 0 || !IsWordByte(static_cast<unsigned char>(text[b - 1]));
      const bool right_ok = e == text.size() || !IsWordByte(static_cast<unsigned char>(text[e]));
      if (!left_ok || !right_ok) continue;
    }
    if (a & kTokenLstrip) {
      while (b > start && IsAsciiSpace(text[b - 1])) --b;
    }
    if (a & kTokenRstrip) {
      while (e < text.size() && IsAsciiSpace(text[e])) ++e;
      pos = e;
    }
    if (b > start) out.push_back({-1, start, b});
    out.push_back({best_id, b, e});
    start = e;
  }
  if (start < text.size()) out.push_back({-1, start, text.size()});
  return out;
}

}  // namespace

namespace {

using tokenizer_internal::NormalizerStep;
using tokenizer_internal::PreTokenizerStep;

// The most input bytes one token of Encode's output can stand for; 0 where there is no bound.
// A token's text bounds what it covers, since escaping spaces ("▁") and prefixes only lengthen
// the text; a character with no piece becomes byte tokens or one <unk> (at most 4 bytes).
int64_t MaxBytesPerToken(const Model& m) {
  const bool bytes = (m.kind != Tokenizer::Kind::kHfBpe || m.byte_fallback) &&
                     std::all_of(m.byte_tokens.begin(), m.byte_tokens.end(), [](int32_t id) { return id >= 0; });
  if (!bytes && (m.unk < 0 || m.fuse_unk)) return 0;  // characters dropped, or runs fused into one <unk>
  int64_t most = 4;
  for (int32_t i = 0; i < static_cast<int32_t>(m.tokens.size()); ++i) {
    if (m.tokens.attrs(i) & (kTokenLstrip | kTokenRstrip)) return 0;  // absorbs the spaces beside it
    most = std::max<int64_t>(most, static_cast<int64_t>(m.tokens.text(i).size()));
  }
  for (const NormalizerStep& n : m.normalizer) {
    if (n.kind != NormalizerStep::Kind::kReplace || n.content.size() >= n.pattern.size()) continue;
    if (n.content.empty()) return 0;  // deletes text
    most *= static_cast<int64_t>((n.pattern.size() + n.content.size() - 1) / n.content.size());
  }
  for (const PreTokenizerStep& p : m.pre_tokenizer)
    if (p.kind == PreTokenizerStep::Kind::kSplit && p.behavior == PreTokenizerStep::Behavior::kRemoved) return 0;
  return most;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Model> m) : m_(std::move(m)), max_bytes_per_token_(MaxBytesPerToken(*m_)) {}

int64_t Tokenizer::MinTokens(size_t text_bytes) const {
  if (max_bytes_per_token_ <= 0) return 0;
  return (static_cast<int64_t>(text_bytes) + max_bytes_per_token_ - 1) / max_bytes_per_token_;
}
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_bos, bool parse_special) const {
  const Model& m = *m_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && m.bos >= 0) out.push_back(m.bos);
  if (text.empty()) return out;

  if (m.kind == Kind::kHfBpe) {
    for (const Fragment& f : PartitionLeftmostLongest(m, m.raw_specials, text, parse_special)) {
      if (f.id >= 0) {
        out.push_back(f.id);
        continue;
      }
      const std::string norm = m.Normalize(text.substr(f.begin, f.end - f.begin));
      for (const Fragment& g : PartitionLeftmostLongest(m, m.normalized_specials, norm, parse_special)) {
        if (g.id >= 0) {
          out.push_back(g.id);
        } else {
          m.EncodeHfChunk(std::string_view(norm).substr(g.begin, g.end - g.begin), f.begin == 0 && g.begin == 0, &out);
        }
      }
    }
    return out;
  }

  bool prev_special = true;
  for (const Fragment& f : PartitionLongestFirst(m, text, parse_special)) {
    if (f.id >= 0) {
      out.push_back(f.id);
      prev_special = true;
      continue;
    }
    std::string chunk;
    if (m.kind == Kind::kSentencePiece && m.add_space_prefix && prev_special) chunk = " ";
    chunk.append(text.substr(f.begin, f.end - f.begin));
    const std::string escaped = utf8::ReplaceAll(chunk, " ", utf8::kSpaceMarker);
    prev_special = false;
    if (m.kind == Kind::kSentencePiece) {
      m.EncodeSpm(escaped, &out);
      continue;
    }
    // gemma4: pre-split into runs of newlines and runs of anything else ("[^\n]+|[\n]+"); a
    // newline run that is a token is emitted whole.
    const std::string_view s = escaped;
    size_t pos = 0;
    while (pos < s.size()) {
      const bool nl = s[pos] == '\n';
      size_t end = pos;
      while (end < s.size() && (s[end] == '\n') == nl) ++end;
      const std::string_view word = s.substr(pos, end - pos);
      const int32_t whole = nl ? m.Lookup(word) : -1;
      if (whole >= 0) {
        out.push_back(whole);
      } else {
        m.EncodeBpeWord(word, &out);
      }
      pos = end;
    }
  }
  return out;
}

std::string Tokenizer::TokenText(int32_t id) const {
  const Model& m = *m_;
  if (id < 0 || id >= vocab_size()) return {};
  const uint32_t a = m.tokens.attrs(id);
  const std::string_view text = m.tokens.text(id);
  if (a & (kTokenUnknown | kTokenControl | kTokenUserDefined)) {
    if (m.kind == Kind::kHfBpe) return utf8::ReplaceAll(text, utf8::kSpaceMarker, " ");
    return std::string(text);
  }
  if (a & kTokenNormal) return utf8::ReplaceAll(text, utf8::kSpaceMarker, " ");
  uint8_t v;
  if ((a & kTokenByte) && tokenizer_internal::IsByteText(text, &v)) return std::string(1, static_cast<char>(v));
  return {};
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  const Model& m = *m_;
  std::string out;
  // HF's ByteFallback decoder turns a run of byte tokens that is not valid UTF-8 into one
  // U+FFFD per byte; llama.cpp (GGUF) concatenates the raw bytes.
  const bool hf = m.kind == Kind::kHfBpe;
  std::string bytes;
  const auto flush = [&] {
    if (bytes.empty()) return;
    if (!hf || utf8::IsValid(bytes)) {
      out += bytes;
    } else {
      for (size_t k = 0; k < bytes.size(); ++k) out += utf8::kReplacement;
    }
    bytes.clear();
  };
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    const uint32_t a = m.tokens.attrs(id);
    if (skip_special && (a & (kTokenControl | kTokenUnknown))) continue;
    if ((a & kTokenByte) && !(a & (kTokenControl | kTokenUnknown | kTokenUserDefined))) {
      bytes += TokenText(id);
      continue;
    }
    flush();
    out += TokenText(id);
  }
  flush();
  return out;
}

std::string_view Tokenizer::Piece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return m_->tokens.text(id);
}

std::optional<int32_t> Tokenizer::Find(std::string_view piece) const {
  const int32_t id = m_->Lookup(piece);
  if (id < 0) return std::nullopt;
  return id;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(m_->tokens.size()); }
int32_t Tokenizer::bos_id() const { return m_->bos; }
int32_t Tokenizer::eos_id() const { return m_->eos; }
int32_t Tokenizer::unk_id() const { return m_->unk; }
int32_t Tokenizer::pad_id() const { return m_->pad; }
bool Tokenizer::add_bos_default() const { return m_->add_bos; }
Tokenizer::Kind Tokenizer::kind() const { return m_->kind; }

uint32_t Tokenizer::Attributes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return 0;
  return m_->tokens.attrs(id);
}
bool Tokenizer::IsControl(int32_t id) const { return (Attributes(id) & kTokenControl) != 0; }
bool Tokenizer::IsByte(int32_t id) const { return (Attributes(id) & kTokenByte) != 0; }
bool Tokenizer::IsEndOfGeneration(int32_t id) const { return std::binary_search(m_->eog.begin(), m_->eog.end(), id); }
const std::vector<int32_t>& Tokenizer::end_of_generation_ids() const { return m_->eog; }

}  // namespace g4
