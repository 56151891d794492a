// Gemma 3 / Gemma 4 chat template renderers. See chat_template.h for the contract and sources;
// tests/chat_template_test.cc checks every case of tests/data/chat_template_golden.json.
#include "tokenizer/chat_template.h"

#include <cstdint>
#include <string>

#include "tokenizer/gemma4_tool_format.h"

namespace g4 {
namespace {

// Decodes one strictly valid UTF-8 sequence at the start of `s` (RFC 3629: no overlongs, no
// surrogates, at most U+10FFFF). Returns its byte length, or 0 if `s` does not start with one.
size_t DecodeUtf8(std::string_view s, char32_t* cp) {
  if (s.empty()) return 0;
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t len;
  char32_t c;
  char32_t min;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, c = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, c = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, c = b0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() < len) return 0;
  for (size_t i = 1; i < len; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if ((b & 0xC0) != 0x80) return 0;
    c = (c << 6) | (b & 0x3F);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
  *cp = c;
  return len;
}

// Python 3 str.isspace() (checked against CPython: every code point 0..0x10FFFF).
bool IsPythonSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Byte offset of the first invalid UTF-8 sequence, or npos.
size_t FindInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp;
    const size_t n = DecodeUtf8(s.substr(i), &cp);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

// The roles this renderer accepts; the template name each renders under.
bool IsSupportedRole(const std::string& role, bool tools) {
  return role == "system" || role == "user" || role == "assistant" || role == "model" || (tools && role == "tool");
}

Status CheckUtf8(std::string_view text, const std::string& where) {
  const size_t bad = FindInvalidUtf8(text);
  if (bad == std::string_view::npos) return OkStatus();
  return InvalidArgument(where + ": invalid UTF-8 at byte " + std::to_string(bad));
}

Status CheckMessages(const std::vector<ChatMessage>& messages, const char* family, bool tools) {
  if (messages.empty()) {
    return InvalidArgument(std::string("messages: the ") + family +
                           " chat template needs at least one message (got an empty list)");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!IsSupportedRole(m.role, tools)) {
      return InvalidArgument(at + ".role: '" + m.role + "' is not supported by the " + family +
                             " chat template renderer (system, user, assistant or model" +
                             (tools ? ", or tool" : "; the template has no tool syntax") + ")");
    }
    if (!tools && !m.tool_calls.empty())
      return InvalidArgument(at + ".tool_calls: the " + family + " chat template has no tool syntax");
    G4_RETURN_IF_ERROR(CheckUtf8(m.content, at + ".content"));
    G4_RETURN_IF_ERROR(CheckUtf8(m.reasoning_content, at + ".reasoning_content"));
    for (size_t k = 0; k < m.tool_calls.size(); ++k) {
      const std::string c = at + ".tool_calls[" + std::to_string(k) + "].function";
      G4_RETURN_IF_ERROR(CheckUtf8(m.tool_calls[k].name, c + ".name"));
      G4_RETURN_IF_ERROR(CheckUtf8(m.tool_calls[k].arguments, c + ".arguments"));
    }
  }
  return OkStatus();
}

// assistant -> model, as both templates do; every other supported role keeps its name.
std::string_view TemplateRole(const std::string& role) {
  return role == "assistant" ? std::string_view("model") : std::string_view(role);
}

// A parsed JSON text when it is an object, else null (no exceptions).
nlohmann::json JsonObjectOrNull(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json();
}

// One message in the Gemma 4 template's shape: calls with their arguments, results attached.
struct Gemma4Message {
  std::string role;  // template role: model for assistant
  std::string content;
  std::string reasoning_content;
  std::vector<std::pair<std::string, nlohmann::json>> tool_calls;      // name, arguments
  std::vector<std::string> tool_call_ids;
  std::vector<std::pair<std::string, nlohmann::json>> tool_responses;  // name, response
};

// OpenAI's tool shapes -> the template's (chat_template.h, RenderGemma4Chat).
StatusOr<std::vector<Gemma4Message>> ToGemma4Messages(const std::vector<ChatMessage>& messages, size_t first) {
  std::vector<Gemma4Message> out;
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      if (out.empty() || out.back().role != "model" || out.back().tool_calls.empty())
        return InvalidArgument("messages[" + std::to_string(i) +
                               "].role: a 'tool' message must follow an assistant message with tool_calls");
      Gemma4Message& host = out.back();
      std::string name;
      for (size_t k = 0; k < host.tool_calls.size() && !m.tool_call_id.empty(); ++k)
        if (host.tool_call_ids[k] == m.tool_call_id) {
          name = host.tool_calls[k].first;
          break;
        }
      const size_t position = host.tool_responses.size();
      if (name.empty()) name = position < host.tool_calls.size() ? host.tool_calls[position].first : "unknown";
      nlohmann::json value = JsonObjectOrNull(m.content);
      host.tool_responses.emplace_back(name, value.is_null() ? nlohmann::json(m.content) : std::move(value));
      continue;
    }
    const std::string_view role = TemplateRole(m.role);
    if (role == "model" && m.tool_calls.empty() && !out.empty() && !out.back().tool_responses.empty() &&
        out.back().content.empty()) {
      out.back().content = m.content;
      continue;
    }
    Gemma4Message g;
    g.role = std::string(role);
    g.content = m.content;
    g.reasoning_content = m.reasoning_content;
    for (const ChatToolCall& c : m.tool_calls) {
      nlohmann::json args = JsonObjectOrNull(c.arguments);
      g.tool_calls.emplace_back(c.name, args.is_null() ? nlohmann::json(c.arguments) : std::move(args));
      g.tool_call_ids.push_back(c.id);
    }
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace

std::string_view TrimPythonWhitespace(std::string_view text) {
  // Leading code points.
  size_t begin = 0;
  while (begin < text.size()) {
    char32_t cp;
    const size_t n = DecodeUtf8(text.substr(begin), &cp);
    if (n == 0 || !IsPythonSpace(cp)) break;
    begin += n;
  }
  // Trailing code points: find the start of the last sequence (at most 3 continuation bytes back).
  size_t end = text.size();
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && end - start < 4 &&
           (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
      --start;
    }
    char32_t cp;
    const size_t n = DecodeUtf8(text.substr(start, end - start), &cp);
    if (n != end - start || !IsPythonSpace(cp)) break;
    end = start;
  }
  return text.substr(begin, end - begin);
}

std::string StripGemma4Thinking(std::string_view text) {
  static constexpr std::string_view kOpen = "<|channel>";
  static constexpr std::string_view kClose = "<channel|>";
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (true) {
    const size_t close = text.find(kClose, pos);
    const std::string_view part =
        text.substr(pos, close == std::string_view::npos ? std::string_view::npos : close - pos);
    const size_t open = part.find(kOpen);
    out.append(part.substr(0, open));  // npos keeps the whole part
    if (close == std::string_view::npos) break;
    pos = close + kClose.size();
  }
  return out;
}

StatusOr<ChatTemplateKind> ChatTemplateKindFromName(std::string_view name) {
  if (name == "gemma3") return ChatTemplateKind::kGemma3;
  if (name == "gemma4") return ChatTemplateKind::kGemma4;
  return InvalidArgument("chat template: unknown name '" + std::string(name) +
                         "' (expected gemma3 or gemma4)");
}

StatusOr<std::string> RenderGemma3Chat(const std::vector<ChatMessage>& messages,
                                       const ChatTemplateOptions& options) {
  G4_RETURN_IF_ERROR(CheckMessages(messages, "Gemma 3", /*tools=*/false));
  if (options.tools.is_array() && !options.tools.empty())
    return InvalidArgument("tools: the Gemma 3 chat template has no tool syntax");
  std::string out = "<bos>";
  size_t first = 0;
  std::string first_user_prefix;
  if (messages[0].role == "system") {
    first_user_prefix = messages[0].content + "\n\n";  // not trimmed, as in the template
    first = 1;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const size_t position = i - first;
    if ((m.role == "user") != (position % 2 == 0)) {
      return InvalidArgument(
          "messages[" + std::to_string(i) + "]: role '" + m.role +
          "' breaks the Gemma 3 template's rule 'Conversation roles must alternate "
          "user/assistant/user/assistant/...' (after an optional leading system message, even "
          "positions must be user and odd positions must not be)");
    }
    out += "<start_of_turn>";
    out += TemplateRole(m.role);
    out += '\n';
    if (i == first) out += first_user_prefix;
    out += TrimPythonWhitespace(m.content);
    out += "<end_of_turn>\n";
  }
  if (options.add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

StatusOr<std::string> RenderGemma4Chat(const std::vector<ChatMessage>& messages,
                                       const ChatTemplateOptions& options) {
  G4_RETURN_IF_ERROR(CheckMessages(messages, "Gemma 4", /*tools=*/true));
  const bool has_tools = options.tools.is_array() && !options.tools.empty();
  std::string out = "<bos>";
  size_t first = 0;
  // The template's ns.prev_message_type: what the last thing written was.
  enum class Prev { kNone, kOther, kToolCall, kToolResponse } prev = Prev::kNone;
  const bool system_first = messages[0].role == "system";
  if (options.enable_thinking || system_first || has_tools) {
    out += "<|turn>system\n";
    if (options.enable_thinking) out += "<|think|>\n", prev = Prev::kOther;
    if (system_first) {
      out += TrimPythonWhitespace(messages[0].content);
      first = 1;
    }
    if (has_tools) {
      for (const nlohmann::json& tool : options.tools) out += "<|tool>" + FormatGemma4Declaration(tool) + "<tool|>";
      prev = Prev::kOther;
    }
    out += "<turn|>\n";
  }
  G4_ASSIGN_OR_RETURN(std::vector<Gemma4Message> turns, ToGemma4Messages(messages, first));
  size_t last_user = turns.size();  // none
  for (size_t i = 0; i < turns.size(); ++i)
    if (turns[i].role == "user") last_user = i;
  for (size_t i = 0; i < turns.size(); ++i) {
    const Gemma4Message& m = turns[i];
    if (!(prev == Prev::kToolResponse && !m.tool_calls.empty())) out += "<|turn>" + m.role + "\n";
    prev = Prev::kNone;
    if (!m.tool_calls.empty()) {
      if (!m.reasoning_content.empty() && (last_user == turns.size() || i > last_user))
        out += "<|channel>thought\n" + m.reasoning_content + "<channel|>";
      for (const auto& [name, args] : m.tool_calls) out += FormatGemma4ToolCall(name, args);
      prev = Prev::kToolCall;
    }
    for (const auto& [name, response] : m.tool_responses) out += FormatGemma4ToolResponse(name, response);
    if (!m.tool_responses.empty()) prev = Prev::kToolResponse;
    if (m.role == "model") {
      out += TrimPythonWhitespace(StripGemma4Thinking(m.content));
    } else {
      out += TrimPythonWhitespace(m.content);
    }
    if (m.tool_responses.empty() || !m.content.empty()) out += "<turn|>\n";
  }
  if (options.add_generation_prompt) {
    if (prev != Prev::kToolResponse) out += "<|turn>model\n";
    if (!options.enable_thinking) out += "<|channel>thought\n<channel|>";
  }
  return out;
}

StatusOr<std::string> RenderChatTemplate(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                         const ChatTemplateOptions& options) {
  switch (kind) {
    case ChatTemplateKind::kGemma3:
      return RenderGemma3Chat(messages, options);
    case ChatTemplateKind::kGemma4:
      return RenderGemma4Chat(messages, options);
  }
  return Internal("RenderChatTemplate: unknown ChatTemplateKind");
}

}  // namespace g4
