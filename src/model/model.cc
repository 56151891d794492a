#include "model/model.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/gguf_model.h"
#include "model/safetensors.h"
#include "tensor/quantize.h"

namespace g4 {

StatusOr<std::optional<DType>> ParseQuantizeFlag(const std::string& s) {
  if (s.empty() || s == "none") return std::optional<DType>();
  if (s == "q8_0" || s == "Q8_0") return std::optional<DType>(DType::kQ8_0);
  if (s == "q4_0" || s == "Q4_0") return std::optional<DType>(DType::kQ4_0);
  if (s == "w4a16" || s == "W4A16") return std::optional<DType>(DType::kW4G32);
  return InvalidArgument("--quantize: '" + s + "' is not one of q8_0, q4_0, w4a16");
}

namespace {

const char* QuantizeName(DType t) {
  return t == DType::kQ8_0 ? "q8_0" : t == DType::kQ4_0 ? "q4_0" : "w4a16";
}

Status ApplyLoadOptions(LoadedModel* m, const LoadOptions& o) {
  if (!o.quantize) return OkStatus();
  if (!m->quantization.empty())
    return InvalidArgument(m->path + ": --quantize needs an F32, F16 or BF16 checkpoint; this one is already " + m->quantization);
  StatusOr<std::unique_ptr<TensorStore>> q =
      QuantizeWeights(std::move(m->store), m->config, *o.quantize, o.ple_bits, &m->weights, &m->quantize_stats);
  if (!q.ok()) return Status(q.status().code(), m->path + ": " + q.status().message());
  m->store = std::move(q).value();
  m->quantization = QuantizeName(*o.quantize);
  return OkStatus();
}

// LoadOptions::pack_q4_0: the Q4_0 tensors only matmuls read, each once.
void PackQ4_0Weights(LoadedModel* m) {
  const ModelWeights& w = m->weights;
  std::vector<const Tensor*> mats = {w.ple_model_proj};
  if (w.lm_head != w.embed) mats.push_back(w.lm_head);
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t : {l.q_proj, l.k_proj, l.v_proj, l.o_proj, l.gate_proj, l.up_proj, l.down_proj, l.ple_gate, l.ple_proj})
      mats.push_back(t);
  }
  std::set<const Tensor*> done;
  for (const Tensor* t : mats) {
    if (t == nullptr || t == w.embed || t == w.ple_embed || !Q4_0x4Packable(t->dtype, t->shape) ||
        !done.insert(t).second)
      continue;
    m->store->PackQ4_0x4(*t);  // false (nothing changed) for bytes mapped from the file
  }
}

// The per-read callback that feeds options.copy_progress a running total out of `total` bytes.
std::function<void(size_t)> CopyProgress(const LoadOptions& options, size_t total) {
  if (!options.copy_progress) return {};
  return [done = size_t{0}, total, &options](size_t n) mutable {
    done += n;
    options.copy_progress(done, total);
  };
}

}  // namespace

StatusOr<std::unique_ptr<LoadedModel>> LoadModel(const std::string& path, const LoadOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) return NotFound("model path '" + path + "' does not exist");
  auto m = std::make_unique<LoadedModel>();
  m->path = path;
  if (!fs::is_directory(path, ec)) {
    G4_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(path));
    G4_ASSIGN_OR_RETURN(m->config, ConfigFromGguf(*gguf));
    if (!options.mmap && !options.quantize) {
      G4_RETURN_IF_ERROR(gguf->ReadDataIntoMemory(CopyProgress(options, gguf->DataBytesToCopy())));
      m->weights_copied = true;
    }
    m->gguf = gguf.get();
    m->store = MakeHfNamedGgufStore(std::move(gguf));
    StatusOr<ModelWeights> w = BindWeights(m->config, *m->store);
    if (!w.ok()) return Status(w.status().code(), path + ": " + w.status().message());
    m->weights = std::move(w).value();
    G4_RETURN_IF_ERROR(ApplyLoadOptions(m.get(), options));
    if (options.pack_q4_0) PackQ4_0Weights(m.get());
    return m;
  }
  const std::string config_path = (fs::path(path) / "config.json").string();
  if (!fs::exists(config_path, ec)) return NotFound("no config.json in '" + path + "'");
  G4_ASSIGN_OR_RETURN(m->config, ParseHfConfigFile(config_path));
  G4_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsStore> store, SafetensorsStore::OpenDirectory(path));
  SafetensorsStore* files = store.get();
  m->store = std::move(store);
  {
    G4_ASSIGN_OR_RETURN(std::string text, ReadTextFile(config_path));
    const nlohmann::json cfg = nlohmann::json::parse(text, nullptr, false);
    if (cfg.is_object() && cfg.contains("quantization_config") && !cfg["quantization_config"].is_null()) {
      G4_ASSIGN_OR_RETURN(m->store, WrapCompressedTensors(std::move(m->store), cfg["quantization_config"].dump(), path));
      m->quantization = "w4a16-ct";
    }
  }
  // Not for compressed-tensors checkpoints: their packed weights are repacked at load and the
  // stored pages dropped (a copy would hold both at once).
  if (!options.mmap && !options.quantize && m->quantization.empty()) {
    G4_RETURN_IF_ERROR(files->ReadDataIntoMemory(CopyProgress(options, files->DataBytesToCopy())));
    m->weights_copied = true;
  }
  StatusOr<ModelWeights> w = BindWeights(m->config, *m->store);
  if (!w.ok()) return Status(w.status().code(), path + ": " + w.status().message());
  m->weights = std::move(w).value();
  G4_RETURN_IF_ERROR(ApplyLoadOptions(m.get(), options));
  if (options.pack_q4_0) PackQ4_0Weights(m.get());
  return m;
}

std::string DefaultModelPath() {
  if (const char* m = std::getenv("GEMMA4RT_MODEL"); m && *m) return m;
  return DefaultModelFile();
}

std::string DefaultModelFile() {
  if (const char* m = std::getenv("GEMMA4RT_DEFAULT_MODEL"); m && *m) return m;
  const char* cache = std::getenv("GEMMA4RT_CACHE");
  const char* home = std::getenv("HOME");
  const std::string dir = cache && *cache ? cache : std::string(home ? home : ".") + "/.cache/gemma4rt";
  return dir + "/gemma-3-270m-q4_k_m.gguf";
}

std::string WeightsDescription(const LoadedModel& m) {
  const ModelWeights& w = m.weights;
  const std::string embed = w.embed ? std::string(DTypeName(w.embed->dtype)) : "none";
  // The layers' attention, MLP and expert projections: their dtypes, most bytes first.
  std::vector<std::pair<size_t, DType>> bytes;
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t : {l.q_proj, l.k_proj, l.v_proj, l.o_proj, l.gate_proj, l.up_proj, l.down_proj,
                            l.experts_gate_up, l.experts_down}) {
      if (t == nullptr) continue;
      auto it = std::find_if(bytes.begin(), bytes.end(), [&](const auto& b) { return b.second == t->dtype; });
      if (it == bytes.end()) bytes.emplace_back(t->nbytes, t->dtype);
      else it->first += t->nbytes;
    }
  }
  std::stable_sort(bytes.begin(), bytes.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string s;
  for (const auto& [n, t] : bytes) {
    if (!s.empty()) s += '+';
    s += DTypeName(t);
  }
  if (s.empty()) s = embed;
  else if (s != embed) s += " embed=" + embed;
  if (!m.quantization.empty()) s += " quantization=" + m.quantization;
  return s;
}

void PrefaultWeights(const LoadedModel& model, const std::function<void(double)>& progress) {
  std::vector<const Tensor*> tensors;
  const ModelWeights& w = model.weights;
  for (const Tensor* t : {w.embed, w.lm_head, w.final_norm, w.ple_embed, w.ple_model_proj, w.ple_proj_norm})
    if (t) tensors.push_back(t);
  for (const LayerWeights& l : w.layers)
    for (const Tensor* t : {l.input_norm, l.q_proj, l.k_proj, l.v_proj, l.q_norm, l.k_norm, l.o_proj, l.post_attn_norm,
                            l.pre_ffn_norm, l.gate_proj, l.up_proj, l.down_proj, l.post_ffn_norm, l.ple_gate, l.ple_proj,
                            l.ple_post_norm, l.router_proj, l.router_scale, l.per_expert_scale, l.experts_gate_up,
                            l.experts_down, l.pre_ffn_norm_2, l.post_ffn_norm_1, l.post_ffn_norm_2})
      if (t) tensors.push_back(t);
  size_t total = 0, done = 0, next_report = 0;
  for (const Tensor* t : tensors) total += t->nbytes;
  volatile uint8_t sink = 0;
  for (const Tensor* t : tensors) {
    for (size_t off = 0; off < t->nbytes; off += 4096) {
      sink = sink + t->data[off];
      done += std::min<size_t>(4096, t->nbytes - off);
      if (progress && done >= next_report) {
        progress(total ? static_cast<double>(done) / total : 1.0);
        next_report = done + total / 100 + 1;
      }
    }
  }
  if (progress) progress(1.0);
}

}  // namespace g4
