// Responses: a request's events -> chat.completion / text_completion JSON and SSE chunks (api.h).

#include "server/api.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "server/api_internal.h"
#include "server/chat_tools.h"
#include "tokenizer/utf8.h"

namespace g4::server {

using namespace api_internal;

// ---- responses ----

std::string NewResponseId(Endpoint endpoint) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-";
  for (int i = 0; i < 24; ++i) id += kHex[rng() & 15];
  return id;
}

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

ResponseMeta ResponseMetaFor(const ParsedRequest& p, Endpoint endpoint, const Tokenizer* tokenizer) {
  ResponseMeta meta;
  meta.id = NewResponseId(endpoint);
  meta.created = UnixNow();
  meta.model = p.model;
  meta.endpoint = endpoint;
  meta.include_usage = p.include_usage;
  meta.return_token_ids = p.return_token_ids;
  if (p.return_token_ids) meta.prompt_token_ids = p.completion.prompt;
  meta.logprobs = p.completion.logprobs;
  meta.tokenizer = tokenizer;
  if (endpoint == Endpoint::kChat && p.channels) {
    meta.channels = p.channels;
    meta.stream_channels = std::make_shared<Gemma4OutputParser>(*p.channels);
  }
  if (p.echo) {
    meta.echo = true;
    meta.prompt_token_ids = p.completion.prompt;
    if (p.ids_bos_added) {  // echo the ids as sent (ResponseMeta::echo_without_bos)
      meta.echo_without_bos = true;
      meta.prompt_token_ids.erase(meta.prompt_token_ids.begin());
    }
    // The prompt as given; a prompt of ids as its text (the BOS this server added shows nothing).
    meta.echo_text = !p.prompt_text.empty() || tokenizer == nullptr
                         ? p.prompt_text
                         : tokenizer->Decode(p.completion.prompt, /*skip_special=*/true);
  }
  return meta;
}

std::string FinishReason(const CompletionEvent& e) { return e.finish_reason == "length" ? "length" : "stop"; }

json UsageJson(const CompletionEvent& e) {
  return json{{"prompt_tokens", e.prompt_tokens},
              {"completion_tokens", e.completion_tokens},
              {"total_tokens", e.prompt_tokens + e.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", e.cached_tokens}}}};
}

json TimingsJson(const CompletionEvent& e) {
  auto per = [](double ms, int n) { return n > 0 && ms > 0 ? ms / n : 0.0; };
  auto rate = [](double ms, int n) { return n > 0 && ms > 0 ? 1000.0 * n / ms : 0.0; };
  const int prefilled = e.prompt_tokens - e.cached_tokens;  // llama-server's prompt_n: cache_n not counted
  return json{{"prompt_n", prefilled},
              {"cache_n", e.cached_tokens},
              {"prompt_ms", e.prompt_ms},
              {"prompt_per_token_ms", per(e.prompt_ms, prefilled)},
              {"prompt_per_second", rate(e.prompt_ms, prefilled)},
              {"predicted_n", e.completion_tokens},
              {"predicted_ms", e.predicted_ms},
              {"predicted_per_token_ms", per(e.predicted_ms, e.completion_tokens)},
              {"predicted_per_second", rate(e.predicted_ms, e.completion_tokens)},
              {"queue_ms", e.queue_ms}};
}

namespace {

json Envelope(const ResponseMeta& meta, bool chunk) {
  const char* object = meta.endpoint == Endpoint::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return json{{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

// A streaming choice: chat {"delta": {...}}, completions {"text": ...}.
json ChunkChoice(const ResponseMeta& meta, const json& delta, const std::string& text) {
  json c = {{"index", 0}};
  if (meta.endpoint == Endpoint::kChat) c["delta"] = delta;
  else c["text"] = text;
  c["logprobs"] = nullptr;
  c["finish_reason"] = nullptr;
  return c;
}

// One token as logprobs name it: its text, or, where that text is not valid UTF-8 on its own
// (a byte token of a character split over several), "bytes:\\xNN..." as OpenAI names such tokens,
// so that no two byte tokens share a name (completions' top_logprobs are keyed by it); `bytes`
// exact. Without a tokenizer: "token_id:N" (vLLM's form).
void TokenFields(const ResponseMeta& meta, int32_t id, std::string* text, json* bytes) {
  const std::string raw = meta.tokenizer ? meta.tokenizer->TokenText(id) : std::string();
  *bytes = json::array();
  for (const char c : raw) bytes->push_back(static_cast<int>(static_cast<unsigned char>(c)));
  if (meta.tokenizer == nullptr) {
    *text = "token_id:" + std::to_string(id);
  } else if (utf8::IsValid(raw)) {
    *text = raw;
  } else {
    static constexpr char kHex[] = "0123456789abcdef";
    *text = "bytes:";
    for (const char c : raw) {
      const auto b = static_cast<unsigned char>(c);
      *text += std::string("\\x") + kHex[b >> 4] + kHex[b & 15];
    }
  }
}

// A logprob as JSON: -inf (a token the model gives no probability) as -9999.0, as vLLM and OpenAI
// write it (JSON has no infinity; nlohmann would write null).
json LogprobValue(float x) { return std::isinf(x) ? json(-9999.0) : json(x); }

// choice.logprobs for `lps` (OpenAI's shapes, api.h), or null when not asked for; with `prompt`
// (completions' echo), the prompt's tokens first (meta.prompt_token_ids[0] with null, then
// `prompt`'s entries for the rest). Completions' text_offset starts at *text_offset, which moves past these tokens by the characters each adds
// to the returned text (the lead bytes of its text: none for a control token, which the text
// does not show; one for the first byte token of a character, none for the others).
json LogprobsJson(const ResponseMeta& meta, const std::vector<TokenLogprobs>& lps, int64_t* text_offset,
                  const std::vector<TokenLogprobs>* prompt = nullptr) {
  if (meta.logprobs < 0) return nullptr;
  std::string text;
  json bytes;
  if (meta.endpoint == Endpoint::kChat) {
    json content = json::array();
    for (const TokenLogprobs& lp : lps) {
      TokenFields(meta, lp.id, &text, &bytes);
      json top = json::array();
      for (const auto& [id, logprob] : lp.top) {
        std::string t;
        json b;
        TokenFields(meta, id, &t, &b);
        top.push_back(json{{"token", t}, {"logprob", LogprobValue(logprob)}, {"bytes", b}});
      }
      content.push_back(
          json{{"token", text}, {"logprob", LogprobValue(lp.logprob)}, {"bytes", bytes}, {"top_logprobs", top}});
    }
    return json{{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  // text_offset: characters (code points) of the returned text before the token. A token whose
  // text starts inside a character (a byte token after the first of a split character) is at that
  // character's start. Generated tokens: each adds the lead bytes of its text, control tokens
  // (which the text does not show) none. Echoed prompt tokens are found in the prompt's text as
  // sent, where special tokens typed in a string prompt show as written and a BOS the server added
  // does not.
  auto is_lead = [](char ch) { return (static_cast<unsigned char>(ch) & 0xC0) != 0x80; };
  auto entry = [&](const TokenLogprobs* lp, int32_t id, int64_t offset) {
    TokenFields(meta, id, &text, &bytes);
    tokens.push_back(text);
    offsets.push_back(offset);
    if (lp == nullptr) {  // echo: the prompt's first token has no log-probability (nothing precedes it)
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      return;
    }
    token_logprobs.push_back(LogprobValue(lp->logprob));
    json top = json::object();
    for (const auto& [tid, logprob] : lp->top) {
      std::string t;
      json b;
      TokenFields(meta, tid, &t, &b);
      if (!top.contains(t)) top[t] = LogprobValue(logprob);
    }
    // The sampled token always (OpenAI's legacy completions: up to logprobs + 1 entries).
    if (!top.contains(text)) top[text] = LogprobValue(lp->logprob);
    top_logprobs.push_back(top);
  };
  if (prompt != nullptr && !meta.prompt_token_ids.empty()) {
    const std::string& echoed = meta.echo_text;
    size_t at = 0;  // bytes of echoed matched so far
    int64_t chars = 0;  // code points of echoed[0, start of the character holding `at`)
    size_t counted = 0;  // bytes of echoed that `chars` covers
    for (size_t i = 0; i < meta.prompt_token_ids.size(); ++i) {
      const int32_t id = meta.prompt_token_ids[i];
      const std::string raw = meta.tokenizer ? meta.tokenizer->TokenText(id) : std::string();
      size_t start = std::min(at, echoed.size());
      while (start > 0 && start < echoed.size() && !is_lead(echoed[start])) --start;  // inside a character
      for (; counted < start; ++counted) chars += is_lead(echoed[counted]);
      const size_t k = meta.echo_without_bos ? i : i - 1;  // prompt_logprobs[k]: the full prompt's token k + 1
      entry(!meta.echo_without_bos && i == 0 ? nullptr : (k < prompt->size() ? &(*prompt)[k] : nullptr), id, chars);
      if (!raw.empty() && echoed.compare(at, raw.size(), raw) == 0) at += raw.size();
    }
    *text_offset = 0;
    for (const char ch : echoed) *text_offset += is_lead(ch);
  }
  for (const TokenLogprobs& lp : lps) {
    const std::string raw = meta.tokenizer ? meta.tokenizer->TokenText(lp.id) : std::string();
    const int32_t one[] = {lp.id};
    const bool shown = meta.tokenizer != nullptr && !meta.tokenizer->Decode(one, /*skip_special=*/true).empty();
    const bool continues = shown && !raw.empty() && !is_lead(raw[0]) && *text_offset > 0;
    entry(&lp, lp.id, *text_offset - (continues ? 1 : 0));
    if (shown) *text_offset += std::count_if(raw.begin(), raw.end(), is_lead);
  }
  return json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}, {"text_offset", offsets}};
}

// A chat message's or delta's channel fields: content (null in a message with calls and no text),
// reasoning_content, tool_calls (ids made here; streamed with their index).
void ChannelFields(ResponseMeta& meta, const ChannelDelta& d, bool stream, json* out) {
  if (!d.content.empty() || !stream) (*out)["content"] = d.content.empty() && !d.calls.empty() ? json(nullptr) : json(d.content);
  if (!d.reasoning.empty()) (*out)["reasoning_content"] = d.reasoning;
  if (d.calls.empty()) return;
  json calls = json::array();
  for (const ParsedToolCall& c : d.calls) calls.push_back(ToolCallJson(c, NewToolCallId(), meta.tool_calls_sent++, stream));
  (*out)["tool_calls"] = std::move(calls);
}

std::string ChatFinishReason(const ResponseMeta& meta, const CompletionEvent& e) {
  return meta.tool_calls_sent > 0 ? "tool_calls" : FinishReason(e);
}

std::string Chunk(const ResponseMeta& meta, json choice) {
  json j = Envelope(meta, true);
  j["choices"] = json::array({std::move(choice)});
  if (meta.include_usage) j["usage"] = nullptr;
  return SseEvent(j);
}

}  // namespace

json CompletionResponseJson(const ResponseMeta& meta, const CompletionResult& r) {
  json j = Envelope(meta, false);
  json c = {{"index", 0}};
  ResponseMeta m = meta;  // counts the calls
  if (meta.endpoint == Endpoint::kChat && meta.channels) {
    Gemma4OutputParser parser(*meta.channels);
    ChannelDelta d = parser.Push(r.text);
    d.Append(parser.Finish());
    json message = {{"role", "assistant"}};
    ChannelFields(m, d, /*stream=*/false, &message);
    c["message"] = std::move(message);
  } else if (meta.endpoint == Endpoint::kChat) {
    c["message"] = json{{"role", "assistant"}, {"content", r.text}};
  } else {
    c["text"] = meta.echo ? meta.echo_text + r.text : r.text;
  }
  int64_t text_offset = 0;
  c["logprobs"] = LogprobsJson(meta, r.logprobs, &text_offset, meta.echo ? &r.prompt_logprobs : nullptr);
  c["finish_reason"] = ChatFinishReason(m, r.final_event);
  if (!r.final_event.degenerate.empty()) c["degenerate"] = r.final_event.degenerate;
  if (meta.return_token_ids) c["token_ids"] = r.tokens;
  j["choices"] = json::array({c});
  j["usage"] = UsageJson(r.final_event);
  j["timings"] = TimingsJson(r.final_event);
  if (meta.return_token_ids) j["prompt_token_ids"] = meta.prompt_token_ids;
  return j;
}

std::string SseEvent(const json& j) { return "data: " + Dump(j) + "\n\n"; }

std::string EchoChunk(ResponseMeta& meta, const std::vector<TokenLogprobs>& prompt_logprobs) {
  json choice = ChunkChoice(meta, json::object(), meta.echo_text);
  choice["logprobs"] = LogprobsJson(meta, {}, &meta.text_offset, &prompt_logprobs);
  return Chunk(meta, std::move(choice));
}

std::string FirstChunk(ResponseMeta& meta) {
  if (meta.endpoint != Endpoint::kChat) return meta.echo && meta.logprobs < 0 ? EchoChunk(meta, {}) : "";
  json choice = ChunkChoice(meta, json{{"role", "assistant"}, {"content", ""}}, "");
  if (meta.return_token_ids) choice["prompt_token_ids"] = meta.prompt_token_ids;
  return Chunk(meta, std::move(choice));
}

std::string DeltaChunk(ResponseMeta& meta, const CompletionEvent& e) {
  json delta = {{"content", e.text}};
  if (meta.stream_channels) {
    delta = json::object();
    ChannelFields(meta, meta.stream_channels->Push(e.text), /*stream=*/true, &delta);
    if (delta.empty()) delta["content"] = "";
  }
  json choice = ChunkChoice(meta, delta, e.text);
  choice["logprobs"] = LogprobsJson(meta, e.logprobs, &meta.text_offset);
  if (meta.return_token_ids) choice["token_ids"] = e.tokens;
  return Chunk(meta, std::move(choice));
}

std::string FinalChunks(ResponseMeta& meta, const CompletionEvent& e) {
  json delta = json::object();
  if (meta.stream_channels) {
    ChannelDelta d = meta.stream_channels->Push(e.text);
    d.Append(meta.stream_channels->Finish());
    ChannelFields(meta, d, /*stream=*/true, &delta);
  } else if (!e.text.empty()) {
    delta["content"] = e.text;
  }
  json choice = ChunkChoice(meta, delta, e.text);
  choice["logprobs"] = LogprobsJson(meta, e.logprobs, &meta.text_offset);
  choice["finish_reason"] = ChatFinishReason(meta, e);
  if (!e.degenerate.empty()) choice["degenerate"] = e.degenerate;
  if (meta.return_token_ids) choice["token_ids"] = e.tokens;
  json j = Envelope(meta, true);
  j["choices"] = json::array({choice});
  if (meta.include_usage) j["usage"] = nullptr;
  j["timings"] = TimingsJson(e);
  std::string out = SseEvent(j);
  if (meta.include_usage) {
    json u = Envelope(meta, true);
    u["choices"] = json::array();
    u["usage"] = UsageJson(e);
    out += SseEvent(u);
  }
  out += kSseDone;
  return out;
}

std::string ErrorChunks(const ApiError& e) { return SseEvent(ErrorJson(e)) + std::string(kSseDone); }

}  // namespace g4::server
