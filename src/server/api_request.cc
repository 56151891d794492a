// Completion requests: a request's JSON -> a validated ParsedRequest (the fields are in api.h).

#include "server/api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "base/parse_int.h"
#include "server/api_internal.h"
#include "server/chat_tools.h"
#include "tokenizer/utf8.h"

namespace g4::server {

using namespace api_internal;

namespace {

constexpr size_t kMaxStops = 16;
// OpenAI's chat API refuses more than 2048 messages in one request ("array too long ... maximum
// length 2048") and a logit_bias of more than 300 entries; vLLM checks only that the ids are in
// the vocabulary. Both bound work done before the context's length is known: every message is
// templated and tokenized, every bias applied to every sampled token.
constexpr size_t kMaxMessages = 2048;
constexpr size_t kMaxLogitBias = 300;

ApiOr<std::vector<std::string>> ParseStop(const json& o) {
  std::vector<std::string> stops;
  const json* v = Field(o, "stop");
  if (!v) return stops;
  if (v->is_string()) {
    if (!v->get_ref<const std::string&>().empty()) stops.push_back(v->get<std::string>());
    return stops;
  }
  if (!v->is_array()) return WrongType("stop", "a string or an array of strings", *v);
  if (v->size() > kMaxStops) return BadRequest("stop: at most " + std::to_string(kMaxStops) + " stop strings", "stop");
  for (size_t i = 0; i < v->size(); ++i) {
    const json& s = (*v)[i];
    if (!s.is_string()) return WrongType("stop[" + std::to_string(i) + "]", "a string", s);
    if (!s.get_ref<const std::string&>().empty()) stops.push_back(s.get<std::string>());
  }
  return stops;
}

ApiOr<std::vector<ChatMessage>> ParseMessages(const json& o) {
  const json* v = Field(o, "messages");
  if (!v) return BadRequest("messages is required", "messages", "missing_required_parameter");
  if (!v->is_array()) return WrongType("messages", "an array", *v);
  if (v->empty()) return BadRequest("messages must not be empty", "messages");
  if (v->size() > kMaxMessages)
    return BadRequest("messages: at most " + std::to_string(kMaxMessages) + " messages per request, got " +
                          std::to_string(v->size()),
                      "messages");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return WrongType(at, "an object", m);
    const json* role = Field(m, "role");
    if (!role) return BadRequest(at + ".role is required", at + ".role", "missing_required_parameter");
    if (!role->is_string()) return WrongType(at + ".role", "a string", *role);
    ChatMessage cm;
    cm.role = role->get<std::string>();
    if (cm.role == "developer") cm.role = "system";  // OpenAI's newer name for the system role
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant" && cm.role != "model" && cm.role != "tool")
      return BadRequest(at + ".role must be one of system, developer, user, assistant, model, tool (got '" +
                            utf8::Sanitize(cm.role) + "')",
                        at + ".role");
    API_RETURN_IF_ERROR(ParseMessageToolFields(m, at, &cm));
    const json* c = Field(m, "content");
    if (!c) {
      if (cm.role != "assistant" && cm.role != "model")
        return BadRequest(at + ".content is required", at + ".content", "missing_required_parameter");
    } else if (c->is_string()) {
      cm.content = c->get<std::string>();
    } else if (c->is_array()) {
      for (size_t k = 0; k < c->size(); ++k) {
        const json& part = (*c)[k];
        const std::string pat = at + ".content[" + std::to_string(k) + "]";
        if (!part.is_object()) return WrongType(pat, "an object", part);
        const json* type = Field(part, "type");
        if (!type || !type->is_string())
          return BadRequest(pat + ".type must be a string", pat + ".type", type ? "" : "missing_required_parameter");
        if (type->get_ref<const std::string&>() != "text")
          return BadRequest(pat + ".type: only text content parts are supported (got '" +
                                utf8::Sanitize(type->get<std::string>()) + "')",
                            pat + ".type", "unsupported_value");
        const json* text = Field(part, "text");
        if (!text || !text->is_string()) return BadRequest(pat + ".text must be a string", pat + ".text");
        if (k > 0) cm.content += "\n";
        cm.content += text->get<std::string>();
      }
    } else {
      return WrongType(at + ".content", "a string or an array of content parts", *c);
    }
    out.push_back(std::move(cm));
  }
  return out;
}

// Template switches: chat_template_kwargs.{enable_thinking, add_generation_prompt} and the top-level
// add_generation_prompt (llama-server's /apply-template and vLLM's chat requests put it there; both
// places mean the same, and different values in the two are a 400). continue_final_message (vLLM)
// would render the last message as an open turn, which the renderers cannot do: true is a 400.
MaybeError ParseTemplateOptions(const json& o, ChatTemplateOptions* opts) {
  std::optional<bool> top_level_agp, kwargs_agp, continue_final;
  API_RETURN_IF_ERROR(OptBool(o, "add_generation_prompt", &top_level_agp));
  API_RETURN_IF_ERROR(OptBool(o, "continue_final_message", &continue_final));
  if (continue_final.value_or(false))
    return BadRequest("continue_final_message is not supported (the last message is always a closed turn)",
                      "continue_final_message", "unsupported_parameter");
  if (const json* k = Field(o, "chat_template_kwargs")) {
    if (!k->is_object()) return WrongType("chat_template_kwargs", "an object", *k);
    if (const json* t = Field(*k, "enable_thinking")) {
      if (!t->is_boolean()) return WrongType("chat_template_kwargs.enable_thinking", "a boolean", *t);
      opts->enable_thinking = t->get<bool>();
    }
    if (const json* t = Field(*k, "add_generation_prompt")) {
      if (!t->is_boolean()) return WrongType("chat_template_kwargs.add_generation_prompt", "a boolean", *t);
      kwargs_agp = t->get<bool>();
    }
  }
  if (top_level_agp && kwargs_agp && *top_level_agp != *kwargs_agp)
    return BadRequest("add_generation_prompt and chat_template_kwargs.add_generation_prompt disagree (" +
                          std::string(*top_level_agp ? "true" : "false") + " and " + (*kwargs_agp ? "true" : "false") +
                          "); give one of them",
                      "add_generation_prompt");
  if (top_level_agp) opts->add_generation_prompt = *top_level_agp;
  if (kwargs_agp) opts->add_generation_prompt = *kwargs_agp;
  return std::nullopt;
}

}  // namespace

namespace api_internal {

ApiOr<std::string> RenderMessages(const json& o, const ModelInfo& model, std::optional<OutputParserOptions>* output) {
  auto messages = ParseMessages(o);
  if (!messages.ok()) return messages.error();
  ChatTemplateOptions opts;
  API_RETURN_IF_ERROR(ParseTemplateOptions(o, &opts));
  auto tools = ParseChatToolSettings(o, model.template_kind);
  if (!tools.ok()) return tools.error();
  if (tools->enable_thinking) {
    const json* k = Field(o, "chat_template_kwargs");
    const json* t = k && k->is_object() ? Field(*k, "enable_thinking") : nullptr;
    if (t && t->get<bool>() != *tools->enable_thinking)
      return BadRequest("reasoning_effort and chat_template_kwargs.enable_thinking disagree; give one of them", "reasoning_effort");
    opts.enable_thinking = *tools->enable_thinking;
  }
  opts.tools = tools->tools;
  StatusOr<std::string> text = RenderChatTemplate(model.template_kind, messages.value(), opts);
  if (!text.ok()) {
    std::string param = ParamFromMessage(text.status().message(), false);
    if (param.rfind("messages", 0) != 0 && param != "tools") param = "messages";
    return BadRequest(text.status().message(), param);
  }
  if (output && model.template_kind == ChatTemplateKind::kGemma4) *output = tools->output;
  return std::move(text).value() + tools->prompt_suffix;
}

MaybeError TokenIds(const json& a, const std::string& param, const ModelInfo& model, std::vector<int32_t>* out) {
  for (size_t i = 0; i < a.size(); ++i) {
    int64_t id = 0;
    const std::string p = param + "[" + std::to_string(i) + "]";
    if (!a[i].is_number()) return WrongType(p, "a token id", a[i]);
    API_RETURN_IF_ERROR(IntValue(a[i], p, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &id));
    if (id < 0 || id >= model.vocab_size)
      return BadRequest(p + ": token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                            std::to_string(model.vocab_size) + ")",
                        param, "invalid_token_id");
    out->push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

}  // namespace api_internal

namespace {

// Prompt text -> ids (special tokens parsed). A text whose byte count alone shows it cannot fit
// the context (Tokenizer::MinTokens) is refused before it is encoded, which takes seconds for
// megabytes of text.
MaybeError EncodePrompt(const std::string& text, const ModelInfo& model, const char* param, std::vector<int32_t>* ids) {
  const int64_t at_least = model.tokenizer->MinTokens(text.size());
  if (at_least >= model.context_size)
    return BadRequest("This model's maximum context length is " + std::to_string(model.context_size) +
                          " tokens. However, your prompt has at least " + std::to_string(at_least) +
                          " tokens, which leaves no room for a completion.",
                      param, "context_length_exceeded");
  *ids = model.tokenizer->Encode(text, /*add_bos=*/false, /*parse_special=*/true);
  return std::nullopt;
}

// Completions' prompt -> ids with exactly one BOS at the front.
MaybeError ParsePrompt(const json& o, const ModelInfo& model, ParsedRequest* r) {
  const json* v = Field(o, "prompt");
  if (!v) return BadRequest("prompt is required", "prompt", "missing_required_parameter");
  const json* p = v;
  if (v->is_array() && !v->empty() && (v->front().is_string() || v->front().is_array())) {
    if (v->size() > 1) return BadRequest("prompt: batches of prompts are not supported; send one prompt per request", "prompt",
                                         "unsupported_value");
    p = &v->front();
  }
  std::vector<int32_t>& ids = r->completion.prompt;
  if (p->is_string()) {
    if (!model.tokenizer)
      return BadRequest("prompt: this model has no tokenizer; send the prompt as token ids", "prompt", "unsupported_value");
    r->prompt_text = p->get<std::string>();
    API_RETURN_IF_ERROR(EncodePrompt(r->prompt_text, model, "prompt", &ids));
  } else if (p->is_array()) {
    if (p->empty()) return BadRequest("prompt must not be empty", "prompt");
    API_RETURN_IF_ERROR(TokenIds(*p, "prompt", model, &ids));
  } else {
    return WrongType("prompt", "a string, an array of strings or an array of token ids", *v);
  }
  if (model.bos_id >= 0 && (ids.empty() || ids.front() != model.bos_id)) {
    ids.insert(ids.begin(), model.bos_id);
    r->ids_bos_added = !p->is_string();
  }
  return std::nullopt;
}

// Another server's name for one of our fields (see "Field names from other servers" in api.h):
// sets *given to the name the request used (`ours` when neither or both are there). Both there with
// different values: 400 naming the alias.
MaybeError PickAlias(const json& o, const char* ours, const char* alias, const char* origin, const char** given) {
  const json* a = Field(o, ours);
  const json* b = Field(o, alias);
  *given = b && !a ? alias : ours;
  if (a && b && *a != *b)
    return BadRequest(std::string(alias) + " (" + origin + "'s name) and " + ours + " are the same setting but differ (" +
                          Dump(*b) + " and " + Dump(*a) + "); give one of them",
                      alias);
  return std::nullopt;
}

MaybeError ParseSampling(const json& o, const ModelInfo& model, SamplingParams* s) {
  const char* repetition_key = "repetition_penalty";
  API_RETURN_IF_ERROR(PickAlias(o, "repetition_penalty", "repeat_penalty", "llama-server", &repetition_key));
  struct F {
    const char* key;
    float* out;
  } floats[] = {{"temperature", &s->temperature},          {"top_p", &s->top_p},
                {"min_p", &s->min_p},                      {"presence_penalty", &s->presence_penalty},
                {"frequency_penalty", &s->frequency_penalty}, {repetition_key, &s->repetition_penalty}};
  for (const F& f : floats) {
    std::optional<double> d;
    API_RETURN_IF_ERROR(OptNumber(o, f.key, &d));
    if (!d) continue;
    if (std::fabs(*d) > std::numeric_limits<float>::max())
      return BadRequest(std::string(f.key) + " is out of range (" + Dump(o[f.key]) + ")", f.key);
    *f.out = static_cast<float>(*d);
  }
  if (const json* v = Field(o, "top_k")) {
    int64_t k = 0;
    API_RETURN_IF_ERROR(IntValue(*v, "top_k", -1, std::numeric_limits<int32_t>::max(), &k));
    s->top_k = static_cast<int>(k);
  }
  // seed: [0, 2^64) fixes the RNG; -1 is llama.cpp's "random seed", the same as no seed (a fresh
  // one per request); other negative values are a 400, not wrapped around to 2^64 - n. One
  // message for every out-of-range value, integer or float (1e30, 2^64).
  if (const json* v = Field(o, "seed")) {
    auto out_of_range = [](const std::string& got) {
      return BadRequest("seed must be an integer in [0, 2^64), or -1 for a random seed; got " + got, "seed");
    };
    if (v->is_number_unsigned()) {
      s->seed = v->get<uint64_t>();
    } else if (v->is_number_integer()) {
      const int64_t seed = v->get<int64_t>();
      if (seed < -1) return out_of_range(std::to_string(seed));
      if (seed == -1) s->seed = std::nullopt;
      else s->seed = static_cast<uint64_t>(seed);
    } else if (v->is_number_float()) {
      const double d = v->get<double>();
      if (d != std::floor(d)) return BadRequest("seed must be an integer, got " + Dump(*v), "seed");
      if (d == -1) s->seed = std::nullopt;
      else if (d < 0 || d >= 18446744073709551616.0)  // 2^64; an integral value shown as one
        return out_of_range(std::fabs(d) < 9.2e18 ? std::to_string(static_cast<int64_t>(d)) : Dump(*v));
      else s->seed = static_cast<uint64_t>(d);
    } else {
      return WrongType("seed", "an integer", *v);
    }
  }
  if (const json* v = Field(o, "logit_bias")) {
    if (!v->is_object()) return WrongType("logit_bias", "an object mapping token ids to biases", *v);
    if (v->size() > kMaxLogitBias)
      return BadRequest("logit_bias: at most " + std::to_string(kMaxLogitBias) + " entries, got " + std::to_string(v->size()),
                        "logit_bias");
    for (auto it = v->begin(); it != v->end(); ++it) {
      const std::string& key = it.key();
      const std::optional<long long> id = ParseWholeInteger(key);
      if (!id || *id < 0 || *id >= model.vocab_size)
        return BadRequest("logit_bias: '" + utf8::Sanitize(key) + "' is not a token id in [0, " +
                              std::to_string(model.vocab_size) + ")",
                          "logit_bias");
      if (!it.value().is_number()) return WrongType("logit_bias[" + key + "]", "a number", it.value());
      const double b = it.value().get<double>();
      if (!(b >= -100 && b <= 100))
        return BadRequest("logit_bias[" + key + "] must be in [-100, 100], got " + Dump(it.value()), "logit_bias");
      s->logit_bias[static_cast<int32_t>(*id)] = static_cast<float>(b);
    }
  }
  Status st = s->ValidateForVocab(model.vocab_size);
  if (!st.ok()) {
    std::string message = st.message();
    std::string param = ParamFromMessage(message, true);
    if (param == "repetition_penalty" && std::string_view(repetition_key) != param) {  // named as the request did
      message = repetition_key + message.substr(param.size());
      param = repetition_key;
    }
    return BadRequest(message, param);
  }
  return std::nullopt;
}

// Fields of llama-server and vLLM that would change generation and that this server does not
// implement: accepted at the value that switches them off, else 400 unsupported_parameter. The
// policy is in api.h ("Field names from other servers").
enum class OffWhen { kZero, kAtMostZero, kAtMostOne, kAtLeastOne, kFalse, kEmpty, kNull };
struct Inert {
  const char* key;
  const char* what;  // what it asks for, for the message
  OffWhen off;
};
constexpr Inert kInert[] = {
    // llama-server (/completion and its OpenAI-compatible routes)
    {"typical_p", "locally typical sampling", OffWhen::kAtLeastOne},
    {"top_n_sigma", "top-n-sigma sampling", OffWhen::kAtMostZero},
    {"xtc_probability", "XTC sampling", OffWhen::kAtMostZero},
    {"dynatemp_range", "dynamic temperature", OffWhen::kAtMostZero},
    {"mirostat", "Mirostat sampling", OffWhen::kZero},
    {"dry_multiplier", "the DRY repetition penalty", OffWhen::kZero},
    {"min_keep", "a minimum number of candidates kept by the filters", OffWhen::kAtMostOne},
    {"n_probs", "llama-server's token probabilities; OpenAI's logprobs and top_logprobs are", OffWhen::kAtMostZero},
    {"post_sampling_probs", "probabilities after the samplers; logprobs here are the raw logits'", OffWhen::kFalse},
    {"t_max_predict_ms", "a time limit on generation", OffWhen::kAtMostZero},
    {"n_indent", "an indentation stop", OffWhen::kAtMostZero},
    {"grammar", "grammar-constrained generation", OffWhen::kEmpty},
    {"json_schema", "schema-constrained generation", OffWhen::kEmpty},
    {"samplers", "a sampler order (here it is fixed: penalties, temperature, top_k, top_p, min_p)", OffWhen::kEmpty},
    // vLLM extra parameters
    {"min_tokens", "a minimum output length", OffWhen::kAtMostZero},
    {"use_beam_search", "beam search", OffWhen::kFalse},
    {"include_stop_str_in_output", "stop strings kept in the output", OffWhen::kFalse},
    {"bad_words", "banned words", OffWhen::kEmpty},
    {"allowed_token_ids", "a token whitelist", OffWhen::kEmpty},
    {"guided_json", "guided decoding", OffWhen::kEmpty},
    {"guided_regex", "guided decoding", OffWhen::kEmpty},
    {"guided_choice", "guided decoding", OffWhen::kEmpty},
    {"guided_grammar", "guided decoding", OffWhen::kEmpty},
    {"structured_outputs", "structured outputs", OffWhen::kEmpty},
    {"prompt_logprobs", "log-probabilities of the prompt's tokens", OffWhen::kNull},
    {"return_tokens_as_token_ids", "token ids in place of the tokens' texts in logprobs", OffWhen::kFalse},
};

// The kInert fields (refused unless off) and repeat_last_n (into sampling.repetition_window).
MaybeError ParseInert(const json& o, SamplingParams& sampling) {
  for (const Inert& f : kInert) {
    const json* v = Field(o, f.key);
    if (!v) continue;
    bool off = false;
    const char* off_text = "";
    switch (f.off) {
      case OffWhen::kZero:
      case OffWhen::kAtMostZero:
      case OffWhen::kAtMostOne:
      case OffWhen::kAtLeastOne: {
        if (!v->is_number()) return WrongType(f.key, "a number", *v);
        const double d = v->get<double>();
        if (f.off == OffWhen::kZero) off = d == 0, off_text = "0";
        if (f.off == OffWhen::kAtMostZero) off = d <= 0, off_text = "0";
        if (f.off == OffWhen::kAtMostOne) off = d <= 1, off_text = "0 or 1";
        if (f.off == OffWhen::kAtLeastOne) off = d >= 1, off_text = "1";
        break;
      }
      case OffWhen::kFalse:
        if (!v->is_boolean()) return WrongType(f.key, "a boolean", *v);
        off = !v->get<bool>();
        off_text = "false";
        break;
      case OffWhen::kEmpty:
        off = v->is_string() ? v->get_ref<const std::string&>().empty() : (v->is_array() || v->is_object()) && v->empty();
        off_text = "null or empty";
        break;
      case OffWhen::kNull:  // any value but null (which Field skips) asks for it
        off_text = "null";
        break;
    }
    if (!off)
      return BadRequest(std::string(f.key) + " (" + f.what + ") is not supported by this server; leave it out or send " + off_text +
                            " (got " + Dump(*v) + ")",
                        f.key, "unsupported_parameter");
  }
  // repeat_last_n (llama-server): the window of the repetition penalty, the last N tokens of
  // prompt + output (64 there by default; 0 = none), -1 = all of them (HF/vLLM, this server's
  // default): SamplingParams::repetition_window.
  if (const json* v = Field(o, "repeat_last_n")) {
    int64_t n = 0;
    API_RETURN_IF_ERROR(IntValue(*v, "repeat_last_n", -1, std::numeric_limits<int32_t>::max(), &n));
    sampling.repetition_window = static_cast<int>(n);
  } else if (Field(o, "repeat_penalty") != nullptr && Field(o, "repetition_penalty") == nullptr) {
    // A penalty under llama-server's name means what llama-server does with it: the last 64
    // tokens (its repeat_last_n default), not the whole context.
    sampling.repetition_window = 64;
  }
  return std::nullopt;
}

// logprobs / top_logprobs -> *top_n (CompletionRequest::logprobs): -1 when not asked for.
//   chat: logprobs true|false (OpenAI), top_logprobs 0..20 (needs logprobs true when above 0, as
//         OpenAI and vLLM say).
//   completions: logprobs N in 0..20 (OpenAI's legacy integer: the N most likely tokens besides
//         the chosen one's; vLLM's range) or a boolean (true: top_logprobs if given, else 1, as
//         vLLM reads a Python true).
MaybeError ParseLogprobs(const json& o, Endpoint ep, int* top_n) {
  *top_n = -1;
  int64_t top = 0;
  const json* t = Field(o, "top_logprobs");
  if (t != nullptr) API_RETURN_IF_ERROR(IntValue(*t, "top_logprobs", 0, kMaxTopLogprobs, &top));
  bool wants = false;
  if (const json* lp = Field(o, "logprobs")) {
    if (lp->is_boolean()) {
      wants = lp->get<bool>();
    } else if (ep == Endpoint::kCompletion && lp->is_number()) {
      int64_t k = 0;
      API_RETURN_IF_ERROR(IntValue(*lp, "logprobs", 0, kMaxTopLogprobs, &k));
      if (t != nullptr && top != k)
        return BadRequest("top_logprobs (" + std::to_string(top) + ") and an integer logprobs (" + std::to_string(k) +
                              ") disagree: give one of them",
                          "top_logprobs");
      *top_n = static_cast<int>(k);
      return std::nullopt;
    } else {
      return WrongType("logprobs", ep == Endpoint::kChat ? "a boolean" : "an integer", *lp);
    }
  }
  if (!wants && top > 0)
    return BadRequest("top_logprobs needs \"logprobs\": true", "top_logprobs");
  if (wants) *top_n = ep == Endpoint::kCompletion && t == nullptr ? 1 : static_cast<int>(top);
  return std::nullopt;
}

// Fields we validate and refuse when they ask for something not supported.
MaybeError ParseUnsupported(const json& o, Endpoint ep) {
  std::optional<int64_t> n;
  API_RETURN_IF_ERROR(OptInt(o, "n", &n));
  if (n && *n < 1) return BadRequest("n must be at least 1, got " + std::to_string(*n), "n");
  if (n && *n > 1) return BadRequest("n > 1 is not supported (one choice per request)", "n", "unsupported_value");
  std::optional<int64_t> best_of;
  API_RETURN_IF_ERROR(OptInt(o, "best_of", &best_of));
  if (best_of && *best_of != 1) return BadRequest("best_of must be 1 (got " + std::to_string(*best_of) + ")", "best_of", "unsupported_value");
  if (const json* s = Field(o, "suffix")) {
    if (!s->is_string()) return WrongType("suffix", "a string", *s);
    if (!s->get_ref<const std::string&>().empty())
      return BadRequest("suffix is not supported", "suffix", "unsupported_parameter");
  }
  if (const json* t = Field(o, "tools"); t && ep == Endpoint::kCompletion) {  // chat: chat_tools.h
    if (!t->is_array()) return WrongType("tools", "an array", *t);
    if (!t->empty()) return BadRequest("tools are a chat field (/v1/chat/completions)", "tools", "unsupported_parameter");
  }
  if (const json* rf = Field(o, "response_format")) {
    if (!rf->is_object()) return WrongType("response_format", "an object", *rf);
    const json* type = Field(*rf, "type");
    if (!type || !type->is_string() || type->get_ref<const std::string&>() != "text")
      return BadRequest("response_format: only {\"type\": \"text\"} is supported", "response_format", "unsupported_value");
  }
  return std::nullopt;
}

}  // namespace

ApiOr<ParsedRequest> ParseRequestJson(const json& o, Endpoint ep, const ModelInfo& model) {
  if (!o.is_object()) return BadRequest("the request body must be a JSON object, got " + TypeName(o));
  ParsedRequest r;
  r.endpoint = ep;
  r.model = model.id;
  if (const json* m = Field(o, "model")) {
    if (!m->is_string()) return WrongType("model", "a string", *m);
    const std::string& name = m->get_ref<const std::string&>();
    if (!name.empty()) API_RETURN_IF_ERROR(CheckModelId(name, model));
  }
  API_RETURN_IF_ERROR(ParseUnsupported(o, ep));
  API_RETURN_IF_ERROR(ParseLogprobs(o, ep, &r.completion.logprobs));
  std::optional<bool> echo;
  API_RETURN_IF_ERROR(OptBool(o, "echo", &echo));
  if (echo.value_or(false) && ep == Endpoint::kChat)
    return BadRequest("echo is a completions field (chat has no prompt text to echo)", "echo", "unsupported_parameter");
  r.echo = echo.value_or(false);
  r.completion.prompt_logprobs = r.echo && r.completion.logprobs >= 0;
  std::optional<bool> stream, ignore_eos, return_ids;
  API_RETURN_IF_ERROR(OptBool(o, "stream", &stream));
  API_RETURN_IF_ERROR(OptBool(o, "ignore_eos", &ignore_eos));
  API_RETURN_IF_ERROR(OptBool(o, "return_token_ids", &return_ids));
  r.stream = stream.value_or(false);
  r.completion.ignore_eos = ignore_eos.value_or(false);
  r.return_token_ids = return_ids.value_or(false);
  std::optional<bool> cache_prompt;  // llama-server's: reuse a cached prefix (default true)
  API_RETURN_IF_ERROR(OptBool(o, "cache_prompt", &cache_prompt));
  r.completion.cache_prompt = cache_prompt.value_or(true);
  if (const json* so = Field(o, "stream_options")) {
    if (!so->is_object()) return WrongType("stream_options", "an object", *so);
    if (!r.stream) return BadRequest("stream_options is only allowed when stream is true", "stream_options");
    std::optional<bool> iu;
    if (const json* v = Field(*so, "include_usage")) {
      if (!v->is_boolean()) return WrongType("stream_options.include_usage", "a boolean", *v);
      iu = v->get<bool>();
    }
    r.include_usage = iu.value_or(false);
  }
  r.completion.sampling = model.default_sampling;
  API_RETURN_IF_ERROR(ParseSampling(o, model, &r.completion.sampling));
  API_RETURN_IF_ERROR(ParseInert(o, r.completion.sampling));
  r.completion.stop_ids = model.default_stop_ids;
  // stop_token_ids (vLLM): ids whose generation ends the request, even with ignore_eos
  // (CompletionRequest::stop_token_ids); up to 64, each in the vocabulary.
  if (const json* v = Field(o, "stop_token_ids")) {
    if (!v->is_null()) {
      if (!v->is_array()) return WrongType("stop_token_ids", "an array of token ids", *v);
      if (v->size() > 64) return BadRequest("stop_token_ids: at most 64 ids, got " + std::to_string(v->size()), "stop_token_ids");
      API_RETURN_IF_ERROR(TokenIds(*v, "stop_token_ids", model, &r.completion.stop_token_ids));
    }
  }
  auto stops = ParseStop(o);
  if (!stops.ok()) return stops.error();
  r.completion.stop = std::move(stops.value());
  if (!r.completion.stop.empty() && !model.tokenizer)
    return BadRequest("stop: this model has no tokenizer, so stop strings cannot be matched", "stop", "unsupported_value");

  std::optional<int64_t> max_tokens, max_completion, n_predict;
  API_RETURN_IF_ERROR(OptInt(o, "max_tokens", &max_tokens));
  API_RETURN_IF_ERROR(OptInt(o, "max_completion_tokens", &max_completion));
  const char* mt_param = max_completion ? "max_completion_tokens" : "max_tokens";
  if (max_completion) max_tokens = max_completion;
  // n_predict (llama-server's name): the same as max_tokens, and -1 = until the context is full.
  bool until_full = false;
  API_RETURN_IF_ERROR(OptInt(o, "n_predict", &n_predict));
  if (n_predict) {
    if (*n_predict == 0 || *n_predict < -1)
      return BadRequest("n_predict must be -1 (until the context is full) or at least 1, got " + std::to_string(*n_predict), "n_predict");
    if (max_tokens && *max_tokens != *n_predict)
      return BadRequest(std::string("n_predict (llama-server's name) and ") + mt_param + " are the same setting but differ (" +
                            std::to_string(*n_predict) + " and " + std::to_string(*max_tokens) + "); give one of them",
                        "n_predict");
    if (*n_predict == -1) until_full = true;
    else if (!max_tokens) max_tokens = n_predict, mt_param = "n_predict";
  }
  // 0 with echo: the prompt alone, scored (OpenAI's legacy completions and vLLM take it so).
  if (max_tokens && *max_tokens < (r.echo ? 0 : 1))
    return BadRequest(std::string(mt_param) + " must be at least " + (r.echo ? "0 with echo" : "1") + ", got " +
                          std::to_string(*max_tokens),
                      mt_param);
  if (max_tokens && *max_tokens > model.context_size)
    return BadRequest(std::string(mt_param) + " is too large: " + std::to_string(*max_tokens) + "; the context size is " +
                          std::to_string(model.context_size) + " tokens (prompt and completion together)",
                      mt_param);

  const char* prompt_param = ep == Endpoint::kChat ? "messages" : "prompt";
  if (ep == Endpoint::kChat) {
    if (!model.tokenizer)
      return BadRequest("messages: this model has no tokenizer; use /v1/completions with token ids", "messages", "unsupported_value");
    auto text = RenderMessages(o, model, &r.channels);
    if (!text.ok()) return text.error();
    r.prompt_text = std::move(text.value());
    API_RETURN_IF_ERROR(EncodePrompt(r.prompt_text, model, "messages", &r.completion.prompt));
    // With tools the model's next move after its calls is "<|tool_response>": the caller's turn.
    if (r.channels && r.channels->tools) {
      const std::vector<int32_t> id = model.tokenizer->Encode("<|tool_response>", false, true);
      if (id.size() == 1) r.completion.stop_ids.push_back(id[0]);
    }
  } else {
    API_RETURN_IF_ERROR(ParsePrompt(o, model, &r));
  }
  const int64_t p = static_cast<int64_t>(r.completion.prompt.size());
  if (p >= model.context_size)
    return BadRequest("This model's maximum context length is " + std::to_string(model.context_size) +
                          " tokens. However, your prompt has " + std::to_string(p) + " tokens, which leaves no room for a completion.",
                      prompt_param, "context_length_exceeded");
  if (max_tokens && p + *max_tokens > model.context_size)
    return BadRequest("This model's maximum context length is " + std::to_string(model.context_size) + " tokens. However, you requested " +
                          std::to_string(p + *max_tokens) + " tokens (" + std::to_string(p) + " in the prompt, " +
                          std::to_string(*max_tokens) + " for the completion). Reduce the prompt or " + mt_param + ".",
                      mt_param, "context_length_exceeded");
  const int64_t room = model.context_size - p;
  r.completion.max_tokens =
      static_cast<int>(max_tokens ? *max_tokens : (ep == Endpoint::kChat || until_full ? room : std::min<int64_t>(16, room)));
  return r;
}

ApiOr<ParsedRequest> ParseChatRequest(std::string_view body, const ModelInfo& model) {
  auto j = ParseJsonBody(body);
  if (!j.ok()) return j.error();
  return ParseRequestJson(j.value(), Endpoint::kChat, model);
}

ApiOr<ParsedRequest> ParseCompletionRequest(std::string_view body, const ModelInfo& model) {
  auto j = ParseJsonBody(body);
  if (!j.ok()) return j.error();
  return ParseRequestJson(j.value(), Endpoint::kCompletion, model);
}

}  // namespace g4::server
