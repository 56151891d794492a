// --backend, --pjrt-plugin and the device flags for a CLI11 app (the CLI's commands and
// `serve` add the same flags).
#pragma once

#include <CLI/CLI.hpp>

#include "backends/backend_factory.h"
#include "backends/xla/mesh.h"

namespace g4 {

// with_env: each flag is also read from GEMMA4RT_<FLAG> (serve's convention).
inline void AddBackendFlags(CLI::App* app, BackendOptions* o, bool with_env = false) {
  auto env = [&](CLI::Option* opt, const char* name) {
    if (with_env) opt->envname(name);
    return opt;
  };
  env(app->add_option("--backend", o->backend, "where the model runs: cpu (default), xla (a PJRT plugin) or cuda"),
      "GEMMA4RT_BACKEND")
      ->check(CLI::IsMember(kBackendNames));
  env(app->add_option("--pjrt-plugin", o->pjrt_plugin,
                      "--backend xla: the PJRT plugin (.so); default: found in site-packages or ~/.cache/gemma4rt/xla"),
      "GEMMA4RT_PJRT_PLUGIN");
  auto* mesh = env(app->add_option("--mesh", o->mesh, "--backend xla: SPMD over a device mesh, e.g. data=2,model=4"),
                   "GEMMA4RT_MESH")
                   ->check([](const std::string& text) { return MeshFlagError(text); });
  env(app->add_option("--devices", o->devices, "--backend xla: split the model over N devices (--mesh model=N)"),
      "GEMMA4RT_DEVICES")
      ->check(CLI::Range(1, xla::kMaxMeshDevices))
      ->excludes(mesh);
  env(app->add_option("--compute-dtype", o->compute_dtype,
                      "--backend xla or cuda: the matmuls' dtype, auto|f32|bf16|f16 (f32 accumulation; auto: the "
                      "device policy)"),
      "GEMMA4RT_COMPUTE_DTYPE")
      ->check(CLI::IsMember(kComputeDtypeFlagValues));
  env(app->add_option("--device", o->device, "--backend xla or cuda: which device runs the model (default 0)"),
      "GEMMA4RT_DEVICE")
      ->check(CLI::Range(0, (1 << 16) - 1));
  env(app->add_option("--device-memory", o->device_memory,
                      "--backend xla: the memory the plan must fit, e.g. 512M or 8G (default: the device's)"),
      "GEMMA4RT_DEVICE_MEMORY")
      ->transform(CLI::AsSizeValue(false));
}

}  // namespace g4
