#include "backends/xla/pjrt.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstring>
#include <string_view>
#include <map>
#include <mutex>

namespace g4::xla {
namespace {

// Every args struct starts with struct_size and extension_start: zero it and set the size this
// build's header gives (the plugin reads no field past it).
template <class T>
T Args(size_t size) {
  T a{};
  a.struct_size = size;
  return a;
}
#define G4_ARGS(T) Args<T>(T##_STRUCT_SIZE)

// Waits for and destroys `event`; its error as a Status.
Status AwaitEvent(const Plugin& p, PJRT_Event* event, const std::string& what) {
  if (event == nullptr) return OkStatus();
  auto await = G4_ARGS(PJRT_Event_Await_Args);
  await.event = event;
  Status s = G4_PJRT_CALL(p, PJRT_Event_Await, &await, what);
  auto destroy = G4_ARGS(PJRT_Event_Destroy_Args);
  destroy.event = event;
  Status d = G4_PJRT_CALL(p, PJRT_Event_Destroy, &destroy, what);
  return s.ok() ? d : s;
}

}  // namespace

std::string Plugin::VersionString() const {
  return std::to_string(major_version()) + "." + std::to_string(minor_version());
}

bool Plugin::Has(size_t offset) const {
  if (offset + sizeof(void*) > api_->struct_size) return false;
  void* entry;
  std::memcpy(&entry, reinterpret_cast<const char*>(api_) + offset, sizeof(void*));
  return entry != nullptr;
}

Status Plugin::ToStatus(PJRT_Error* error, const std::string& what) const {
  if (error == nullptr) return OkStatus();
  std::string message = "(no message)";
  if (Has(offsetof(PJRT_Api, PJRT_Error_Message))) {
    auto m = G4_ARGS(PJRT_Error_Message_Args);
    m.error = error;
    api_->PJRT_Error_Message(&m);
    if (m.message != nullptr) message.assign(m.message, m.message_size);
  }
  StatusCode code = StatusCode::kInternal;
  if (Has(offsetof(PJRT_Api, PJRT_Error_GetCode))) {
    auto c = G4_ARGS(PJRT_Error_GetCode_Args);
    c.error = error;
    PJRT_Error* e2 = api_->PJRT_Error_GetCode(&c);
    if (e2 == nullptr) {
      switch (c.code) {
        case PJRT_Error_Code_INVALID_ARGUMENT: code = StatusCode::kInvalidArgument; break;
        case PJRT_Error_Code_NOT_FOUND: code = StatusCode::kNotFound; break;
        case PJRT_Error_Code_RESOURCE_EXHAUSTED: code = StatusCode::kResourceExhausted; break;
        case PJRT_Error_Code_FAILED_PRECONDITION: code = StatusCode::kFailedPrecondition; break;
        case PJRT_Error_Code_UNIMPLEMENTED: code = StatusCode::kUnimplemented; break;
        case PJRT_Error_Code_CANCELLED: code = StatusCode::kCancelled; break;
        default: break;
      }
    } else if (Has(offsetof(PJRT_Api, PJRT_Error_Destroy))) {
      auto d = G4_ARGS(PJRT_Error_Destroy_Args);
      d.error = e2;
      api_->PJRT_Error_Destroy(&d);
    }
  }
  if (Has(offsetof(PJRT_Api, PJRT_Error_Destroy))) {
    auto d = G4_ARGS(PJRT_Error_Destroy_Args);
    d.error = error;
    api_->PJRT_Error_Destroy(&d);
  }
  return Status(code, what + ": " + message);
}

StatusOr<std::shared_ptr<const Plugin>> Plugin::Load(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Plugin>> loaded;  // plugins are never unloaded
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = loaded.find(path); it != loaded.end()) return it->second;
  struct stat st;
  if (path.empty() || stat(path.c_str(), &st) != 0) return NotFound("PJRT plugin '" + path + "': no such file");
  if (!S_ISREG(st.st_mode)) return InvalidArgument("PJRT plugin '" + path + "' is not a regular file");
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return InvalidArgument("PJRT plugin '" + path + "' could not be loaded as a shared library: " + (err ? err : "?"));
  }
  using GetApiFn = const PJRT_Api* (*)();
  auto get_api = reinterpret_cast<GetApiFn>(dlsym(handle, "GetPjrtApi"));
  if (get_api == nullptr) {
    dlclose(handle);
    return InvalidArgument("'" + path + "' is not a PJRT plugin: it exports no GetPjrtApi");
  }
  const PJRT_Api* api = get_api();
  if (api == nullptr) return InvalidArgument("PJRT plugin '" + path + "': GetPjrtApi returned no function table");
  if (api->struct_size < offsetof(PJRT_Api, pjrt_api_version) + sizeof(PJRT_Api_Version))
    return InvalidArgument("PJRT plugin '" + path + "': its function table is too short to be one");
  const int major = api->pjrt_api_version.major_version;
  if (major != PJRT_API_MAJOR)
    return FailedPrecondition("PJRT plugin '" + path + "' implements PJRT C API " + std::to_string(major) + "." +
                              std::to_string(api->pjrt_api_version.minor_version) + "; this build speaks major version " +
                              std::to_string(PJRT_API_MAJOR) + " (API " + std::to_string(PJRT_API_MAJOR) + "." +
                              std::to_string(PJRT_API_MINOR) + ")");
  std::shared_ptr<const Plugin> plugin(new Plugin(path, api));
  auto init = G4_ARGS(PJRT_Plugin_Initialize_Args);
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(*plugin, PJRT_Plugin_Initialize, &init, "PJRT plugin '" + path + "': initialize"));
  loaded.emplace(path, plugin);
  return plugin;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    Reset();
    plugin_ = o.plugin_;
    buffer_ = o.buffer_;
    o.buffer_ = nullptr;
  }
  return *this;
}

void Buffer::Reset() {
  if (buffer_ == nullptr) return;
  auto a = G4_ARGS(PJRT_Buffer_Destroy_Args);
  a.buffer = buffer_;
  buffer_ = nullptr;
  (void)G4_PJRT_CALL(*plugin_, PJRT_Buffer_Destroy, &a, "destroy buffer");
}

StatusOr<std::vector<int64_t>> Buffer::Dimensions() const {
  auto a = G4_ARGS(PJRT_Buffer_Dimensions_Args);
  a.buffer = buffer_;
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(*plugin_, PJRT_Buffer_Dimensions, &a, "buffer dimensions"));
  return std::vector<int64_t>(a.dims, a.dims + a.num_dims);
}

StatusOr<PJRT_Buffer_Type> Buffer::ElementType() const {
  auto a = G4_ARGS(PJRT_Buffer_ElementType_Args);
  a.buffer = buffer_;
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(*plugin_, PJRT_Buffer_ElementType, &a, "buffer element type"));
  return a.type;
}

Status Buffer::ToHost(void* dst, size_t bytes) const {
  auto q = G4_ARGS(PJRT_Buffer_ToHostBuffer_Args);
  q.src = buffer_;
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(*plugin_, PJRT_Buffer_ToHostBuffer, &q, "device-to-host size"));
  if (q.dst_size > bytes)
    return InvalidArgument("device-to-host copy: the buffer holds " + std::to_string(q.dst_size) + " bytes, room for " +
                           std::to_string(bytes));
  auto a = G4_ARGS(PJRT_Buffer_ToHostBuffer_Args);
  a.src = buffer_;
  a.dst = dst;
  a.dst_size = q.dst_size;
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(*plugin_, PJRT_Buffer_ToHostBuffer, &a, "device-to-host copy"));
  return AwaitEvent(*plugin_, a.event, "device-to-host copy");
}

LoadedExecutable::~LoadedExecutable() {
  auto a = G4_ARGS(PJRT_LoadedExecutable_Destroy_Args);
  a.executable = exe_;
  (void)G4_PJRT_CALL(*plugin_, PJRT_LoadedExecutable_Destroy, &a, "destroy executable");
}

namespace {
// The PJRT_Executable behind a loaded one, destroyed with the guard.
struct ExecutableRef {
  const Plugin* plugin;
  PJRT_Executable* exe = nullptr;
  ~ExecutableRef() {
    if (exe == nullptr) return;
    auto a = G4_ARGS(PJRT_Executable_Destroy_Args);
    a.executable = exe;
    (void)G4_PJRT_CALL(*plugin, PJRT_Executable_Destroy, &a, "destroy executable");
  }
};
Status GetExecutable(const Plugin& p, PJRT_LoadedExecutable* loaded, ExecutableRef* out) {
  auto a = G4_ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  a.loaded_executable = loaded;
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(p, PJRT_LoadedExecutable_GetExecutable, &a, "get executable"));
  out->plugin = &p;
  out->exe = a.executable;
  return OkStatus();
}
}  // namespace

StatusOr<size_t> LoadedExecutable::NumOutputs() const {
  ExecutableRef ref{plugin_.get()};
  G4_RETURN_IF_ERROR(GetExecutable(*plugin_, exe_, &ref));
  auto a = G4_ARGS(PJRT_Executable_NumOutputs_Args);
  a.executable = ref.exe;
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(*plugin_, PJRT_Executable_NumOutputs, &a, "executable outputs"));
  return a.num_outputs;
}

StatusOr<CompiledMemory> LoadedExecutable::MemoryStats() const {
  ExecutableRef ref{plugin_.get()};
  G4_RETURN_IF_ERROR(GetExecutable(*plugin_, exe_, &ref));
  auto a = G4_ARGS(PJRT_Executable_GetCompiledMemoryStats_Args);
  a.executable = ref.exe;
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(*plugin_, PJRT_Executable_GetCompiledMemoryStats, &a, "compiled memory stats"));
  CompiledMemory m;
  m.argument_bytes = a.argument_size_in_bytes;
  m.output_bytes = a.output_size_in_bytes;
  m.alias_bytes = a.alias_size_in_bytes;
  m.temp_bytes = a.temp_size_in_bytes;
  m.code_bytes = a.generated_code_size_in_bytes;
  m.peak_bytes = a.peak_memory_in_bytes;
  return m;
}

StatusOr<std::string> LoadedExecutable::OptimizedProgram(std::string* format) const {
  ExecutableRef ref{plugin_.get()};
  G4_RETURN_IF_ERROR(GetExecutable(*plugin_, exe_, &ref));
  auto program = G4_ARGS(PJRT_Program);
  auto a = G4_ARGS(PJRT_Executable_OptimizedProgram_Args);
  a.executable = ref.exe;
  a.program = &program;
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(*plugin_, PJRT_Executable_OptimizedProgram, &a, "optimized program"));  // its size
  std::string code(program.code_size, '\0');
  program.code = code.data();
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(*plugin_, PJRT_Executable_OptimizedProgram, &a, "optimized program"));
  code.resize(program.code_size);
  if (format != nullptr) *format = std::string(program.format, program.format_size);
  return code;
}

StatusOr<std::vector<Buffer>> LoadedExecutable::Execute(std::span<PJRT_Buffer* const> args,
                                                        std::span<const int64_t> non_donatable, PJRT_Device* device) {
  G4_ASSIGN_OR_RETURN(auto outs,
                      ExecuteSharded({std::vector<PJRT_Buffer*>(args.begin(), args.end())}, non_donatable, device));
  return std::move(outs[0]);
}

StatusOr<std::vector<PJRT_Device*>> LoadedExecutable::AddressableDevices() const {
  auto a = G4_ARGS(PJRT_LoadedExecutable_AddressableDevices_Args);
  a.executable = exe_;
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(*plugin_, PJRT_LoadedExecutable_AddressableDevices, &a, "executable devices"));
  return std::vector<PJRT_Device*>(a.addressable_devices, a.addressable_devices + a.num_addressable_devices);
}

StatusOr<std::vector<std::vector<Buffer>>> LoadedExecutable::ExecuteSharded(
    const std::vector<std::vector<PJRT_Buffer*>>& args, std::span<const int64_t> non_donatable, PJRT_Device* device) {
  G4_ASSIGN_OR_RETURN(size_t num_outputs, NumOutputs());
  const size_t n = args.size();
  if (n == 0) return InvalidArgument("execute: no argument list");
  for (const auto& list : args)
    if (list.size() != args[0].size()) return InvalidArgument("execute: the devices' argument lists differ in length");
  std::vector<std::vector<PJRT_Buffer*>> outputs(n, std::vector<PJRT_Buffer*>(num_outputs, nullptr));
  std::vector<PJRT_Buffer**> output_lists(n);
  std::vector<PJRT_Buffer* const*> arg_lists(n);
  for (size_t d = 0; d < n; ++d) {
    output_lists[d] = outputs[d].data();
    arg_lists[d] = args[d].data();
  }
  std::vector<PJRT_Event*> done(n, nullptr);
  auto opts = G4_ARGS(PJRT_ExecuteOptions);
  opts.non_donatable_input_indices = non_donatable.data();
  opts.num_non_donatable_input_indices = non_donatable.size();
  auto a = G4_ARGS(PJRT_LoadedExecutable_Execute_Args);
  a.executable = exe_;
  a.options = &opts;
  a.argument_lists = arg_lists.data();
  a.num_devices = n;
  a.num_args = args[0].size();
  a.output_lists = output_lists.data();
  a.device_complete_events = done.data();
  a.execute_device = device;
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(*plugin_, PJRT_LoadedExecutable_Execute, &a, "execute"));
  std::vector<std::vector<Buffer>> result(n);
  for (size_t d = 0; d < n; ++d) {
    result[d].reserve(num_outputs);
    for (PJRT_Buffer* b : outputs[d]) result[d].emplace_back(plugin_.get(), b);
  }
  Status status = OkStatus();
  for (PJRT_Event* e : done) {
    Status s = AwaitEvent(*plugin_, e, "execute");
    if (status.ok()) status = s;
  }
  G4_RETURN_IF_ERROR(status);
  return result;
}

StatusOr<std::unique_ptr<Client>> Client::Create(std::shared_ptr<const Plugin> plugin,
                                                 const std::vector<NamedOption>& options) {
  std::vector<PJRT_NamedValue> values(options.size());
  for (size_t i = 0; i < options.size(); ++i) {
    PJRT_NamedValue& v = values[i];
    v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    v.name = options[i].name.c_str();
    v.name_size = options[i].name.size();
    v.value_size = 1;
    if (const auto* s = std::get_if<std::string>(&options[i].value)) {
      v.type = PJRT_NamedValue_kString;
      v.string_value = s->c_str();
      v.value_size = s->size();
    } else if (const auto* n = std::get_if<int64_t>(&options[i].value)) {
      v.type = PJRT_NamedValue_kInt64;
      v.int64_value = *n;
    } else if (const auto* b = std::get_if<bool>(&options[i].value)) {
      v.type = PJRT_NamedValue_kBool;
      v.bool_value = *b;
    } else {
      v.type = PJRT_NamedValue_kFloat;
      v.float_value = std::get<float>(options[i].value);
    }
  }
  auto a = G4_ARGS(PJRT_Client_Create_Args);
  a.create_options = values.data();
  a.num_options = values.size();
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(*plugin, PJRT_Client_Create, &a, "create PJRT client"));
  std::unique_ptr<Client> c(new Client(plugin, a.client));

  auto name = G4_ARGS(PJRT_Client_PlatformName_Args);
  name.client = c->client_;
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(*plugin, PJRT_Client_PlatformName, &name, "platform name"));
  c->platform_name_.assign(name.platform_name, name.platform_name_size);
  auto version = G4_ARGS(PJRT_Client_PlatformVersion_Args);
  version.client = c->client_;
  if (G4_PJRT_CALL(*plugin, PJRT_Client_PlatformVersion, &version, "platform version").ok())
    c->platform_version_.assign(version.platform_version, version.platform_version_size);
  auto devs = G4_ARGS(PJRT_Client_AddressableDevices_Args);
  devs.client = c->client_;
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(*plugin, PJRT_Client_AddressableDevices, &devs, "addressable devices"));
  c->devices_.assign(devs.addressable_devices, devs.addressable_devices + devs.num_addressable_devices);
  if (c->devices_.empty()) return InvalidArgument("PJRT plugin '" + plugin->path() + "' exposes no addressable device");
  return c;
}

Client::~Client() {
  auto a = G4_ARGS(PJRT_Client_Destroy_Args);
  a.client = client_;
  (void)G4_PJRT_CALL(*plugin_, PJRT_Client_Destroy, &a, "destroy client");
}

namespace {

// The description of `client`'s addressable device `device`; InvalidArgument for an unknown device.
StatusOr<PJRT_DeviceDescription*> DeviceDescription(const Client& client, int device) {
  if (device < 0 || device >= client.num_devices())
    return InvalidArgument("device " + std::to_string(device) + " does not exist: the " + client.platform_name() +
                           " client has " + std::to_string(client.num_devices()) + " device(s)");
  auto d = G4_ARGS(PJRT_Device_GetDescription_Args);
  d.device = client.device(device);
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(client.plugin(), PJRT_Device_GetDescription, &d, "device description"));
  return d.device_description;
}

}  // namespace

StatusOr<std::string> Client::DeviceKind(int device) const {
  G4_ASSIGN_OR_RETURN(PJRT_DeviceDescription* description, DeviceDescription(*this, device));
  auto k = G4_ARGS(PJRT_DeviceDescription_Kind_Args);
  k.device_description = description;
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(*plugin_, PJRT_DeviceDescription_Kind, &k, "device kind"));
  return std::string(k.device_kind, k.device_kind_size);
}

int Client::DeviceIndex(const PJRT_Device* device) const {
  for (size_t i = 0; i < devices_.size(); ++i)
    if (devices_[i] == device) return static_cast<int>(i);
  return -1;
}

int64_t Client::DeviceMemoryLimit(int device) const {
  if (device < 0 || device >= num_devices()) return 0;
  auto m = G4_ARGS(PJRT_Device_MemoryStats_Args);
  m.device = devices_[device];
  if (!G4_PJRT_CALL(*plugin_, PJRT_Device_MemoryStats, &m, "device memory").ok()) return 0;
  return m.bytes_limit_is_set ? m.bytes_limit : 0;
}

StatusOr<std::vector<std::pair<std::string, std::string>>> Client::DeviceAttributes(int device) const {
  G4_ASSIGN_OR_RETURN(PJRT_DeviceDescription* description, DeviceDescription(*this, device));
  auto a = G4_ARGS(PJRT_DeviceDescription_Attributes_Args);
  a.device_description = description;
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(*plugin_, PJRT_DeviceDescription_Attributes, &a, "device attributes"));
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < a.num_attributes; ++i) {
    const PJRT_NamedValue& v = a.attributes[i];
    std::string text;
    switch (v.type) {
      case PJRT_NamedValue_kString: text.assign(v.string_value, v.value_size); break;
      case PJRT_NamedValue_kInt64: text = std::to_string(v.int64_value); break;
      case PJRT_NamedValue_kInt64List:
        for (size_t j = 0; j < v.value_size; ++j) text += (j ? "." : "") + std::to_string(v.int64_array_value[j]);
        break;
      case PJRT_NamedValue_kFloat: text = std::to_string(v.float_value); break;
      case PJRT_NamedValue_kBool: text = v.bool_value ? "true" : "false"; break;
      default: continue;
    }
    out.emplace_back(std::string(v.name, v.name_size), std::move(text));
  }
  return out;
}

StatusOr<Buffer> Client::Upload(const void* data, PJRT_Buffer_Type type, std::span<const int64_t> dims, int device) {
  if (device < 0 || device >= num_devices())
    return InvalidArgument("device " + std::to_string(device) + " does not exist: the " + platform_name_ +
                           " client has " + std::to_string(num_devices()) + " device(s)");
  auto a = G4_ARGS(PJRT_Client_BufferFromHostBuffer_Args);
  a.client = client_;
  a.data = data;
  a.type = type;
  a.dims = dims.data();
  a.num_dims = dims.size();
  a.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
  a.device = devices_[device];
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(*plugin_, PJRT_Client_BufferFromHostBuffer, &a, "host-to-device copy"));
  Buffer b(plugin_.get(), a.buffer);
  G4_RETURN_IF_ERROR(AwaitEvent(*plugin_, a.done_with_host_buffer, "host-to-device copy"));
  return b;
}

StatusOr<std::unique_ptr<LoadedExecutable>> Client::Compile(const std::string& mlir, const std::string& compile_options) {
  std::string code = mlir;  // PJRT_Program::code is a non-const char*
  static const char kFormat[] = "mlir";
  auto prog = G4_ARGS(PJRT_Program);
  prog.code = code.data();
  prog.code_size = code.size();
  prog.format = kFormat;
  prog.format_size = sizeof(kFormat) - 1;
  auto a = G4_ARGS(PJRT_Client_Compile_Args);
  a.client = client_;
  a.program = &prog;
  a.compile_options = compile_options.data();
  a.compile_options_size = compile_options.size();
  G4_RETURN_IF_ERROR(G4_PJRT_CALL(*plugin_, PJRT_Client_Compile, &a, "compile StableHLO"));
  return std::make_unique<LoadedExecutable>(plugin_, a.executable);
}

}  // namespace g4::xla
