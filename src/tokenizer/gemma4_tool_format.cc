// Gemma 4 tool syntax writers; see gemma4_tool_format.h. Each block names the template macro or
// loop it follows (tools/templates/gemma4_chat_template.jinja).
#include "tokenizer/gemma4_tool_format.h"

#include <algorithm>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/chat_template.h"

namespace g4 {
namespace {

using json = nlohmann::json;
constexpr std::string_view kQuote = "<|\"|>";

std::string AsciiLower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

std::string AsciiUpper(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  return out;
}

// Jinja's `dictsort` over an object's members: by key, case-insensitively.
std::vector<std::pair<std::string, const json*>> DictSort(const json& object) {
  std::vector<std::pair<std::string, const json*>> items;
  if (!object.is_object()) return items;
  for (auto it = object.begin(); it != object.end(); ++it) items.emplace_back(it.key(), &it.value());
  std::stable_sort(items.begin(), items.end(),
                   [](const auto& a, const auto& b) { return AsciiLower(a.first) < AsciiLower(b.first); });
  return items;
}

// value[key] as Jinja looks it up: nullptr when `value` is no object or lacks the key (Undefined).
const json* Get(const json* value, std::string_view key) {
  if (value == nullptr || !value->is_object()) return nullptr;
  auto it = value->find(std::string(key));
  return it == value->end() ? nullptr : &*it;
}

// Jinja truthiness; Undefined (nullptr) and null are false.
bool Truthy(const json* v) {
  if (v == nullptr || v->is_null()) return false;
  if (v->is_boolean()) return v->get<bool>();
  if (v->is_number_integer() || v->is_number_unsigned()) return v->get<int64_t>() != 0;
  if (v->is_number_float()) return v->get<double>() != 0.0;
  if (v->is_string()) return !v->get_ref<const std::string&>().empty();
  return !v->empty();
}

// Python's repr() of a JSON value (what str() writes for a list's or dict's items).
std::string PyRepr(const json& v);

std::string PyStringRepr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == q) {
      out += '\\', out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += c;
    }
  }
  return out + q;
}

// Python's str() of a JSON value, as `{{ value }}` writes it.
std::string PyStr(const json* v) {
  if (v == nullptr) return "";  // Undefined renders as nothing
  if (v->is_string()) return v->get<std::string>();
  return PyRepr(*v);
}

std::string PyRepr(const json& v) {
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_number()) return v.dump();  // shortest round trip, Python's exponent style
  if (v.is_string()) return PyStringRepr(v.get<std::string>());
  std::string out;
  if (v.is_array()) {
    out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + PyRepr(v[i]);
    return out + "]";
  }
  out = "{";
  bool first = true;
  for (auto it = v.begin(); it != v.end(); ++it) {
    out += (first ? "" : ", ") + PyStringRepr(it.key()) + ": " + PyRepr(it.value());
    first = false;
  }
  return out + "}";
}

// `x | upper`: str(x).upper(); Undefined -> "".
std::string Upper(const json* v) { return AsciiUpper(PyStr(v)); }

// The "<|"|>a<|"|>,<|"|>b<|"|>" list of a `required` array (the template iterates it).
std::string QuotedList(const json* list) {
  std::string out;
  if (list == nullptr || !list->is_array()) return out;
  for (size_t i = 0; i < list->size(); ++i) {
    if (i) out += ',';
    out += kQuote;
    out += PyStr(&(*list)[i]);
    out += kQuote;
  }
  return out;
}

// The template's `{%- if add_comma %},{%- else -%}{%- set add_comma = true -%}{% endif -%}`.
void Comma(bool* add_comma, std::string* out) {
  if (*add_comma) {
    *out += ',';
  } else {
    *add_comma = true;
  }
}

// format_parameters(properties, required): the `required` argument is never written by the macro.
std::string FormatParameters(const json* properties) {
  static constexpr std::string_view kStandard[] = {"description", "type", "properties", "required", "nullable"};
  std::string out;
  bool found_first = false;
  if (properties == nullptr) return out;
  for (const auto& [key, value_ref] : DictSort(*properties)) {
    const json* value = value_ref;
    if (std::find(std::begin(kStandard), std::end(kStandard), key) != std::end(kStandard)) continue;
    bool add_comma = false;
    if (found_first) out += ',';
    found_first = true;
    out += key + ":{";
    if (const json* d = Get(value, "description"); Truthy(d)) {
      out += "description:";
      out += kQuote;
      out += PyStr(d);
      out += kQuote;
      add_comma = true;
    }
    if (Truthy(Get(value, "nullable"))) {
      Comma(&add_comma, &out);
      out += "nullable:true";
    }
    const std::string type = Upper(Get(value, "type"));
    if (type == "STRING") {
      if (const json* e = Get(value, "enum"); Truthy(e)) {
        Comma(&add_comma, &out);
        out += "enum:" + FormatGemma4Argument(*e, true);
      }
    } else if (type == "OBJECT") {
      out += ",properties:{";
      if (const json* p = Get(value, "properties"); p != nullptr && p->is_object()) {
        out += FormatParameters(p);
      } else if (value->is_object()) {
        out += FormatParameters(value);
      }
      out += '}';
      if (const json* r = Get(value, "required"); Truthy(r)) out += ",required:[" + QuotedList(r) + "]";
    } else if (type == "ARRAY") {
      if (const json* items = Get(value, "items"); items != nullptr && items->is_object() && !items->empty()) {
        out += ",items:{";
        bool items_first = false;
        for (const auto& [ik, iv] : DictSort(*items)) {
          if (iv->is_null()) continue;
          if (items_first) out += ',';
          items_first = true;
          if (ik == "properties") {
            out += "properties:{";
            if (iv->is_object()) out += FormatParameters(iv);
            out += '}';
          } else if (ik == "required") {
            out += "required:[" + QuotedList(iv) + "]";
          } else if (ik == "type") {
            if (iv->is_string()) {
              out += "type:" + FormatGemma4Argument(json(AsciiUpper(iv->get<std::string>())), true);
            } else {
              json upper = json::array();
              if (iv->is_array())
                for (const json& t : *iv) upper.push_back(Upper(&t));
              out += "type:" + FormatGemma4Argument(upper, true);
            }
          } else {
            out += ik + ":" + FormatGemma4Argument(*iv, true);
          }
        }
        out += '}';
      }
    }
    Comma(&add_comma, &out);
    out += "type:";
    out += kQuote;
    out += type;
    out += kQuote;
    out += '}';
  }
  return out;
}

}  // namespace

std::string FormatGemma4Argument(const json& value, bool escape_keys) {
  if (value.is_string()) return std::string(kQuote) + value.get<std::string>() + std::string(kQuote);
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  if (value.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [key, v] : DictSort(value)) {
      if (!first) out += ',';
      first = false;
      out += escape_keys ? std::string(kQuote) + key + std::string(kQuote) : key;
      out += ':' + FormatGemma4Argument(*v, escape_keys);
    }
    return out + "}";
  }
  if (value.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < value.size(); ++i) {
      if (i) out += ',';
      out += FormatGemma4Argument(value[i], escape_keys);
    }
    return out + "]";
  }
  return PyRepr(value);
}

std::string FormatGemma4Declaration(const json& tool) {
  const json* fn = Get(&tool, "function");
  std::string out = "declaration:" + PyStr(Get(fn, "name")) + "{description:";
  out += kQuote;
  out += PyStr(Get(fn, "description"));
  out += kQuote;
  const json* params = Get(fn, "parameters");
  if (Truthy(params)) {
    out += ",parameters:{";
    if (const json* p = Get(params, "properties"); Truthy(p)) out += "properties:{" + FormatParameters(p) + "},";
    if (const json* r = Get(params, "required"); Truthy(r)) out += "required:[" + QuotedList(r) + "],";
    if (const json* t = Get(params, "type"); Truthy(t)) {
      out += "type:";
      out += kQuote;
      out += Upper(t);
      out += kQuote;
      out += '}';
    }
  }
  if (const json* response = Get(fn, "response")) {
    out += ",response:{";
    if (const json* d = Get(response, "description"); Truthy(d)) {
      out += "description:";
      out += kQuote;
      out += PyStr(d);
      out += kQuote;
      out += ',';
    }
    if (Upper(Get(response, "type")) == "OBJECT") {
      out += "type:";
      out += kQuote;
      out += "OBJECT";
      out += kQuote;
      out += '}';
    }
  }
  out += '}';
  return std::string(TrimPythonWhitespace(out));
}

std::string FormatGemma4ToolCall(const std::string& name, const json& arguments) {
  std::string out = "<|tool_call>call:" + name + "{";
  if (arguments.is_object()) {
    bool first = true;
    for (const auto& [key, v] : DictSort(arguments)) {
      if (!first) out += ',';
      first = false;
      out += key + ":" + FormatGemma4Argument(*v, false);
    }
  } else if (arguments.is_string()) {
    out += arguments.get<std::string>();
  }
  return out + "}<tool_call|>";
}

std::string FormatGemma4ToolResponse(const std::string& name, const json& response) {
  std::string out = "<|tool_response>response:" + name + "{";
  if (response.is_object()) {
    bool first = true;
    for (const auto& [key, v] : DictSort(response)) {
      if (!first) out += ',';
      first = false;
      out += key + ":" + FormatGemma4Argument(*v, false);
    }
  } else {
    out += "value:" + FormatGemma4Argument(response, false);
  }
  return out + "}<tool_response|>";
}

}  // namespace g4
