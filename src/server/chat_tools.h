// The chat request's tool and thinking fields (OpenAI's shapes, llama-server's and vLLM's
// spellings), validated into template options and the output parser's settings.
//
//   tools                [{type: "function", function: {name, description?, parameters?}}], at most
//                        kMaxTools; Gemma 4 declares them in the prompt. Gemma 3 has no tool syntax
//                        of its own: a non-empty list is a 400 that says so.
//   tool_choice          "auto" (default): the model may call; "none": the tools are left out of the
//                        prompt and nothing is read as a call; "required": the generation starts
//                        inside a call (the prompt ends with "<|tool_call>call:"); {type: "function",
//                        function: {name}}: starts inside a call of that function ("...call:NAME{").
//   parallel_tool_calls  bool, default true; false keeps the first call only.
//   messages[i]          assistant: tool_calls [{id, type: "function", function: {name, arguments:
//                        JSON text}}], reasoning_content (string); tool: {content, tool_call_id}.
//   thinking (Gemma 4)   chat_template_kwargs.enable_thinking (vLLM, llama-server), or top-level
//                        reasoning_effort (OpenAI's: "none"/"minimal" off, "low"/"medium"/"high"
//                        on; Gemma 4 has no levels). On a Gemma 3 model reasoning_effort other than
//                        none is a 400 (enable_thinking is ignored, as its template does).
//   reasoning_format     llama-server's: "none" leaves the thought channel in content;
//                        "auto"/"deepseek" (default) return it in reasoning_content.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/api.h"
#include "server/tool_calls.h"
#include "tokenizer/chat_template.h"

namespace g4::server {

inline constexpr size_t kMaxTools = 128;

// What the tool and thinking fields ask of the prompt and of the output.
struct ChatToolSettings {
  nlohmann::json tools;              // to declare (null: none)
  std::string prompt_suffix;         // appended after the generation prompt (a forced call's start)
  std::optional<bool> enable_thinking;  // from reasoning_effort
  OutputParserOptions output;        // how the model's text is split
};

// Reads tools, tool_choice, parallel_tool_calls, reasoning_effort and reasoning_format of the chat
// request `o` for a model with `kind`'s template. Errors: 400 naming the field.
ApiOr<ChatToolSettings> ParseChatToolSettings(const nlohmann::json& o, ChatTemplateKind kind);

// A message's tool fields (`at` = "messages[i]"): an assistant's tool_calls and
// reasoning_content, a tool message's tool_call_id. nullopt when fine.
std::optional<ApiError> ParseMessageToolFields(const nlohmann::json& m, const std::string& at, ChatMessage* out);

// A fresh tool call id: "call_" and 24 random hex digits.
std::string NewToolCallId();

// OpenAI's tool_calls entry for a parsed call (with "index" when streamed).
nlohmann::json ToolCallJson(const ParsedToolCall& call, const std::string& id, int index, bool with_index);

}  // namespace g4::server
