// The OpenAI-compatible request/response layer of `gemma4rt serve`, as pure functions (no HTTP, no
// threads): request JSON -> validated CompletionRequest, scheduler events -> response JSON/SSE.
// Conventions: ../shared/spec/serving.md (OpenAI shapes, llama-server extras, vLLM ranges).
//
// Requests (POST /v1/chat/completions, POST /v1/completions):
//   model              optional string; must be one of ModelInfo::accepted_ids, else 404 model_not_found
//   messages (chat)    non-empty array of {role: system|developer|user|assistant|model, content:
//                      string | [{type:"text", text}] | null (assistant only)}; rendered with the
//                      model family's chat template (which writes <bos>), then encoded without BOS
//   prompt (compl.)    string | [string] | [int] | [[int]]; raw text, no template; exactly one BOS
//                      (added unless the prompt already starts with it). More than one prompt: 400.
//   max_completion_tokens / max_tokens   int >= 1, or 0 with echo (the prompt alone); the former
//                      wins. Default: chat = the rest of the context (vLLM), completions = 16 (OpenAI, vLLM). prompt + max_tokens must
//                      fit the context (400 context_length_exceeded).
//   n_predict          llama-server's max_tokens: int >= 1, or -1 = the rest of the context (both
//                      endpoints). Given with max_tokens / max_completion_tokens: must be equal (400).
//   temperature, top_p, top_k, min_p, presence_penalty, frequency_penalty, repetition_penalty
//   (alias repeat_penalty, llama-server's name), logit_bias   as SamplingParams (ranges in
//                      sampler.h); unset fields keep the model's generation defaults
//                      (generation_config.json). presence/frequency_penalty count generated tokens
//                      only (OpenAI), not llama.cpp's last-64-tokens window of prompt and output.
//   seed               int in [0, 2^64) = reproducible; -1 (llama.cpp's "random") = no seed: a
//                      fresh random one per request; other negative values: 400.
//   stop               string | [string] (empty strings ignored, at most 16)
//   n                  int; only 1 is supported (n > 1: 400 naming `n`)
//   logprobs / top_logprobs   chat: logprobs bool, top_logprobs 0..20 (above 0 only with logprobs
//                      true); completions: logprobs 0..20 (or a bool, as chat). Each generated
//                      token's log-probability and the top_logprobs most likely tokens', under the
//                      raw logits' softmax (ComputeLogprobs, runtime/sampler.h: before penalties,
//                      biases, temperature and filters, as vLLM's default), in OpenAI's shapes:
//                      chat choice.logprobs {content: [{token, logprob, bytes, top_logprobs:
//                      [{token, logprob, bytes}]}], refusal: null}; completions choice.logprobs
//                      {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}.
//                      One entry per generated token (completion_tokens of them), the token that
//                      ended the generation (end of turn) included; streamed with the chunk that
//                      carries the token's text (or the final chunk). `token` is the token's text
//                      ("bytes:\\xNN..." where that is not valid UTF-8 on its own: a byte of a
//                      character split over tokens), `bytes` its exact bytes; completions'
//                      top_logprobs also hold the sampled token; text_offset counts the characters
//                      (code points) of the returned text before the token (the bytes of a
//                      character split over tokens all at its start; control tokens the text does
//                      not show take none; echoed special tokens typed in a string prompt count as
//                      written); -inf is written -9999.0.
//   stream, stream_options.include_usage   (stream_options without stream: 400)
//   chat_template_kwargs.enable_thinking   Gemma 4 thinking switch
//   add_generation_prompt (top level, llama-server/vLLM) or chat_template_kwargs.add_generation_prompt
//                      bool, default true: end the prompt with the model turn's header. The two
//                      places disagreeing: 400. continue_final_message true (vLLM): 400.
//   ignore_eos (vLLM), return_token_ids (vLLM: choice.token_ids + prompt_token_ids)
//   cache_prompt (llama-server)   bool, default true: reuse the prompt's prefix a slot's KV cache
//                      holds (CompletionRequest::cache_prompt); the output is the same either way.
//   echo (completions)  bool: the prompt's text before the completion's, and with logprobs the
//                      prompt's tokens first in choice.logprobs (the first with null logprob and
//                      top_logprobs, then each given the tokens before it: CompletionRequest::
//                      prompt_logprobs; a token-id prompt as sent, without the BOS the server
//                      added, its first id then given that BOS); streamed as the first chunk.
//                      Chat: 400.
//   tools, tool_choice, parallel_tool_calls, reasoning_effort, reasoning_format, messages'
//                      tool_calls / tool messages: chat_tools.h (Gemma 4; tools on Gemma 3: 400)
//   suffix / best_of > 1 / non-text response_format: 400 (not supported)
//
// Field names from other servers (users arrive with llama-server's and vLLM's request bodies). A
// field that would change what is generated is never silently ignored: it is either
//   - an alias honoured with the same meaning and validation as ours: repeat_penalty =
//     repetition_penalty, n_predict = max_tokens; the alias and our name together with different
//     values are a 400 naming the alias; or
//   - accepted only at the value that switches it off and a 400 unsupported_parameter otherwise
//     (api.cc kInert): typical_p 1, top_n_sigma <= 0, xtc_probability 0, dynatemp_range 0,
//     mirostat 0, dry_multiplier 0, min_keep <= 1, n_probs 0, t_max_predict_ms 0, n_indent 0,
//     empty grammar / json_schema / samplers (llama-server); min_tokens 0, use_beam_search false,
//     include_stop_str_in_output false, empty bad_words / allowed_token_ids /
//     guided_json / guided_regex / guided_choice / guided_grammar / structured_outputs (vLLM).
//   - repeat_last_n (llama-server): the repetition penalty's window (SamplingParams::
//     repetition_window), -1 (all of prompt + output) to 2^31 - 1; stop_token_ids (vLLM): up to
//     64 ids that end the request when generated, even with ignore_eos
//     (CompletionRequest::stop_token_ids).
// Fields that cannot change the tokens are ignored like any unknown field: id_slot,
// n_keep, n_discard (no context shifting here: a prompt that does not fit is a 400), the settings
// of samplers that are off (xtc_threshold, dry_base, dry_allowed_length, dry_penalty_last_n,
// dry_sequence_breakers, mirostat_tau, mirostat_eta, dynatemp_exponent), and penalize_nl and tfs_z,
// which llama.cpp no longer reads either.
// Unknown fields are ignored (OpenAI SDKs send extras). Every error is an ApiError with the HTTP
// status, an OpenAI `type`, the offending `param` (JSON path, e.g. "messages[1].content") and a
// `code` where one applies.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "server/tool_calls.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace g4::server {

// An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" -> null
  std::string code;   // "" -> null
};

// 400 invalid_request_error naming `param`.
ApiError BadRequest(std::string message, std::string param = "", std::string code = "");
// The status's usual type and code (401 authentication_error/invalid_api_key, 404 not_found,
// 413 request_too_large, 429 rate_limit_error/queue_full, 499 client_closed_request (nginx's, for a
// client that hung up: counted, never received), 503 unavailable_error, 500 server_error).
ApiError ErrorForStatus(int status, std::string message);
nlohmann::json ErrorJson(const ApiError& e);
// A Status from the engine/scheduler as an ApiError: InvalidArgument -> 400 (param = the message's
// first word when it names a field; "context_length_exceeded:" -> that code), ResourceExhausted ->
// 429, FailedPrecondition -> 503, anything else -> 500.
ApiError FromStatus(const Status& s);

// A value or an ApiError.
template <typename T>
class ApiOr {
 public:
  ApiOr(ApiError e) : v_(std::move(e)) {}
  ApiOr(T v) : v_(std::move(v)) {}
  bool ok() const { return std::holds_alternative<T>(v_); }
  const ApiError& error() const { return std::get<ApiError>(v_); }
  T& value() { return std::get<T>(v_); }
  const T& value() const { return std::get<T>(v_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<ApiError, T> v_;
};

// What the request layer needs to know about the served model.
struct ModelInfo {
  std::string id;                         // the id responses carry and /v1/models lists
  std::vector<std::string> accepted_ids;  // ids a request's `model` may name (id, file/dir name, path)
  ChatTemplateKind template_kind = ChatTemplateKind::kGemma3;
  const Tokenizer* tokenizer = nullptr;   // null: token-id prompts only, no chat, no stop strings
  int context_size = 0;                   // tokens per sequence (prompt + completion)
  int vocab_size = 0;                     // valid prompt ids are [0, vocab_size)
  int32_t bos_id = 2;
  SamplingParams default_sampling;        // the model's generation defaults
  std::vector<int32_t> default_stop_ids;  // from the model's generation config
  int64_t created = 0;                    // unix time the model was loaded
};

enum class Endpoint { kChat, kCompletion };

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;            // the id to answer with (ModelInfo::id)
  std::string prompt_text;      // chat: the rendered template; completion: the prompt string ("" for ids)
  CompletionRequest completion; // ready for Scheduler::Submit
  bool stream = false;
  bool include_usage = false;
  bool return_token_ids = false;
  bool echo = false;            // completions' echo (CompletionRequest::prompt_logprobs with logprobs)
  bool ids_bos_added = false;   // completions: a token-id prompt to which the server added the BOS
  // Chat on Gemma 4: how the output splits into content, reasoning_content and tool_calls
  // (chat_tools.h); unset: all of it is content.
  std::optional<OutputParserOptions> channels;
};

// Parses the raw body (must be a JSON object) of POST /v1/chat/completions or /v1/completions.
ApiOr<ParsedRequest> ParseChatRequest(std::string_view body, const ModelInfo& model);
ApiOr<ParsedRequest> ParseCompletionRequest(std::string_view body, const ModelInfo& model);
// The same from an already parsed document (the fuzzer and tests use both paths).
ApiOr<ParsedRequest> ParseRequestJson(const nlohmann::json& j, Endpoint endpoint, const ModelInfo& model);

// Parses a body as a JSON object. Malformed JSON -> 400 (the parser's message); bytes that are not
// UTF-8 inside a string -> 400 naming that string's path ("messages[0].content").
ApiOr<nlohmann::json> ParseJsonBody(std::string_view body);

// llama-server extras.
//   POST /tokenize     {"content": str, "add_special": bool=false, "parse_special": bool=true,
//                       "with_pieces": bool=false} -> {"tokens": [id | {"id", "piece"}]}
//   POST /detokenize   {"tokens": [int]} -> {"content": str}
//   POST /apply-template  {"messages": [...], "add_generation_prompt": bool=true,
//                       "chat_template_kwargs": {...}} -> {"prompt": str}: the chat request's
//                       rendering (same template options), not tokenized
ApiOr<nlohmann::json> HandleTokenize(std::string_view body, const ModelInfo& model);
ApiOr<nlohmann::json> HandleDetokenize(std::string_view body, const ModelInfo& model);
ApiOr<nlohmann::json> HandleApplyTemplate(std::string_view body, const ModelInfo& model);

// GET /v1/models.
nlohmann::json ModelsJson(const ModelInfo& model);
// GET /v1/models/{id} (OpenAI's retrieve): the model object of ModelsJson if `id` is one the
// server accepts in requests' "model" (ModelInfo::accepted_ids), else 404 model_not_found.
ApiOr<nlohmann::json> ModelJson(std::string_view id, const ModelInfo& model);

// ---- responses ----

// Identity of one response: id ("chatcmpl-..." / "cmpl-..."), creation time, model id.
struct ResponseMeta {
  std::string id;
  int64_t created = 0;
  std::string model;
  Endpoint endpoint = Endpoint::kChat;
  bool include_usage = false;
  bool return_token_ids = false;
  std::vector<int32_t> prompt_token_ids;  // echoed with return_token_ids; the first token's name with echo
  int logprobs = -1;                      // CompletionRequest::logprobs: -1 = choice.logprobs null
  const Tokenizer* tokenizer = nullptr;   // the tokens' texts in logprobs (null: "")
  int64_t text_offset = 0;                // a stream's completions logprobs: characters of the tokens already sent
  bool echo = false;                      // completions: the prompt's text (echo_text) comes first
  std::string echo_text;
  // echo of a token-id prompt the server put a BOS in front of: prompt_token_ids are the ids as
  // sent, and their entries are prompt_logprobs[0..] (the first id's given that BOS), as vLLM
  // echoes id prompts as given (lm-evaluation-harness slices the entries by its own token count).
  bool echo_without_bos = false;
  // Chat with ParsedRequest::channels: the message's content, reasoning_content and tool_calls
  // (finish_reason "tool_calls" when there are calls); a stream's parser and the calls it sent.
  std::optional<OutputParserOptions> channels;
  std::shared_ptr<Gemma4OutputParser> stream_channels;
  int tool_calls_sent = 0;
};
// A fresh id with the endpoint's prefix and 24 random hex digits.
std::string NewResponseId(Endpoint endpoint);
int64_t UnixNow();
// The response's meta for a parsed request: a fresh id, the time now, what the request asked to
// be echoed and how; `tokenizer` (may be null) names the logprobs' tokens and the echoed ids.
ResponseMeta ResponseMetaFor(const ParsedRequest& p, Endpoint endpoint, const Tokenizer* tokenizer);

// What a finished request produced: the concatenated text and ids and the final event.
struct CompletionResult {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;  // one per token when asked for (ResponseMeta::logprobs >= 0)
  std::vector<TokenLogprobs> prompt_logprobs;  // echo with logprobs: the prompt's (CompletionEvent)
  CompletionEvent final_event;  // done == true
};

// "stop" or "length" (a "cancelled" request reports "stop"; it is only seen when shutting down).
std::string FinishReason(const CompletionEvent& final_event);
// {prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details: {cached_tokens}}
// (OpenAI's: the prompt tokens reused from the KV cache, counted in prompt_tokens too)
nlohmann::json UsageJson(const CompletionEvent& final_event);
// llama-server's timings: prompt_n (prompt tokens prefilled), cache_n (reused from the KV cache),
// prompt_ms, prompt_per_token_ms, prompt_per_second, predicted_n, predicted_ms,
// predicted_per_token_ms, predicted_per_second (+ queue_ms).
nlohmann::json TimingsJson(const CompletionEvent& final_event);

// The non-streamed response: chat.completion or text_completion. The choice carries
// "degenerate": "<why>" when the degeneracy guard ended the generation (finish_reason stays
// "stop"), "token_ids" with return_token_ids, and "logprobs" (else null) when asked for.
nlohmann::json CompletionResponseJson(const ResponseMeta& meta, const CompletionResult& result);

// Streaming (SSE). One `data: <json>\n\n` event per call.
std::string SseEvent(const nlohmann::json& j);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";
// The first chunk: chat: delta {role: "assistant", content: ""}; completions: nothing (returns ""),
// or with echo and no logprobs the EchoChunk.
std::string FirstChunk(ResponseMeta& meta);
// Completions' echo: a chunk of the prompt's text (meta.echo_text) and, with logprobs, its tokens'
// entries (the event that carries prompt_logprobs).
std::string EchoChunk(ResponseMeta& meta, const std::vector<TokenLogprobs>& prompt_logprobs);
// A content chunk for an event's text (and its tokens with return_token_ids, their logprobs when
// asked for; the stream's meta.text_offset moves past them: one meta per stream).
std::string DeltaChunk(ResponseMeta& meta, const CompletionEvent& event);
// The last content chunk: the final event's text, finish_reason, timings, degenerate (token ids and
// logprobs as DeltaChunk); then (with include_usage) the usage chunk with empty choices; then [DONE].
std::string FinalChunks(ResponseMeta& meta, const CompletionEvent& final_event);
// An error inside a stream (after the 200 went out): `data: {"error": ...}` then [DONE].
std::string ErrorChunks(const ApiError& e);

// Whether `s` is valid UTF-8 (shortest forms, no surrogates, <= U+10FFFF).
bool IsValidUtf8(std::string_view s);

// The API keys a request presents, from its Authorization and X-Api-Key header values ("" when a
// header is absent): the token of `Authorization: Bearer TOKEN`, the scheme in any case ("bearer",
// "BEARER": RFC 7235 schemes are case-insensitive) and any spaces or tabs around the token; then the
// value of `X-Api-Key: KEY` (llama-server's header), trimmed. Another scheme ("Basic ...", or a bare
// key without a scheme) presents nothing. The server accepts a request when any of them is one of
// its keys. No errors; 0, 1 or 2 keys.
std::vector<std::string> PresentedApiKeys(std::string_view authorization, std::string_view x_api_key);

}  // namespace g4::server
