#include "runtime/prefix_cache.h"

#include <algorithm>

namespace g4 {

int ReusablePrefix(const ModelConfig& config, const KvCache& cache, std::span<const int32_t> held,
                   std::span<const int32_t> prompt) {
  if (prompt.empty()) return 0;
  const size_t limit = std::min(held.size(), prompt.size() - 1);
  size_t common = 0;
  while (common < limit && held[common] == prompt[common]) ++common;
  const int r = static_cast<int>(common);
  const int L = static_cast<int>(held.size());
  for (int l = 0; r > 0 && l < config.num_layers; ++l) {
    if (!cache.owns(l) || cache.window(l) == 0) continue;  // KV-shared (reads its donor's) or full
    if (std::max(0, r - cache.window(l) + 1) < L - cache.slots(l)) return 0;
  }
  return r;
}

}  // namespace g4
