#include "runtime/engine.h"

#include <algorithm>
#include <cstring>
#include <set>

namespace g4 {
namespace {

EngineOptions Resolve(EngineOptions o, const ModelConfig& c) {
  if (o.max_context == 0) o.max_context = DefaultContextSize(c);
  return o;
}

}  // namespace

int DefaultContextSize(const ModelConfig& config) { return std::min(config.max_position, kDefaultContextCap); }

StatusOr<int> ResolveContextSize(const ModelConfig& config, int requested) {
  if (requested < 0) return InvalidArgument("context size must be >= 0 (0 = the default), got " + std::to_string(requested));
  if (requested > config.max_position)
    return InvalidArgument("context size " + std::to_string(requested) + " exceeds the model's max_position_embeddings (" +
                           std::to_string(config.max_position) + ")");
  return requested == 0 ? DefaultContextSize(config) : requested;
}

StatusOr<DType> ParseCacheType(const std::string& name) {
  if (name == "f32") return DType::kF32;
  if (name == "f16") return DType::kF16;
  if (name == "bf16") return DType::kBF16;
  if (name == "q8" || name == "q8_0") return DType::kI8;
  if (name == "fp8") return DType::kF8E4M3;  // held where the backend says it can (Backend::CheckKvCacheType)
  return InvalidArgument("--cache-type must be f32, f16, bf16, q8 or fp8, got '" + name + "'");
}

const char* CacheTypeName(DType type) {
  switch (type) {
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI8: return "q8";
    case DType::kF8E4M3: return "fp8";
    default: return "f32";
  }
}

namespace {

// "a,b" -> {"a", "b"}; "" -> {""}, empty items kept, for the caller's check to name them.
std::vector<std::string> SplitCacheTypeList(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t comma; (comma = list.find(',', start)) != std::string::npos; start = comma + 1)
    out.push_back(list.substr(start, comma - start));
  out.push_back(list.substr(start));
  return out;
}

}  // namespace

StatusOr<std::vector<std::string>> RewriteCacheTypeAliases(std::vector<std::string> args,
                                                            const std::function<bool(const std::string&)>& takes_value,
                                                            bool lists) {
  // llama.cpp's four spellings, then gemma4rt's own, which joins the check where it is given more
  // than once or with an alias (else CLI11 would refuse a second --cache-type although all agree).
  static const char* const kSpellings[] = {"-ctk", "-ctv", "--cache-type-k", "--cache-type-v", "--cache-type"};
  std::vector<std::string> out;
  std::vector<std::pair<std::string, std::string>> given;  // (spelling, value), one per spelling
  bool alias = false;
  int occurrences = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    bool taken = false;
    for (const char* spelling : kSpellings) {
      const std::string name = spelling;
      const bool own = name == "--cache-type";
      std::string value;
      if (a == name && i + 1 < args.size()) {
        value = args[++i];
      } else if (a == name && !own) {
        return InvalidArgument(name + " needs a value (f16, bf16, f32, q8_0 or fp8)");
      } else if (a.rfind(name + "=", 0) == 0) {
        value = a.substr(name.size() + 1);
      } else {
        continue;
      }
      // One type per flag outside bench (a list runs bench once per type).
      if (!lists && value.find(',') != std::string::npos)
        return InvalidArgument(name + ": '" + value + "' is a list of cache types, which only `gemma4rt bench` runs "
                               "(once per type); give one type: f16, bf16, f32, q8_0 or fp8");
      // An alias's value is checked here, under the name the user typed (CLI11 would name --cache-type);
      // with lists, each type of a comma-separated list (bench's sweep, as llama-bench's), and those
      // of --cache-type too (CLI11 would drop an empty item).
      if (!own || lists) {
        std::vector<std::string> types{value};
        if (lists) types = SplitCacheTypeList(value);
        for (const std::string& t : types) {
          const auto parsed = ParseCacheType(t);
          if (parsed.ok()) continue;
          return InvalidArgument(name + ": '" + t + "' is not a KV cache type gemma4rt has: f16, bf16, f32 or q8_0 "
                                 "(4-bit caches such as q4_0 are not supported)");
        }
      }
      // The same spelling again: with lists its types join the list (llama-bench appends repeats);
      // otherwise a second, different type is refused as such.
      auto same = std::find_if(given.begin(), given.end(), [&](const auto& g) { return g.first == name; });
      if (same == given.end()) {
        given.emplace_back(name, value);
      } else if (lists) {
        same->second += "," + value;
      } else if (same->second != value) {
        return InvalidArgument(name + " given twice with different types (" + name + " " + same->second + ", " + name +
                               " " + value + "): give one type, f16, bf16, f32 or q8_0");
      }
      ++occurrences;
      alias = alias || !own;
      taken = true;
      break;
    }
    if (taken) continue;
    out.push_back(a);
    if (takes_value && i + 1 < args.size() && takes_value(a)) out.push_back(args[++i]);  // its value, as given
  }
  if (!alias && occurrences <= 1) return args;  // --cache-type once or not at all: CLI11 checks it
  for (const auto& [name, value] : given)
    if (value != given[0].second)
      return InvalidArgument("K and V cache types differ (" + given[0].first + " " + given[0].second + ", " + name + " " +
                             value + "): gemma4rt keeps K and V in one type, --cache-type f16, bf16, f32 or q8");
  out.push_back("--cache-type");
  out.push_back(given[0].second);
  return out;
}

Engine::Engine(std::unique_ptr<LoadedModel> model, std::unique_ptr<Backend> backend, const EngineOptions& options,
               std::unique_ptr<KvCacheBase> cache)
    : model_(std::move(model)),
      backend_(std::move(backend)),
      options_(options),
      cache_(std::move(cache)),
      graph_last_(BuildGemmaGraph(model_->config, model_->weights, GraphOptions{false})),
      graph_all_(BuildGemmaGraph(model_->config, model_->weights, GraphOptions{true})) {}

const Graph& Engine::GraphFor(bool all_logits, bool capture) {
  if (!capture) return all_logits ? graph_all_ : graph_last_;
  std::unique_ptr<Graph>& g = graph_capture_[all_logits ? 1 : 0];
  if (!g) g = std::make_unique<Graph>(BuildGemmaGraph(model_->config, model_->weights, GraphOptions{all_logits, true}));
  return *g;
}

StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<LoadedModel> model, std::unique_ptr<Backend> backend,
                                                 const EngineOptions& options) {
  if (options.max_seqs < 1 || options.max_seqs > 4096) return InvalidArgument("max_seqs must be in [1, 4096]");
  G4_RETURN_IF_ERROR(ResolveContextSize(model->config, options.max_context).status());
  if (options.prefill_chunk < 1) return InvalidArgument("prefill chunk must be >= 1");
  if (!IsAnyKvCacheType(options.kv_type))
    return InvalidArgument("KV cache type must be f32, f16, bf16, i8 or f8_e4m3, not " + std::string(DTypeName(options.kv_type)));
  const EngineOptions resolved = Resolve(options, model->config);
  G4_ASSIGN_OR_RETURN(std::unique_ptr<KvCacheBase> cache,
                      backend->CreateKvCache(model->config, resolved.max_seqs, resolved.max_context, resolved.kv_type));
  std::unique_ptr<Engine> e(new Engine(std::move(model), std::move(backend), resolved, std::move(cache)));
  G4_RETURN_IF_ERROR(e->backend_->PlanMemory(e->graph_all_, *e->cache_));
  return e;
}

Status Engine::CheckTokens(std::span<const int32_t> tokens) const {
  const ModelConfig& c = config();
  const int limit = c.ple_dim > 0 ? std::min(c.vocab, c.ple_vocab) : c.vocab;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= limit)
      return InvalidArgument("token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) + " is outside the vocabulary [0, " +
                             std::to_string(limit) + ")");
  return OkStatus();
}

StatusOr<Executable*> Engine::GetExecutable(int num_tokens, int num_output_rows, bool all_logits, bool capture) {
  auto key = std::make_tuple(num_tokens, num_output_rows, all_logits, capture);
  auto it = executables_.find(key);
  if (it != executables_.end()) return it->second.get();
  G4_ASSIGN_OR_RETURN(std::unique_ptr<Executable> exe,
                      backend_->Compile(GraphFor(all_logits, capture), num_tokens, num_output_rows));
  Executable* raw = exe.get();
  executables_[key] = std::move(exe);
  return raw;
}

Status Engine::Prefill(int seq, std::span<const int32_t> tokens, bool all_logits, std::vector<float>* logits,
                       std::map<std::string, std::vector<float>>* captured, const std::atomic<bool>* interrupt) {
  last_exe_ = nullptr;
  if (seq < 0 || seq >= cache_->max_seqs()) return InvalidArgument("sequence " + std::to_string(seq) + " is out of range");
  if (tokens.empty()) return InvalidArgument("prefill needs at least one token");
  G4_RETURN_IF_ERROR(CheckTokens(tokens));
  const int start = cache_->length(seq);
  if (start + static_cast<int64_t>(tokens.size()) > cache_->max_context())
    return ResourceExhausted("sequence would hold " + std::to_string(start + tokens.size()) + " tokens; the context size is " +
                             std::to_string(cache_->max_context()));
  const int V = config().vocab;
  const int n = static_cast<int>(tokens.size());
  if (logits) logits->assign(all_logits ? static_cast<size_t>(n) * V : V, 0.0f);
  if (captured) captured->clear();
  for (int begin = 0; begin < n; begin += options_.prefill_chunk) {
    if (begin > 0 && interrupt != nullptr && interrupt->load()) {
      last_exe_ = nullptr;  // no logits
      return Cancelled("prefill interrupted after " + std::to_string(begin) + " of " + std::to_string(n) + " tokens");
    }
    const int len = std::min(options_.prefill_chunk, n - begin);
    const bool last_chunk = begin + len == n;
    const int out_rows = all_logits ? len : (last_chunk ? 1 : 0);
    G4_ASSIGN_OR_RETURN(Executable * exe, GetExecutable(len, out_rows, all_logits, captured != nullptr));
    pos_buf_.resize(len);
    seq_buf_.assign(len, seq);
    out_buf_.assign(out_rows, len - 1);
    for (int i = 0; i < len; ++i) pos_buf_[i] = cache_->length(seq) + i;
    StepInput in{tokens.subspan(begin, len), pos_buf_, seq_buf_, out_buf_};
    G4_RETURN_IF_ERROR(exe->Run(in, *cache_));
    cache_->set_length(seq, cache_->length(seq) + len);
    last_exe_ = exe;
    if (logits && out_rows > 0) {
      OutputView lv = exe->Output("logits");
      float* dst = all_logits ? logits->data() + static_cast<size_t>(begin) * V : logits->data();
      std::memcpy(dst, lv.data, sizeof(float) * lv.rows * lv.cols);
    }
    if (captured) {
      for (const Node& node : GraphFor(all_logits, true).nodes()) {
        if (node.name.empty() || node.rows != Rows::kTokens) continue;
        OutputView ov = exe->Output(node.name);
        std::vector<float>& dst = (*captured)[node.name];
        dst.insert(dst.end(), ov.data, ov.data + static_cast<size_t>(ov.rows) * ov.cols);
      }
    }
  }
  return OkStatus();
}

Status Engine::Decode(std::span<const int32_t> seqs, std::span<const int32_t> tokens, std::vector<float>* logits) {
  last_exe_ = nullptr;
  if (seqs.empty() || seqs.size() != tokens.size()) return InvalidArgument("decode needs one token per sequence");
  G4_RETURN_IF_ERROR(CheckTokens(tokens));
  std::set<int32_t> seen;
  for (int32_t s : seqs) {
    if (s < 0 || s >= cache_->max_seqs()) return InvalidArgument("sequence " + std::to_string(s) + " is out of range");
    if (!seen.insert(s).second) return InvalidArgument("sequence " + std::to_string(s) + " appears twice in one decode step");
    if (cache_->length(s) + 1 > cache_->max_context())
      return ResourceExhausted("sequence " + std::to_string(s) + " is full (context size " + std::to_string(cache_->max_context()) + ")");
  }
  const int B = static_cast<int>(seqs.size());
  G4_ASSIGN_OR_RETURN(Executable * exe, GetExecutable(B, B, false, false));
  pos_buf_.resize(B);
  out_buf_.resize(B);
  for (int b = 0; b < B; ++b) {
    pos_buf_[b] = cache_->length(seqs[b]);
    out_buf_[b] = b;
  }
  StepInput in{tokens, pos_buf_, seqs, out_buf_};
  G4_RETURN_IF_ERROR(exe->Run(in, *cache_));
  for (int b = 0; b < B; ++b) cache_->set_length(seqs[b], cache_->length(seqs[b]) + 1);
  last_exe_ = exe;
  if (logits) {
    OutputView lv = exe->Output("logits");
    logits->assign(lv.data, lv.data + static_cast<size_t>(lv.rows) * lv.cols);
  }
  return OkStatus();
}

StatusOr<int> Engine::Warmup(int chunk) {
  for (int s = 0; s < cache_->max_seqs(); ++s)
    if (cache_->length(s) != 0) return FailedPrecondition("warm-up needs an empty KV cache");
  int steps = 0;
  std::vector<int> sizes;
  const int most = std::min(chunk, cache_->max_context());
  for (int n = 1; n < most; n *= 2) sizes.push_back(n);
  sizes.push_back(most);
  const std::vector<int32_t> zeros(most, 0);
  for (int n : sizes) {
    G4_RETURN_IF_ERROR(Prefill(0, std::span<const int32_t>(zeros).first(n), false, nullptr));
    cache_->Reset(0);
    ++steps;
  }
  sizes.clear();
  for (int b = 1; b < cache_->max_seqs(); b *= 2) sizes.push_back(b);
  sizes.push_back(cache_->max_seqs());
  std::vector<int32_t> seqs, tokens;
  for (int b : sizes) {
    seqs.resize(b);
    for (int i = 0; i < b; ++i) seqs[i] = i;
    tokens.assign(b, 0);
    G4_RETURN_IF_ERROR(Decode(seqs, tokens, nullptr));
    for (int i = 0; i < b; ++i) cache_->Reset(i);
    ++steps;
  }
  // Slots in groups (Backend::SlotGroups, a mesh's data axis): a batched decode step runs as one
  // group of rows per slot group, each padded to the bucket of the largest group, a program per
  // bucket (1, 2, 4, ... up to the group's slots): one step of each, every group equally full.
  const int groups = backend_->SlotGroups(), S = cache_->max_seqs();
  if (groups > 1 && S % groups == 0) {
    const int per = S / groups;
    for (int g = 1; g < 2 * per; g *= 2) {
      seqs.clear();
      for (int d = 0; d < groups; ++d)
        for (int i = 0; i < std::min(g, per); ++i) seqs.push_back(d * per + i);
      tokens.assign(seqs.size(), 0);
      G4_RETURN_IF_ERROR(Decode(seqs, tokens, nullptr));
      for (int32_t s : seqs) cache_->Reset(s);
      ++steps;
    }
  }
  last_exe_ = nullptr;
  return steps;
}

std::span<float> Engine::StepLogits() const {
  if (!last_exe_) return {};
  OutputView lv = last_exe_->Output("logits");
  return {lv.data, static_cast<size_t>(lv.rows) * lv.cols};
}

}  // namespace g4
