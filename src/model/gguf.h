// GGUF files (llama.cpp's format, version 2 and 3): metadata and tensors, mmap'd.
//
// Layout (ggml docs/gguf.md): magic "GGUF", u32 version, u64 tensor_count, u64 kv_count, then
// kv_count (string key, u32 type, value) entries, then tensor infos (string name, u32 n_dims,
// u64 ne[n_dims], u32 ggml_type, u64 offset), padding to `general.alignment` (default 32),
// then the data section; each tensor's data starts at data_start + offset.
// Tensor shapes are reported in PyTorch order (ggml's ne reversed): a weight with
// ne = [in, out] becomes shape [out, in], matching nn.Linear.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "tensor/tensor.h"

namespace g4 {

// One metadata value. Integers of every width are widened to int64/uint64; float32 to double.
// Arrays hold one element type; string arrays are kept as vector<string>.
struct GgufValue {
  enum class Type { kUInt, kInt, kFloat, kBool, kString, kArray };
  Type type = Type::kUInt;
  uint32_t gguf_type = 0;         // the GGUF type id as stored (0..12)
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;
  uint32_t array_type = 0;        // GGUF type id of the elements, for kArray
  std::vector<GgufValue> array;   // numeric/bool elements (strings go to `strings`)
  std::vector<std::string> strings;
};

class GgufFile : public TensorStore {
 public:
  // Opens and validates `path`. Errors (message names the file and, where one is involved, the
  // key or tensor): NotFound; DataLoss for a bad magic, counts or lengths larger than the file,
  // a value or tensor info running past the end, tensor data out of range or overlapping,
  // dimensions whose product overflows or is not a multiple of the type's block size;
  // Unimplemented for an unsupported version, metadata type or tensor type (named).
  static StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);

  uint32_t version() const { return version_; }
  const std::string& path() const { return path_; }

  // Metadata lookup; nullptr if absent.
  const GgufValue* FindMeta(const std::string& key) const;
  // Typed getters: NotFound if absent (unless a default is given), InvalidArgument naming the
  // key if the stored type does not convert (ints convert to each other when in range; floats
  // accept ints).
  StatusOr<int64_t> GetInt(const std::string& key) const;
  int64_t GetInt(const std::string& key, int64_t dflt) const;
  StatusOr<double> GetFloat(const std::string& key) const;
  double GetFloat(const std::string& key, double dflt) const;
  StatusOr<std::string> GetString(const std::string& key) const;
  bool GetBool(const std::string& key, bool dflt) const;
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }

  // TensorStore: tensors by their GGUF names ("blk.0.attn_q.weight").
  const Tensor* Find(std::string_view name) const override;
  std::vector<std::string> Names() const override;

 private:
  std::unique_ptr<MappedFile> file_;
  std::string path_;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::map<std::string, Tensor, std::less<>> tensors_;
  friend class GgufParser;
};

}  // namespace g4
