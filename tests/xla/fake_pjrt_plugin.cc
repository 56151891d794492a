// A stand-in PJRT plugin for the loader's error paths: exports GetPjrtApi with a function table
// that is either of another major version (G4_FAKE_MAJOR) or cut short right after
// PJRT_Plugin_Initialize (G4_FAKE_SHORT), as an older minor version's would be.
#include <cstddef>

#include "xla/pjrt/c/pjrt_c_api.h"

namespace {
PJRT_Error* Initialize(PJRT_Plugin_Initialize_Args*) { return nullptr; }

PJRT_Api MakeApi() {
  PJRT_Api api{};
  api.struct_size = PJRT_Api_STRUCT_SIZE;
  api.pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
  api.pjrt_api_version.major_version = G4_FAKE_MAJOR;
  api.pjrt_api_version.minor_version = 1;
  api.PJRT_Plugin_Initialize = Initialize;
#if G4_FAKE_SHORT
  api.struct_size = offsetof(PJRT_Api, PJRT_Plugin_Initialize) + sizeof(void*);
#endif
  return api;
}
const PJRT_Api kApi = MakeApi();
}  // namespace

extern "C" __attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi() { return &kApi; }
