// The KV cache of a device backend (XLA, CUDA): the base's sequence lengths, the backend that
// made it (each step checks that the cache it is given is its own) and the bytes it holds.
#pragma once

#include <cstddef>

#include "runtime/kv_cache.h"

namespace g4 {

template <class Owner>
class DeviceKvCache : public KvCacheBase {
 public:
  DeviceKvCache(const Owner* owner, int max_seqs, int max_context, DType type)
      : KvCacheBase(max_seqs, max_context, type), owner(owner) {}
  size_t bytes() const override { return bytes_; }

  const Owner* owner;
  size_t bytes_ = 0;  // the whole cache
};

}  // namespace g4
