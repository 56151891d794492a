// The engine's side of the CUDA backend (cuda_module.h): the module is loaded on first use from
// $GEMMA4RT_CUDA_MODULE, else beside the running executable, else where the build wrote it.
#include <dlfcn.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>

#include "backends/cuda/cuda_module.h"

namespace g4 {
namespace {

struct Loaded {
  const cuda::ModuleApi* api = nullptr;
  std::string error;  // why not, where api is null
};

const Loaded& Module() {
  static Loaded loaded;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> paths;
    if (const char* env = std::getenv("GEMMA4RT_CUDA_MODULE"); env != nullptr && *env != '\0') {
      paths.push_back(env);
    } else {
      std::error_code ec;
      const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
      if (!ec) paths.push_back((exe.parent_path() / "libgemma4rt_cuda.so").string());
#ifdef GEMMA4RT_CUDA_MODULE_PATH
      paths.push_back(GEMMA4RT_CUDA_MODULE_PATH);
#endif
    }
    std::string tried;
    for (const std::string& p : paths) {
      if (!std::filesystem::exists(p)) {
        tried += (tried.empty() ? "" : "; ") + p + ": no such file";
        continue;
      }
      void* h = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) {
        const char* e = dlerror();
        tried += (tried.empty() ? "" : "; ") + p + ": " + (e ? e : "dlopen failed");
        continue;
      }
      using Entry = const cuda::ModuleApi* (*)();
      auto entry = reinterpret_cast<Entry>(dlsym(h, "g4_cuda_backend_api"));
      const cuda::ModuleApi* api = entry ? entry() : nullptr;
      if (api == nullptr || api->version != cuda::kModuleApiVersion) {
        tried += (tried.empty() ? "" : "; ") + p + ": not this build's CUDA backend module";
        continue;
      }
      loaded.api = api;
      return;
    }
    loaded.error = "cannot load the CUDA backend module (" + tried +
                   "; it needs the CUDA runtime and cuBLAS libraries; $GEMMA4RT_CUDA_MODULE names another path)";
  });
  return loaded;
}

}  // namespace

StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options) {
  const Loaded& m = Module();
  if (m.api == nullptr) return FailedPrecondition("--backend cuda: " + m.error);
  return m.api->make(options);
}

const CudaDeviceInfo* CudaInfo(const Backend& backend) {
  const Loaded& m = Module();
  return m.api ? m.api->info(backend) : nullptr;
}

CudaWeightBytes CudaWeights(const Backend& backend) {
  const Loaded& m = Module();
  return m.api ? m.api->weights(backend) : CudaWeightBytes{};
}

int CudaDeviceCount() {
  const Loaded& m = Module();
  return m.api ? m.api->device_count() : 0;
}

}  // namespace g4
