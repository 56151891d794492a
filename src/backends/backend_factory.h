// The one place that names the backends. The CLI (generate, logits, info, bench) and the server
// choose theirs with --backend cpu|xla|cuda, --pjrt-plugin PATH, --device N and --compute-dtype
// (backend_flags.h) and make it here;
// nothing else knows which backend runs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/backend.h"

namespace g4 {

inline const std::vector<std::string> kBackendNames = {"cpu", "xla", "cuda"};

struct BackendOptions {
  std::string backend = "cpu";  // --backend: "cpu", "xla" or "cuda"
  // --pjrt-plugin: the PJRT plugin for "xla"; "" = $GEMMA4RT_PJRT_PLUGIN, else the first plugin
  // FindPjrtPlugin finds.
  std::string pjrt_plugin;
  int device = 0;                       // --device: the CUDA device for "cuda"
  std::string compute_dtype = "auto";   // --compute-dtype: auto, bf16, f16 or f32 ("cuda": cuda/cuda_policy.h)
  int threads = 1;               // CPU worker threads (>= 1)
  bool f32_activations = false;  // CPU: CpuBackendOptionsFor
  bool profile = false;          // CPU: CpuBackendOptions::profile (`bench --profile`)
};

// Errors: InvalidArgument for an unknown backend name; for "xla": Unimplemented in a build
// without the XLA backend, NotFound when no plugin is given or found (naming where it looked),
// and MakeXlaBackend's (a file that is not a plugin, another API major version, the plugin's own);
// for "cuda": Unimplemented in a build without the CUDA backend, MakeCudaBackend's (no device, a
// compute dtype the device cannot honour).
StatusOr<std::unique_ptr<Backend>> MakeBackend(const BackendOptions& options);

// The device-policy fields of a backend MakeBackend made, for the first log line and `info`:
// "backend=cpu simd=AVX2 compute=f32 activations=..." or "backend=xla plugin=PATH api=0.115
// platform=cpu device=cpu device_memory=... compute=f32 weights_on_device=..." or "backend=cuda
// device=0 name=... cc=9.0 device_memory=... compute=bf16(cc9.0>=8.0) accumulate=f32 ...".
std::string DevicePolicyFields(const Backend& backend, const BackendOptions& options);

// Whether the loader should repack Q4_0 weights for the CPU kernels (LoadOptions::pack_q4_0):
// only for the CPU backend (PackQ4_0ForCpu); the XLA backend reads weights as stored.
bool PackQ4_0For(const BackendOptions& options, bool no_repack);

// A PJRT plugin for --backend xla without --pjrt-plugin: $GEMMA4RT_PJRT_PLUGIN, then, in Python
// site-packages directories ($VIRTUAL_ENV, ~/.local, /usr/local, /usr) and gemma4rt's cache
// (~/.cache/gemma4rt/xla, scripts/setup-xla.sh): libtpu, JAX's CUDA plugins and XLA's CPU plugin,
// in that order. `searched` receives one line per place looked at and what was there.
// NotFound (with the places) when there is none.
StatusOr<std::string> FindPjrtPlugin(std::vector<std::string>* searched);

}  // namespace g4
