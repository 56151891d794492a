// GGUF checkpoints of architectures "gemma3" and "gemma4" mapped onto the same ModelConfig and
// weight names as Hugging Face checkpoints, so one binder and one model definition serve both.
// Keys: ../shared/spec/gemma-architecture.md section 5 and llama.cpp's conversion/gemma.py
// (Gemma3Model/Gemma4Model) and src/models/gemma3.cpp / gemma4.cpp hparams.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "model/config.h"
#include "model/gguf.h"
#include "tensor/tensor.h"

namespace g4 {

// Builds the per-layer plan from GGUF metadata (and tensor presence: K=V layers lack attn_v,
// rope_freqs marks proportional RoPE). Gemma 3 GGUFs have the `1+w` norm offset folded into the
// weights, so norm_offset is 0. Errors: NotFound/InvalidArgument naming the key; Unimplemented
// for other architectures.
StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& file);

// A TensorStore that presents a GGUF file's tensors under their Hugging Face names
// ("model.layers.3.self_attn.q_proj.weight" for "blk.3.attn_q.weight"). GGUF tensors whose names
// it does not know (rope_freqs, vision) are not presented.
std::unique_ptr<TensorStore> MakeHfNamedGgufStore(std::unique_ptr<GgufFile> file);

}  // namespace g4
