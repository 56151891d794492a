// --backend, --pjrt-plugin, --device and --compute-dtype for a CLI11 app (the CLI's commands and `serve` add the same flags).
#pragma once

#include <CLI/CLI.hpp>

#include "backends/backend_factory.h"

namespace g4 {

inline void AddBackendFlags(CLI::App* app, BackendOptions* o) {
  app->add_option("--backend", o->backend,
                  "where the model runs: cpu (the default), xla (a PJRT plugin: XLA's CPU plugin, JAX's CUDA plugin, "
                  "libtpu) or cuda (an NVIDIA GPU, in builds with the CUDA backend)")
      ->check(CLI::IsMember(kBackendNames));
  app->add_option("--pjrt-plugin", o->pjrt_plugin,
                  "the PJRT plugin for --backend xla (a .so exporting GetPjrtApi); default: $GEMMA4RT_PJRT_PLUGIN, "
                  "else one found in Python site-packages or ~/.cache/gemma4rt/xla");
  app->add_option("--device", o->device, "the CUDA device index for --backend cuda (default 0)")->check(CLI::NonNegativeNumber);
  app->add_option("--compute-dtype", o->compute_dtype,
                  "the GPU's compute dtype for --backend cuda: auto (bf16 at compute capability >= 8.0, else f16), "
                  "bf16 or f16 (f32 accumulation either way); one the device cannot honour is refused")
      ->check(CLI::IsMember({"auto", "bf16", "f16", "f32"}));
}

}  // namespace g4
