// Helpers shared by the request layer's files (api.cc, api_request.cc, api_response.cc): JSON
// field access that answers a wrong field with an OpenAI-shaped 400. Not part of api.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api.h"

// Returns the ApiError of `expr` (a MaybeError) if it holds one.
#define API_RETURN_IF_ERROR(expr)        \
  do {                                   \
    if (auto api_err_ = (expr)) return *api_err_; \
  } while (0)

namespace g4::server::api_internal {

using json = nlohmann::json;

using MaybeError = std::optional<ApiError>;

std::string Dump(const json& j);
std::string TypeName(const json& v);
// 404 model_not_found (param "model") unless `id` is one of the names the server answers to.
MaybeError CheckModelId(std::string_view id, const ModelInfo& model);
ApiError WrongType(const std::string& param, const std::string& expected, const json& got);
// A present, non-null field, or nullptr.
const json* Field(const json& o, const char* key);
MaybeError OptBool(const json& o, const char* key, std::optional<bool>* out);
MaybeError OptNumber(const json& o, const char* key, std::optional<double>* out);
// Integers in [lo, hi]; a float with an integral value (5.0) is accepted, 5.5 is not.
MaybeError IntValue(const json& v, const std::string& param, int64_t lo, int64_t hi, int64_t* out);
MaybeError OptInt(const json& o, const char* key, std::optional<int64_t>* out);
// The field name a Status message starts with ("top_p must be ..." -> "top_p"; "messages[2].role:
// ..." -> "messages[2].role"); "" when the message does not start with one.
std::string ParamFromMessage(const std::string& m, bool strip_index);

// An array of token ids in [0, model.vocab_size) appended to *out; `param` names it in errors.
MaybeError TokenIds(const json& a, const std::string& param, const ModelInfo& model, std::vector<int32_t>* out);
// The chat prompt; `output` (may be null) gets how the model's text is to be split.
ApiOr<std::string> RenderMessages(const json& o, const ModelInfo& model, std::optional<OutputParserOptions>* output = nullptr);

}  // namespace g4::server::api_internal
