// Gemma 4 output channels and tool-call syntax; see tool_calls.h.
#include "server/tool_calls.h"

#include <algorithm>
#include <utility>

#include <nlohmann/json.hpp>

namespace g4::server {
namespace {

using json = nlohmann::json;

constexpr std::string_view kQuote = "<|\"|>";
constexpr std::string_view kCallOpen = "<|tool_call>";
constexpr std::string_view kCallClose = "<tool_call|>";
constexpr std::string_view kChannelOpen = "<|channel>";
constexpr std::string_view kChannelClose = "<channel|>";
constexpr std::string_view kResponseOpen = "<|tool_response>";
constexpr std::string_view kThoughtHeader = "thought\n";
constexpr int kMaxDepth = 64;  // nesting of {...} / [...] in one call

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

// Recursive-descent reader of the call syntax and its drifts over `s` from `pos`.
class ValueReader {
 public:
  explicit ValueReader(std::string_view s) : s_(s) {}

  size_t pos = 0;

  void SkipSpace() {
    while (pos < s_.size() && IsSpace(s_[pos])) ++pos;
  }
  bool AtEnd() {
    SkipSpace();
    return pos >= s_.size();
  }
  bool StartsWith(std::string_view t) const { return s_.substr(pos).substr(0, t.size()) == t; }

  // A string in <|"|>...<|"|> or JSON's "..." (escapes as JSON); pos is at the opening quote.
  std::optional<std::string> QuotedString() {
    if (StartsWith(kQuote)) {
      const size_t end = s_.find(kQuote, pos + kQuote.size());
      if (end == std::string_view::npos) return std::nullopt;
      std::string out(s_.substr(pos + kQuote.size(), end - pos - kQuote.size()));
      pos = end + kQuote.size();
      return out;
    }
    if (pos < s_.size() && s_[pos] == '"') {
      size_t i = pos + 1;
      while (i < s_.size() && s_[i] != '"') i += s_[i] == '\\' ? 2 : 1;
      if (i >= s_.size()) return std::nullopt;
      json j = json::parse(s_.substr(pos, i + 1 - pos), nullptr, /*allow_exceptions=*/false);
      if (!j.is_string()) return std::nullopt;
      pos = i + 1;
      return j.get<std::string>();
    }
    return std::nullopt;
  }

  // An object after its opener ('{' or '('), up to the matching closer.
  std::optional<json> Object(char closer, int depth) {
    json out = json::object();
    while (true) {
      SkipSpace();
      if (pos >= s_.size()) return std::nullopt;
      if (s_[pos] == closer) {
        ++pos;
        return out;
      }
      std::string key;
      if (auto q = QuotedString()) {
        key = *q;
      } else {
        const size_t start = pos;
        while (pos < s_.size() && s_[pos] != ':' && s_[pos] != '=' && std::string_view("{}[](),").find(s_[pos]) == std::string_view::npos &&
               !StartsWith(kQuote))
          ++pos;
        key = std::string(Trim(s_.substr(start, pos - start)));
      }
      SkipSpace();
      if (key.empty() || pos >= s_.size() || (s_[pos] != ':' && s_[pos] != '=')) return std::nullopt;
      ++pos;
      auto v = Value(closer, depth + 1);
      if (!v) return std::nullopt;
      out[key] = std::move(*v);
      SkipSpace();
      if (pos < s_.size() && s_[pos] == ',') ++pos;
      else if (pos >= s_.size() || s_[pos] != closer) return std::nullopt;
    }
  }

  std::optional<json> Array(int depth) {
    json out = json::array();
    while (true) {
      SkipSpace();
      if (pos >= s_.size()) return std::nullopt;
      if (s_[pos] == ']') {
        ++pos;
        return out;
      }
      auto v = Value(']', depth + 1);
      if (!v) return std::nullopt;
      out.push_back(std::move(*v));
      SkipSpace();
      if (pos < s_.size() && s_[pos] == ',') ++pos;
      else if (pos >= s_.size() || s_[pos] != ']') return std::nullopt;
    }
  }

  // One value; a bare one ends at ',' or `closer` (or any closing bracket) outside quotes.
  std::optional<json> Value(char closer, int depth) {
    if (depth > kMaxDepth) return std::nullopt;
    SkipSpace();
    if (pos >= s_.size()) return std::nullopt;
    if (StartsWith(kQuote) || s_[pos] == '"') {
      auto q = QuotedString();
      if (!q) return std::nullopt;
      return json(std::move(*q));
    }
    if (s_[pos] == '{' || s_[pos] == '(') {
      const char c = s_[pos++] == '{' ? '}' : ')';
      return Object(c, depth);
    }
    if (s_[pos] == '[') {
      ++pos;
      return Array(depth);
    }
    const size_t start = pos;
    while (pos < s_.size() && s_[pos] != ',' && s_[pos] != closer && s_[pos] != '}' && s_[pos] != ')' && s_[pos] != ']')
      ++pos;
    const std::string_view word = Trim(s_.substr(start, pos - start));
    if (word.empty()) return std::nullopt;
    if (word == "true") return json(true);
    if (word == "false") return json(false);
    if (word == "null" || word == "None") return json(nullptr);
    json n = json::parse(word, nullptr, /*allow_exceptions=*/false);
    if (n.is_number()) return n;
    return json(std::string(word));  // an unquoted string
  }

 private:
  std::string_view s_;
};

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.' ||
         static_cast<unsigned char>(c) >= 0x80;
}

// The length of the longest suffix of `text` that is a proper prefix of one of `markers`.
size_t PartialMarker(std::string_view text, const std::vector<std::string_view>& markers) {
  size_t best = 0;
  for (std::string_view m : markers) {
    for (size_t k = std::min(text.size(), m.size() - 1); k > best; --k) {
      if (text.substr(text.size() - k) == m.substr(0, k)) {
        best = k;
        break;
      }
    }
  }
  return best;
}

}  // namespace

void ChannelDelta::Append(ChannelDelta more) {
  content += more.content;
  reasoning += more.reasoning;
  for (ParsedToolCall& c : more.calls) calls.push_back(std::move(c));
}

std::optional<ParsedToolCall> ParseGemma4ToolCall(std::string_view body) {
  body = Trim(body);
  if (body.substr(0, 5) == "call:") body.remove_prefix(5);
  body = Trim(body);
  size_t n = 0;
  while (n < body.size() && IsNameChar(body[n])) ++n;
  if (n == 0) return std::nullopt;
  ParsedToolCall call;
  call.name = std::string(body.substr(0, n));
  ValueReader r(body);
  r.pos = n;
  json args = json::object();
  if (!r.AtEnd()) {
    const char open = body[r.pos];
    if (open != '{' && open != '(') return std::nullopt;
    ++r.pos;
    auto obj = r.Object(open == '{' ? '}' : ')', 0);
    if (!obj) return std::nullopt;
    args = std::move(*obj);
    if (!r.AtEnd()) return std::nullopt;
  }
  call.arguments = args.dump(-1, ' ', false, json::error_handler_t::replace);
  return call;
}

Gemma4OutputParser::Gemma4OutputParser(OutputParserOptions options) : options_(std::move(options)) {
  if (options_.forced_call_prefix) {
    mode_ = Mode::kCall;
    call_ = *options_.forced_call_prefix;
  }
}

ChannelDelta Gemma4OutputParser::Push(std::string_view text) {
  ChannelDelta out;
  pending_.append(text);
  Run(false, &out);
  return out;
}

ChannelDelta Gemma4OutputParser::Finish() {
  ChannelDelta out;
  Run(true, &out);
  if (mode_ == Mode::kCall) EndCall(false, &out);
  if (mode_ == Mode::kReasoningHeader) mode_ = Mode::kReasoning;
  pending_.clear();
  return out;
}

void Gemma4OutputParser::EndCall(bool closed, ChannelDelta* out) {
  auto call = ParseGemma4ToolCall(call_);
  if (call) {
    if (options_.parallel_calls || calls_ == 0) {
      out->calls.push_back(std::move(*call));
      ++calls_;
    }
  } else {
    out->content += std::string(kCallOpen) + call_ + (closed ? std::string(kCallClose) : "");
  }
  call_.clear();
  mode_ = Mode::kContent;
}

void Gemma4OutputParser::Run(bool final, ChannelDelta* out) {
  while (!pending_.empty()) {
    std::string_view p = pending_;
    switch (mode_) {
      case Mode::kDropped:
        pending_.clear();
        return;
      case Mode::kContent: {
        std::vector<std::string_view> markers;
        if (options_.tools) markers.push_back(kCallOpen), markers.push_back(kResponseOpen);
        if (options_.reasoning) markers.push_back(kChannelOpen);
        size_t at = std::string_view::npos;
        std::string_view found;
        for (std::string_view m : markers) {
          const size_t i = p.find(m);
          if (i < at) at = i, found = m;
        }
        if (at == std::string_view::npos) {
          const size_t hold = final ? 0 : PartialMarker(p, markers);
          out->content.append(p.substr(0, p.size() - hold));
          pending_.erase(0, p.size() - hold);
          return;
        }
        out->content.append(p.substr(0, at));
        pending_.erase(0, at + found.size());
        mode_ = found == kCallOpen ? Mode::kCall : found == kChannelOpen ? Mode::kReasoningHeader : Mode::kDropped;
        break;
      }
      case Mode::kReasoningHeader:
        if (p.substr(0, kThoughtHeader.size()) == kThoughtHeader) {
          pending_.erase(0, kThoughtHeader.size());
        } else if (!final && kThoughtHeader.substr(0, p.size()) == p) {
          return;  // may still become the header
        }
        mode_ = Mode::kReasoning;
        break;
      case Mode::kReasoning: {
        const size_t at = p.find(kChannelClose);
        if (at == std::string_view::npos) {
          const size_t hold = final ? 0 : PartialMarker(p, {kChannelClose});
          out->reasoning.append(p.substr(0, p.size() - hold));
          pending_.erase(0, p.size() - hold);
          return;
        }
        out->reasoning.append(p.substr(0, at));
        pending_.erase(0, at + kChannelClose.size());
        mode_ = Mode::kContent;
        break;
      }
      case Mode::kCall: {
        const size_t at = p.find(kCallClose);
        if (at == std::string_view::npos) {
          const size_t hold = final ? 0 : PartialMarker(p, {kCallClose});
          call_.append(p.substr(0, p.size() - hold));
          pending_.erase(0, p.size() - hold);
          return;
        }
        call_.append(p.substr(0, at));
        pending_.erase(0, at + kCallClose.size());
        EndCall(true, out);
        break;
      }
    }
  }
}

}  // namespace g4::server
