// Native renderers for the Gemma 3 and Gemma 4 chat templates (no Jinja engine).
//
// Each renderer produces, byte for byte, the prompt string Hugging Face
// `tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...,
// enable_thinking=...)` renders with the official template, including the leading "<bos>" text
// exactly once (so the tokenizer must NOT add another BOS when it encodes the result; see
// ../shared/spec/serving.md "Exactly one BOS").
//
// Templates reproduced (texts kept as data under tools/templates/, golden renderings in
// tests/data/chat_template_golden.json made by tools/make_template_golden.py with jinja2 and
// transformers' own render_jinja_template):
//   Gemma 3: Google's gemma-3-*-it template (huggingface/transformers
//            models/gemma3/convert_gemma3_weights.py `_CHAT_TEMPLATE`).
//   Gemma 4: Google's gemma-4-31B-it template (ggml-org/llama.cpp
//            models/templates/google-gemma-4-31B-it-interleaved.jinja); spec section 6.4.
//
// Scope: text messages {role, content string}; Gemma 4 also tools (declarations), assistant
// tool_calls with reasoning_content, and tool messages (OpenAI's shapes, turned into the
// template's as RenderGemma4Chat says; golden renderings in
// tests/data/chat_template_tools_golden.json). Multimodal content parts are out of scope. Other
// model templates (a GGUF's tokenizer.chat_template, a fine-tune's chat_template.jinja) are not
// rendered: there is no Jinja engine here. Known Gemma 4 template revisions
// that render differently (documented so nobody "fixes" a golden by accident):
//   - llama.cpp models/templates/gemma4.jinja writes "<|think|>" without the "\n" that follows it
//     here; HF-tokenized prompts seen in the wild ([..., 98, 107, 106, ...]) have the "\n".
//   - Later Google revisions merge consecutive assistant messages into one model turn and (E2B/E4B)
//     reportedly drop the empty thought channel from the generation prompt. This renderer keeps
//     one turn per message and the empty channel, as the 31B template above does.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace g4 {

// Which official template to reproduce.
enum class ChatTemplateKind {
  kGemma3,  // <start_of_turn>role\n...<end_of_turn>\n, no system role, strict alternation
  kGemma4,  // <|turn>role\n...<turn|>\n, native system turn, thinking switch
};

// "gemma3" / "gemma4" (case-sensitive). Errors: InvalidArgument naming the unknown name.
StatusOr<ChatTemplateKind> ChatTemplateKindFromName(std::string_view name);

// One call in an assistant message (OpenAI's tool_calls[i]: id, function.name, function.arguments).
struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text as the client sent it
};

// One chat message. `role` is one of "system", "user", "assistant", "model" ("model" is accepted
// as a synonym of "assistant", which both templates render as "model") or, Gemma 4 only, "tool".
// `content` is UTF-8 text.
struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string r, std::string c) : role(std::move(r)), content(std::move(c)) {}

  std::string role;
  std::string content;
  std::vector<ChatToolCall> tool_calls;  // assistant (Gemma 4)
  std::string reasoning_content;         // assistant with tool_calls (Gemma 4)
  std::string tool_call_id;              // tool (Gemma 4)
};

struct ChatTemplateOptions {
  // Append the header of the model turn to be generated (HF `add_generation_prompt`).
  bool add_generation_prompt = true;
  // Gemma 4 only (HF `chat_template_kwargs.enable_thinking`): opens a system turn holding
  // "<|think|>\n" and omits the empty thought channel after the generation header. Gemma 3 ignores
  // it, as its template does.
  bool enable_thinking = false;
  // Gemma 4 only: OpenAI's `tools` (an array of {type: "function", function: {name, ...}}), written
  // as declarations into the system turn; null or empty: none. Gemma 3 refuses a non-empty list.
  nlohmann::json tools;
};

// Renders `messages` with the Gemma 3 template.
//   - A first message with role system is not a turn: its content, UNtrimmed, plus "\n\n" is
//     prepended to the first remaining message's (trimmed) content. If the system message is the
//     only message, its text is dropped (as the official template does).
//   - The remaining messages must alternate: position p (0-based, after removing that system
//     message) must be "user" exactly when p is even; otherwise the template raises
//     "Conversation roles must alternate user/assistant/user/assistant/...".
//   - assistant -> "model"; other roles render under their own name (a system message at an odd
//     position renders as a "system" turn, as the official template does). Content is trimmed of
//     Unicode whitespace (Python str.strip()).
// Errors: InvalidArgument for an empty list, an unsupported role, content that is not valid UTF-8,
// or an alternation break; the message names the index in `messages`, e.g. "messages[2]".
StatusOr<std::string> RenderGemma3Chat(const std::vector<ChatMessage>& messages,
                                       const ChatTemplateOptions& options = {});

// Renders `messages` with the Gemma 4 template.
//   - "<bos>", then a system turn "<|turn>system\n" + ("<|think|>\n" if enable_thinking) +
//     trim(first message content if it is a system message) + "<turn|>\n", emitted only when
//     enable_thinking is on or the first message is a system message.
//   - Every other message becomes "<|turn>" + role + "\n" + body + "<turn|>\n" with
//     assistant -> "model". Body: model turns have their thinking stripped (each
//     "<|channel>...<channel|>" span removed, an unclosed "<|channel>..." dropped to the end of
//     its segment, stray "<channel|>" removed) and are then trimmed; other roles are trimmed.
//     No alternation check (consecutive users/assistants are separate turns).
//   - add_generation_prompt: "<|turn>model\n" (not after tool results, which the model answers
//     in the same turn), plus the empty thought channel "<|channel>thought\n<channel|>" when
//     enable_thinking is off.
//   - tools: each "<|tool>" + declaration + "<tool|>" in the system turn (after its text), which
//     tools open as thinking does (gemma4_tool_format.h).
//   - OpenAI's tool shapes become the template's: an assistant's tool_calls are written
//     "<|tool_call>call:NAME{...}<tool_call|>" with arguments that parse as a JSON object written
//     as the template writes a mapping (any other text as is), after "<|channel>thought\n" +
//     reasoning_content + "<channel|>" when the message comes after the last user message; each
//     "tool" message becomes a "<|tool_response>" of the assistant message before it, which must
//     have tool_calls (else InvalidArgument naming the tool message's role): its name is the call
//     whose id is tool_call_id, else the call at the same position, else "unknown"; its value the
//     content when that is a JSON object, else the content text. A model turn that ends in tool
//     results stays open; an assistant message without tool_calls that follows them becomes that
//     turn's text (when it has none yet), as the model writes its answer after the results. An
//     assistant message with tool_calls after tool results continues the same turn.
// Errors: InvalidArgument for an empty list, an unsupported role, content that is not valid UTF-8,
// or a tool message without a call before it, naming the index, e.g. "messages[1].role".
StatusOr<std::string> RenderGemma4Chat(const std::vector<ChatMessage>& messages,
                                       const ChatTemplateOptions& options = {});

// Dispatches to RenderGemma3Chat / RenderGemma4Chat.
StatusOr<std::string> RenderChatTemplate(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                         const ChatTemplateOptions& options = {});

// Python `str.strip()` on UTF-8 text: removes leading and trailing code points for which Python's
// str.isspace() is true (U+0009..U+000D, U+001C..U+001F, U+0020, U+0085, U+00A0, U+1680,
// U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000), which is what Jinja's `trim` filter
// does. Bytes that do not decode as UTF-8 are treated as non-whitespace. Exposed for tests.
std::string_view TrimPythonWhitespace(std::string_view text);

// The Gemma 4 template's `strip_thinking` macro (before its final trim): split on "<channel|>",
// keep each part up to its first "<|channel>", concatenate. Exposed for tests.
std::string StripGemma4Thinking(std::string_view text);

}  // namespace g4
