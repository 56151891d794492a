// The Gemma 4 chat template's tool syntax, as text: function declarations, calls and results.
//
// Each function writes what the template's macro of the same role writes (Google's gemma-4-31B-it
// template, tools/templates/gemma4_chat_template.jinja: format_function_declaration,
// format_parameters, format_argument and the tool_calls / tool_responses loops), byte for byte for
// JSON values. Strings are quoted with the <|"|> token and written raw inside it; object keys are
// visited in the order of Jinja's `dictsort` (case-insensitive: ASCII letters folded; keys that
// differ only in non-ASCII case are ordered by bytes, where Python would fold them); numbers and
// null are written as Python's str() writes them (21, 2.5, 1e-05, 1e+20, None), booleans as
// true/false.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace g4 {

// format_argument(value, escape_keys): strings <|"|>s<|"|>, booleans true/false, objects
// {k:v,...} (keys quoted with <|"|> when escape_keys), arrays [v,...], others as Python's str().
std::string FormatGemma4Argument(const nlohmann::json& value, bool escape_keys);

// "declaration:NAME{description:<|"|>...<|"|>,parameters:{...}}" for one OpenAI tool
// {type: "function", function: {name, description?, parameters?, response?}}, trimmed. A field
// that is absent writes what the template writes for it (an empty description, no parameters).
// `tool.function.name` must be a string (callers check).
std::string FormatGemma4Declaration(const nlohmann::json& tool);

// "<|tool_call>call:NAME{k:v,...}<tool_call|>": `arguments` an object (its members in dictsort
// order, keys bare, values format_argument) or a string written as is.
std::string FormatGemma4ToolCall(const std::string& name, const nlohmann::json& arguments);

// "<|tool_response>response:NAME{k:v,...}<tool_response|>" for an object, else
// "...{value:" + format_argument(response) + "}...".
std::string FormatGemma4ToolResponse(const std::string& name, const nlohmann::json& response);

}  // namespace g4
