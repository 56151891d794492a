#include "runtime/prefix_cache.h"

#include <algorithm>

namespace g4 {

int ReusablePrefix(const ModelConfig& config, int max_context, std::span<const int32_t> held,
                   std::span<const int32_t> prompt) {
  if (prompt.empty()) return 0;
  const size_t limit = std::min(held.size(), prompt.size() - 1);
  size_t common = 0;
  while (common < limit && held[common] == prompt[common]) ++common;
  const int r = static_cast<int>(common);
  const int L = static_cast<int>(held.size());
  for (const LayerPlan& lp : config.layers) {
    if (lp.kv_donor >= 0 || lp.window == 0) continue;  // KV-shared (reads its donor's) or full
    const int slots = std::min(lp.window, max_context);  // the ring's size (KvCache's layout)
    if (r > 0 && std::max(0, r - lp.window + 1) < L - slots) return 0;
  }
  return r;
}

}  // namespace g4
