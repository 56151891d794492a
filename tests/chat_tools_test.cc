// Chat requests with tools and thinking (server/chat_tools.h) and the responses' content,
// reasoning_content and tool_calls, whole and streamed, on the tiny Gemma 4 tokenizer.
#include <gtest/gtest.h>

#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "server/api.h"
#include "model/gguf.h"
#include "server/chat_tools.h"
#include "tiny_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace g4::server {
namespace {

using json = nlohmann::json;

const Tokenizer& Tok() { return test_util::TinyGemma4Tokenizer(); }

ModelInfo Info(ChatTemplateKind kind = ChatTemplateKind::kGemma4) {
  ModelInfo m;
  m.id = "tiny";
  m.accepted_ids = {"tiny"};
  m.template_kind = kind;
  m.tokenizer = &Tok();
  m.context_size = 4096;
  m.vocab_size = Tok().vocab_size();
  m.bos_id = 2;
  m.default_stop_ids = {1, 106};
  return m;
}

const json kWeather = json::parse(R"({"type": "function", "function": {"name": "get_weather",
  "description": "Get the weather.", "parameters": {"type": "object",
  "properties": {"city": {"type": "string"}}, "required": ["city"]}}})");

json Request(json extra = json::object()) {
  json r = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}}, {"tools", {kWeather}}, {"max_tokens", 16}};
  r.update(extra);
  return r;
}

ApiOr<ParsedRequest> Chat(const json& j, const ModelInfo& m = Info()) { return ParseChatRequest(j.dump(), m); }

bool EndsWith(const std::string& s, const std::string& t) { return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0; }

TEST(ChatToolsTest, ToolsAreDeclaredAndCallsParsed) {
  auto r = Chat(Request());
  ASSERT_TRUE(r.ok()) << r.error().message;
  ChatTemplateOptions opt;
  opt.tools = json::array({kWeather});
  EXPECT_EQ(r->prompt_text, *RenderGemma4Chat({{"user", "Weather in Paris?"}}, opt));
  EXPECT_NE(r->prompt_text.find("<|tool>declaration:get_weather{description:<|\"|>Get the weather.<|\"|>"), std::string::npos);
  ASSERT_TRUE(r->channels.has_value());
  EXPECT_TRUE(r->channels->tools);
  EXPECT_TRUE(r->channels->parallel_calls);
  EXPECT_FALSE(r->channels->forced_call_prefix.has_value());
  // "<|tool_response>" (id 21 in the tiny vocabulary) ends the generation: the caller's turn.
  ASSERT_EQ(Tok().Encode("<|tool_response>", false, true), std::vector<int32_t>{21});
  EXPECT_NE(std::find(r->completion.stop_ids.begin(), r->completion.stop_ids.end(), 21), r->completion.stop_ids.end());
}

TEST(ChatToolsTest, ToolChoice) {
  auto none = Chat(Request({{"tool_choice", "none"}}));
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_EQ(none->prompt_text.find("<|tool>"), std::string::npos);
  EXPECT_FALSE(none->channels->tools);
  auto required = Chat(Request({{"tool_choice", "required"}, {"parallel_tool_calls", false}}));
  ASSERT_TRUE(required.ok()) << required.error().message;
  EXPECT_TRUE(EndsWith(required->prompt_text, "<|turn>model\n<|channel>thought\n<channel|><|tool_call>call:"));
  EXPECT_EQ(required->channels->forced_call_prefix, "call:");
  EXPECT_FALSE(required->channels->parallel_calls);
  auto named = Chat(Request({{"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}));
  ASSERT_TRUE(named.ok()) << named.error().message;
  EXPECT_TRUE(EndsWith(named->prompt_text, "<|tool_call>call:get_weather{"));
  EXPECT_EQ(named->channels->forced_call_prefix, "call:get_weather{");
}

TEST(ChatToolsTest, Errors) {
  auto g3 = Chat(Request(), Info(ChatTemplateKind::kGemma3));
  ASSERT_FALSE(g3.ok());
  EXPECT_EQ(g3.error().status, 400);
  EXPECT_EQ(g3.error().param, "tools");
  EXPECT_NE(g3.error().message.find("Gemma 3"), std::string::npos) << g3.error().message;
  struct Case {
    json extra;
    std::string param;
  };
  const std::vector<Case> cases = {
      {{{"tool_choice", "always"}}, "tool_choice"},
      {{{"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}, "tool_choice.function.name"},
      {{{"tools", json::array()}, {"tool_choice", "required"}}, "tool_choice"},
      {{{"parallel_tool_calls", "yes"}}, "parallel_tool_calls"},
      {{{"tools", {{{"type", "function"}, {"function", {{"name", 3}}}}}}}, "tools[0].function.name"},
      {{{"tools", {{{"type", "retrieval"}}}}}, "tools[0].type"},
      {{{"reasoning_effort", "max"}}, "reasoning_effort"},
      {{{"reasoning_effort", "high"}, {"chat_template_kwargs", {{"enable_thinking", false}}}}, "reasoning_effort"},
      {{{"messages", {{{"role", "user"}, {"content", "q"}}, {{"role", "tool"}, {"content", "r"}}}}}, "messages[1].role"},
      {{{"messages", {{{"role", "assistant"}, {"tool_calls", {{{"function", {{"name", "f"}, {"arguments", 5}}}}}}}}}},
       "messages[0].tool_calls[0].function.arguments"},
  };
  for (const Case& c : cases) {
    auto r = Chat(Request(c.extra));
    ASSERT_FALSE(r.ok()) << c.extra.dump();
    EXPECT_EQ(r.error().status, 400);
    EXPECT_EQ(r.error().param, c.param) << r.error().message;
  }
}

TEST(ChatToolsTest, ThinkingSwitches) {
  auto high = Chat(Request({{"reasoning_effort", "high"}}));
  ASSERT_TRUE(high.ok()) << high.error().message;
  EXPECT_EQ(high->prompt_text.rfind("<bos><|turn>system\n<|think|>\n", 0), 0u);
  auto kwargs = Chat(Request({{"chat_template_kwargs", {{"enable_thinking", true}}}}));
  ASSERT_TRUE(kwargs.ok());
  EXPECT_EQ(kwargs->prompt_text, high->prompt_text);
  auto off = Chat(Request({{"reasoning_effort", "none"}}));
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->prompt_text.find("<|think|>"), std::string::npos);
  auto none_format = Chat(Request({{"reasoning_format", "none"}}));
  ASSERT_TRUE(none_format.ok());
  EXPECT_FALSE(none_format->channels->reasoning);
}

TEST(ChatToolsTest, HistoryWithCallsAndResults) {
  json msgs = json::parse(R"([{"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"}])");
  auto r = Chat(Request({{"messages", msgs}}));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(EndsWith(r->prompt_text,
                       "<|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}"
                       "<tool_call|><|tool_response>response:get_weather{temperature:21}<tool_response|>"
                       "<|channel>thought\n<channel|>"))
      << r->prompt_text;
}

const std::string kCallText = "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>";

CompletionEvent Final(const std::string& reason = "stop") {
  CompletionEvent e;
  e.done = true;
  e.finish_reason = reason;
  e.prompt_tokens = 10;
  e.completion_tokens = 5;
  return e;
}

// The scheduler's text skips control tokens: the channel and call markers are not control tokens
// in Gemma 4's vocabulary (HF "special": false, GGUF USER_DEFINED), so the parser sees them
// ("<|tool_response>" need not show: with tools it is a stop token).
TEST(ChatToolsTest, MarkersSurviveTheSchedulersTextDecoding) {
  const std::string text = "<|channel>thought\nx<channel|>" + kCallText + "<|\"|>";
  auto gguf_file = GgufFile::Open(std::string(GEMMA4RT_TEST_DATA_DIR) + "/data/tokenizer_gemma4_tiny/tokenizer_gemma4_tiny.gguf");
  ASSERT_TRUE(gguf_file.ok()) << gguf_file.status().ToString();
  auto gguf = Tokenizer::FromGguf(**gguf_file);
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  for (const Tokenizer* tok : std::vector<const Tokenizer*>{&Tok(), gguf->get()}) {
    const std::vector<int32_t> ids = tok->Encode(text, false, true);
    EXPECT_EQ(ids.front(), 17);  // <|channel> is one token
    EXPECT_EQ(tok->Decode(ids, /*skip_special=*/true), text);
  }
}

TEST(ChatToolsTest, ResponseCarriesToolCalls) {
  auto r = Chat(Request());
  ASSERT_TRUE(r.ok());
  const ResponseMeta meta = ResponseMetaFor(r.value(), Endpoint::kChat, &Tok());
  CompletionResult res;
  res.text = kCallText;
  res.final_event = Final();
  const json j = CompletionResponseJson(meta, res);
  const json& choice = j.at("choices").at(0);
  EXPECT_EQ(choice.at("finish_reason"), "tool_calls");
  const json& msg = choice.at("message");
  EXPECT_TRUE(msg.at("content").is_null());
  ASSERT_EQ(msg.at("tool_calls").size(), 1u);
  const json& call = msg.at("tool_calls").at(0);
  EXPECT_TRUE(std::regex_match(call.at("id").get<std::string>(), std::regex("call_[0-9a-f]{24}"))) << call.dump();
  EXPECT_EQ(call.at("type"), "function");
  EXPECT_EQ(call.at("function").at("name"), "get_weather");
  EXPECT_EQ(call.at("function").at("arguments"), R"({"city":"Paris"})");
  EXPECT_FALSE(call.contains("index"));
}

TEST(ChatToolsTest, ResponseWithoutCallsIsContentAndReasoning) {
  auto r = Chat(Request({{"chat_template_kwargs", {{"enable_thinking", true}}}}));
  ASSERT_TRUE(r.ok());
  const ResponseMeta meta = ResponseMetaFor(r.value(), Endpoint::kChat, &Tok());
  CompletionResult res;
  res.text = "<|channel>thought\nParis is in France.<channel|>It is sunny. <|tool_call>call:{bad}<tool_call|>";
  res.final_event = Final("length");
  const json j = CompletionResponseJson(meta, res);
  const json& choice = j.at("choices").at(0);
  EXPECT_EQ(choice.at("finish_reason"), "length");
  EXPECT_EQ(choice.at("message").at("content"), "It is sunny. <|tool_call>call:{bad}<tool_call|>");
  EXPECT_EQ(choice.at("message").at("reasoning_content"), "Paris is in France.");
  EXPECT_FALSE(choice.at("message").contains("tool_calls"));
}

// The stream's chunks as the HTTP server sends them, one event per token of `text`.
std::vector<json> Stream(const ParsedRequest& p, const std::string& text, const std::string& reason = "stop") {
  ResponseMeta meta = ResponseMetaFor(p, Endpoint::kChat, &Tok());
  std::string sse = FirstChunk(meta);
  const std::vector<int32_t> ids = Tok().Encode(text, false, true);
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    CompletionEvent e;
    e.text = Tok().TokenText(ids[i]);
    e.tokens = {ids[i]};
    sse += DeltaChunk(meta, e);
  }
  CompletionEvent fin = Final(reason);
  if (!ids.empty()) fin.text = Tok().TokenText(ids.back());
  sse += FinalChunks(meta, fin);
  std::vector<json> chunks;
  size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const size_t end = sse.find("\n\n", pos);
    const std::string body = sse.substr(pos + 6, end - pos - 6);
    if (body != "[DONE]") chunks.push_back(json::parse(body));
    pos = end;
  }
  return chunks;
}

TEST(ChatToolsTest, StreamedToolCallDeltas) {
  auto r = Chat(Request({{"stream", true}}));
  ASSERT_TRUE(r.ok());
  const std::string text = "Checking. " + kCallText + "<|tool_call>call:get_weather{city:<|\"|>Rome<|\"|>}<tool_call|>";
  const std::vector<json> chunks = Stream(r.value(), text);
  std::string content;
  std::vector<json> calls;
  for (const json& c : chunks) {
    const json& d = c.at("choices").at(0).at("delta");
    if (d.contains("content")) content += d.at("content").get<std::string>();
    if (d.contains("tool_calls"))
      for (const json& tc : d.at("tool_calls")) calls.push_back(tc);
  }
  EXPECT_EQ(content, "Checking. ");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].at("index"), 0);
  EXPECT_EQ(calls[1].at("index"), 1);
  EXPECT_EQ(calls[0].at("function").at("arguments"), R"({"city":"Paris"})");
  EXPECT_EQ(calls[1].at("function").at("arguments"), R"({"city":"Rome"})");
  EXPECT_NE(calls[0].at("id"), calls[1].at("id"));
  EXPECT_EQ(chunks.back().at("choices").at(0).at("finish_reason"), "tool_calls");
}

TEST(ChatToolsTest, StreamedReasoningDeltas) {
  auto r = Chat(Request({{"stream", true}, {"reasoning_effort", "low"}}));
  ASSERT_TRUE(r.ok());
  const std::vector<json> chunks = Stream(r.value(), "<|channel>thought\nLet me think.<channel|>Sunny.");
  std::string content, reasoning;
  for (const json& c : chunks) {
    const json& d = c.at("choices").at(0).at("delta");
    if (d.contains("content")) content += d.at("content").get<std::string>();
    if (d.contains("reasoning_content")) reasoning += d.at("reasoning_content").get<std::string>();
  }
  EXPECT_EQ(content, "Sunny.");
  EXPECT_EQ(reasoning, "Let me think.");
  EXPECT_EQ(chunks.back().at("choices").at(0).at("finish_reason"), "stop");
}

}  // namespace
}  // namespace g4::server
