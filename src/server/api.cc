#include "server/api.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "server/api_internal.h"
#include "tokenizer/utf8.h"

namespace g4::server {
namespace api_internal {

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string TypeName(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

MaybeError CheckModelId(std::string_view id, const ModelInfo& model) {
  if (std::find(model.accepted_ids.begin(), model.accepted_ids.end(), id) != model.accepted_ids.end()) return std::nullopt;
  ApiError e = ErrorForStatus(404, "The model '" + utf8::Sanitize(std::string(id)) + "' does not exist; this server serves '" +
                                       model.id + "'");
  e.param = "model";
  e.code = "model_not_found";
  return e;
}

ApiError WrongType(const std::string& param, const std::string& expected, const json& got) {
  return BadRequest(param + " must be " + expected + ", got " + TypeName(got), param);
}

const json* Field(const json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

MaybeError OptBool(const json& o, const char* key, std::optional<bool>* out) {
  const json* v = Field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return WrongType(key, "a boolean", *v);
  *out = v->get<bool>();
  return std::nullopt;
}

MaybeError OptNumber(const json& o, const char* key, std::optional<double>* out) {
  const json* v = Field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) return WrongType(key, "a number", *v);
  *out = v->get<double>();
  return std::nullopt;
}

MaybeError IntValue(const json& v, const std::string& param, int64_t lo, int64_t hi, int64_t* out) {
  // The message names the range allowed, as the CLI's flags do.
  const auto out_of_range = [&](const std::string& got) {
    return BadRequest(param + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + got,
                      param);
  };
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) return out_of_range(std::to_string(u));
    *out = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    *out = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d != std::floor(d)) return BadRequest(param + " must be an integer, got " + Dump(v), param);
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi))
      return out_of_range(Dump(v));
    *out = static_cast<int64_t>(d);
  } else {
    return WrongType(param, "an integer", v);
  }
  if (*out < lo || *out > hi) return out_of_range(std::to_string(*out));
  return std::nullopt;
}

MaybeError OptInt(const json& o, const char* key, std::optional<int64_t>* out) {
  const json* v = Field(o, key);
  if (!v) return std::nullopt;
  int64_t x = 0;
  API_RETURN_IF_ERROR(IntValue(*v, key, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &x));
  *out = x;
  return std::nullopt;
}

std::string ParamFromMessage(const std::string& m, bool strip_index) {
  size_t n = 0;
  while (n < m.size() && (std::isalnum(static_cast<unsigned char>(m[n])) || m[n] == '_' || m[n] == '[' || m[n] == ']' ||
                          m[n] == '.'))
    ++n;
  if (n == 0 || n == m.size() || (m[n] != ' ' && m[n] != ':')) return "";
  std::string p = m.substr(0, n);
  if (strip_index) p = p.substr(0, p.find('['));
  while (!p.empty() && p.back() == '.') p.pop_back();
  return p;
}

}  // namespace api_internal

using namespace api_internal;

namespace {

// U+10FFFF (a noncharacter) marks bytes that were not UTF-8, so the parser can still tell us where.
constexpr std::string_view kInvalidMark = "\xF4\x8F\xBF\xBF";
constexpr int kMaxDepth = 64;

// Path of the first string (value or key) holding kInvalidMark, or "".
std::string FindMarked(const json& j, const std::string& path, int depth) {
  if (depth > kMaxDepth) return "";
  if (j.is_string()) return j.get_ref<const std::string&>().find(kInvalidMark) != std::string::npos ? path : "";
  if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      std::string p = FindMarked(j[i], path + "[" + std::to_string(i) + "]", depth + 1);
      if (!p.empty()) return p;
    }
  } else if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string child = path.empty() ? it.key() : path + "." + it.key();
      if (it.key().find(kInvalidMark) != std::string::npos) return path.empty() ? "(a key)" : path;
      std::string p = FindMarked(it.value(), child, depth + 1);
      if (!p.empty()) return p;
    }
  }
  return "";
}

// Nesting depth of JSON text (brackets outside strings), stopping early past kMaxDepth.
bool TooDeep(std::string_view s) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

ApiOr<json> ParseText(std::string_view body) {
  try {
    return json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (const size_t p = what.find("] "); what.rfind("[json.exception", 0) == 0 && p != std::string::npos)
      what = what.substr(p + 2);
    return BadRequest("malformed JSON: " + utf8::Sanitize(what), "", "invalid_json");
  }
}

}  // namespace

ApiError BadRequest(std::string message, std::string param, std::string code) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

ApiError ErrorForStatus(int status, std::string message) {
  ApiError e{status, std::move(message), "invalid_request_error", "", ""};
  switch (status) {
    case 401: e.type = "authentication_error"; e.code = "invalid_api_key"; break;
    case 403: e.type = "permission_error"; break;
    case 404: e.code = "not_found"; break;
    case 405: e.code = "method_not_allowed"; break;
    case 408: e.code = "request_timeout"; break;
    case 413: e.code = "request_too_large"; break;
    case 415: e.code = "unsupported_media_type"; break;
    case 431: e.code = "request_header_fields_too_large"; break;
    case 429: e.type = "rate_limit_error"; e.code = "queue_full"; break;
    case 499: e.code = "client_closed_request"; break;  // nginx's: the client hung up before the answer
    case 501: e.code = "not_implemented"; break;  // a request feature the server lacks: the request's fault
    case 503: e.type = "unavailable_error"; e.code = "unavailable"; break;
    default:
      if (status >= 500) e.type = "server_error";
  }
  return e;
}

json ErrorJson(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return json{{"error", err}};
}

ApiError FromStatus(const Status& s) {
  const std::string& m = s.message();
  switch (s.code()) {
    case StatusCode::kInvalidArgument: {
      constexpr std::string_view kCtx = "context_length_exceeded:";
      if (m.rfind(kCtx, 0) == 0)
        return BadRequest(std::string(TrimPythonWhitespace(m.substr(kCtx.size()))), "max_tokens", "context_length_exceeded");
      return BadRequest(m, ParamFromMessage(m, true));
    }
    case StatusCode::kResourceExhausted: return ErrorForStatus(429, m);
    case StatusCode::kFailedPrecondition: return ErrorForStatus(503, m);
    case StatusCode::kNotFound: return ErrorForStatus(404, m);
    case StatusCode::kUnimplemented: return BadRequest(m, "", "unsupported_value");
    default: return ErrorForStatus(500, s.ToString());
  }
}

bool IsValidUtf8(std::string_view s) { return utf8::IsValid(s); }

std::vector<std::string> PresentedApiKeys(std::string_view authorization, std::string_view x_api_key) {
  auto is_space = [](char c) { return c == ' ' || c == '\t'; };
  auto trim = [&](std::string_view v) {
    while (!v.empty() && is_space(v.front())) v.remove_prefix(1);
    while (!v.empty() && is_space(v.back())) v.remove_suffix(1);
    return v;
  };
  std::vector<std::string> keys;
  std::string_view auth = trim(authorization);
  constexpr std::string_view kBearer = "bearer";
  if (auth.size() > kBearer.size() && is_space(auth[kBearer.size()]) &&
      std::equal(kBearer.begin(), kBearer.end(), auth.begin(),
                 [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); })) {
    const std::string_view token = trim(auth.substr(kBearer.size()));
    if (!token.empty()) keys.emplace_back(token);
  }
  if (const std::string_view key = trim(x_api_key); !key.empty()) keys.emplace_back(key);
  return keys;
}

ApiOr<json> ParseJsonBody(std::string_view body) {
  if (TooDeep(body)) return BadRequest("malformed JSON: nesting deeper than " + std::to_string(kMaxDepth) + " levels", "", "invalid_json");
  if (utf8::IsValid(body)) return ParseText(body);
  // Mark each invalid byte, parse, and name the string that held one.
  std::string marked;
  marked.reserve(body.size() + 16);
  for (size_t i = 0; i < body.size();) {
    const int n = utf8::ValidSeqLen(body, i);
    if (n > 0) {
      marked.append(body.substr(i, n));
      i += n;
    } else {
      marked.append(kInvalidMark);
      ++i;
    }
  }
  auto j = ParseText(marked);
  if (!j.ok()) return BadRequest("the request body is not valid UTF-8", "", "invalid_utf8");
  const std::string path = FindMarked(j.value(), "", 0);
  if (path.empty()) return BadRequest("the request body is not valid UTF-8", "", "invalid_utf8");
  return BadRequest(path + " is not valid UTF-8", path, "invalid_utf8");
}

ApiOr<json> HandleTokenize(std::string_view body, const ModelInfo& model) {
  auto jr = ParseJsonBody(body);
  if (!jr.ok()) return jr.error();
  const json& o = jr.value();
  if (!o.is_object()) return BadRequest("the request body must be a JSON object, got " + TypeName(o));
  if (!model.tokenizer) return BadRequest("this model has no tokenizer", "content", "unsupported_value");
  const json* c = Field(o, "content");
  if (!c) return BadRequest("content is required", "content", "missing_required_parameter");
  if (!c->is_string()) return WrongType("content", "a string", *c);
  std::optional<bool> add_special, parse_special, with_pieces;
  API_RETURN_IF_ERROR(OptBool(o, "add_special", &add_special));
  API_RETURN_IF_ERROR(OptBool(o, "parse_special", &parse_special));
  API_RETURN_IF_ERROR(OptBool(o, "with_pieces", &with_pieces));
  std::vector<int32_t> ids = model.tokenizer->Encode(c->get_ref<const std::string&>(), false, parse_special.value_or(true));
  if (add_special.value_or(false) && model.bos_id >= 0 && (ids.empty() || ids.front() != model.bos_id))
    ids.insert(ids.begin(), model.bos_id);
  json tokens = json::array();
  for (int32_t id : ids) {
    if (!with_pieces.value_or(false)) {
      tokens.push_back(id);
      continue;
    }
    const std::string piece = model.tokenizer->TokenText(id);
    json p = piece;
    if (!utf8::IsValid(piece)) {  // a byte token: its bytes, as llama-server does
      p = json::array();
      for (unsigned char b : piece) p.push_back(static_cast<int>(b));
    }
    tokens.push_back(json{{"id", id}, {"piece", p}});
  }
  return json{{"tokens", tokens}};
}

ApiOr<json> HandleDetokenize(std::string_view body, const ModelInfo& model) {
  auto jr = ParseJsonBody(body);
  if (!jr.ok()) return jr.error();
  const json& o = jr.value();
  if (!o.is_object()) return BadRequest("the request body must be a JSON object, got " + TypeName(o));
  if (!model.tokenizer) return BadRequest("this model has no tokenizer", "tokens", "unsupported_value");
  const json* t = Field(o, "tokens");
  if (!t) return BadRequest("tokens is required", "tokens", "missing_required_parameter");
  if (!t->is_array()) return WrongType("tokens", "an array of token ids", *t);
  std::vector<int32_t> ids;
  API_RETURN_IF_ERROR(TokenIds(*t, "tokens", model, &ids));
  return json{{"content", utf8::Sanitize(model.tokenizer->Decode(ids, /*skip_special=*/false))}};
}

ApiOr<json> HandleApplyTemplate(std::string_view body, const ModelInfo& model) {
  auto jr = ParseJsonBody(body);
  if (!jr.ok()) return jr.error();
  const json& o = jr.value();
  if (!o.is_object()) return BadRequest("the request body must be a JSON object, got " + TypeName(o));
  auto text = RenderMessages(o, model);
  if (!text.ok()) return text.error();
  return json{{"prompt", text.value()}};
}

namespace {
json ModelObject(const ModelInfo& model) {
  return json{{"id", model.id},       {"object", "model"},          {"created", model.created},
              {"owned_by", "gemma4rt"}, {"max_model_len", model.context_size}};
}
}  // namespace

json ModelsJson(const ModelInfo& model) { return json{{"object", "list"}, {"data", json::array({ModelObject(model)})}}; }

ApiOr<json> ModelJson(std::string_view id, const ModelInfo& model) {
  API_RETURN_IF_ERROR(CheckModelId(id, model));
  return ModelObject(model);
}

}  // namespace g4::server
