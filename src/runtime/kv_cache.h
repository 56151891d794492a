// KvCacheBase: what the engine and scheduler know of a KV cache -- its sequences' lengths, limits
// and size. Where K and V live is the backend's (Backend::CreateKvCache): host memory for the CPU
// backend (KvCache below), device buffers for the XLA backend.
//
// KvCache: K and V of every cache-owning layer in host memory, for a fixed number of sequences.
//
// Layout per owning layer l and sequence s: K and V each [slots, Nkv, D] of the cache's element type
// (f32; f16: IEEE binary16, or bf16: the top half of an f32, each rounded to nearest even from
// the f32 rows, half the bytes; or i8: a quarter of the bytes, see below), where
// slots = min(window, max_context) for sliding layers (a ring) and max_context for full layers.
// Invariant: the slot of a token is derived from its absolute position only (pos % window on
// a ring, pos otherwise); nothing else (no padding) ever occupies a slot. KV-shared layers own no
// cache: they read their donor's. Stored K is post-norm, post-RoPE; V is post-v_norm.
//
// i8 (DType::kI8, `--cache-type q8`): each KV head's D elements of a row are int8 q with one f32
// scale s per (slot, KV head), x = q * s: s = max |x| / 127 over those D elements, q = x / s
// rounded to nearest even (cpu::QuantizeKvRow). The scales are a second array per layer and
// sequence, [slots, Nkv] f32 (k_scale/v_scale). f32 rather than f16 scales: 4 bytes per 256 or 512
// int8 (1.6% or 0.8% more), no f16 range to leave (tiny rows: max |x| / 127 below f16's 6e-5 would
// lose scale bits) and no conversion in the kernel.
#pragma once

#include <cstddef>
#include <vector>

#include "base/aligned.h"
#include "model/config.h"
#include "tensor/dtype.h"

namespace g4 {

// The element types every backend's KV cache holds: DType::kF32, kF16 and kBF16.
inline bool IsKvCacheType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }
// The element types the host KvCache holds: those and kI8 (int8 with per-row scales).
inline bool IsHostKvCacheType(DType t) { return IsKvCacheType(t) || t == DType::kI8; }
// Types stored with one f32 scale per (slot, KV head): kI8 and kF8E4M3 (fp8 e4m3, x = q * s with
// s = max |x| / 448; only where a device computes with it: xla/device_policy.h, cuda/cuda_policy.h).
inline bool IsScaledKvCacheType(DType t) { return t == DType::kI8 || t == DType::kF8E4M3; }
// Every KV cache type some backend may hold (each backend refuses the ones it has not, with why).
inline bool IsAnyKvCacheType(DType t) { return IsHostKvCacheType(t) || t == DType::kF8E4M3; }
// Bytes of one KV head's row of D elements of `type`, its scale included (i8, fp8: D + 4).
inline size_t KvHeadRowBytes(DType type, int head_dim) {
  return static_cast<size_t>(head_dim) * DTypeSize(type) + (IsScaledKvCacheType(type) ? sizeof(float) : 0);
}

class KvCacheBase {
 public:
  KvCacheBase(int max_seqs, int max_context, DType type)
      : type_(type), lengths_(max_seqs, 0), max_context_(max_context) {}
  virtual ~KvCacheBase() = default;

  DType type() const { return type_; }
  // Bytes per element: 4 (f32), 2 (f16, bf16) or 1 (i8, whose scales come on top: KvHeadRowBytes).
  size_t elem_bytes() const { return DTypeSize(type_); }
  int max_seqs() const { return static_cast<int>(lengths_.size()); }
  int max_context() const { return max_context_; }
  // Positions 0..length-1 of sequence `seq` have been written.
  int length(int seq) const { return lengths_[seq]; }
  void set_length(int seq, int n) { lengths_[seq] = n; }
  // Forgets a sequence (its slots are overwritten by the next user). O(1).
  void Reset(int seq) { lengths_[seq] = 0; }
  // Total bytes of K and V held (wherever they live).
  virtual size_t bytes() const = 0;

 private:
  DType type_;
  std::vector<int> lengths_;
  int max_context_;
};

class KvCache : public KvCacheBase {
 public:
  // max_context: the most positions one sequence may hold (tokens); max_seqs >= 1; type: the
  // element type of K and V, DType::kF32, kF16, kBF16 or kI8 (std::invalid_argument otherwise).
  KvCache(const ModelConfig& config, int max_seqs, int max_context, DType type = DType::kF32);

  bool owns(int layer) const { return layers_[layer].slots > 0; }
  int slots(int layer) const { return layers_[layer].slots; }
  int window(int layer) const { return layers_[layer].window; }
  int slot_of(int layer, int pos) const { return layers_[layer].window ? pos % layers_[layer].slots : pos; }
  // Row of `kv_width` = Nkv*D elements of type() for (layer, seq, slot).
  void* k(int layer, int seq, int slot) { return Row(layers_[layer].k, layer, seq, slot); }
  void* v(int layer, int seq, int slot) { return Row(layers_[layer].v, layer, seq, slot); }
  int kv_width(int layer) const { return layers_[layer].width; }
  int kv_heads(int layer) const { return layers_[layer].heads; }  // Nkv
  // i8 only (nullptr otherwise): the Nkv f32 scales of the row k(...) / v(...).
  float* k_scale(int layer, int seq, int slot) { return ScaleRow(layers_[layer].ks, layer, seq, slot); }
  float* v_scale(int layer, int seq, int slot) { return ScaleRow(layers_[layer].vs, layer, seq, slot); }
  size_t bytes() const override;
  // Bytes one sequence needs at `context` tokens with elements of `type` (for admission and `info`;
  // any IsAnyKvCacheType, fp8 too: the device backends' caches have this layout's bytes).
  static size_t BytesPerSequence(const ModelConfig& config, int context, DType type = DType::kF32);

 private:
  struct Layer {
    int slots = 0;   // 0: not an owner
    int window = 0;
    int width = 0;   // Nkv * D
    int heads = 0;   // Nkv
    AlignedVector<unsigned char> k, v;  // 64-byte aligned: every row is, where its bytes are a multiple of 64
    std::vector<float> ks, vs;          // i8: [seqs, slots, Nkv] scales; else empty
  };
  float* ScaleRow(std::vector<float>& buf, int layer, int seq, int slot) {
    const Layer& L = layers_[layer];
    return buf.empty() ? nullptr : buf.data() + (static_cast<size_t>(seq) * L.slots + slot) * L.heads;
  }
  void* Row(AlignedVector<unsigned char>& buf, int layer, int seq, int slot) {
    const Layer& L = layers_[layer];
    return buf.data() + (static_cast<size_t>(seq) * L.slots + slot) * L.width * elem_bytes();
  }
  std::vector<Layer> layers_;
};

}  // namespace g4
