// Gemma 4's output channels: the model's text split into answer text (`content`), thinking
// (`reasoning_content`) and tool calls (`tool_calls`), incrementally as it is generated.
//
// What the model writes (tools/templates/gemma4_chat_template.jinja, spec gemma-architecture.md):
//   thinking   "<|channel>thought\n" ... "<channel|>"      -> reasoning (the "thought\n" header dropped)
//   a call     "<|tool_call>call:NAME{k:v,...}<tool_call|>" -> a tool call; values are
//              <|"|>text<|"|>, numbers, true/false/null, {k:v} and [v,...], keys bare
//   results    "<|tool_response>": the model expects the caller's results here; the text from it on
//              is not the model's to give (callers also stop generation at that token)
// Drifts read as calls (reported from real models by other engines): an argument list in
// "(...)" instead of "{...}", "=" instead of ":", strings without quotes or in JSON's "...",
// keys quoted either way, no "call:" prefix, and a last call whose closing "<tool_call|>" never
// came (generation ended at max_tokens or a stop). Text after "<|tool_call>" that does not read
// as a call stays content, marker included: the parser never fails.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace g4::server {

// One parsed call: the function's name and its arguments as JSON object text.
struct ParsedToolCall {
  std::string name;
  std::string arguments;  // compact JSON object text, e.g. {"city":"Paris"}
};

// Parses one call body: the text between "<|tool_call>" and "<tool_call|>" (e.g.
// `call:get_weather{city:<|"|>Paris<|"|>}`), with the drifts above. nullopt: not a call.
std::optional<ParsedToolCall> ParseGemma4ToolCall(std::string_view body);

// What one step of output adds to each channel.
struct ChannelDelta {
  std::string content;
  std::string reasoning;
  std::vector<ParsedToolCall> calls;
  bool empty() const { return content.empty() && reasoning.empty() && calls.empty(); }
  // Appends `more`'s text and calls to this.
  void Append(ChannelDelta more);
};

struct OutputParserOptions {
  bool tools = false;            // read "<|tool_call>" blocks as calls (else they stay content)
  bool reasoning = true;         // read "<|channel>" blocks as reasoning (else they stay content)
  bool parallel_calls = true;    // false: calls after the first are dropped
  // The generation began inside a call (tool_choice "required" or a named function): the prompt
  // ended with "<|tool_call>" + this text (e.g. "call:" or "call:NAME{").
  std::optional<std::string> forced_call_prefix;
};

// Splits streamed text into channels. Text that may be the start of a marker is held back until
// it is known, so the concatenation of every Push's and Finish's deltas is the whole split.
class Gemma4OutputParser {
 public:
  explicit Gemma4OutputParser(OutputParserOptions options);

  ChannelDelta Push(std::string_view text);
  // The end of generation: an unclosed call is read as a call if it parses (else content); held
  // text is released.
  ChannelDelta Finish();
  // Calls returned so far.
  int calls() const { return calls_; }

 private:
  enum class Mode { kContent, kReasoningHeader, kReasoning, kCall, kDropped };
  void Run(bool final, ChannelDelta* out);
  void EndCall(bool closed, ChannelDelta* out);

  OutputParserOptions options_;
  Mode mode_ = Mode::kContent;
  std::string pending_;  // unconsumed text of the current mode
  std::string call_;     // the call's body so far
  int calls_ = 0;
};

}  // namespace g4::server
