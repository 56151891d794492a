#include "backends/backend_factory.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#if GEMMA4RT_HAVE_XLA
#include "backends/xla/mesh.h"
#include "backends/xla/device_policy.h"
#include "backends/xla/xla_backend.h"
#endif
#if GEMMA4RT_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace g4 {
namespace {

namespace fs = std::filesystem;

// Python site-packages (and dist-packages) directories under `prefix`/lib/python3.*/.
std::vector<fs::path> SitePackages(const fs::path& prefix) {
  std::vector<fs::path> out;
  std::error_code ec;
  const fs::path lib = prefix / "lib";
  if (!fs::is_directory(lib, ec)) return out;
  for (const auto& e : fs::directory_iterator(lib, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("python3", 0) != 0) continue;
    for (const char* sub : {"site-packages", "dist-packages"})
      if (fs::is_directory(e.path() / sub, ec)) out.push_back(e.path() / sub);
  }
  return out;
}

}  // namespace

StatusOr<std::string> FindPjrtPlugin(std::vector<std::string>* searched) {
  if (const char* env = std::getenv("GEMMA4RT_PJRT_PLUGIN"); env != nullptr && *env != '\0') {
    if (searched) searched->push_back(std::string("$GEMMA4RT_PJRT_PLUGIN: ") + env);
    return std::string(env);
  }
  const char* home = std::getenv("HOME");
  std::vector<fs::path> dirs;
  if (const char* venv = std::getenv("VIRTUAL_ENV")) for (auto& d : SitePackages(venv)) dirs.push_back(d);
  if (home) for (auto& d : SitePackages(fs::path(home) / ".local")) dirs.push_back(d);
  for (const char* prefix : {"/usr/local", "/usr"}) for (auto& d : SitePackages(prefix)) dirs.push_back(d);
  // Relative to a site-packages directory, most specific accelerator first.
  static const char* const kPlugins[] = {"libtpu/libtpu.so", "jax_plugins/xla_cuda13/xla_cuda_plugin.so",
                                         "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
                                         "lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so"};
  std::error_code ec;
  for (const fs::path& d : dirs) {
    for (const char* rel : kPlugins) {
      if (fs::is_regular_file(d / rel, ec)) {
        if (searched) searched->push_back(d.string() + ": found " + rel);
        return (d / rel).string();
      }
    }
    if (searched) searched->push_back(d.string() + ": no PJRT plugin");
  }
  if (home) {
    const fs::path cpu = fs::path(home) / ".cache/gemma4rt/xla/lammps-jax-pjrt-cpu-0.11.2/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so";
    if (fs::is_regular_file(cpu, ec)) {
      if (searched) searched->push_back(cpu.parent_path().string() + ": found " + cpu.filename().string());
      return cpu.string();
    }
    if (searched) searched->push_back((fs::path(home) / ".cache/gemma4rt/xla").string() + ": no PJRT plugin");
  }
  std::string where;
  if (searched)
    for (const std::string& s : *searched) where += (where.empty() ? "" : "; ") + s;
  return NotFound("--backend xla: no PJRT plugin given (--pjrt-plugin PATH or $GEMMA4RT_PJRT_PLUGIN) or found (" +
                  (where.empty() ? std::string("no site-packages directory") : where) +
                  "); scripts/setup-xla.sh installs XLA's CPU plugin");
}

StatusOr<std::unique_ptr<Backend>> MakeBackend(const BackendOptions& o) {
  if (o.backend == "cpu") {
    if (!o.mesh.empty() || o.devices != 0) return InvalidArgument("--mesh and --devices need --backend xla");
    if (o.device != 0) return InvalidArgument("--device applies to --backend xla or cuda");
    if (o.device_memory != 0) return InvalidArgument("--device-memory applies to --backend xla (the device's memory plan)");
    if (o.compute_dtype != "auto" && o.compute_dtype != "f32")
      return InvalidArgument("--compute-dtype " + o.compute_dtype +
                             ": the CPU backend accumulates in f32 (its activation policy is --f32-activations); "
                             "--compute-dtype applies to --backend xla or cuda");
    CpuBackendOptions co = CpuBackendOptionsFor(o.f32_activations);
    co.profile = o.profile;
    return MakeCpuBackend(o.threads, co);
  }
  if (o.backend == "cuda") {
    if (!o.mesh.empty() || o.devices != 0) return InvalidArgument("--mesh and --devices need --backend xla");
    if (o.device_memory != 0)
      return InvalidArgument("--device-memory applies to --backend xla (the CUDA backend plans against free device memory)");
#if GEMMA4RT_HAVE_CUDA
    return MakeCudaBackend({o.device, o.compute_dtype});
#else
    return Unimplemented("--backend cuda: this build has no CUDA backend (configure with the CUDA toolkit: "
                         "cmake -DGEMMA4RT_CUDA=ON; scripts/build.sh does where nvcc is found)");
#endif
  }
  if (o.backend != "xla") return InvalidArgument("--backend must be cpu, xla or cuda, got '" + o.backend + "'");
#if GEMMA4RT_HAVE_XLA
  xla::Mesh mesh;
  if (!o.mesh.empty() && o.devices > 0) return InvalidArgument("give --mesh or --devices, not both");
  if ((!o.mesh.empty() || o.devices > 1) && o.device != 0)
    return InvalidArgument("--device picks one device; a mesh runs on devices 0 to N-1 (drop --device)");
  if (!o.mesh.empty()) {
    G4_ASSIGN_OR_RETURN(mesh, xla::ParseMesh(o.mesh));
  } else if (o.devices != 0) {
    G4_ASSIGN_OR_RETURN(mesh, xla::MeshOfDevices(o.devices));
  }
  std::string path = o.pjrt_plugin;
  if (path.empty()) {
    std::vector<std::string> searched;
    G4_ASSIGN_OR_RETURN(path, FindPjrtPlugin(&searched));
    for (const std::string& s : searched) std::fprintf(stderr, "gemma4rt: looking for a PJRT plugin: %s\n", s.c_str());
  }
  XlaBackendOptions xo;
  xo.plugin_path = path;
  xo.mesh = mesh;
  xo.compute_dtype = o.compute_dtype;
  xo.device = o.device;
  xo.device_memory_bytes = o.device_memory;
  return MakeXlaBackend(xo);
#else
  return Unimplemented("--backend xla: this build has no XLA backend (configure with the PJRT C API header: "
                       "scripts/setup-xla.sh, then cmake -DGEMMA4RT_XLA_INCLUDE_DIR=...)");
#endif
}

std::string DevicePolicyFields(const Backend& backend, const BackendOptions& o) {
#if GEMMA4RT_HAVE_XLA
  if (const XlaDeviceInfo* x = XlaInfo(backend)) {
    char mem[64] = "unreported";
    if (x->memory_bytes > 0) std::snprintf(mem, sizeof mem, "%.1fGiB", x->memory_bytes / 1073741824.0);
    return "backend=xla plugin=" + x->plugin_path + " api=" + x->api_version + " platform=" + x->platform +
           " device=\"" + x->device_kind + "\" device_index=" + std::to_string(x->device) + "/" +
           std::to_string(x->num_devices) + (x->compute_capability.empty() ? "" : " compute_capability=" + x->compute_capability) +
           " device_memory=" + mem + (x->mesh.size() > 1 ? " mesh=" + x->mesh.ToString() : std::string()) +
           " compute=" + x->compute_dtype + " compute_policy=\"" + x->compute_reason +
           "\" weights_on_device=" + xla::WeightsOnDevice(x->compute);
  }
#endif
#if GEMMA4RT_HAVE_CUDA
  if (const CudaDeviceInfo* c = backend.Name() == "cuda" ? CudaInfo(backend) : nullptr) {  // (loads no module for cpu/xla)
    char mem[96];
    std::snprintf(mem, sizeof mem, "%.1fGiB(free=%.1fGiB)", c->total_memory / 1073741824.0, c->free_memory / 1073741824.0);
    return "backend=cuda device=" + std::to_string(c->device) + " name=\"" + c->name + "\" cc=" + std::to_string(c->cc_major) +
           "." + std::to_string(c->cc_minor) + " sms=" + std::to_string(c->sm_count) + " device_memory=" + mem +
           " compute=" + c->compute_dtype + "(" + c->compute_reason + ") accumulate=f32 activations=f32" +
           " weights_on_device=f16,bf16-as-" + c->compute_dtype + ",f32-as-" + c->compute_dtype +
           ",q8_0/q4_0/q4_k/q6_k/w4g32-as-stored kv_cache=on-device";
  }
#endif
  (void)backend;
  return std::string("backend=cpu simd=") + cpu::SimdTargetName() +
         " compute=f32 activations=" + ActivationPolicy(CpuBackendOptionsFor(o.f32_activations));
}

StatusOr<std::vector<std::string>> MeshPlanLines(const Backend& backend, const Graph& graph, const ModelConfig& config,
                                                 int max_seqs, int max_context, DType kv_type) {
#if GEMMA4RT_HAVE_XLA
  if (const XlaDeviceInfo* x = XlaInfo(backend); x != nullptr && x->mesh.size() > 1)
    return XlaMeshPlan(backend, graph, config, max_seqs, max_context, kv_type);
#endif
  (void)backend, (void)graph, (void)config, (void)max_seqs, (void)max_context, (void)kv_type;
  return std::vector<std::string>{};
}

std::string MeshFlagError(const std::string& text) {
#if GEMMA4RT_HAVE_XLA
  if (auto m = xla::ParseMesh(text); !m.ok()) return m.status().message();
#endif
  (void)text;
  return "";
}

int MeshDataAxis(const BackendOptions& o) {
#if GEMMA4RT_HAVE_XLA
  if (!o.mesh.empty())
    if (auto m = xla::ParseMesh(o.mesh); m.ok()) return m->data;
#endif
  (void)o;
  return 1;
}

std::string MemoryPlanText(const Backend& backend) {
#if GEMMA4RT_HAVE_XLA
  if (const xla::MemoryPlan* p = XlaPlan(backend)) return xla::DescribeMemoryPlan(*p);
#endif
  (void)backend;
  return "";
}

bool PackQ4_0For(const BackendOptions& o, bool no_repack) {
  return o.backend == "cpu" && PackQ4_0ForCpu(o.f32_activations, no_repack);
}

}  // namespace g4
