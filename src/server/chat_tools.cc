// Chat requests' tool and thinking fields; see chat_tools.h.
#include "server/chat_tools.h"

#include <random>

#include "tokenizer/utf8.h"

namespace g4::server {
namespace {

using json = nlohmann::json;

const json* Field(const json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

const char* TypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::null: return "null";
    default: return "a number";
  }
}

ApiError WrongType(const std::string& param, const std::string& expected, const json& got) {
  return BadRequest(param + " must be " + expected + ", got " + TypeName(got), param);
}

std::optional<ApiError> CheckTool(const json& t, const std::string& at) {
  if (!t.is_object()) return WrongType(at, "an object", t);
  const json* type = Field(t, "type");
  if (!type || !type->is_string() || type->get_ref<const std::string&>() != "function")
    return BadRequest(at + ".type must be \"function\"", at + ".type");
  const json* fn = Field(t, "function");
  if (!fn || !fn->is_object()) return BadRequest(at + ".function must be an object", at + ".function");
  const json* name = Field(*fn, "name");
  if (!name || !name->is_string() || name->get_ref<const std::string&>().empty())
    return BadRequest(at + ".function.name must be a non-empty string", at + ".function.name");
  if (const json* d = Field(*fn, "description"); d && !d->is_string())
    return WrongType(at + ".function.description", "a string", *d);
  if (const json* p = Field(*fn, "parameters"); p && !p->is_object())
    return WrongType(at + ".function.parameters", "an object (a JSON Schema)", *p);
  if (const json* p = Field(*fn, "parameters")) {
    if (const json* props = Field(*p, "properties"); props && !props->is_object())
      return WrongType(at + ".function.parameters.properties", "an object", *props);
  }
  return std::nullopt;
}

}  // namespace

ApiOr<ChatToolSettings> ParseChatToolSettings(const json& o, ChatTemplateKind kind) {
  ChatToolSettings s;
  const bool gemma4 = kind == ChatTemplateKind::kGemma4;
  s.output.reasoning = gemma4;
  json tools = json::array();
  if (const json* t = Field(o, "tools")) {
    if (!t->is_array()) return WrongType("tools", "an array", *t);
    if (t->size() > kMaxTools)
      return BadRequest("tools: at most " + std::to_string(kMaxTools) + " tools, got " + std::to_string(t->size()), "tools");
    if (!t->empty() && !gemma4)
      return BadRequest("tools: this model's chat template (Gemma 3) has no tool-call syntax; tools need a Gemma 4 model",
                        "tools", "unsupported_parameter");
    for (size_t i = 0; i < t->size(); ++i)
      if (auto e = CheckTool((*t)[i], "tools[" + std::to_string(i) + "]")) return *e;
    tools = *t;
  }
  std::string choice = "auto", forced_name;
  if (const json* c = Field(o, "tool_choice")) {
    if (c->is_string()) {
      choice = c->get<std::string>();
      if (choice != "auto" && choice != "none" && choice != "required")
        return BadRequest("tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": "
                          "{\"name\": ...}}, got '" + utf8::Sanitize(choice) + "'",
                          "tool_choice");
    } else if (c->is_object()) {
      const json* fn = Field(*c, "function");
      const json* name = fn && fn->is_object() ? Field(*fn, "name") : nullptr;
      if (!name || !name->is_string())
        return BadRequest("tool_choice.function.name must be a string", "tool_choice.function.name");
      forced_name = name->get<std::string>();
      bool found = false;
      for (const json& t : tools) found |= t["function"]["name"] == forced_name;
      if (!found)
        return BadRequest("tool_choice names the function '" + utf8::Sanitize(forced_name) + "', which is not in tools",
                          "tool_choice.function.name");
      choice = "function";
    } else {
      return WrongType("tool_choice", "a string or an object", *c);
    }
  }
  if ((choice == "required" || choice == "function") && tools.empty())
    return BadRequest("tool_choice '" + choice + "' needs tools", "tool_choice");
  std::optional<bool> parallel;
  if (const json* p = Field(o, "parallel_tool_calls")) {
    if (!p->is_boolean()) return WrongType("parallel_tool_calls", "a boolean", *p);
    parallel = p->get<bool>();
  }
  if (choice != "none" && !tools.empty()) {
    s.tools = std::move(tools);
    s.output.tools = true;
    s.output.parallel_calls = parallel.value_or(true);
    if (choice == "required") s.output.forced_call_prefix = "call:";
    if (choice == "function") s.output.forced_call_prefix = "call:" + forced_name + "{";
    if (s.output.forced_call_prefix) s.prompt_suffix = "<|tool_call>" + *s.output.forced_call_prefix;
  }
  if (const json* e = Field(o, "reasoning_effort")) {
    if (!e->is_string()) return WrongType("reasoning_effort", "a string", *e);
    const std::string& v = e->get_ref<const std::string&>();
    if (v == "none" || v == "minimal") {
      s.enable_thinking = false;
    } else if (v == "low" || v == "medium" || v == "high") {
      if (!gemma4)
        return BadRequest("reasoning_effort: this model's chat template (Gemma 3) has no thinking mode", "reasoning_effort",
                          "unsupported_value");
      s.enable_thinking = true;
    } else {
      return BadRequest("reasoning_effort must be one of none, minimal, low, medium, high, got '" + utf8::Sanitize(v) + "'",
                        "reasoning_effort");
    }
  }
  if (const json* f = Field(o, "reasoning_format")) {
    if (!f->is_string()) return WrongType("reasoning_format", "a string", *f);
    const std::string& v = f->get_ref<const std::string&>();
    if (v == "none") s.output.reasoning = false;
    else if (v != "auto" && v != "deepseek" && v != "deepseek-legacy")
      return BadRequest("reasoning_format must be none, auto or deepseek, got '" + utf8::Sanitize(v) + "'", "reasoning_format");
  }
  return s;
}

std::optional<ApiError> ParseMessageToolFields(const json& m, const std::string& at, ChatMessage* out) {
  if (const json* tc = Field(m, "tool_calls")) {
    if (!tc->is_array()) return WrongType(at + ".tool_calls", "an array", *tc);
    if (!tc->empty() && out->role != "assistant" && out->role != "model")
      return BadRequest(at + ".tool_calls: only assistant messages carry tool calls", at + ".tool_calls");
    for (size_t k = 0; k < tc->size(); ++k) {
      const json& c = (*tc)[k];
      const std::string p = at + ".tool_calls[" + std::to_string(k) + "]";
      if (!c.is_object()) return WrongType(p, "an object", c);
      const json* fn = Field(c, "function");
      if (!fn || !fn->is_object()) return BadRequest(p + ".function must be an object", p + ".function");
      const json* name = Field(*fn, "name");
      if (!name || !name->is_string() || name->get_ref<const std::string&>().empty())
        return BadRequest(p + ".function.name must be a non-empty string", p + ".function.name");
      ChatToolCall call;
      call.name = name->get<std::string>();
      if (const json* args = Field(*fn, "arguments")) {
        // OpenAI sends JSON text; an object (some clients) is taken as that text.
        if (args->is_string()) call.arguments = args->get<std::string>();
        else if (args->is_object()) call.arguments = args->dump();
        else return WrongType(p + ".function.arguments", "a string of JSON", *args);
      }
      if (const json* id = Field(c, "id")) {
        if (!id->is_string()) return WrongType(p + ".id", "a string", *id);
        call.id = id->get<std::string>();
      }
      out->tool_calls.push_back(std::move(call));
    }
  }
  if (const json* r = Field(m, "reasoning_content")) {
    if (!r->is_string()) return WrongType(at + ".reasoning_content", "a string", *r);
    out->reasoning_content = r->get<std::string>();
  }
  if (out->role == "tool") {
    if (const json* id = Field(m, "tool_call_id")) {
      if (!id->is_string()) return WrongType(at + ".tool_call_id", "a string", *id);
      out->tool_call_id = id->get<std::string>();
    }
  }
  return std::nullopt;
}

std::string NewToolCallId() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kHex[rng() & 15];
  return id;
}

json ToolCallJson(const ParsedToolCall& call, const std::string& id, int index, bool with_index) {
  json j = json::object();
  if (with_index) j["index"] = index;
  j["id"] = id;
  j["type"] = "function";
  j["function"] = json{{"name", call.name}, {"arguments", call.arguments}};
  return j;
}

}  // namespace g4::server
