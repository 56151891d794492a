// A loaded checkpoint: its config, the tensor store that owns the (mmap'd) weights, and the
// bound weight views.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/weights.h"
#include "tensor/tensor.h"

namespace g4 {

struct LoadedModel {
  std::string path;
  ModelConfig config;
  std::unique_ptr<TensorStore> store;
  ModelWeights weights;
  const GgufFile* gguf = nullptr;  // the GGUF file (owned by `store`) when loaded from one, for its tokenizer
};

// Loads a Hugging Face checkpoint directory (config.json + model.safetensors or a sharded set with
// model.safetensors.index.json) or a GGUF file (architectures gemma3, gemma4). Errors: NotFound (no such directory / config.json / weights),
// InvalidArgument or Unimplemented from the config parser, DataLoss from the safetensors reader,
// NotFound/InvalidArgument from weight binding; every message names the file.
StatusOr<std::unique_ptr<LoadedModel>> LoadModel(const std::string& path);

// Where commands look for a model when none is given: $GEMMA4RT_MODEL, else
// $GEMMA4RT_DEFAULT_MODEL, else <cache>/gemma-3-270m-q4_k_m.gguf with <cache> = $GEMMA4RT_CACHE or
// ~/.cache/gemma4rt (where scripts/fetch-default-model.sh puts it). The path may not exist.
std::string DefaultModelPath();

// Reads every page of the bound weights once (they are mmap'd, so a cold file would otherwise be
// read during the first request), calling progress(fraction done in [0, 1]) about every 1%.
void PrefaultWeights(const LoadedModel& model, const std::function<void(double)>& progress);

}  // namespace g4
