// KvCacheBase: what the engine and scheduler know of a KV cache -- its sequences' lengths, limits
// and size. Where K and V live is the backend's (Backend::CreateKvCache): host memory for the CPU
// backend (KvCache below), device buffers for the XLA backend.
//
// KvCache: K and V of every cache-owning layer in host memory, for a fixed number of sequences.
//
// Layout per owning layer l and sequence s: K and V each [slots, Nkv, D] of the cache's element type
// (f32; f16: IEEE binary16, or bf16: the top half of an f32, each rounded to nearest even from
// the f32 rows, half the bytes), where
// slots = min(window, max_context) for sliding layers (a ring) and max_context for full layers.
// Invariant: the slot of a token is derived from its absolute position only (pos % window on
// a ring, pos otherwise); nothing else (no padding) ever occupies a slot. KV-shared layers own no
// cache: they read their donor's. Stored K is post-norm, post-RoPE; V is post-v_norm.
#pragma once

#include <cstddef>
#include <vector>

#include "base/aligned.h"
#include "model/config.h"
#include "tensor/dtype.h"

namespace g4 {

// The element types a KvCache holds: DType::kF32, kF16 and kBF16.
inline bool IsKvCacheType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

class KvCacheBase {
 public:
  KvCacheBase(int max_seqs, int max_context, DType type)
      : type_(type), lengths_(max_seqs, 0), max_context_(max_context) {}
  virtual ~KvCacheBase() = default;

  DType type() const { return type_; }
  // Bytes per element: 4 (f32) or 2 (f16, bf16).
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
  // element type of K and V, DType::kF32, kF16 or kBF16 (std::invalid_argument otherwise).
  KvCache(const ModelConfig& config, int max_seqs, int max_context, DType type = DType::kF32);

  bool owns(int layer) const { return layers_[layer].slots > 0; }
  int slots(int layer) const { return layers_[layer].slots; }
  int window(int layer) const { return layers_[layer].window; }
  int slot_of(int layer, int pos) const { return layers_[layer].window ? pos % layers_[layer].slots : pos; }
  // Row of `kv_width` = Nkv*D elements of type() for (layer, seq, slot).
  void* k(int layer, int seq, int slot) { return Row(layers_[layer].k, layer, seq, slot); }
  void* v(int layer, int seq, int slot) { return Row(layers_[layer].v, layer, seq, slot); }
  int kv_width(int layer) const { return layers_[layer].width; }
  size_t bytes() const override;
  // Bytes one sequence needs at `context` tokens with elements of `type` (for admission and `info`).
  static size_t BytesPerSequence(const ModelConfig& config, int context, DType type = DType::kF32);

 private:
  struct Layer {
    int slots = 0;   // 0: not an owner
    int window = 0;
    int width = 0;   // Nkv * D
    AlignedVector<unsigned char> k, v;  // 64-byte aligned: every row is, where its bytes are a multiple of 64
  };
  void* Row(AlignedVector<unsigned char>& buf, int layer, int seq, int slot) {
    const Layer& L = layers_[layer];
    return buf.data() + (static_cast<size_t>(seq) * L.slots + slot) * L.width * elem_bytes();
  }
  std::vector<Layer> layers_;
};

}  // namespace g4
