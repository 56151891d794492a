// libFuzzer target for the server's request layer (src/server/api.h): every input is one request
// body for one endpoint, parsed and validated exactly as the HTTP server does; accepted requests
// are checked against the invariants the scheduler relies on and rendered into every response shape.
//
// Input: byte 0 picks the endpoint ('C' chat, 'P' completions, 'T' /tokenize, 'D' /detokenize,
// 'A' /apply-template; any other byte: its value mod 5) and, with its high bit set, a model without
// a tokenizer; the remaining bytes are the body. 'O' instead feeds the rest to Gemma 4's output
// parser (server/tool_calls.h) as model output: byte 1 picks its options and a split point; the
// channels must not depend on how the text is split, and every call's arguments are a JSON object. Seeds in fuzz/corpus/requests/; dictionary
// fuzz/request.dict. Built by fuzz/CMakeLists.txt (clang, -fsanitize=fuzzer,address,undefined; not
// part of the main build), run by scripts/fuzz-requests.sh and scripts/test-fuzz.sh. The tokenizer
// is the tiny Gemma 4 one from tests/data (path compiled in as REQUEST_FUZZ_TOKENIZER_DIR).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/api.h"
#include "server/tool_calls.h"
#include "tokenizer/tokenizer.h"

namespace {

using g4::server::ApiError;
using g4::server::Endpoint;
using g4::server::ModelInfo;

[[noreturn]] void Die(const char* what, std::string_view body) {
  std::fprintf(stderr, "request_fuzz: invariant violated: %s\nbody: %.*s\n", what, static_cast<int>(body.size()), body.data());
  std::abort();
}

const g4::Tokenizer* Tok() {
  static std::unique_ptr<g4::Tokenizer> t = [] {
    auto r = g4::Tokenizer::FromHfDirectory(REQUEST_FUZZ_TOKENIZER_DIR);
    if (!r.ok()) {
      std::fprintf(stderr, "request_fuzz: %s\n", r.status().ToString().c_str());
      std::abort();
    }
    return std::move(r).value();
  }();
  return t.get();
}

ModelInfo Info(bool tokenizer) {
  ModelInfo m;
  m.id = "tiny";
  m.accepted_ids = {"tiny", "tiny.gguf"};
  m.template_kind = g4::ChatTemplateKind::kGemma4;
  m.tokenizer = tokenizer ? Tok() : nullptr;
  m.context_size = 256;
  m.vocab_size = tokenizer ? Tok()->vocab_size() : 512;
  m.bos_id = 2;
  m.default_sampling.top_k = 64;
  m.default_sampling.top_p = 0.95f;
  m.default_stop_ids = {1, 106};
  return m;
}

void CheckError(const ApiError& e, std::string_view body) {
  if (e.status != 400 && e.status != 404) Die("a request error that is not 400/404", body);
  if (e.message.empty()) Die("an error without a message", body);
  const std::string dumped = g4::server::ErrorJson(e).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (!g4::server::IsValidUtf8(dumped)) Die("error JSON is not UTF-8", body);
}

// Fake log-probabilities for `ids`: each with `top_n` alternatives (ids from the vocabulary).
std::vector<g4::TokenLogprobs> FakeLogprobs(const std::vector<int32_t>& ids, int top_n, int vocab) {
  std::vector<g4::TokenLogprobs> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    g4::TokenLogprobs t;
    t.id = ids[i];
    t.logprob = i % 3 == 2 ? -std::numeric_limits<float>::infinity() : -0.25f * static_cast<float>(i);
    for (int k = 0; k < top_n; ++k) t.top.emplace_back((ids[i] + k) % vocab, -0.5f * static_cast<float>(k));
    out.push_back(std::move(t));
  }
  return out;
}

void CheckRequest(const g4::server::ParsedRequest& r, const ModelInfo& m, std::string_view body) {
  const g4::CompletionRequest& c = r.completion;
  if (c.prompt.empty()) Die("empty prompt accepted", body);
  if (c.prompt.front() != m.bos_id) Die("prompt does not start with BOS", body);
  if (c.prompt.size() > 1 && c.prompt[1] == m.bos_id && r.endpoint == Endpoint::kCompletion && !r.prompt_text.empty() &&
      r.prompt_text.rfind("<bos><bos>", 0) != 0)
    Die("double BOS", body);
  for (int32_t id : c.prompt)
    if (id < 0 || id >= m.vocab_size) Die("prompt id outside the vocabulary", body);
  if (r.echo && r.endpoint != Endpoint::kCompletion) Die("echo accepted on chat", body);
  // max_tokens >= 1, or 0 with completions' echo (the prompt alone).
  if (c.max_tokens < (r.echo ? 0 : 1)) Die("max_tokens below its minimum", body);
  if (static_cast<int64_t>(c.prompt.size()) + c.max_tokens > m.context_size) Die("prompt + max_tokens beyond the context", body);
  if (c.logprobs < -1 || c.logprobs > g4::kMaxTopLogprobs) Die("logprobs outside [-1, 20]", body);
  if (c.prompt_logprobs != (r.echo && c.logprobs >= 0)) Die("prompt_logprobs without echo and logprobs", body);
  if (r.ids_bos_added && (r.endpoint != Endpoint::kCompletion || !r.prompt_text.empty())) Die("BOS added to a text prompt", body);
  if (!c.sampling.ValidateForVocab(m.vocab_size).ok()) Die("invalid sampling params accepted", body);
  for (const std::string& s : c.stop)
    if (s.empty()) Die("empty stop string accepted", body);
  if (!c.stop.empty() && !m.tokenizer) Die("stop strings without a tokenizer", body);
  for (int32_t id : c.stop_token_ids)
    if (id < 0 || id >= m.vocab_size) Die("stop_token_ids outside the vocabulary", body);
  if (r.include_usage && !r.stream) Die("include_usage without stream", body);

  // Render every response shape from fake events, with the response meta the HTTP server builds.
  const g4::server::ResponseMeta meta = g4::server::ResponseMetaFor(r, r.endpoint, m.tokenizer);
  // Generated tokens: up to 4 of the prompt's ids (max_tokens of them at most).
  g4::CompletionEvent delta;
  delta.tokens.assign(c.prompt.begin(), c.prompt.begin() + std::min<size_t>(c.prompt.size(), std::min(c.max_tokens, 4)));
  size_t cut = std::min<size_t>(8, r.prompt_text.size());  // whole UTF-8 characters
  while (cut > 0 && cut < r.prompt_text.size() && (static_cast<unsigned char>(r.prompt_text[cut]) & 0xC0) == 0x80) --cut;
  delta.text = r.prompt_text.substr(0, cut);
  if (c.logprobs >= 0) delta.logprobs = FakeLogprobs(delta.tokens, c.logprobs, m.vocab_size);
  g4::CompletionEvent prompt_event;
  prompt_event.prompt = true;
  if (c.prompt_logprobs)
    prompt_event.prompt_logprobs = FakeLogprobs(std::vector<int32_t>(c.prompt.begin() + 1, c.prompt.end()), c.logprobs, m.vocab_size);
  g4::CompletionEvent fin;
  fin.done = true;
  fin.finish_reason = c.max_tokens & 1 ? "length" : "stop";
  fin.prompt_tokens = static_cast<int>(c.prompt.size());
  fin.completion_tokens = static_cast<int>(delta.tokens.size());

  g4::server::CompletionResult res;
  res.text = delta.text;
  res.tokens = delta.tokens;
  res.logprobs = delta.logprobs;
  res.prompt_logprobs = prompt_event.prompt_logprobs;
  res.final_event = fin;
  // As the server writes it (invalid UTF-8 from a token-id prompt's bytes replaced).
  std::string out = g4::server::CompletionResponseJson(meta, res).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  g4::server::ResponseMeta stream_meta = meta;
  out += g4::server::FirstChunk(stream_meta);
  if (c.prompt_logprobs) out += g4::server::EchoChunk(stream_meta, prompt_event.prompt_logprobs);
  out += g4::server::DeltaChunk(stream_meta, delta);
  out += g4::server::FinalChunks(stream_meta, fin);
  if (out.empty()) Die("no output", body);
}

// The channels of `text` fed in `pieces` (joined: all of `text`), in one string for comparison.
std::string Channels(const std::vector<std::string_view>& pieces, const g4::server::OutputParserOptions& o, std::string_view body) {
  g4::server::Gemma4OutputParser parser(o);
  g4::server::ChannelDelta all;
  for (std::string_view p : pieces) all.Append(parser.Push(p));
  all.Append(parser.Finish());
  std::string out = all.content + '\0' + all.reasoning;
  for (const auto& c : all.calls) {
    if (c.name.empty()) Die("a call without a name", body);
    auto args = nlohmann::json::parse(c.arguments, nullptr, false);
    if (!args.is_object()) Die("a call's arguments are not a JSON object", body);
    out += '\0' + c.name + '\0' + c.arguments;
  }
  return out;
}

void CheckOutputParser(std::string_view data) {
  if (data.empty()) return;
  const auto opt = static_cast<uint8_t>(data[0]);
  const std::string_view text = data.substr(1);
  g4::server::OutputParserOptions o;
  o.tools = opt & 1;
  o.reasoning = opt & 2;
  o.parallel_calls = opt & 4;
  if (opt & 8) o.forced_call_prefix = opt & 16 ? "call:" : "call:f{";
  const size_t cut = text.empty() ? 0 : (opt >> 5) * 977 % (text.size() + 1);
  const std::string whole = Channels({text}, o, data);
  if (Channels({text.substr(0, cut), text.substr(cut)}, o, data) != whole) Die("the channels depend on the split", data);
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(text.substr(i, 1));
  if (Channels(bytes, o, data) != whole) Die("the channels differ byte by byte", data);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t sel = data[0];
  if (sel == 'O') {
    CheckOutputParser(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
    return 0;
  }
  const bool tokenizer = (sel & 0x80) == 0;
  int ep = sel % 5;
  switch (sel) {
    case 'C': ep = 0; break;
    case 'P': ep = 1; break;
    case 'T': ep = 2; break;
    case 'D': ep = 3; break;
    case 'A': ep = 4; break;
  }
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  const ModelInfo m = Info(tokenizer);
  if (ep <= 1) {
    auto r = ep == 0 ? g4::server::ParseChatRequest(body, m) : g4::server::ParseCompletionRequest(body, m);
    if (r.ok()) CheckRequest(r.value(), m, body);
    else CheckError(r.error(), body);
    return 0;
  }
  auto r = ep == 2 ? g4::server::HandleTokenize(body, m)
           : ep == 3 ? g4::server::HandleDetokenize(body, m)
                     : g4::server::HandleApplyTemplate(body, m);
  if (r.ok()) {
    const std::string s = r.value().dump();  // strict: a response must be valid UTF-8 JSON
    if (s.empty()) Die("empty response", body);
  } else {
    CheckError(r.error(), body);
  }
  return 0;
}
