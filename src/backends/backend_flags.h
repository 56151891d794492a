// --backend and --pjrt-plugin for a CLI11 app (the CLI's commands and `serve` add the same flags).
#pragma once

#include <CLI/CLI.hpp>

#include "backends/backend_factory.h"

namespace g4 {

inline void AddBackendFlags(CLI::App* app, BackendOptions* o) {
  app->add_option("--backend", o->backend,
                  "where the model runs: cpu (the default) or xla (a PJRT plugin: XLA's CPU plugin, JAX's CUDA plugin, "
                  "libtpu)")
      ->check(CLI::IsMember(kBackendNames));
  app->add_option("--pjrt-plugin", o->pjrt_plugin,
                  "the PJRT plugin for --backend xla (a .so exporting GetPjrtApi); default: $GEMMA4RT_PJRT_PLUGIN, "
                  "else one found in Python site-packages or ~/.cache/gemma4rt/xla");
}

}  // namespace g4
