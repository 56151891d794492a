#include "runtime/generate.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

#include "base/mapped_file.h"

#include "runtime/stop.h"
#include "tokenizer/detokenizer.h"

namespace g4 {

StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerFor(const LoadedModel& model) {
  if (model.gguf != nullptr) return Tokenizer::FromGguf(*model.gguf);
  return Tokenizer::FromHfDirectory(model.path);
}

Status ModelGenerationDefaults(const LoadedModel& model, SamplingParams* s, std::vector<int32_t>* stop_ids) {
  *s = SamplingParams{};
  s->temperature = 1.0f;
  s->top_k = 64;
  s->top_p = 0.95f;
  for (int id : model.config.stop_ids) stop_ids->push_back(id);
  const std::string path = (std::filesystem::path(model.path) / "generation_config.json").string();
  if (model.gguf != nullptr || !std::filesystem::exists(path)) return OkStatus();
  G4_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument(path + ": not a JSON object");
  auto num = [&](const char* key, float* out) -> Status {
    if (!j.contains(key) || j[key].is_null()) return OkStatus();
    if (!j[key].is_number()) return InvalidArgument(path + ": '" + key + "' must be a number");
    *out = j[key].get<float>();
    return OkStatus();
  };
  G4_RETURN_IF_ERROR(num("temperature", &s->temperature));
  G4_RETURN_IF_ERROR(num("top_p", &s->top_p));
  G4_RETURN_IF_ERROR(num("min_p", &s->min_p));
  G4_RETURN_IF_ERROR(num("repetition_penalty", &s->repetition_penalty));
  if (j.contains("top_k") && j["top_k"].is_number_integer()) s->top_k = j["top_k"].get<int>();
  if (j.contains("do_sample") && j["do_sample"].is_boolean() && !j["do_sample"].get<bool>()) s->temperature = 0.0f;
  auto ids = [&](const char* key, std::vector<int32_t>* out) -> Status {
    if (!j.contains(key) || j[key].is_null()) return OkStatus();
    const nlohmann::json& v = j[key];
    if (v.is_number_integer()) {
      out->push_back(v.get<int32_t>());
      return OkStatus();
    }
    if (!v.is_array()) return InvalidArgument(path + ": '" + key + "' must be an id or a list of ids");
    for (const auto& e : v) {
      if (!e.is_number_integer()) return InvalidArgument(path + ": '" + key + "' must hold integers");
      out->push_back(e.get<int32_t>());
    }
    return OkStatus();
  };
  G4_RETURN_IF_ERROR(ids("suppress_tokens", &s->suppress_tokens));
  G4_RETURN_IF_ERROR(ids("eos_token_id", stop_ids));
  return OkStatus();
}

Status Generate(Engine& engine, const Tokenizer* tokenizer, int seq, const GenerateRequest& req,
                const std::function<void(std::string_view)>& on_text, GenerateResult* result) {
  using Clock = std::chrono::steady_clock;
  if (req.prompt.empty()) return InvalidArgument("prompt: no tokens");
  if (req.max_tokens < 1) return InvalidArgument("max_tokens must be >= 1");
  const int64_t need = static_cast<int64_t>(req.prompt.size()) + req.max_tokens;
  if (need > engine.options().max_context)
    return ResourceExhausted("prompt (" + std::to_string(req.prompt.size()) + " tokens) + max_tokens (" +
                             std::to_string(req.max_tokens) + ") exceeds the context size " +
                             std::to_string(engine.options().max_context));
  G4_RETURN_IF_ERROR(req.sampling.ValidateForVocab(engine.config().vocab));
  G4_ASSIGN_OR_RETURN(Sampler sampler, Sampler::Create(req.sampling));
  if (tokenizer == nullptr && !req.stop.empty()) return InvalidArgument("stop: stop strings need a tokenizer");
  G4_ASSIGN_OR_RETURN(StopMatcher stops, StopMatcher::Create(req.stop));
  std::optional<IncrementalDetokenizer> detok;
  if (tokenizer != nullptr) detok.emplace(*tokenizer, /*skip_special=*/true);
  *result = GenerateResult{};
  result->prompt_tokens = static_cast<int>(req.prompt.size());
  result->seed = sampler.seed();
  auto emit = [&](const std::string& piece) {
    if (piece.empty()) return;
    result->text += piece;
    if (on_text) on_text(piece);
  };
  auto is_stop_token = [&](int32_t id) {
    if (req.ignore_eos) return false;
    return (tokenizer != nullptr && tokenizer->IsEndOfGeneration(id)) ||
           std::find(req.stop_ids.begin(), req.stop_ids.end(), id) != req.stop_ids.end();
  };

  engine.ResetSequence(seq);
  const auto t0 = Clock::now();
  // Each step's logits are sampled in place in the engine's step memory (no copy).
  const Status prefilled = engine.Prefill(seq, req.prompt, false, nullptr, nullptr, req.interrupt);
  const auto t1 = Clock::now();
  result->prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  if (prefilled.code() == StatusCode::kCancelled) {  // interrupted between prefill chunks
    result->finish_reason = "interrupted";
    result->prefilled_tokens = engine.SequenceLength(seq);
    return OkStatus();
  }
  G4_RETURN_IF_ERROR(prefilled);
  result->prefilled_tokens = result->prompt_tokens;
  result->finish_reason = "length";
  for (int i = 0; i < req.max_tokens; ++i) {
    G4_ASSIGN_OR_RETURN(int32_t next, sampler.SampleInPlace(engine.StepLogits(), req.prompt, result->tokens));
    result->tokens.push_back(next);
    if (is_stop_token(next)) {
      result->finish_reason = "stop";
      break;
    }
    StopMatcher::Result r = stops.Feed(detok ? detok->Push(next) : std::string());
    emit(r.text);
    if (r.stopped) {
      result->finish_reason = "stop";
      break;
    }
    if (i + 1 == req.max_tokens) break;
    if (req.interrupt != nullptr && req.interrupt->load()) {
      result->finish_reason = "interrupted";
      break;
    }
    G4_RETURN_IF_ERROR(engine.Decode(std::span<const int32_t>(&seq, 1), std::span<const int32_t>(&next, 1), nullptr));
  }
  if (!stops.stopped()) {
    StopMatcher::Result r = stops.Feed(detok ? detok->Flush() : std::string());
    emit(r.text);
    if (!r.stopped) emit(stops.Flush().text);
    else if (result->finish_reason != "interrupted") result->finish_reason = "stop";
  }
  result->decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  return OkStatus();
}

}  // namespace g4
