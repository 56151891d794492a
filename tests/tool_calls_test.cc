// Gemma 4 output channels: calls in the template's syntax and in each drift peers report, thinking,
// and text that is no call, split into content / reasoning_content / tool_calls. Every output is
// also streamed token by token (the tiny Gemma 4 tokenizer's pieces) and in every split into two
// and three parts, and must give the same channels.
#include "server/tool_calls.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace g4::server {
namespace {

struct Channels {
  std::string content;
  std::string reasoning;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  bool operator==(const Channels&) const = default;
};

void Add(const ChannelDelta& d, Channels* c) {
  c->content += d.content;
  c->reasoning += d.reasoning;
  for (const ParsedToolCall& call : d.calls) c->calls.emplace_back(call.name, call.arguments);
}

Channels Parse(const std::vector<std::string>& pieces, const OutputParserOptions& options) {
  Gemma4OutputParser parser(options);
  Channels c;
  for (const std::string& p : pieces) Add(parser.Push(p), &c);
  Add(parser.Finish(), &c);
  return c;
}

std::string Show(const Channels& c) {
  std::string s = "content=[" + c.content + "] reasoning=[" + c.reasoning + "]";
  for (const auto& [n, a] : c.calls) s += " call " + n + " " + a;
  return s;
}

const Tokenizer& TinyTokenizer() {
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::FromHfDirectory(std::string(GEMMA4RT_TEST_DATA_DIR) + "/data/tokenizer_gemma4_tiny");
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return std::move(t).value().release();
  }();
  return *tok;
}

OutputParserOptions Opts(bool tools, bool parallel = true, std::optional<std::string> forced = std::nullopt) {
  OutputParserOptions o;
  o.tools = tools;
  o.parallel_calls = parallel;
  o.forced_call_prefix = std::move(forced);
  return o;
}

// Checks `text` in one piece, token by token, and in every split into two and three parts.
void ExpectChannels(const std::string& text, const Channels& expected, OutputParserOptions options = Opts(true)) {
  SCOPED_TRACE(text);
  Channels whole = Parse({text}, options);
  EXPECT_EQ(whole, expected) << "whole: " << Show(whole) << "\nexpected: " << Show(expected);
  const Tokenizer& tok = TinyTokenizer();
  std::vector<std::string> tokens;
  for (int32_t id : tok.Encode(text, false, true)) tokens.push_back(tok.TokenText(id));
  std::string joined;
  for (const auto& t : tokens) joined += t;
  ASSERT_EQ(joined, text);  // the pieces are the text
  Channels by_token = Parse(tokens, options);
  EXPECT_EQ(by_token, expected) << "by token: " << Show(by_token);
  for (size_t i = 0; i <= text.size(); ++i) {
    Channels two = Parse({text.substr(0, i), text.substr(i)}, options);
    ASSERT_EQ(two, expected) << "split at " << i << ": " << Show(two);
  }
  if (text.size() <= 120) {
    for (size_t i = 0; i <= text.size(); ++i)
      for (size_t j = i; j <= text.size(); ++j) {
        Channels three = Parse({text.substr(0, i), text.substr(i, j - i), text.substr(j)}, options);
        ASSERT_EQ(three, expected) << "split at " << i << "," << j << ": " << Show(three);
      }
  }
}

Channels Calls(std::vector<std::pair<std::string, std::string>> calls, std::string content = "", std::string reasoning = "") {
  return {std::move(content), std::move(reasoning), std::move(calls)};
}

TEST(ToolCallsTest, TemplateSyntax) {
  ExpectChannels("<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,unit:<|\"|>celsius<|\"|>}<tool_call|>",
                 Calls({{"get_weather", R"({"city":"Paris","unit":"celsius"})"}}));
}

TEST(ToolCallsTest, ValueTypesNestedAndQuotedPunctuation) {
  ExpectChannels(
      "<|tool_call>call:search_docs{exact:false,filters:{Author:<|\"|>Ann, Bo {x}<|\"|>,year:2024},limit:10,"
      "none:null,q:<|\"|>a \"quoted\" text: yes<|\"|>,score:-0.25,tags:[<|\"|>x<|\"|>,<|\"|>y<|\"|>],rows:[{id:1},{id:2}]}"
      "<tool_call|>",
      Calls({{"search_docs",
              R"({"exact":false,"filters":{"Author":"Ann, Bo {x}","year":2024},"limit":10,"none":null,)"
              R"("q":"a \"quoted\" text: yes","rows":[{"id":1},{"id":2}],"score":-0.25,"tags":["x","y"]})"}}));
}

TEST(ToolCallsTest, ParallelCallsWithTextAround) {
  ExpectChannels(
      "Let me check. <|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>"
      "<|tool_call>call:get_weather{city:<|\"|>Rome<|\"|>}<tool_call|>",
      Calls({{"get_weather", R"({"city":"Paris"})"}, {"get_weather", R"({"city":"Rome"})"}}, "Let me check. "));
}

TEST(ToolCallsTest, ParallelCallsOffKeepsTheFirst) {
  ExpectChannels("<|tool_call>call:a{}<tool_call|><|tool_call>call:b{}<tool_call|>", Calls({{"a", "{}"}}),
                 Opts(true, false));
}

TEST(ToolCallsTest, TextFromToolResponseOnIsDropped) {
  ExpectChannels("<|tool_call>call:f{x:1}<tool_call|><|tool_response>response:f{value:<|\"|>made up<|\"|>}",
                 Calls({{"f", R"({"x":1})"}}));
}

TEST(ToolCallsTest, DriftParentheses) {
  ExpectChannels("<|tool_call>call:get_weather(city:<|\"|>Paris<|\"|>)<tool_call|>", Calls({{"get_weather", R"({"city":"Paris"})"}}));
  ExpectChannels("<|tool_call>call:get_weather(city=\"Paris\", days=3)<tool_call|>",
                 Calls({{"get_weather", R"({"city":"Paris","days":3})"}}));
}

TEST(ToolCallsTest, DriftUnquotedAndJsonQuotedStrings) {
  ExpectChannels("<|tool_call>call:get_weather{city:Paris,unit:celsius}<tool_call|>",
                 Calls({{"get_weather", R"({"city":"Paris","unit":"celsius"})"}}));
  ExpectChannels("<|tool_call>call:get_weather{\"city\":\"New York\",\"n\":2.5,\"ok\":true}<tool_call|>",
                 Calls({{"get_weather", R"({"city":"New York","n":2.5,"ok":true})"}}));
  ExpectChannels("<|tool_call>call:f{<|\"|>key<|\"|>:None}<tool_call|>", Calls({{"f", R"({"key":null})"}}));
}

TEST(ToolCallsTest, DriftMissingClosingMarkerAtTheEnd) {
  ExpectChannels("<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}", Calls({{"get_weather", R"({"city":"Paris"})"}}));
  ExpectChannels("<|tool_call>get_time{}", Calls({{"get_time", "{}"}}));  // no call: prefix either
  ExpectChannels("<|tool_call>call:get_time", Calls({{"get_time", "{}"}}));
}

TEST(ToolCallsTest, TextThatIsNoCallStaysContent) {
  for (const std::string text : {"<|tool_call>call:{x:1}<tool_call|>", "<|tool_call>call:f{x:<|\"|>unterminated}<tool_call|>",
                                 "<|tool_call>call:f{x:1} trailing<tool_call|>", "<|tool_call>call:f{x:1",
                                 "<|tool_call>call:f{:1}<tool_call|>", "<|tool_call><tool_call|>", "<|tool_call>"}) {
    ExpectChannels(text, Calls({}, text));
  }
  ExpectChannels("a < b and <tool_call|> alone", Calls({}, "a < b and <tool_call|> alone"));
}

TEST(ToolCallsTest, ToolsOffKeepsCallsAsContent) {
  const std::string text = "<|tool_call>call:f{x:1}<tool_call|>";
  ExpectChannels(text, Calls({}, text), Opts(false));
}

TEST(ToolCallsTest, ThinkingIsReasoning) {
  ExpectChannels("<|channel>thought\nThe user wants Paris.<channel|>It is sunny.",
                 Calls({}, "It is sunny.", "The user wants Paris."));
  ExpectChannels("<|channel>thought\nNeed the tool.<channel|><|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>",
                 Calls({{"get_weather", R"({"city":"Paris"})"}}, "", "Need the tool."));
  ExpectChannels("<|channel>no header<channel|>x", Calls({}, "x", "no header"));
  ExpectChannels("<|channel>thought\nunfinished", Calls({}, "", "unfinished"));
  ExpectChannels("<|channel>though", Calls({}, "", "though"));
}

TEST(ToolCallsTest, ForcedCallPrefix) {
  ExpectChannels("get_weather{city:<|\"|>Oslo<|\"|>}<tool_call|>", Calls({{"get_weather", R"({"city":"Oslo"})"}}),
                 Opts(true, true, "call:"));
  ExpectChannels("city:<|\"|>Oslo<|\"|>}<tool_call|>", Calls({{"get_weather", R"({"city":"Oslo"})"}}),
                 Opts(true, true, "call:get_weather{"));
}

TEST(ToolCallsTest, DeepNestingIsNoCall) {
  std::string deep = "<|tool_call>call:f{x:" + std::string(200, '[') + std::string(200, ']') + "}<tool_call|>";
  Channels c = Parse({deep}, Opts(true));
  EXPECT_TRUE(c.calls.empty());
  EXPECT_EQ(c.content, deep);
}

}  // namespace
}  // namespace g4::server
