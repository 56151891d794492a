#include "runtime/kv_cache.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace g4 {

KvCache::KvCache(const ModelConfig& c, int max_seqs, int max_context, DType type)
    : KvCacheBase(max_seqs, max_context, type), layers_(c.num_layers) {
  if (!IsHostKvCacheType(type))
    throw std::invalid_argument("KV cache type must be F32, F16, BF16 or I8, not " + std::string(DTypeName(type)));
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerPlan& lp = c.layers[l];
    if (lp.kv_donor >= 0) continue;
    Layer& L = layers_[l];
    L.window = lp.window;
    L.slots = lp.window ? std::min(lp.window, max_context) : max_context;
    L.width = lp.num_kv_heads * lp.head_dim;
    L.heads = lp.num_kv_heads;
    const size_t n = static_cast<size_t>(max_seqs) * L.slots * L.width * elem_bytes();
    L.k.assign(n, 0);
    L.v.assign(n, 0);
    if (type == DType::kI8) {
      L.ks.assign(static_cast<size_t>(max_seqs) * L.slots * L.heads, 0.0f);
      L.vs.assign(L.ks.size(), 0.0f);
    }
  }
}

size_t KvCache::bytes() const {
  size_t b = 0;
  for (const Layer& L : layers_) b += L.k.size() + L.v.size() + (L.ks.size() + L.vs.size()) * sizeof(float);
  return b;
}

size_t KvCache::BytesPerSequence(const ModelConfig& c, int context, DType type) {
  if (!IsAnyKvCacheType(type))
    throw std::invalid_argument("KV cache type must be F32, F16, BF16, I8 or F8_E4M3, not " + std::string(DTypeName(type)));
  size_t b = 0;
  for (const LayerPlan& lp : c.layers) {
    if (lp.kv_donor >= 0) continue;
    const size_t slots = lp.window ? std::min(lp.window, context) : context;
    b += 2 * slots * lp.num_kv_heads * KvHeadRowBytes(type, lp.head_dim);
  }
  return b;
}

}  // namespace g4
