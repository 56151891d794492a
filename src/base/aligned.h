// AlignedAllocator: a std::allocator whose blocks start on a kAlign-byte boundary, for buffers that
// SIMD kernels stream through in whole vectors. glibc's malloc aligns large blocks to 16 bytes
// only, so every 64-byte (AVX-512) load of a row straddles two cache lines; the decode attention
// kernel measured ~15% slower on such a KV cache.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace g4 {

template <class T, size_t kAlign = 64>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U, kAlign>&) {}  // NOLINT: rebinding must be implicit
  template <class U>
  struct rebind {
    using other = AlignedAllocator<U, kAlign>;
  };
  // Throws std::bad_alloc (as std::allocator) when n elements cannot be allocated.
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kAlign))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(kAlign)); }
  template <class U>
  bool operator==(const AlignedAllocator<U, kAlign>&) const { return true; }
};

// A vector of T whose data() is 64-byte aligned.
template <class T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace g4
