// Chat templates: byte-for-byte equality with Hugging Face's rendering of the official Gemma 3 and
// Gemma 4 templates (tests/data/chat_template_golden.json, written by
// tools/make_template_golden.py with jinja2 + transformers' render_jinja_template), the error
// cases the templates raise on, and the inputs this renderer refuses on purpose.
#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace g4 {
namespace {

using json = nlohmann::json;

json LoadGolden(const std::string& file = "chat_template_golden.json") {
  const std::string path = std::string(GEMMA4RT_TEST_DATA_DIR) + "/data/" + file;
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

// OpenAI-shaped messages (content null allowed; tool_calls, tool_call_id, reasoning_content).
std::vector<ChatMessage> Messages(const json& j) {
  std::vector<ChatMessage> out;
  for (const json& m : j) {
    ChatMessage cm(m.at("role").get<std::string>(), m.at("content").is_null() ? "" : m.at("content").get<std::string>());
    if (m.contains("tool_calls"))
      for (const json& c : m.at("tool_calls"))
        cm.tool_calls.push_back({c.value("id", ""), c.at("function").at("name").get<std::string>(),
                                 c.at("function").at("arguments").get<std::string>()});
    cm.tool_call_id = m.value("tool_call_id", "");
    cm.reasoning_content = m.value("reasoning_content", "");
    out.push_back(std::move(cm));
  }
  return out;
}

// Shows control characters so a mismatch is readable.
std::string Visible(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += c;
    }
  }
  return out;
}

TEST(ChatTemplateTest, GoldenFileCoversBothTemplatesAndErrors) {
  const json golden = LoadGolden();
  int g3 = 0, g4 = 0, errors = 0;
  for (const json& c : golden.at("cases")) {
    (c.at("template") == "gemma3" ? g3 : g4)++;
    errors += c.contains("error");
  }
  EXPECT_GE(g3, 15);
  EXPECT_GE(g4, 25);
  EXPECT_GE(errors, 6);
}

TEST(ChatTemplateTest, MatchesHuggingFaceGoldenByteForByte) {
  const json golden = LoadGolden();
  for (const json& c : golden.at("cases")) {
    const std::string name = c.at("name");
    SCOPED_TRACE(name);
    auto kind = ChatTemplateKindFromName(c.at("template").get<std::string>());
    ASSERT_TRUE(kind.ok()) << kind.status().ToString();
    ChatTemplateOptions opt;
    opt.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    // null = the kwarg was not passed, which both templates treat as false.
    opt.enable_thinking = c.at("enable_thinking").is_boolean() && c.at("enable_thinking").get<bool>();
    auto out = RenderChatTemplate(*kind, Messages(c.at("messages")), opt);
    if (c.contains("expected")) {
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      const std::string expected = c.at("expected");
      EXPECT_EQ(*out, expected) << "got:      " << Visible(*out) << "\nexpected: " << Visible(expected);
      // Exactly one BOS, at the start.
      EXPECT_EQ(out->rfind("<bos>"), 0u);
    } else {
      ASSERT_FALSE(out.ok()) << "expected an error (" << c.at("error") << "), got " << Visible(*out);
      EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
      if (c.at("error_index").is_number()) {
        const std::string where = "messages[" + std::to_string(c.at("error_index").get<int>()) + "]";
        EXPECT_NE(out.status().message().find(where), std::string::npos) << out.status().message();
      } else {
        EXPECT_NE(out.status().message().find("empty"), std::string::npos) << out.status().message();
      }
      if (c.at("template") == "gemma3" && c.at("error_index").is_number()) {
        EXPECT_NE(out.status().message().find("alternate"), std::string::npos) << out.status().message();
      }
    }
  }
}

TEST(ChatTemplateTest, ToolsMatchHuggingFaceGoldenByteForByte) {
  const json golden = LoadGolden("chat_template_tools_golden.json");
  ASSERT_GE(golden.at("cases").size(), 18u);
  for (const json& c : golden.at("cases")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    ChatTemplateOptions opt;
    opt.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    opt.enable_thinking = c.at("enable_thinking").is_boolean() && c.at("enable_thinking").get<bool>();
    opt.tools = c.at("tools");
    auto out = RenderGemma4Chat(Messages(c.at("messages")), opt);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    const std::string expected = c.at("expected");
    EXPECT_EQ(*out, expected) << "got:      " << Visible(*out) << "\nexpected: " << Visible(expected);
  }
}

TEST(ChatTemplateTest, ToolMessageNeedsACallBeforeIt) {
  ChatMessage tool("tool", "{}");
  auto out = RenderGemma4Chat({{"user", "hi"}, {"assistant", "no calls"}, tool});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("messages[2].role"), std::string::npos) << out.status().message();
}

TEST(ChatTemplateTest, Gemma3HasNoToolSyntax) {
  ChatTemplateOptions opt;
  opt.tools = json::parse(R"([{"type":"function","function":{"name":"f"}}])");
  auto out = RenderGemma3Chat({{"user", "hi"}}, opt);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("no tool syntax"), std::string::npos) << out.status().message();
  ChatMessage call("assistant", "");
  call.tool_calls.push_back({"c1", "f", "{}"});
  auto out2 = RenderGemma3Chat({{"user", "hi"}, call, {"user", "ok"}});
  ASSERT_FALSE(out2.ok());
  EXPECT_NE(out2.status().message().find("messages[1].tool_calls"), std::string::npos) << out2.status().message();
}

TEST(ChatTemplateTest, SpecExamplesGemma4) {
  // ../shared/spec/gemma-architecture.md section 6.4.
  auto plain = RenderGemma4Chat({{"user", "Hello"}});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(*plain, "<bos><|turn>user\nHello<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
  auto think = RenderGemma4Chat({{"user", "Hello"}}, {.add_generation_prompt = true, .enable_thinking = true, .tools = nullptr});
  ASSERT_TRUE(think.ok());
  EXPECT_EQ(*think, "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHello<turn|>\n<|turn>model\n");
}

TEST(ChatTemplateTest, SpecExampleGemma3) {
  auto out = RenderGemma3Chat({{"system", "Be brief."}, {"user", "Hi"}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n");
}

TEST(ChatTemplateTest, RejectsUnsupportedRolesNamingTheIndex) {
  for (ChatTemplateKind kind : {ChatTemplateKind::kGemma3, ChatTemplateKind::kGemma4}) {
    auto out = RenderChatTemplate(kind, {{"user", "hi"}, {"tool", "{}"}});
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(out.status().message().find("messages[1].role"), std::string::npos) << out.status().message();
    EXPECT_NE(out.status().message().find("tool"), std::string::npos);
  }
  auto dev = RenderGemma4Chat({{"developer", "x"}, {"user", "hi"}});
  ASSERT_FALSE(dev.ok());
  EXPECT_NE(dev.status().message().find("messages[0].role"), std::string::npos);
}

TEST(ChatTemplateTest, RejectsInvalidUtf8NamingTheIndex) {
  auto out = RenderGemma4Chat({{"user", "ok"}, {"assistant", std::string("bad \xC3 byte")}});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("messages[1].content"), std::string::npos) << out.status().message();
  // Overlong encoding and a UTF-16 surrogate are invalid too.
  EXPECT_FALSE(RenderGemma3Chat({{"user", std::string("\xC0\xAF")}}).ok());
  EXPECT_FALSE(RenderGemma3Chat({{"user", std::string("\xED\xA0\x80")}}).ok());
}

TEST(ChatTemplateTest, EmptyConversationIsAnError) {
  for (ChatTemplateKind kind : {ChatTemplateKind::kGemma3, ChatTemplateKind::kGemma4}) {
    auto out = RenderChatTemplate(kind, {});
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(ChatTemplateTest, UnknownTemplateName) {
  auto k = ChatTemplateKindFromName("llama3");
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("llama3"), std::string::npos);
}

TEST(ChatTemplateTest, TrimMatchesPythonStrip) {
  EXPECT_EQ(TrimPythonWhitespace("  a b \n"), "a b");
  EXPECT_EQ(TrimPythonWhitespace("\xC2\xA0\xE3\x80\x80x\xE2\x80\x83"), "x");  // NBSP, ideographic, em
  EXPECT_EQ(TrimPythonWhitespace("\x1Cx\x1F"), "x");                           // ASCII separators
  EXPECT_EQ(TrimPythonWhitespace("\xE2\x80\x8Bx"), "\xE2\x80\x8Bx");           // U+200B is not space
  EXPECT_EQ(TrimPythonWhitespace(" \t\n"), "");
  EXPECT_EQ(TrimPythonWhitespace(""), "");
  EXPECT_EQ(TrimPythonWhitespace("x\xC2\x85"), "x");  // U+0085 NEL
}

TEST(ChatTemplateTest, StripThinkingMacro) {
  EXPECT_EQ(StripGemma4Thinking("<|channel>thought\nabc<channel|>Answer"), "Answer");
  EXPECT_EQ(StripGemma4Thinking("a<|channel>x<channel|>b<|channel>y<channel|>c"), "abc");
  EXPECT_EQ(StripGemma4Thinking("keep<|channel>unclosed"), "keep");
  EXPECT_EQ(StripGemma4Thinking("stray<channel|>tail"), "straytail");
  EXPECT_EQ(StripGemma4Thinking("no markup"), "no markup");
  EXPECT_EQ(StripGemma4Thinking(""), "");
}

}  // namespace
}  // namespace g4
