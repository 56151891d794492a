// --backend, --pjrt-plugin and the device flags for a CLI11 app (the CLI's commands and
// `serve` add the same flags).
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
  auto* mesh = app->add_option("--mesh", o->mesh,
                               "with --backend xla: run SPMD over a data x model device mesh, e.g. data=2,model=4 (model "
                               "splits heads, MLP, vocabulary, experts; data splits the sequence slots)")
                   ->check([](const std::string& text) { return MeshFlagError(text); });
  app->add_option("--devices", o->devices, "with --backend xla: split the model over N devices (--mesh model=N)")
      ->check(CLI::Range(1, 1 << 16))
      ->excludes(mesh);
  app->add_option("--compute-dtype", o->compute_dtype,
                  "--backend xla or cuda: the dtype of the matmuls (f32 accumulation): auto (TPU and CUDA compute "
                  "capability >= 8.0: bf16; CUDA below 8.0: f16; XLA's CPU plugin: f32), f32, bf16 or f16; refused "
                  "where the device has no such arithmetic")
      ->check(CLI::IsMember(kComputeDtypeFlagValues));
  app->add_option("--device", o->device, "--backend xla or cuda: which device runs the model (default 0)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--device-memory", o->device_memory,
                  "--backend xla: the device memory the memory plan checks against, e.g. 512M or 8G (default: the "
                  "device's own limit where the plugin reports it)")
      ->transform(CLI::AsSizeValue(false));
}

}  // namespace g4
