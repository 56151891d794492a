// The server's request/response layer without HTTP (src/server/api.h, metrics.h, serve.h flags):
// every request field, every bad-input class with its status and `param`, exactly one BOS, the
// response and SSE shapes, Prometheus text.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include <cstdlib>
#include <set>
#include <sstream>

#include "server/api.h"
#include "server/metrics.h"
#include "server/serve.h"
#include "tiny_tokenizer.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace g4::server {
namespace {

using json = nlohmann::json;

const Tokenizer& Tok() { return test_util::TinyGemma4Tokenizer(); }

ModelInfo Info(bool with_tokenizer = true) {
  ModelInfo m;
  m.id = "tiny";
  m.accepted_ids = {"tiny", "tiny.gguf"};
  m.template_kind = ChatTemplateKind::kGemma4;
  m.tokenizer = with_tokenizer ? &Tok() : nullptr;
  m.context_size = 64;
  m.vocab_size = with_tokenizer ? Tok().vocab_size() : 512;
  m.bos_id = 2;
  m.default_sampling.temperature = 1.0f;
  m.default_sampling.top_k = 64;
  m.default_sampling.top_p = 0.95f;
  m.default_stop_ids = {1, 106};
  return m;
}

ApiOr<ParsedRequest> Chat(const json& j, const ModelInfo& m = Info()) { return ParseChatRequest(j.dump(), m); }
ApiOr<ParsedRequest> Compl(const json& j, const ModelInfo& m = Info()) { return ParseCompletionRequest(j.dump(), m); }

json UserMsg(const std::string& text) { return json::array({{{"role", "user"}, {"content", text}}}); }

#define EXPECT_API_ERROR(result, status_, param_)                                  \
  do {                                                                              \
    const auto& r_ = (result);                                                      \
    ASSERT_FALSE(r_.ok()) << "expected an error";                                   \
    EXPECT_EQ(r_.error().status, status_) << r_.error().message;                    \
    EXPECT_EQ(r_.error().param, param_) << r_.error().message;                      \
  } while (0)

TEST(ServerApiTest, ChatRendersTheTemplateAndEncodesWithoutAddingBos) {
  json req = {{"model", "tiny"}, {"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}}}};
  auto r = Chat(req);
  ASSERT_TRUE(r.ok()) << r.error().message;
  auto text = RenderGemma4Chat({{"system", "Be brief."}, {"user", "Hi"}});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(r->prompt_text, *text);
  EXPECT_EQ(r->completion.prompt, Tok().Encode(*text, false, true));
  EXPECT_EQ(r->completion.prompt[0], 2);
  EXPECT_NE(r->completion.prompt[1], 2) << "exactly one BOS";
  EXPECT_EQ(r->model, "tiny");
  EXPECT_FALSE(r->stream);
  EXPECT_EQ(r->endpoint, Endpoint::kChat);
  // Model defaults where the request is silent; the rest of the context by default.
  EXPECT_FLOAT_EQ(r->completion.sampling.temperature, 1.0f);
  EXPECT_EQ(r->completion.sampling.top_k, 64);
  EXPECT_EQ(r->completion.stop_ids, (std::vector<int32_t>{1, 106}));
  EXPECT_EQ(r->completion.max_tokens, 64 - static_cast<int>(r->completion.prompt.size()));
}

TEST(ServerApiTest, ChatAcceptsContentPartsDeveloperRoleAndThinking) {
  json parts = {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}};
  auto r = Chat({{"messages", {{{"role", "developer"}, {"content", "sys"}}, {{"role", "user"}, {"content", parts}}}}});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->prompt_text, *RenderGemma4Chat({{"system", "sys"}, {"user", "a\nb"}}));
  auto t = Chat({{"messages", UserMsg("x")}, {"chat_template_kwargs", {{"enable_thinking", true}}}});
  ASSERT_TRUE(t.ok());
  EXPECT_NE(t->prompt_text.find("<|think|>"), std::string::npos);
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"chat_template_kwargs", {{"enable_thinking", "yes"}}}}), 400,
                   "chat_template_kwargs.enable_thinking");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"chat_template_kwargs", 3}}), 400, "chat_template_kwargs");
}

TEST(ServerApiTest, EveryFieldIsReadIntoTheRequest) {
  json req = {{"messages", UserMsg("Hi")},
              {"max_completion_tokens", 7},
              {"max_tokens", 9},
              {"temperature", 0.5},
              {"top_p", 0.9},
              {"top_k", 40},
              {"min_p", 0.05},
              {"presence_penalty", 0.5},
              {"frequency_penalty", -0.5},
              {"repetition_penalty", 1.1},
              {"seed", 1234},
              {"stop", {"\n\n", "", "END"}},
              {"n", 1},
              {"logprobs", false},
              {"top_logprobs", 0},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}},
              {"logit_bias", {{"17", -5.5}}},
              {"ignore_eos", true},
              {"return_token_ids", true},
              {"user", "someone"},
              {"response_format", {{"type", "text"}}}};
  auto r = Chat(req);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const CompletionRequest& c = r->completion;
  EXPECT_EQ(c.max_tokens, 7) << "max_completion_tokens wins over max_tokens";
  EXPECT_FLOAT_EQ(c.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(c.sampling.top_p, 0.9f);
  EXPECT_EQ(c.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(c.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(c.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(c.sampling.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(c.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(c.sampling.seed, 1234u);
  EXPECT_EQ(c.stop, (std::vector<std::string>{"\n\n", "END"})) << "empty stop strings are ignored";
  EXPECT_FLOAT_EQ(c.sampling.logit_bias.at(17), -5.5f);
  EXPECT_TRUE(c.ignore_eos);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_TRUE(r->return_token_ids);
  auto s = Chat({{"messages", UserMsg("Hi")}, {"stop", "x"}, {"seed", 18446744073709551615ull}, {"top_k", -1}});
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->completion.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(s->completion.sampling.seed, 18446744073709551615ull);
  auto neg = Chat({{"messages", UserMsg("Hi")}, {"seed", -1}, {"max_tokens", 5.0}});
  ASSERT_TRUE(neg.ok()) << neg.error().message;
  EXPECT_EQ(neg->completion.sampling.seed, std::nullopt) << "-1 is llama.cpp's random seed (SeedMinusOneIsRandom)";
  EXPECT_EQ(neg->completion.max_tokens, 5) << "an integral float is an integer";
}

TEST(ServerApiTest, CompletionPromptFormsGetExactlyOneBos) {
  const std::vector<int32_t> body = Tok().Encode("Hello world", false, true);
  std::vector<int32_t> with_bos = {2};
  with_bos.insert(with_bos.end(), body.begin(), body.end());
  for (const json& prompt : {json("Hello world"), json("<bos>Hello world"), json::array({"Hello world"}), json(body),
                             json(with_bos), json::array({json(body)})}) {
    auto r = Compl({{"prompt", prompt}});
    ASSERT_TRUE(r.ok()) << prompt.dump() << ": " << r.error().message;
    EXPECT_EQ(r->completion.prompt, with_bos) << prompt.dump();
    EXPECT_EQ(r->completion.max_tokens, 16) << "OpenAI's completions default";
  }
  auto ids_only = Compl({{"prompt", {5, 6, 7}}}, Info(false));
  ASSERT_TRUE(ids_only.ok()) << ids_only.error().message;
  EXPECT_EQ(ids_only->completion.prompt, (std::vector<int32_t>{2, 5, 6, 7}));
}

TEST(ServerApiTest, BadPromptsAndMessages) {
  EXPECT_API_ERROR(Compl(json::object()), 400, "prompt");
  EXPECT_API_ERROR(Compl({{"prompt", json::array()}}), 400, "prompt");
  EXPECT_API_ERROR(Compl({{"prompt", {"a", "b"}}}), 400, "prompt");
  EXPECT_API_ERROR(Compl({{"prompt", 5}}), 400, "prompt");
  EXPECT_API_ERROR(Compl({{"prompt", {1, -3}}}), 400, "prompt");
  EXPECT_API_ERROR(Compl({{"prompt", {1, 999999}}}), 400, "prompt");
  EXPECT_API_ERROR(Compl({{"prompt", {1, "x"}}}), 400, "prompt[1]");
  EXPECT_API_ERROR(Compl({{"prompt", "text"}}, Info(false)), 400, "prompt");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}}, Info(false)), 400, "messages");
  EXPECT_API_ERROR(Chat(json::object()), 400, "messages");
  EXPECT_API_ERROR(Chat({{"messages", "hi"}}), 400, "messages");
  EXPECT_API_ERROR(Chat({{"messages", json::array()}}), 400, "messages");
  EXPECT_API_ERROR(Chat({{"messages", {5}}}), 400, "messages[0]");
  EXPECT_API_ERROR(Chat({{"messages", {{{"content", "x"}}}}}), 400, "messages[0].role");
  EXPECT_API_ERROR(Chat({{"messages", {{{"role", "tool"}, {"content", "x"}}}}}), 400, "messages[0].role");
  EXPECT_API_ERROR(Chat({{"messages", {{{"role", 3}, {"content", "x"}}}}}), 400, "messages[0].role");
  auto alien = Chat({{"messages", {{{"role", "alien"}, {"content", "x"}}}}});
  ASSERT_FALSE(alien.ok());
  EXPECT_EQ(alien.error().message,
            "messages[0].role must be one of system, developer, user, assistant, model, tool (got 'alien')");
  EXPECT_API_ERROR(Chat({{"messages", {{{"role", "user"}}}}}), 400, "messages[0].content");
  EXPECT_API_ERROR(Chat({{"messages", {{{"role", "user"}, {"content", 7}}}}}), 400, "messages[0].content");
  json image = {{{"type", "image_url"}, {"image_url", {{"url", "http://x"}}}}};
  EXPECT_API_ERROR(Chat({{"messages", {{{"role", "user"}, {"content", image}}}}}), 400, "messages[0].content[0].type");
  // Gemma 3's template enforces alternation: the renderer's message names the index.
  ModelInfo g3 = Info();
  g3.template_kind = ChatTemplateKind::kGemma3;
  auto alt = Chat({{"messages", {{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}}}}, g3);
  ASSERT_FALSE(alt.ok());
  EXPECT_EQ(alt.error().status, 400);
  EXPECT_EQ(alt.error().param.rfind("messages", 0), 0u) << alt.error().param;
}

TEST(ServerApiTest, MalformedJsonWrongTypesAndInvalidUtf8) {
  for (std::string body : {"", "{", "{\"messages\": [}", "nul", "{\"a\":1} trailing", "{\"a\":\"\\ud800\"}"}) {
    auto r = ParseChatRequest(body, Info());
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error().status, 400) << body;
    EXPECT_EQ(r.error().code, "invalid_json") << body;
  }
  EXPECT_API_ERROR(ParseChatRequest("[1,2]", Info()), 400, "");
  EXPECT_API_ERROR(ParseChatRequest("\"str\"", Info()), 400, "");
  std::string deep(100000, '[');
  EXPECT_API_ERROR(ParseChatRequest(deep, Info()), 400, "");
  // Invalid UTF-8 inside a string names that string.
  std::string bad = "{\"messages\":[{\"role\":\"user\",\"content\":\"ok \xC3\x28 no\"}]}";
  auto r = ParseChatRequest(bad, Info());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().status, 400);
  EXPECT_EQ(r.error().param, "messages[0].content");
  EXPECT_EQ(r.error().code, "invalid_utf8");
  auto p = ParseCompletionRequest("{\"prompt\":\"\xFF\"}", Info());
  EXPECT_API_ERROR(p, 400, "prompt");
  auto k = ParseCompletionRequest("{\"prompt\":\"x\", \"stop\":[\"a\",\"\xED\xA0\x80\"]}", Info());
  EXPECT_API_ERROR(k, 400, "stop[1]");
  // Wrong types name the field.
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"temperature", "hot"}}), 400, "temperature");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"temperature", true}}), 400, "temperature");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"top_k", "5"}}), 400, "top_k");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"top_k", 2.5}}), 400, "top_k");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"max_tokens", "10"}}), 400, "max_tokens");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"seed", 1.5}}), 400, "seed");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"stream", "yes"}}), 400, "stream");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"stop", 5}}), 400, "stop");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"stop", {"a", 1}}}), 400, "stop[1]");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"stop", json(std::vector<std::string>(17, "s"))}}), 400, "stop");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"model", 5}}), 400, "model");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"logit_bias", {1, 2}}}), 400, "logit_bias");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"logit_bias", {{"abc", 1}}}}), 400, "logit_bias");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"logit_bias", {{"5", 101}}}}), 400, "logit_bias");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"logit_bias", {{"99999999", 1}}}}), 400, "logit_bias");
}

// logit_bias takes at most 300 entries and a chat at most 2048 messages (OpenAI's bounds): more
// is a 400 naming the field and the count, before any entry is applied or message templated.
TEST(ServerApiTest, LogitBiasEntriesAndMessagesAreBounded) {
  auto bias = [](int n) {
    json b = json::object();
    for (int i = 0; i < n; ++i) b[std::to_string(i)] = 1;
    return b;
  };
  auto ok = Chat({{"messages", UserMsg("x")}, {"logit_bias", bias(300)}});
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok.value().completion.sampling.logit_bias.size(), 300u);
  auto over = Chat({{"messages", UserMsg("x")}, {"logit_bias", bias(301)}});
  EXPECT_API_ERROR(over, 400, "logit_bias");
  EXPECT_EQ(over.error().message, "logit_bias: at most 300 entries, got 301");
  EXPECT_API_ERROR(Compl({{"prompt", "x"}, {"logit_bias", bias(301)}}), 400, "logit_bias");

  json many = json::array();
  for (int i = 0; i < 2049; ++i) many.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", "a"}});
  auto refused = Chat({{"messages", many}});
  EXPECT_API_ERROR(refused, 400, "messages");
  EXPECT_EQ(refused.error().message, "messages: at most 2048 messages per request, got 2049");
  many.erase(many.begin());  // 2048, starting with an assistant turn: still accepted as far as the count goes
  auto counted = Chat({{"messages", many}});
  if (!counted.ok()) {
    EXPECT_EQ(counted.error().message.find("at most 2048"), std::string::npos) << counted.error().message;
  }
}

TEST(ServerApiTest, OutOfRangeSamplingValues) {
  struct Case {
    const char* field;
    json value;
  } cases[] = {{"temperature", -0.1},       {"temperature", 1e39},       {"top_p", 0},      {"top_p", 1.5},
               {"top_p", -1},               {"top_k", -2},               {"min_p", 1.5},    {"min_p", -0.1},
               {"presence_penalty", 2.5},   {"frequency_penalty", -2.5}, {"repetition_penalty", 0},
               {"repetition_penalty", -1},  {"top_k", 1e12}};
  for (const Case& c : cases) {
    auto r = Chat({{"messages", UserMsg("x")}, {c.field, c.value}});
    EXPECT_API_ERROR(r, 400, c.field);
  }
  // An integer's message names its range (a fresh user's -5 got "top_k is out of range (-5)").
  auto k = Chat({{"messages", UserMsg("x")}, {"top_k", -5}});
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.error().message, "top_k must be an integer in [-1, 2147483647], got -5");
  auto w = Chat({{"messages", UserMsg("x")}, {"repeat_last_n", -5.0}});
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().message, "repeat_last_n must be an integer in [-1, 2147483647], got -5.0");
  auto big = Chat({{"messages", UserMsg("x")}, {"top_k", 9223372036854775808ull}});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().message, "top_k must be an integer in [-1, 2147483647], got 9223372036854775808");
  // Boundaries that are allowed.
  for (const Case& c : std::vector<Case>{{"temperature", 0}, {"top_p", 1}, {"min_p", 1}, {"top_k", 0}, {"presence_penalty", -2}}) {
    auto r = Chat({{"messages", UserMsg("x")}, {c.field, c.value}});
    EXPECT_TRUE(r.ok()) << c.field << ": " << r.error().message;
  }
}

TEST(ServerApiTest, MaxTokensAndContextLength) {
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"max_tokens", 0}}), 400, "max_tokens");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"max_tokens", -1}}), 400, "max_tokens");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"max_completion_tokens", 0}}), 400, "max_completion_tokens");
  // 0 with echo: the prompt alone (OpenAI's legacy completions, vLLM); without echo, or below 0, no.
  EXPECT_API_ERROR(Compl({{"prompt", "x"}, {"max_tokens", 0}}), 400, "max_tokens");
  EXPECT_API_ERROR(Compl({{"prompt", "x"}, {"max_tokens", -1}, {"echo", true}}), 400, "max_tokens");
  auto zero = Compl({{"prompt", "x"}, {"max_tokens", 0}, {"echo", true}});
  ASSERT_TRUE(zero.ok()) << zero.error().message;
  EXPECT_EQ(zero->completion.max_tokens, 0);
  EXPECT_TRUE(zero->echo);
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"max_tokens", 1e15}}), 400, "max_tokens");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"max_tokens", 1000000000000}}), 400, "max_tokens");
  // Prompt + max_tokens beyond the 64-token context.
  auto r = Compl({{"prompt", {5, 6, 7, 8, 9, 10, 11, 12, 13, 14}}, {"max_tokens", 60}});
  EXPECT_API_ERROR(r, 400, "max_tokens");
  EXPECT_EQ(r.error().code, "context_length_exceeded");
  auto fits = Compl({{"prompt", {5, 6, 7, 8, 9, 10, 11, 12, 13, 14}}, {"max_tokens", 53}});
  EXPECT_TRUE(fits.ok());
  // A prompt that fills the context.
  std::string longtext;
  for (int i = 0; i < 100; ++i) longtext += "word" + std::to_string(i) + " ";
  auto p = Compl({{"prompt", longtext}});
  EXPECT_API_ERROR(p, 400, "prompt");
  EXPECT_EQ(p.error().code, "context_length_exceeded");
  auto c = Chat({{"messages", UserMsg(longtext)}});
  EXPECT_API_ERROR(c, 400, "messages");
  EXPECT_EQ(c.error().code, "context_length_exceeded");
  // A text whose length alone shows it cannot fit is refused before it is encoded.
  const std::string huge(64 * Tok().max_bytes_per_token(), 'a');
  for (const auto& h : {Compl({{"prompt", huge}}), Chat({{"messages", UserMsg(huge)}})}) {
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.error().code, "context_length_exceeded");
    EXPECT_NE(h.error().message.find("your prompt has at least "), std::string::npos) << h.error().message;
  }
  // The default max_tokens never exceeds the room left.
  std::vector<int> ids(60, 5);
  auto d = Compl({{"prompt", ids}});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->completion.max_tokens, 3);
}

TEST(ServerApiTest, UnsupportedFieldsAreRefusedByName) {
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"n", 2}}), 400, "n");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"n", 0}}), 400, "n");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"echo", true}}), 400, "echo");  // completions only
  EXPECT_API_ERROR(Compl({{"prompt", "x"}, {"echo", "yes"}}), 400, "echo");
  EXPECT_API_ERROR(Compl({{"prompt", "x"}, {"suffix", "y"}}), 400, "suffix");
  EXPECT_API_ERROR(Compl({{"prompt", "x"}, {"best_of", 3}}), 400, "best_of");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"tools", {{{"type", "function"}}}}}), 400, "tools[0].function");
  EXPECT_API_ERROR(Compl({{"prompt", "x"}, {"tools", {{{"type", "function"}}}}}), 400, "tools");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"response_format", {{"type", "json_object"}}}}), 400, "response_format");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"stream_options", {{"include_usage", true}}}}), 400, "stream_options");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"stream", true}, {"stream_options", {{"include_usage", 1}}}}), 400,
                   "stream_options.include_usage");
  EXPECT_API_ERROR(Compl({{"prompt", {5, 6}}, {"stop", "x"}}, Info(false)), 400, "stop");
  // Nulls are "not given".
  auto r = Chat({{"messages", UserMsg("x")}, {"temperature", nullptr}, {"stop", nullptr}, {"stream_options", nullptr},
                 {"max_tokens", nullptr}, {"n", nullptr}, {"seed", nullptr}, {"tools", json::array()}});
  EXPECT_TRUE(r.ok()) << r.error().message;
}

TEST(ServerApiTest, LogprobsAreReadAsTheirTopCount) {
  auto top = [](const ApiOr<ParsedRequest>& r) { return r.ok() ? r->completion.logprobs : -100; };
  // Not asked for: -1, also with logprobs false, top_logprobs 0 or nulls.
  EXPECT_EQ(top(Chat({{"messages", UserMsg("x")}})), -1);
  EXPECT_EQ(top(Chat({{"messages", UserMsg("x")}, {"logprobs", false}, {"top_logprobs", 0}})), -1);
  EXPECT_EQ(top(Chat({{"messages", UserMsg("x")}, {"logprobs", nullptr}, {"top_logprobs", nullptr}})), -1);
  // Chat: logprobs true, top_logprobs 0..20.
  EXPECT_EQ(top(Chat({{"messages", UserMsg("x")}, {"logprobs", true}})), 0);
  EXPECT_EQ(top(Chat({{"messages", UserMsg("x")}, {"logprobs", true}, {"top_logprobs", 20}})), 20);
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"logprobs", true}, {"top_logprobs", 21}}), 400, "top_logprobs");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"logprobs", true}, {"top_logprobs", -1}}), 400, "top_logprobs");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"top_logprobs", 5}}), 400, "top_logprobs");  // needs logprobs true
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"logprobs", false}, {"top_logprobs", 5}}), 400, "top_logprobs");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"logprobs", 3}}), 400, "logprobs");  // chat's is a boolean
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("x")}, {"logprobs", "yes"}}), 400, "logprobs");
  // Completions: the legacy integer, or a boolean as chat.
  EXPECT_EQ(top(Compl({{"prompt", "x"}, {"logprobs", 0}})), 0);
  EXPECT_EQ(top(Compl({{"prompt", "x"}, {"logprobs", 5}})), 5);
  EXPECT_EQ(top(Compl({{"prompt", "x"}, {"logprobs", true}, {"top_logprobs", 2}})), 2);
  EXPECT_EQ(top(Compl({{"prompt", "x"}, {"logprobs", true}})), 1);  // vLLM reads a Python true as 1
  EXPECT_EQ(top(Compl({{"prompt", "x"}, {"logprobs", 3}, {"top_logprobs", 3}})), 3);
  EXPECT_API_ERROR(Compl({{"prompt", "x"}, {"logprobs", 3}, {"top_logprobs", 2}}), 400, "top_logprobs");
  EXPECT_API_ERROR(Compl({{"prompt", "x"}, {"logprobs", 21}}), 400, "logprobs");
  // echo: the prompt's log-probabilities too, when logprobs are asked for.
  auto echo = Compl({{"prompt", "x"}, {"logprobs", 2}, {"echo", true}});
  ASSERT_TRUE(echo.ok());
  EXPECT_TRUE(echo->echo);
  EXPECT_TRUE(echo->completion.prompt_logprobs);
  auto echo_text = Compl({{"prompt", "x"}, {"echo", true}});
  ASSERT_TRUE(echo_text.ok());
  EXPECT_TRUE(echo_text->echo);
  EXPECT_FALSE(echo_text->completion.prompt_logprobs);
  EXPECT_FALSE(Compl({{"prompt", "x"}, {"logprobs", 2}})->completion.prompt_logprobs);
  EXPECT_API_ERROR(Compl({{"prompt", "x"}, {"logprobs", 1.5}}), 400, "logprobs");
}

TEST(ServerApiTest, UnknownModelIs404AndKnownNamesAreAccepted) {
  auto r = Chat({{"messages", UserMsg("x")}, {"model", "gpt-4"}});
  EXPECT_API_ERROR(r, 404, "model");
  EXPECT_EQ(r.error().code, "model_not_found");
  for (const char* name : {"tiny", "tiny.gguf", ""}) EXPECT_TRUE(Chat({{"messages", UserMsg("x")}, {"model", name}}).ok()) << name;
  EXPECT_TRUE(Chat({{"messages", UserMsg("x")}}).ok()) << "model is optional (llama-server)";
}

TEST(ServerApiTest, ErrorShapesAndStatusMapping) {
  json j = ErrorJson(BadRequest("bad", "top_p"));
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "top_p");
  EXPECT_TRUE(j["error"]["code"].is_null());
  EXPECT_TRUE(ErrorJson(ErrorForStatus(500, "x"))["error"]["param"].is_null());
  EXPECT_EQ(ErrorForStatus(401, "k").code, "invalid_api_key");
  EXPECT_EQ(ErrorForStatus(413, "k").code, "request_too_large");
  EXPECT_EQ(ErrorForStatus(408, "k").code, "request_timeout");
  EXPECT_EQ(ErrorForStatus(431, "k").code, "request_header_fields_too_large");
  EXPECT_EQ(ErrorForStatus(500, "k").type, "server_error");
  ApiError ctx = FromStatus(InvalidArgument("context_length_exceeded: the prompt has 9 tokens"));
  EXPECT_EQ(ctx.status, 400);
  EXPECT_EQ(ctx.code, "context_length_exceeded");
  EXPECT_EQ(ctx.message, "the prompt has 9 tokens");
  EXPECT_EQ(FromStatus(InvalidArgument("top_p must be in (0, 1], got 0")).param, "top_p");
  EXPECT_EQ(FromStatus(InvalidArgument("logit_bias[5] must be in [-100, 100]")).param, "logit_bias");
  EXPECT_EQ(FromStatus(ResourceExhausted("queue full")).status, 429);
  EXPECT_EQ(FromStatus(FailedPrecondition("shutting down")).status, 503);
  EXPECT_EQ(FromStatus(Internal("boom")).status, 500);
}

ResponseMeta Meta(std::string id, int64_t created, Endpoint ep, bool include_usage = false) {
  ResponseMeta m;
  m.id = std::move(id);
  m.created = created;
  m.model = "tiny";
  m.endpoint = ep;
  m.include_usage = include_usage;
  return m;
}

CompletionEvent Final(const std::string& reason, const std::string& degenerate = "") {
  CompletionEvent e;
  e.done = true;
  e.finish_reason = reason;
  e.degenerate = degenerate;
  e.prompt_tokens = 10;
  e.completion_tokens = 4;
  e.prompt_ms = 20;
  e.predicted_ms = 40;
  return e;
}

TEST(ServerApiTest, NonStreamedResponses) {
  ResponseMeta meta = Meta(NewResponseId(Endpoint::kChat), 1700000000, Endpoint::kChat);
  EXPECT_EQ(meta.id.rfind("chatcmpl-", 0), 0u);
  EXPECT_NE(meta.id, NewResponseId(Endpoint::kChat));
  EXPECT_EQ(NewResponseId(Endpoint::kCompletion).rfind("cmpl-", 0), 0u);
  CompletionResult res{"Hello", {5, 6}, {}, {}, Final("length")};
  json j = CompletionResponseJson(meta, res);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(j["choices"][0].contains("degenerate"));
  EXPECT_FALSE(j["choices"][0].contains("token_ids"));
  EXPECT_EQ(j["usage"], json({{"prompt_tokens", 10}, {"completion_tokens", 4}, {"total_tokens", 14},
                              {"prompt_tokens_details", {{"cached_tokens", 0}}}}));
  for (const char* k : {"prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n", "predicted_ms",
                        "predicted_per_token_ms", "predicted_per_second"})
    EXPECT_TRUE(j["timings"].contains(k)) << k;
  EXPECT_DOUBLE_EQ(j["timings"]["prompt_per_second"].get<double>(), 500.0);
  EXPECT_DOUBLE_EQ(j["timings"]["predicted_per_token_ms"].get<double>(), 10.0);
  // The degeneracy guard: an explicit field, finish_reason stays "stop".
  meta.endpoint = Endpoint::kCompletion;
  meta.return_token_ids = true;
  meta.prompt_token_ids = {2, 3};
  CompletionResult deg{"la la", {7, 7}, {}, {}, Final("stop", "token 7 repeated 32 times")};
  json d = CompletionResponseJson(meta, deg);
  EXPECT_EQ(d["object"], "text_completion");
  EXPECT_EQ(d["choices"][0]["text"], "la la");
  EXPECT_EQ(d["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(d["choices"][0]["degenerate"], "token 7 repeated 32 times");
  EXPECT_EQ(d["choices"][0]["token_ids"], json({7, 7}));
  EXPECT_EQ(d["prompt_token_ids"], json({2, 3}));
  EXPECT_EQ(FinishReason(Final("cancelled")), "stop");
  CompletionEvent zero = Final("stop");
  zero.completion_tokens = 0;
  zero.predicted_ms = 0;
  EXPECT_EQ(TimingsJson(zero)["predicted_per_second"], 0.0);
}

// The `data:` payloads of an SSE stream, in order.
std::vector<std::string> SseData(const std::string& stream) {
  std::vector<std::string> out;
  std::stringstream ss(stream);
  std::string line;
  while (std::getline(ss, line)) {
    if (line.empty()) continue;
    EXPECT_EQ(line.rfind("data: ", 0), 0u) << line;
    out.push_back(line.substr(6));
  }
  return out;
}

// A content event of `text` (no token ids).
CompletionEvent Delta(const std::string& text) {
  CompletionEvent e;
  e.text = text;
  return e;
}

TEST(ServerApiTest, StreamChunks) {
  ResponseMeta meta = Meta("chatcmpl-x", 1, Endpoint::kChat, /*include_usage=*/true);
  std::string all = FirstChunk(meta) + DeltaChunk(meta, Delta("Hel")) + DeltaChunk(meta, Delta("lo"));
  CompletionEvent fin = Final("stop", "a 2-token pattern repeated 8 times");
  fin.text = "!";
  all += FinalChunks(meta, fin);
  std::vector<std::string> data = SseData(all);
  ASSERT_EQ(data.size(), 6u);
  EXPECT_EQ(data.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    json c = json::parse(data[i]);
    EXPECT_EQ(c["id"], "chatcmpl-x");
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_TRUE(c.contains("usage"));
    if (i == 4) {  // the usage chunk
      EXPECT_TRUE(c["choices"].empty());
      EXPECT_EQ(c["usage"]["total_tokens"], 14);
      continue;
    }
    EXPECT_TRUE(c["usage"].is_null());
    ASSERT_EQ(c["choices"].size(), 1u);
    const json& ch = c["choices"][0];
    if (i == 0) {
      EXPECT_EQ(ch["delta"]["role"], "assistant");
    } else {
      EXPECT_FALSE(ch["delta"].contains("role"));
    }
    if (ch["delta"].contains("content")) text += ch["delta"]["content"].get<std::string>();
    if (i == 3) {
      EXPECT_EQ(ch["finish_reason"], "stop");
      EXPECT_EQ(ch["degenerate"], "a 2-token pattern repeated 8 times");
      EXPECT_TRUE(c.contains("timings"));
    } else {
      EXPECT_TRUE(ch["finish_reason"].is_null());
    }
  }
  EXPECT_EQ(text, "Hello!");
  // Completions: no role chunk; text in choices[].text; no usage chunk without include_usage.
  ResponseMeta cm = Meta("cmpl-y", 1, Endpoint::kCompletion);
  EXPECT_EQ(FirstChunk(cm), "");
  std::vector<std::string> d2 = SseData(DeltaChunk(cm, Delta("a")) + FinalChunks(cm, Final("length")));
  ASSERT_EQ(d2.size(), 3u);
  json c0 = json::parse(d2[0]);
  EXPECT_EQ(c0["object"], "text_completion");
  EXPECT_EQ(c0["choices"][0]["text"], "a");
  EXPECT_FALSE(c0.contains("usage"));
  json c1 = json::parse(d2[1]);
  EXPECT_EQ(c1["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(c1["choices"][0]["text"], "");
  std::vector<std::string> e = SseData(ErrorChunks(ErrorForStatus(500, "boom")));
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(json::parse(e[0])["error"]["message"], "boom");
}

TEST(ServerApiTest, TokenizeDetokenizeApplyTemplateAndModels) {
  auto t = HandleTokenize(R"({"content": "Hello world"})", Info());
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t.value()["tokens"], json(Tok().Encode("Hello world", false, true)));
  auto b = HandleTokenize(R"({"content": "Hello", "add_special": true, "with_pieces": true})", Info());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b.value()["tokens"][0]["id"], 2);
  EXPECT_EQ(b.value()["tokens"][0]["piece"], "<bos>");
  auto d = HandleDetokenize(json{{"tokens", t.value()["tokens"]}}.dump(), Info());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d.value()["content"], "Hello world");
  EXPECT_API_ERROR(HandleTokenize(R"({"content": 5})", Info()), 400, "content");
  EXPECT_API_ERROR(HandleTokenize(R"({})", Info()), 400, "content");
  EXPECT_API_ERROR(HandleDetokenize(R"({"tokens": [1, -1]})", Info()), 400, "tokens");
  EXPECT_API_ERROR(HandleDetokenize(R"({"tokens": "x"})", Info()), 400, "tokens");
  EXPECT_API_ERROR(HandleDetokenize(R"({"tokens": [1]})", Info(false)), 400, "tokens");
  auto a = HandleApplyTemplate(json{{"messages", UserMsg("Hi")}}.dump(), Info());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a.value()["prompt"], *RenderGemma4Chat({{"user", "Hi"}}));
  EXPECT_API_ERROR(HandleApplyTemplate("{}", Info()), 400, "messages");
  json m = ModelsJson(Info());
  EXPECT_EQ(m["object"], "list");
  EXPECT_EQ(m["data"][0]["id"], "tiny");
  EXPECT_EQ(m["data"][0]["object"], "model");
  EXPECT_EQ(m["data"][0]["max_model_len"], 64);
}

// seed -1 is llama.cpp's "random seed": the request carries no seed, exactly as when it has none,
// and the sampler the scheduler builds from it draws a fresh seed per request. Other negative seeds
// are a 400 (they used to wrap around to 2^64 - n); a fixed seed is kept as given.
TEST(ServerApiTest, SeedMinusOneIsRandom) {
  auto none = Chat({{"messages", UserMsg("Hi")}, {"temperature", 1.0}});
  auto minus_one = Chat({{"messages", UserMsg("Hi")}, {"temperature", 1.0}, {"seed", -1}});
  auto minus_one_float = Compl({{"prompt", "Hi"}, {"seed", -1.0}});
  ASSERT_TRUE(none.ok() && minus_one.ok() && minus_one_float.ok());
  EXPECT_EQ(none->completion.sampling.seed, std::nullopt);
  EXPECT_EQ(minus_one->completion.sampling.seed, std::nullopt);
  EXPECT_EQ(minus_one_float->completion.sampling.seed, std::nullopt);
  // What the scheduler does with it (Sampler::Create per request): two requests, two seeds, neither
  // of them 2^64 - 1 (what -1 used to become, the same every time).
  auto a = Sampler::Create(minus_one->completion.sampling);
  auto b = Sampler::Create(minus_one->completion.sampling);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->seed(), b->seed()) << "two draws from std::random_device collided (p = 2^-64)";
  EXPECT_NE(a->seed(), UINT64_MAX);
  EXPECT_NE(b->seed(), UINT64_MAX);
  // A fixed seed reaches the sampler unchanged, so it repeats (ServerHttpRealTest.SameSeedSameSample).
  for (uint64_t seed : {uint64_t{0}, uint64_t{7}, UINT64_MAX}) {
    auto fixed = Chat({{"messages", UserMsg("Hi")}, {"seed", seed}});
    ASSERT_TRUE(fixed.ok());
    EXPECT_EQ(fixed->completion.sampling.seed, seed);
    EXPECT_EQ(Sampler::Create(fixed->completion.sampling)->seed(), seed);
  }
  for (json bad : {json(-2), json(-1000), json(-9223372036854775807LL - 1), json(-2.0)}) {
    auto r = Chat({{"messages", UserMsg("Hi")}, {"seed", bad}});
    EXPECT_API_ERROR(r, 400, "seed");
    EXPECT_EQ(r.error().message, "seed must be an integer in [0, 2^64), or -1 for a random seed; got " +
                                     std::to_string(bad.get<int64_t>()));
  }
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("Hi")}, {"seed", -1.5}}), 400, "seed");
  // Floats beyond the range get the same message (1e30 named int64's range before); an integral
  // float inside it is that integer.
  for (const auto& [bad, shown] : std::vector<std::pair<json, std::string>>{
           {json(1e30), "1e+30"}, {json(18446744073709551616.0), "1.8446744073709552e+19"}, {json(-3.0), "-3"}}) {
    auto r = Chat({{"messages", UserMsg("Hi")}, {"seed", bad}});
    EXPECT_API_ERROR(r, 400, "seed");
    EXPECT_EQ(r.error().message, "seed must be an integer in [0, 2^64), or -1 for a random seed; got " + shown);
  }
  auto big = Chat({{"messages", UserMsg("Hi")}, {"seed", 9223372036854775808.0}});  // 2^63
  ASSERT_TRUE(big.ok()) << big.error().message;
  EXPECT_EQ(big->completion.sampling.seed, uint64_t{1} << 63);
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("Hi")}, {"seed", "7"}}), 400, "seed");
}

// The logprobs shapes without a model: a byte token (part of a character) is named
// "bytes:\\xNN" and counts one character in text_offset only where it starts one; a control
// token counts none; -inf is -9999.0; completions' top_logprobs always hold the sampled token.
TEST(ServerApiTest, LogprobsShapes) {
  const int32_t hello = *Tok().Find("Hello"), world = *Tok().Find("\u2581world"), f0 = *Tok().Find("<0xF0>"),
                b93 = *Tok().Find("<0x93>"), eos = *Tok().Find("<eos>");
  const float inf = std::numeric_limits<float>::infinity();
  CompletionResult res;
  res.text = "Hello world\xF0\x93";
  res.tokens = {hello, world, f0, b93, eos};
  res.logprobs = {{hello, -0.25f, {{hello, -0.25f}, {world, -2.0f}}},
                  {world, -3.0f, {{hello, -1.0f}, {f0, -1.5f}}},  // the sampled token not in the top 2
                  {f0, -0.5f, {{f0, -0.5f}, {b93, -1.25f}}},      // two byte tokens: two names
                  {b93, -inf, {{f0, -0.75f}, {hello, -inf}}},
                  {eos, -0.125f, {{eos, -0.125f}, {hello, -4.0f}}}};
  res.final_event = Final("stop");
  ResponseMeta chat = Meta("chatcmpl-x", 1, Endpoint::kChat);
  chat.tokenizer = &Tok();
  chat.logprobs = 2;
  json c = CompletionResponseJson(chat, res)["choices"][0]["logprobs"];
  ASSERT_EQ(c["content"].size(), 5u);
  EXPECT_TRUE(c["refusal"].is_null());
  EXPECT_EQ(c["content"][0], json({{"token", "Hello"}, {"logprob", -0.25}, {"bytes", {72, 101, 108, 108, 111}},
                                   {"top_logprobs", {{{"token", "Hello"}, {"logprob", -0.25}, {"bytes", {72, 101, 108, 108, 111}}},
                                                     {{"token", " world"}, {"logprob", -2.0}, {"bytes", {32, 119, 111, 114, 108, 100}}}}}}));
  EXPECT_EQ(c["content"][2]["token"], "bytes:\\xf0");
  EXPECT_EQ(c["content"][2]["bytes"], json({240}));
  EXPECT_EQ(c["content"][2]["top_logprobs"][1]["token"], "bytes:\\x93");
  EXPECT_EQ(c["content"][3]["logprob"], -9999.0);
  EXPECT_EQ(c["content"][3]["top_logprobs"][1]["logprob"], -9999.0);
  EXPECT_EQ(c["content"][4]["token"], "<eos>");
  ResponseMeta compl_meta = Meta("cmpl-x", 1, Endpoint::kCompletion);
  compl_meta.tokenizer = &Tok();
  compl_meta.logprobs = 2;
  json l = CompletionResponseJson(compl_meta, res)["choices"][0]["logprobs"];
  EXPECT_EQ(l["tokens"], json({"Hello", " world", "bytes:\\xf0", "bytes:\\x93", "<eos>"}));
  EXPECT_EQ(l["token_logprobs"], json({-0.25, -3.0, -0.5, -9999.0, -0.125}));
  EXPECT_EQ(l["top_logprobs"][0], json({{"Hello", -0.25}, {" world", -2.0}}));
  EXPECT_EQ(l["top_logprobs"][1], json({{"Hello", -1.0}, {"bytes:\\xf0", -1.5}, {" world", -3.0}}));  // + the sampled one
  EXPECT_EQ(l["top_logprobs"][2], json({{"bytes:\\xf0", -0.5}, {"bytes:\\x93", -1.25}}));
  // "Hello" 5 characters, " world" 6, the two bytes of one (incomplete) character 1, both at its
  // start, <eos> none.
  EXPECT_EQ(l["text_offset"], json({0, 5, 11, 11, 12}));
  // Not asked for: null; without a tokenizer the tokens are named by id.
  ResponseMeta none = Meta("cmpl-y", 1, Endpoint::kCompletion);
  EXPECT_TRUE(CompletionResponseJson(none, res)["choices"][0]["logprobs"].is_null());
  none.logprobs = 0;
  json ids = CompletionResponseJson(none, res)["choices"][0]["logprobs"];
  EXPECT_EQ(ids["tokens"][0], "token_id:" + std::to_string(hello));
  EXPECT_EQ(ids["top_logprobs"][0], json({{"token_id:" + std::to_string(hello), -0.25}, {"token_id:" + std::to_string(world), -2.0}}));
  // Streamed, text_offset goes on from chunk to chunk.
  ResponseMeta stream = compl_meta;
  CompletionEvent first, last = Final("stop");
  first.text = "Hello";
  first.tokens = {hello};
  first.logprobs = {res.logprobs[0]};
  last.tokens = {world};
  last.logprobs = {res.logprobs[1]};
  last.text = " world";
  std::string sse = DeltaChunk(stream, first);  // in this order: the offset is the stream's state
  sse += FinalChunks(stream, last);
  std::vector<json> chunks;
  std::stringstream ss(sse);
  for (std::string line; std::getline(ss, line);)
    if (line.rfind("data: {", 0) == 0) chunks.push_back(json::parse(line.substr(6)));
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0]["choices"][0]["logprobs"]["text_offset"], json({0}));
  EXPECT_EQ(chunks[1]["choices"][0]["logprobs"]["text_offset"], json({5}));
}

// repeat_penalty is llama-server's name for repetition_penalty: same field, same validation (named
// as the request named it); both together must agree.
TEST(ServerApiTest, RepeatPenaltyIsRepetitionPenalty) {
  auto r = Chat({{"messages", UserMsg("Hi")}, {"repeat_penalty", 1.3}});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FLOAT_EQ(r->completion.sampling.repetition_penalty, 1.3f);
  auto both = Compl({{"prompt", "Hi"}, {"repeat_penalty", 5}, {"repetition_penalty", 5.0}});
  ASSERT_TRUE(both.ok()) << both.error().message;
  EXPECT_FLOAT_EQ(both->completion.sampling.repetition_penalty, 5.0f);
  auto differ = Compl({{"prompt", "Hi"}, {"repeat_penalty", 5}, {"repetition_penalty", 1.1}});
  EXPECT_API_ERROR(differ, 400, "repeat_penalty");
  EXPECT_EQ(differ.error().message,
            "repeat_penalty (llama-server's name) and repetition_penalty are the same setting but differ (5 and 1.1); give one of them");
  auto zero = Chat({{"messages", UserMsg("Hi")}, {"repeat_penalty", 0}});
  EXPECT_API_ERROR(zero, 400, "repeat_penalty");
  EXPECT_EQ(zero.error().message, "repeat_penalty must be a finite number > 0 (1 = disabled), got 0");
  auto zero_ours = Chat({{"messages", UserMsg("Hi")}, {"repetition_penalty", 0}});
  EXPECT_API_ERROR(zero_ours, 400, "repetition_penalty");
  EXPECT_EQ(zero_ours.error().message, "repetition_penalty must be a finite number > 0 (1 = disabled), got 0");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("Hi")}, {"repeat_penalty", -1}}), 400, "repeat_penalty");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("Hi")}, {"repeat_penalty", "high"}}), 400, "repeat_penalty");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("Hi")}, {"repeat_penalty", 1e39}}), 400, "repeat_penalty");
  auto null = Chat({{"messages", UserMsg("Hi")}, {"repeat_penalty", nullptr}, {"repetition_penalty", 1.2}});
  ASSERT_TRUE(null.ok()) << "null is not given";
  EXPECT_FLOAT_EQ(null->completion.sampling.repetition_penalty, 1.2f);
}

// n_predict is llama-server's max_tokens; -1 there means "until the context is full".
TEST(ServerApiTest, NPredictIsMaxTokens) {
  auto r = Compl({{"prompt", "Hi"}, {"n_predict", 5}});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->completion.max_tokens, 5);
  const int room = 64 - static_cast<int>(r->completion.prompt.size());
  auto full = Compl({{"prompt", "Hi"}, {"n_predict", -1}});
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->completion.max_tokens, room) << "not the completions default of 16";
  auto same = Chat({{"messages", UserMsg("Hi")}, {"n_predict", 5}, {"max_tokens", 5}});
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->completion.max_tokens, 5);
  auto differ = Chat({{"messages", UserMsg("Hi")}, {"n_predict", 5}, {"max_completion_tokens", 6}});
  EXPECT_API_ERROR(differ, 400, "n_predict");
  EXPECT_EQ(differ.error().message,
            "n_predict (llama-server's name) and max_completion_tokens are the same setting but differ (5 and 6); give one of them");
  EXPECT_API_ERROR(Compl({{"prompt", "Hi"}, {"n_predict", -1}, {"max_tokens", 5}}), 400, "n_predict");
  for (int bad : {0, -2}) {
    auto e = Compl({{"prompt", "Hi"}, {"n_predict", bad}});
    EXPECT_API_ERROR(e, 400, "n_predict");
    EXPECT_EQ(e.error().message, "n_predict must be -1 (until the context is full) or at least 1, got " + std::to_string(bad));
  }
  EXPECT_API_ERROR(Compl({{"prompt", "Hi"}, {"n_predict", 1000}}), 400, "n_predict");
  auto ctx = Compl({{"prompt", "Hi"}, {"n_predict", 64}});
  EXPECT_API_ERROR(ctx, 400, "n_predict");
  EXPECT_EQ(ctx.error().code, "context_length_exceeded");
}

// Other servers' fields that would change generation and are not implemented here are accepted at
// the value that switches them off and refused otherwise; never silently ignored.
TEST(ServerApiTest, OtherServersGenerationFieldsAreOffOrRefused) {
  const std::pair<const char*, std::vector<std::pair<json, bool>>> cases[] = {
      {"typical_p", {{1.0, true}, {1.5, true}, {0.9, false}}},
      {"top_n_sigma", {{-1, true}, {0, true}, {1.5, false}}},
      {"xtc_probability", {{0, true}, {0.5, false}}},
      {"dynatemp_range", {{0, true}, {0.5, false}}},
      {"mirostat", {{0, true}, {2, false}}},
      {"dry_multiplier", {{0, true}, {0.8, false}}},
      {"min_keep", {{0, true}, {1, true}, {5, false}}},
      {"n_probs", {{0, true}, {5, false}}},
      {"t_max_predict_ms", {{0, true}, {1000, false}}},
      {"n_indent", {{0, true}, {4, false}}},
      {"grammar", {{"", true}, {"root ::= \"yes\"", false}}},
      {"json_schema", {{json::object(), true}, {{{"type", "object"}}, false}}},
      {"samplers", {{json::array(), true}, {"", true}, {json::array({"top_k", "temperature"}), false}, {"kt", false}}},
      {"min_tokens", {{0, true}, {3, false}}},
      {"use_beam_search", {{false, true}, {true, false}}},
      {"include_stop_str_in_output", {{false, true}, {true, false}}},
      {"bad_words", {{json::array(), true}, {json::array({"no"}), false}}},
      {"allowed_token_ids", {{json::array(), true}, {json::array({5, 6}), false}}},
      {"guided_json", {{json::object(), true}, {{{"type", "object"}}, false}}},
      {"guided_regex", {{"", true}, {"a+", false}}},
      {"guided_choice", {{json::array(), true}, {json::array({"a", "b"}), false}}},
      {"guided_grammar", {{"", true}, {"root ::= x", false}}},
      {"structured_outputs", {{json::object(), true}, {{{"regex", "a"}}, false}}},
      {"post_sampling_probs", {{false, true}, {true, false}}},
      {"prompt_logprobs", {{nullptr, true}, {0, false}, {1, false}}},
      {"return_tokens_as_token_ids", {{false, true}, {true, false}}},
  };
  for (const auto& [key, values] : cases) {
    for (const auto& [value, accepted] : values) {
      for (Endpoint ep : {Endpoint::kChat, Endpoint::kCompletion}) {
        json req = ep == Endpoint::kChat ? json{{"messages", UserMsg("Hi")}} : json{{"prompt", "Hi"}};
        req[key] = value;
        auto r = ParseRequestJson(req, ep, Info());
        if (accepted) {
          EXPECT_TRUE(r.ok()) << key << "=" << value.dump() << ": " << r.error().message;
          continue;
        }
        ASSERT_FALSE(r.ok()) << key << "=" << value.dump() << " must not be ignored";
        EXPECT_EQ(r.error().status, 400);
        EXPECT_EQ(r.error().param, key);
        EXPECT_EQ(r.error().code, "unsupported_parameter") << key;
        EXPECT_EQ(r.error().message.rfind(std::string(key) + " (", 0), 0u) << r.error().message;
        EXPECT_NE(r.error().message.find("is not supported by this server"), std::string::npos) << r.error().message;
      }
    }
  }
  auto mirostat = Chat({{"messages", UserMsg("Hi")}, {"mirostat", 2}});
  EXPECT_EQ(mirostat.error().message, "mirostat (Mirostat sampling) is not supported by this server; leave it out or send 0 (got 2)");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("Hi")}, {"mirostat", "on"}}), 400, "mirostat");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("Hi")}, {"use_beam_search", 1}}), 400, "use_beam_search");
  // The settings of samplers that are off, and fields that cannot change the tokens, pass.
  auto tuning = Chat({{"messages", UserMsg("Hi")}, {"xtc_threshold", 0.2}, {"dry_base", 1.75}, {"mirostat_tau", 5},
                      {"dynatemp_exponent", 1}, {"cache_prompt", true}, {"n_keep", 4}, {"penalize_nl", true}, {"tfs_z", 1}});
  EXPECT_TRUE(tuning.ok()) << tuning.error().message;
  // repeat_last_n: the window of llama.cpp's repetition penalty, the last N tokens (0: none, -1:
  // all, the default).
  for (int n : {64, 0, -1}) {
    auto r = Chat({{"messages", UserMsg("Hi")}, {"repeat_last_n", n}, {"repeat_penalty", 1.1}});
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r.value().completion.sampling.repetition_window, n);
    EXPECT_FLOAT_EQ(r.value().completion.sampling.repetition_penalty, 1.1f);
  }
  EXPECT_EQ(Chat({{"messages", UserMsg("Hi")}}).value().completion.sampling.repetition_window, -1);
  // llama-server's name alone brings llama-server's window (64); vLLM's name, or both, the whole context.
  EXPECT_EQ(Chat({{"messages", UserMsg("Hi")}, {"repeat_penalty", 1.1}}).value().completion.sampling.repetition_window, 64);
  EXPECT_EQ(Chat({{"messages", UserMsg("Hi")}, {"repetition_penalty", 1.1}}).value().completion.sampling.repetition_window, -1);
  EXPECT_EQ(Chat({{"messages", UserMsg("Hi")}, {"repeat_penalty", 1.1}, {"repetition_penalty", 1.1}})
                .value().completion.sampling.repetition_window, -1);
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("Hi")}, {"repeat_last_n", -2}}), 400, "repeat_last_n");
}

// stop_token_ids (vLLM): parsed into CompletionRequest::stop_token_ids, validated as token ids.
TEST(ServerApiTest, StopTokenIds) {
  auto r = Chat({{"messages", UserMsg("Hi")}, {"stop_token_ids", {106, 1}}});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value().completion.stop_token_ids, (std::vector<int32_t>{106, 1}));
  EXPECT_TRUE(Chat({{"messages", UserMsg("Hi")}}).value().completion.stop_token_ids.empty());
  EXPECT_TRUE(Chat({{"messages", UserMsg("Hi")}, {"stop_token_ids", nullptr}}).ok());
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("Hi")}, {"stop_token_ids", 106}}), 400, "stop_token_ids");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("Hi")}, {"stop_token_ids", {"a"}}}), 400, "stop_token_ids[0]");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("Hi")}, {"stop_token_ids", {-1}}}), 400, "stop_token_ids");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("Hi")}, {"stop_token_ids", std::vector<int>(65, 1)}}), 400, "stop_token_ids");
}

// add_generation_prompt (top level, as llama-server's /apply-template and vLLM take it, or in
// chat_template_kwargs): default true; false ends the prompt after the last turn.
TEST(ServerApiTest, AddGenerationPrompt) {
  const std::string with = "<bos><|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>";
  const std::string without = "<bos><|turn>user\nHi<turn|>\n";
  auto prompt = [](const json& extra) {
    json req = {{"messages", UserMsg("Hi")}};
    if (!extra.is_null()) req.update(extra);
    auto a = HandleApplyTemplate(req.dump(), Info());
    EXPECT_TRUE(a.ok()) << a.error().message;
    return a.ok() ? a.value()["prompt"].get<std::string>() : "";
  };
  EXPECT_EQ(prompt({}), with);
  EXPECT_EQ(prompt({{"add_generation_prompt", true}}), with);
  EXPECT_EQ(prompt({{"add_generation_prompt", false}}), without);
  EXPECT_EQ(prompt({{"add_generation_prompt", nullptr}}), with);
  EXPECT_EQ(prompt({{"chat_template_kwargs", {{"add_generation_prompt", false}}}}), without);
  EXPECT_EQ(prompt({{"add_generation_prompt", false}, {"chat_template_kwargs", {{"add_generation_prompt", false}}}}), without);
  auto chat = Chat({{"messages", UserMsg("Hi")}, {"add_generation_prompt", false}});
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->prompt_text, without) << "chat requests render the same way";
  auto disagree = HandleApplyTemplate(
      json{{"messages", UserMsg("Hi")}, {"add_generation_prompt", true}, {"chat_template_kwargs", {{"add_generation_prompt", false}}}}
          .dump(),
      Info());
  EXPECT_API_ERROR(disagree, 400, "add_generation_prompt");
  EXPECT_API_ERROR(HandleApplyTemplate(json{{"messages", UserMsg("Hi")}, {"add_generation_prompt", "no"}}.dump(), Info()), 400,
                   "add_generation_prompt");
  EXPECT_API_ERROR(Chat({{"messages", UserMsg("Hi")}, {"continue_final_message", true}}), 400, "continue_final_message");
  EXPECT_TRUE(Chat({{"messages", UserMsg("Hi")}, {"continue_final_message", false}}).ok());
}

// The key a request presents: Bearer in any case with any spaces, or X-Api-Key.
TEST(ServerApiTest, PresentedApiKeys) {
  using V = std::vector<std::string>;
  EXPECT_EQ(PresentedApiKeys("Bearer k1", ""), V{"k1"});
  EXPECT_EQ(PresentedApiKeys("bearer k1", ""), V{"k1"});
  EXPECT_EQ(PresentedApiKeys("BEARER k1", ""), V{"k1"});
  EXPECT_EQ(PresentedApiKeys("BeArEr k1", ""), V{"k1"});
  EXPECT_EQ(PresentedApiKeys("Bearer    k1  ", ""), V{"k1"});
  EXPECT_EQ(PresentedApiKeys("Bearer\tk1", ""), V{"k1"});
  EXPECT_EQ(PresentedApiKeys("", "k2"), V{"k2"});
  EXPECT_EQ(PresentedApiKeys("", " k2 "), V{"k2"});
  EXPECT_EQ(PresentedApiKeys("Bearer k1", "k2"), (V{"k1", "k2"}));
  EXPECT_EQ(PresentedApiKeys("", ""), V{});
  EXPECT_EQ(PresentedApiKeys("k1", ""), V{}) << "a key without a scheme";
  EXPECT_EQ(PresentedApiKeys("Bearerk1", ""), V{});
  EXPECT_EQ(PresentedApiKeys("Bearer ", ""), V{});
  EXPECT_EQ(PresentedApiKeys("Bearer    ", ""), V{});
  EXPECT_EQ(PresentedApiKeys("Basic k1", ""), V{});
  EXPECT_EQ(PresentedApiKeys("Bearer k1 k2", ""), V{"k1 k2"}) << "not a key the server has";
}

TEST(ServerMetricsTest, PrometheusText) {
  SchedulerStats s;
  s.requests_total = 5;
  s.requests_degenerate = 1;
  s.prompt_tokens_total = 100;
  s.generated_tokens_total = 40;
  s.queue_depth = 2;
  s.busy_slots = 3;
  s.slots = 4;
  s.kv_tokens_used = 256;
  s.kv_tokens_capacity = 1024;
  s.ttft_count = 3;
  s.ttft_sum = 0.3;
  for (int i = 0; i < SchedulerStats::kNumBuckets; ++i) s.ttft_bucket[i] = SchedulerStats::kBuckets[i] >= 0.1 ? 3 : 0;
  std::map<int, uint64_t> http = {{200, 7}, {400, 2}};
  const std::string m = RenderMetrics(s, &http);
  for (const char* line : {"gemma4rt_requests_total 5\n", "gemma4rt_degenerate_responses_total 1\n",
                           "gemma4rt_prompt_tokens_total 100\n", "gemma4rt_generated_tokens_total 40\n",
                           "gemma4rt_queue_depth 2\n", "gemma4rt_busy_slots 3\n", "gemma4rt_kv_cache_usage_ratio 0.25\n",
                           "gemma4rt_time_to_first_token_seconds_bucket{le=\"0.05\"} 0\n",
                           "gemma4rt_time_to_first_token_seconds_bucket{le=\"0.1\"} 3\n",
                           "gemma4rt_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n",
                           "gemma4rt_time_to_first_token_seconds_sum 0.3\n", "gemma4rt_time_to_first_token_seconds_count 3\n",
                           "# TYPE gemma4rt_time_per_output_token_seconds histogram\n",
                           "gemma4rt_http_requests_total{status=\"400\"} 2\n"})
    EXPECT_NE(m.find(line), std::string::npos) << line << "\n" << m;
  // Every sample line is "name{labels} value".
  std::stringstream ss(m);
  std::string line;
  std::set<std::string> types;
  while (std::getline(ss, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      EXPECT_TRUE(types.insert(line.substr(7, line.find(' ', 7) - 7)).second) << line;
    }
    if (line.empty() || line[0] == '#') continue;
    EXPECT_EQ(line.rfind("gemma4rt_", 0), 0u) << line;
    EXPECT_NE(line.find(' '), std::string::npos) << line;
  }
  HttpCounters c;
  c.Count(200);
  c.Count(200);
  c.Count(404);
  EXPECT_EQ(c.Snapshot(), (std::map<int, uint64_t>{{200, 2}, {404, 1}}));
}

TEST(ServeFlagsTest, FlagsEnvironmentAndPrecedence) {
  setenv("GEMMA4RT_PORT", "9999", 1);
  setenv("GEMMA4RT_PARALLEL", "3", 1);
  setenv("GEMMA4RT_METRICS", "1", 1);
  setenv("GEMMA4RT_ALIAS", "from-env", 1);
  ParsedFlags f = ParseServeFlags({"-m", "/x.gguf", "--port", "1234", "-c", "512", "-t", "2", "--api-key", "k1,k2",
                                   "--max-body-bytes", "1000", "--max-queue", "5", "--no-degeneracy-check"});
  unsetenv("GEMMA4RT_PORT");
  unsetenv("GEMMA4RT_PARALLEL");
  unsetenv("GEMMA4RT_METRICS");
  unsetenv("GEMMA4RT_ALIAS");
  ASSERT_TRUE(f.options.has_value());
  const ServeOptions& o = *f.options;
  EXPECT_EQ(o.model, "/x.gguf");
  EXPECT_EQ(o.port, 1234) << "the command line wins";
  EXPECT_EQ(o.parallel, 3) << "from the environment";
  EXPECT_TRUE(o.metrics);
  EXPECT_EQ(o.alias, "from-env");
  EXPECT_EQ(o.ctx, 512);
  EXPECT_EQ(o.threads, 2);
  EXPECT_EQ(o.api_keys, (std::vector<std::string>{"k1", "k2"}));
  EXPECT_EQ(o.max_body_bytes, 1000u);
  EXPECT_EQ(o.max_queue, 5);
  EXPECT_FALSE(o.degeneracy_check);
  EXPECT_EQ(o.host, "127.0.0.1");
  ParsedFlags np = ParseServeFlags({"-np", "8"});
  ASSERT_TRUE(np.options.has_value());
  EXPECT_EQ(np.options->parallel, 8);
  EXPECT_EQ(np.options->port, 8080);
  // llama.cpp's cache-type spellings; an option's value that looks like one stays a value (found by
  // a fresh user: the rewrite took any argument, `--alias -np` or `--alias -ctk` included).
  ParsedFlags ctk = ParseServeFlags({"-ctk", "bf16", "--alias", "-ctk", "-np", "2", "--api-key", "-np"});
  ASSERT_TRUE(ctk.options.has_value());
  EXPECT_EQ(ctk.options->cache_type, "bf16");
  EXPECT_EQ(ctk.options->alias, "-ctk");
  EXPECT_EQ(ctk.options->parallel, 2);
  EXPECT_EQ(ctk.options->api_keys, (std::vector<std::string>{"-np"}));
  ParsedFlags clash = ParseServeFlags({"-ctk", "bf16", "-ctv", "f16"});
  EXPECT_FALSE(clash.options.has_value());
  EXPECT_EQ(clash.exit_code, 2);  // a usage error
  ParsedFlags bad = ParseServeFlags({"--port", "70000"});
  EXPECT_FALSE(bad.options.has_value());
  EXPECT_EQ(bad.exit_code, 2);
  ParsedFlags missing_file = ParseServeFlags({"--api-key-file", "/nonexistent/keys"});
  EXPECT_FALSE(missing_file.options.has_value());
  EXPECT_EQ(missing_file.exit_code, 1);
  // --threads-http: given, or DefaultHttpThreads (room for every running and queued request, at
  // least 512).
  EXPECT_EQ(np.options->threads_http, 0);
  EXPECT_EQ(DefaultHttpThreads(4, 64), 512);
  EXPECT_EQ(DefaultHttpThreads(64, 1000), 1080);
  EXPECT_EQ(DefaultHttpThreads(4, 1 << 20), kMaxHttpThreads) << "--max-queue's range would ask for a million threads";
  EXPECT_FALSE(ParseServeFlags({"--threads-http", "100000"}).options.has_value());
  ParsedFlags http = ParseServeFlags({"--threads-http", "100"});
  ASSERT_TRUE(http.options.has_value());
  EXPECT_EQ(http.options->threads_http, 100);
}

// Found by a fresh user: `--api-key ""` (as `--api-key "$UNSET"` gives) started a server that
// answered everyone, silently. An empty key, from the flag or the environment, is an error, as
// an --api-key-file without a key already was.
TEST(ServeFlagsTest, AnEmptyApiKeyIsAnErrorNotAnOpenServer) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--api-key", ""},
                                               std::vector<std::string>{"--api-key", " , "},
                                               std::vector<std::string>{"--api-key="}}) {
    testing::internal::CaptureStderr();
    ParsedFlags f = ParseServeFlags(args);
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_FALSE(f.options.has_value()) << args[0];
    EXPECT_EQ(f.exit_code, 2);  // a usage error
    if (args.size() != 2 || args[1].empty()) continue;  // CLI11 itself refuses an empty value
    EXPECT_NE(err.find("--api-key is empty"), std::string::npos) << err;
  }
  setenv("GEMMA4RT_API_KEY", "", 1);
  testing::internal::CaptureStderr();
  ParsedFlags env = ParseServeFlags({});
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(env.options.has_value());
  EXPECT_EQ(env.exit_code, 2);
  EXPECT_NE(err.find("GEMMA4RT_API_KEY is empty"), std::string::npos) << err;
  // A key on the command line is used whatever the empty variable says.
  ParsedFlags flag_wins = ParseServeFlags({"--api-key", "k"});
  unsetenv("GEMMA4RT_API_KEY");
  ASSERT_TRUE(flag_wins.options.has_value());
  EXPECT_EQ(flag_wins.options->api_keys, std::vector<std::string>{"k"});
  ParsedFlags none = ParseServeFlags({});
  ASSERT_TRUE(none.options.has_value()) << "no key at all: a server without authentication, as asked";
  EXPECT_TRUE(none.options->api_keys.empty());
  // An empty variable beside a key file (docker-compose's ${KEY:-}): the file's keys guard it.
  const std::string file = testing::TempDir() + "/gemma4rt-keys.txt";
  {
    std::ofstream f(file);
    f << "from-file\n";
  }
  setenv("GEMMA4RT_API_KEY", "", 1);
  ParsedFlags with_file = ParseServeFlags({"--api-key-file", file});
  unsetenv("GEMMA4RT_API_KEY");
  ASSERT_TRUE(with_file.options.has_value());
  EXPECT_EQ(with_file.options->api_keys, std::vector<std::string>{"from-file"});
  // Comment lines are not keys (a fresh user's "# comment" line answered 200 as a key), and a
  // file of comments alone holds no key: an error, not a server guarded by "# only comment".
  {
    std::ofstream f(file);
    f << "# production keys\n  sk-one  \n\n   # indented comment\nsk-two\n";
  }
  ParsedFlags commented = ParseServeFlags({"--api-key-file", file});
  ASSERT_TRUE(commented.options.has_value());
  EXPECT_EQ(commented.options->api_keys, (std::vector<std::string>{"sk-one", "sk-two"}));
  {
    std::ofstream f(file);
    f << "# only comment\n";
  }
  ParsedFlags only_comments = ParseServeFlags({"--api-key-file", file});
  EXPECT_FALSE(only_comments.options.has_value());
  EXPECT_EQ(only_comments.exit_code, 1);
  std::remove(file.c_str());
}

}  // namespace
}  // namespace g4::server
