// A loaded checkpoint: its config, the tensor store that owns the (mmap'd) weights, and the
// bound weight views.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/quantized_store.h"
#include "model/weights.h"
#include "tensor/tensor.h"

namespace g4 {

struct LoadedModel {
  std::string path;
  ModelConfig config;
  std::unique_ptr<TensorStore> store;
  ModelWeights weights;
  const GgufFile* gguf = nullptr;  // the GGUF file (owned by `store`) when loaded from one, for its tokenizer
  std::string quantization;        // "" (as stored), "w4a16-ct" (compressed-tensors checkpoint), or the
                                   // --quantize target ("q8_0", "q4_0", "w4a16")
  QuantizeStats quantize_stats;    // what --quantize converted
  bool weights_copied = false;     // the tensor data was copied into memory (LoadOptions::mmap false)
};

// Where the weights live, as every command's log names them ("memory=..."): "copied" (into
// anonymous memory in 2 MiB pages, the default) or "mapped" (the file mapping: --mmap, info,
// --quantize's and compressed-tensors' stored weights).
inline const char* WeightsMemory(const LoadedModel& m) { return m.weights_copied ? "copied" : "mapped"; }

// How to load: `quantize` converts a float checkpoint at load (see QuantizeWeights): kQ8_0,
// kQ4_0 or kW4G32 (`--quantize q8_0|q4_0|w4a16`); ple_bits 8 or 16 (`--ple-bits`).
struct LoadOptions {
  std::optional<DType> quantize;
  int ple_bits = 8;
  // false (the default): the tensor data is copied from the file into anonymous memory in 2 MiB
  // pages (MappedFile::ReadIntoMemory; decode reads them faster than mapped file pages); the
  // metadata stays mapped. true (--mmap): the weights are used from the file mapping in place
  // (faster start, pages shared with other processes through the page cache). With `quantize`,
  // and for compressed-tensors checkpoints, the stored weights are always mapped (they are read
  // once, converted, and their pages dropped).
  bool mmap = false;
  // Called while the weights are copied (not with mmap): copy_progress(done, total) in bytes, after
  // each read of up to 64 MiB, the last call with done == total. For a progress display.
  std::function<void(size_t done, size_t total)> copy_progress;
  // Rewrites the Q4_0 weights that only matmuls read (attention and MLP projections, the PLE
  // projections, an untied LM head; 2-D with a multiple of 4 rows) in place as kQ4_0x4
  // (tensor/dtype.h), the layout of the CPU's AVX-512 Q4_0 kernel. Only where the bytes are the
  // process's own (copied into memory, or made by --quantize q4_0); weights used from the file
  // mapping (--mmap) stay as stored. The token embedding and the PLE table are never packed (rows
  // are looked up one by one). The commands set it where cpu::Q4_0x4KernelAvailable() and int8
  // activations are used, unless --no-repack (llama.cpp's flag for its own repacking).
  bool pack_q4_0 = false;
};

// The help text of the --mmap / --no-mmap flag (LoadOptions::mmap) every command shares.
inline constexpr const char* kMmapFlagHelp =
    "use the weights in place from the file mapping (faster start); --no-mmap, the default, copies them into memory "
    "(faster decode)";

// The help text of the --no-repack flag (LoadOptions::pack_q4_0 off) every command that runs a
// model shares.
inline constexpr const char* kNoRepackFlagHelp =
    "keep Q4_0 weights in their stored layout instead of rearranging them at load for the AVX-512 kernel";

// "q8_0" -> kQ8_0, "q4_0" -> kQ4_0, "w4a16" -> kW4G32 ("" / "none" -> nullopt). InvalidArgument otherwise.
StatusOr<std::optional<DType>> ParseQuantizeFlag(const std::string& s);

// Loads a Hugging Face checkpoint directory (config.json + model.safetensors or a sharded set with
// model.safetensors.index.json) or a GGUF file (architectures gemma3, gemma4). Errors: NotFound (no such directory / config.json / weights),
// InvalidArgument or Unimplemented from the config parser, DataLoss from the safetensors reader,
// NotFound/InvalidArgument from weight binding; every message names the file.
// A config.json with a compressed-tensors "quantization_config" loads as W4A16 (WrapCompressedTensors).
StatusOr<std::unique_ptr<LoadedModel>> LoadModel(const std::string& path, const LoadOptions& options = {});

// Where commands look for a model when none is given: $GEMMA4RT_MODEL, else
// $GEMMA4RT_DEFAULT_MODEL, else <cache>/gemma-3-270m-q4_k_m.gguf with <cache> = $GEMMA4RT_CACHE or
// ~/.cache/gemma4rt (where scripts/fetch-default-model.sh puts it). The path may not exist.
std::string DefaultModelPath();
// The same without $GEMMA4RT_MODEL: the fetched default model ($GEMMA4RT_DEFAULT_MODEL, else the
// cache path). For the server (whose -m flag reads $GEMMA4RT_MODEL itself) and the tests.
std::string DefaultModelFile();

// The weights as every command's log names them ("weights=..."): the dtypes of the layers'
// attention, MLP and expert projections, most bytes first and joined by '+' ("Q4_K+Q6_K" for a
// Q4_K_M file, "Q4_0x4+Q4_0" where only some were repacked), with " embed=DTYPE" when that is not
// just the embedding's dtype ("Q5_0 embed=Q8_0", "W4G32 embed=F32"), else the one dtype ("F32");
// then " quantization=..." when quantised (LoadedModel::quantization).
std::string WeightsDescription(const LoadedModel& model);

// Reads every page of the bound weights once (they are mmap'd, so a cold file would otherwise be
// read during the first request), calling progress(fraction done in [0, 1]) about every 1%.
void PrefaultWeights(const LoadedModel& model, const std::function<void(double)>& progress);

}  // namespace g4
