// The XLA backend's memory plan: the weights on the device + the KV cache + the largest compiled
// step's working memory, against the device's memory, checked before any step runs.
#pragma once

#include <cstdint>
#include <string>

#include "backends/xla/pjrt.h"
#include "base/status.h"

namespace g4::xla {

struct MemoryPlan {
  int64_t limit = 0;    // bytes of device memory; 0: unknown (nothing is checked)
  std::string limit_source;  // "the device's" or "--device-memory"
  std::string where = "the device";  // or "each device of the mesh data=1,model=4" (bytes are per device)
  int64_t weights = 0;  // bytes the weights take on the device (WeightDeviceBytes)
  int64_t kv = 0;       // bytes of the KV cache
  int64_t step = 0;     // the largest step working memory over the programs compiled so far
  std::string step_name;  // which step that is: "prefill step of 16 tokens"
  int64_t total() const { return weights + kv + step; }
};

// Working memory a compiled step needs beyond the weights and KV cache it is given (`resident`
// bytes of its arguments): its temporaries, its outputs that are not aliased to arguments (the
// logits), and its other arguments (the step's ids and positions).
int64_t StepWorkingBytes(const CompiledMemory& m, int64_t resident);

// OK when `plan` fits (or the limit is unknown); else ResourceExhausted with the arithmetic:
// "weights W bytes + KV cache K bytes (S sequences x C tokens) + prefill step of 16 tokens
// P bytes = N bytes > L bytes of device memory (the device's)". `kv_shape`: "(S sequences x C
// tokens)".
Status CheckMemoryPlan(const MemoryPlan& plan, const std::string& kv_shape);

// "weights 1.2 GiB + KV cache 64.0 MiB + largest step 12.0 MiB (decode step of 8 sequences) =
// 1.3 GiB of 80.0 GiB (the device's)"; the limit part reads "no device memory limit reported"
// when the limit is unknown.
std::string DescribeMemoryPlan(const MemoryPlan& plan);

}  // namespace g4::xla
