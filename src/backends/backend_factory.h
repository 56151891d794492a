// The one place that names the backends. The CLI (generate, logits, info, bench) and the server
// choose theirs with --backend cpu|xla|cuda, --pjrt-plugin PATH, --device N and --compute-dtype
// (backend_flags.h) and make it here;
// nothing else knows which backend runs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "graph/graph.h"
#include "runtime/backend.h"

namespace g4 {

inline const std::vector<std::string> kBackendNames = {"cpu", "xla", "cuda"};

struct BackendOptions {
  std::string backend = "cpu";  // --backend: "cpu", "xla" or "cuda"
  // --pjrt-plugin: the PJRT plugin for "xla"; "" = $GEMMA4RT_PJRT_PLUGIN, else the first plugin
  // FindPjrtPlugin finds.
  std::string pjrt_plugin;
  // --mesh "data=D,model=M" / --devices N (model=N): SPMD over D x M devices (xla only); "" and 0: one device.
  std::string mesh;
  int devices = 0;
  int threads = 1;               // CPU worker threads (>= 1)
  bool f32_activations = false;  // CPU: CpuBackendOptionsFor
  bool profile = false;          // CPU: CpuBackendOptions::profile (`bench --profile`)
  // XLA and CUDA (the CPU backend refuses other values): --compute-dtype auto|f32|bf16|f16 (the
  // device policy, src/backends/xla/device_policy.h), --device N (index into the plugin's
  // addressable devices), --device-memory SIZE (bytes the memory plan checks against; 0: the
  // device's own limit).
  std::string compute_dtype = "auto";
  int device = 0;
  int64_t device_memory = 0;
};

inline const std::vector<std::string> kComputeDtypeFlagValues = {"auto", "f32", "bf16", "f16"};

// Errors: InvalidArgument for an unknown backend name or a device option the backend does not
// take; for "xla": Unimplemented in a build without the XLA backend, InvalidArgument for a
// --device out of range or a --compute-dtype the device cannot honour (with the reason), NotFound
// when no plugin is given or found (naming where it looked), and MakeXlaBackend's (a file that is
// not a plugin, another API major version, the plugin's own); for "cuda": Unimplemented in a build
// without the CUDA backend, MakeCudaBackend's (no device, a compute dtype the device cannot honour).
StatusOr<std::unique_ptr<Backend>> MakeBackend(const BackendOptions& options);

// The device-policy fields of a backend MakeBackend made, for the first log line and `info`:
// "backend=cpu simd=AVX2 compute=f32 activations=..." or "backend=xla plugin=PATH api=0.115
// platform=cpu device=cpu device_index=0/1 device_memory=... compute=f32 compute_policy=\"auto: ...\"
// weights_on_device=..." or "backend=cuda device=0 name=... cc=9.0 device_memory=...
// compute=bf16(cc9.0>=8.0) accumulate=f32 ...".
std::string DevicePolicyFields(const Backend& backend, const BackendOptions& options);

// The per-device memory plan of `graph` on the backend's device mesh (--mesh), for `info --mesh`:
// a few lines (weights and KV cache per device, what is replicated and why), for `max_seqs`
// sequences of `max_context` tokens of `kv_type`. Empty for a backend without a mesh (cpu, one
// device). Errors: an invalid plan (an axis that divides nothing).
StatusOr<std::vector<std::string>> MeshPlanLines(const Backend& backend, const Graph& graph, const ModelConfig& config,
                                                 int max_seqs, int max_context, DType kv_type);
// The check of a --mesh value ("data=D,model=M"): "" when it parses, else why not (a usage error,
// exit 2). "" in a build without the XLA backend (MakeBackend then refuses --backend xla).
std::string MeshFlagError(const std::string& text);
// The sequences the smallest valid plan of `options`' mesh holds (its data axis; 1 without a mesh).
int MeshDataAxis(const BackendOptions& options);
// The XLA backend's memory plan so far (weights + KV cache + the largest compiled step against the
// device's memory), for a log line after warm-up; "" for another backend.
std::string MemoryPlanText(const Backend& backend);

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
