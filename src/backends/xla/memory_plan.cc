#include "backends/xla/memory_plan.h"

#include <algorithm>
#include <cstdio>

namespace g4::xla {
namespace {

std::string Human(int64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1073741824.0) std::snprintf(buf, sizeof buf, "%.1f GiB", b / 1073741824.0);
  else if (b >= 1048576.0) std::snprintf(buf, sizeof buf, "%.1f MiB", b / 1048576.0);
  else std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  return buf;
}

}  // namespace

int64_t StepWorkingBytes(const CompiledMemory& m, int64_t resident) {
  return m.temp_bytes + std::max<int64_t>(0, m.output_bytes - m.alias_bytes) +
         std::max<int64_t>(0, m.argument_bytes - resident);
}

Status CheckMemoryPlan(const MemoryPlan& p, const std::string& kv_shape) {
  if (p.limit <= 0 || p.total() <= p.limit) return OkStatus();
  std::string parts = "weights " + std::to_string(p.weights) + " bytes + KV cache " + std::to_string(p.kv) + " bytes " +
                      kv_shape;
  if (p.step > 0) parts += " + " + p.step_name + " " + std::to_string(p.step) + " bytes";
  return ResourceExhausted("the model does not fit on " + p.where + ": " + parts + " = " + std::to_string(p.total()) +
                           " bytes > " + std::to_string(p.limit) + " bytes of device memory (" + p.limit_source + ")" +
                           (p.step > 0 ? "" : ", before the steps' working memory"));
}

std::string DescribeMemoryPlan(const MemoryPlan& p) {
  std::string s = "weights " + Human(p.weights) + " + KV cache " + Human(p.kv) + " + largest step " + Human(p.step);
  if (!p.step_name.empty()) s += " (" + p.step_name + ")";
  s += " = " + Human(p.total());
  if (p.limit > 0) s += " of " + Human(p.limit) + " (" + p.limit_source + ")";
  else s += "; no device memory limit reported";
  return s;
}

}  // namespace g4::xla
