// A thin C++ layer over the PJRT C API (xla/pjrt/c/pjrt_c_api.h): plugin loading, client,
// buffers, compile and execute, with every PJRT_Error turned into a Status carrying the
// plugin's message.
//
// Call order (docs/ARCHITECTURE.md): dlopen -> GetPjrtApi -> major version check ->
// PJRT_Plugin_Initialize -> PJRT_Client_Create -> PJRT_Client_Compile (format "mlir", StableHLO
// text) -> PJRT_Client_BufferFromHostBuffer -> PJRT_LoadedExecutable_Execute ->
// PJRT_Buffer_ToHostBuffer. No function pointer past the plugin's PJRT_Api::struct_size is used
// (a plugin of an older minor version has a shorter table): such a call is an Unimplemented Status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "base/status.h"
#include "xla/pjrt/c/pjrt_c_api.h"

namespace g4::xla {

// A loaded plugin. Plugins are never unloaded (XLA's plugins register process-wide state), so one
// path is loaded and initialised once per process and shared.
class Plugin {
 public:
  // Errors: NotFound (no such file), InvalidArgument (not a shared library, or one without
  // GetPjrtApi: not a PJRT plugin), FailedPrecondition (a PJRT C API major version other than
  // this build's header), the plugin's own error from PJRT_Plugin_Initialize.
  static StatusOr<std::shared_ptr<const Plugin>> Load(const std::string& path);

  const PJRT_Api* api() const { return api_; }
  const std::string& path() const { return path_; }
  int major_version() const { return api_->pjrt_api_version.major_version; }
  int minor_version() const { return api_->pjrt_api_version.minor_version; }
  // "0.115"
  std::string VersionString() const;
  // Whether the plugin's function table reaches the field at `offset` (offsetof(PJRT_Api, F)) and
  // that entry is set.
  bool Has(size_t offset) const;
  // Converts (and frees) a PJRT_Error: OK for nullptr, else a Status "<what>: <plugin message>".
  Status ToStatus(PJRT_Error* error, const std::string& what) const;

 private:
  Plugin(std::string path, const PJRT_Api* api) : path_(std::move(path)), api_(api) {}
  std::string path_;
  const PJRT_Api* api_;
};

// Calls PJRT function `name` with `args` and returns its Status ("<what>: <plugin message>"), or
// an Unimplemented Status naming the function where the plugin's table ends before it (an older
// minor version) or leaves it unset.
#define G4_PJRT_CALL(plugin, name, args, what)                                                          \
  ((plugin).Has(offsetof(PJRT_Api, name))                                                              \
       ? (plugin).ToStatus((plugin).api()->name(args), what)                                           \
       : ::g4::Unimplemented(std::string(what) + ": the PJRT plugin (API " + (plugin).VersionString() + \
                             ") has no " #name))

// A client create option (PJRT_NamedValue): e.g. {"cpu_device_count", int64_t{1}} for the CPU plugin.
struct NamedOption {
  std::string name;
  std::variant<std::string, int64_t, bool, float> value;
};

class Client;

// An owned device buffer (PJRT_Buffer_Destroy on destruction).
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Plugin* plugin, PJRT_Buffer* buffer) : plugin_(plugin), buffer_(buffer) {}
  Buffer(Buffer&& o) noexcept : plugin_(o.plugin_), buffer_(o.buffer_) { o.buffer_ = nullptr; }
  Buffer& operator=(Buffer&& o) noexcept;
  ~Buffer() { Reset(); }
  void Reset();
  PJRT_Buffer* get() const { return buffer_; }
  // Gives up ownership (the caller destroys it, or hands it to Execute as a donated argument).
  PJRT_Buffer* release() {
    PJRT_Buffer* b = buffer_;
    buffer_ = nullptr;
    return b;
  }
  explicit operator bool() const { return buffer_ != nullptr; }
  StatusOr<std::vector<int64_t>> Dimensions() const;
  StatusOr<PJRT_Buffer_Type> ElementType() const;
  // Copies the whole buffer to `dst` (dense, row-major), `bytes` of room; waits for the copy.
  Status ToHost(void* dst, size_t bytes) const;

 private:
  const Plugin* plugin_ = nullptr;
  PJRT_Buffer* buffer_ = nullptr;
};

// Memory a compiled executable needs on its device, where the plugin reports it.
struct CompiledMemory {
  int64_t argument_bytes = 0, output_bytes = 0, alias_bytes = 0, temp_bytes = 0, code_bytes = 0;
  int64_t peak_bytes = 0;  // peak_memory_in_bytes: 0 where the plugin does not report it
};

class LoadedExecutable {
 public:
  LoadedExecutable(std::shared_ptr<const Plugin> plugin, PJRT_LoadedExecutable* exe) : plugin_(std::move(plugin)), exe_(exe) {}
  ~LoadedExecutable();
  LoadedExecutable(const LoadedExecutable&) = delete;
  LoadedExecutable& operator=(const LoadedExecutable&) = delete;
  StatusOr<size_t> NumOutputs() const;
  // Unimplemented where the plugin does not report it.
  StatusOr<CompiledMemory> MemoryStats() const;
  // The optimized program as compiled (an SPMD program: one partition's), serialized in the
  // plugin's format: *format "hlo" (an HloModuleProto) or another the plugin names.
  StatusOr<std::string> OptimizedProgram(std::string* format) const;
  // Runs on one device with `args` (one argument list). Arguments at `non_donatable` indices are
  // never donated; an argument the program aliases to an output and that is not listed is
  // donated: its buffer is invalid afterwards (destroy it). Waits until the outputs are ready.
  // `device`: run there (a portable executable: CompileOptions::portable); nullptr: the device
  // it was compiled for.
  StatusOr<std::vector<Buffer>> Execute(std::span<PJRT_Buffer* const> args, std::span<const int64_t> non_donatable,
                                        PJRT_Device* device = nullptr);
  // Runs an SPMD program on all its devices: args[d] is device d's argument list (its shards), in
  // the order of AddressableDevices(); returns each device's outputs in that order. Donation as
  // Execute; `device` as Execute's, with one argument list only. Waits until every device's
  // outputs are ready.
  StatusOr<std::vector<std::vector<Buffer>>> ExecuteSharded(const std::vector<std::vector<PJRT_Buffer*>>& args,
                                                            std::span<const int64_t> non_donatable,
                                                            PJRT_Device* device = nullptr);
  // The devices the program runs on, in argument-list order.
  StatusOr<std::vector<PJRT_Device*>> AddressableDevices() const;

 private:
  std::shared_ptr<const Plugin> plugin_;
  PJRT_LoadedExecutable* exe_;
};

class Client {
 public:
  // Errors: the plugin's (e.g. "No visible GPU devices"), InvalidArgument when it exposes no device.
  static StatusOr<std::unique_ptr<Client>> Create(std::shared_ptr<const Plugin> plugin,
                                                  const std::vector<NamedOption>& options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const Plugin& plugin() const { return *plugin_; }
  // "cpu", "cuda", "tpu", ... as the plugin names its platform.
  const std::string& platform_name() const { return platform_name_; }
  const std::string& platform_version() const { return platform_version_; }
  int num_devices() const { return static_cast<int>(devices_.size()); }
  // The addressable device's kind ("cpu", "NVIDIA H200"). InvalidArgument for an unknown device.
  StatusOr<std::string> DeviceKind(int device) const;
  // The index of an addressable device (as Upload takes it), -1 for another.
  int DeviceIndex(const PJRT_Device* device) const;
  // bytes_limit of PJRT_Device_MemoryStats where the plugin reports it; 0 where it does not.
  int64_t DeviceMemoryLimit(int device) const;
  // The device description's attributes (PJRT_DeviceDescription_Attributes), values as text
  // (int64 arrays joined by "."): e.g. {"compute_capability", "9.0"} on JAX's CUDA plugin.
  // InvalidArgument for an unknown device; an empty map where the plugin has none.
  StatusOr<std::vector<std::pair<std::string, std::string>>> DeviceAttributes(int device) const;
  // The addressable device `device` (nullptr when out of range).
  PJRT_Device* device(int device) const {
    return device >= 0 && device < num_devices() ? devices_[device] : nullptr;
  }

  // Copies `data` (dense, row-major, dims outermost first) to a new buffer on `device`; waits until
  // the host data is no longer needed. InvalidArgument for an unknown device.
  StatusOr<Buffer> Upload(const void* data, PJRT_Buffer_Type type, std::span<const int64_t> dims, int device = 0);
  // Compiles a StableHLO module (text) for one device with `compile_options`, a serialized
  // xla.CompileOptionsProto (compile_options.h).
  StatusOr<std::unique_ptr<LoadedExecutable>> Compile(const std::string& mlir, const std::string& compile_options);

 private:
  Client(std::shared_ptr<const Plugin> plugin, PJRT_Client* client) : plugin_(std::move(plugin)), client_(client) {}
  std::shared_ptr<const Plugin> plugin_;
  PJRT_Client* client_;
  std::vector<PJRT_Device*> devices_;
  std::string platform_name_, platform_version_;
};

}  // namespace g4::xla
