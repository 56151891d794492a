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
#include <string_view>
#include <variant>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "tensor/tensor.h"

namespace g4 {

// One metadata value. Scalars: integers of every width are widened to int64 (signed types, `i`)
// or uint64 (unsigned types, `u`); float32/float64 to double (`f`); bool to `b`; strings to `s`.
// Arrays keep their elements where they are, in the file's mapping (views, no copy): numeric and
// bool elements are read from the mapped bytes on access, string elements through a 32-bit offset
// per kStringStride elements (StringAt(k) walks at most kStringStride - 1 length prefixes from
// there), arrays of arrays as one GgufValue per element. A 262144-entry vocabulary thus costs 64
// KiB of offsets (1 MiB with one per element until 2026-11-30), not a GgufValue per entry. A value
// is valid while its GgufFile is open.
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

  // Number of elements of an array; 0 for a scalar or a string.
  size_t size() const { return count_; }
  // Element k of an array (k < size(); a larger k is a bug and aborts through G4_CHECK), converted:
  //   IntAt: integer elements as int64 (uint64 values above 2^63-1 wrap), bool as 0/1, float
  //          elements truncated toward zero; 0 for string or array elements.
  //   FloatAt: any numeric or bool element as double; 0 for string or array elements.
  //   BoolAt: bool elements; numeric elements are true when non-zero; false for string or array
  //           elements.
  //   StringAt: the bytes of a string element (a view into the mapped file); "" for other types.
  //   ArrayAt: an element of an array of arrays; an empty value (size() 0) for other types.
  // Callers that need one element type check `array_type` first.
  int64_t IntAt(size_t k) const;
  double FloatAt(size_t k) const;
  bool BoolAt(size_t k) const;
  std::string_view StringAt(size_t k) const;
  const GgufValue& ArrayAt(size_t k) const;
  // All elements of a string array, copied (empty for other types). Meant for short arrays.
  std::vector<std::string> Strings() const;
  static constexpr size_t kStringStride = 16;

 private:
  friend class GgufParser;
  size_t count_ = 0;
  const uint8_t* elems_ = nullptr;  // the first element's bytes in the mapping (scalar and string arrays)
  std::vector<uint32_t> string_offsets_;  // string arrays: [j] = offset of element j * kStringStride's u64 length from elems_
  std::vector<GgufValue> arrays_;         // arrays of arrays: the elements
};

// GGUF metadata type ids (gguf.md's gguf_metadata_value_type) for `gguf_type` and `array_type`.
inline constexpr uint32_t kGgufUInt8 = 0, kGgufInt8 = 1, kGgufUInt16 = 2, kGgufInt16 = 3, kGgufUInt32 = 4,
                          kGgufInt32 = 5, kGgufFloat32 = 6, kGgufBool = 7, kGgufString = 8, kGgufArray = 9,
                          kGgufUInt64 = 10, kGgufInt64 = 11, kGgufFloat64 = 12;
// True for the eight integer type ids (not bool).
inline constexpr bool IsGgufIntegerType(uint32_t t) {
  return t <= kGgufInt32 || t == kGgufUInt64 || t == kGgufInt64;
}

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

  // Metadata lookup; nullptr if absent. The value (and the array views in it) lives as long as
  // this GgufFile.
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

  // Returns the mapped pages of the header, metadata and tensor infos (the bytes before the first
  // whole page of tensor data) to the kernel: they leave the resident set and are read back from
  // the file if a metadata array is read again. Open calls it after parsing; call it again after
  // reading large arrays (the tokenizer does). Never fails (madvise errors are ignored).
  void ReleaseMetadataPages() const;

  // Copies the tensor data section into anonymous memory in 2 MiB pages at the same addresses
  // (MappedFile::ReadIntoMemory; every Tensor stays valid; on_read(n) after each read of n bytes,
  // n summing to DataBytesToCopy()). Errors: DataLoss naming the file.
  Status ReadDataIntoMemory(const std::function<void(size_t)>& on_read = {}) {
    return file_ ? file_->ReadIntoMemory(static_cast<size_t>(data_start_), on_read) : OkStatus();
  }
  size_t DataBytesToCopy() const { return file_ ? file_->BytesToCopy(static_cast<size_t>(data_start_)) : 0; }

  // TensorStore: tensors by their GGUF names ("blk.0.attn_q.weight").
  const Tensor* Find(std::string_view name) const override;
  std::vector<std::string> Names() const override;
  // Only for tensors in the part copied by ReadDataIntoMemory (MappedFile::Rewrite).
  bool PackQ4_0x4(const Tensor& t) override;

 private:
  std::unique_ptr<MappedFile> file_;
  std::string path_;
  uint32_t version_ = 0;
  uint64_t data_start_ = 0;  // offset of the tensor data section
  std::map<std::string, GgufValue> metadata_;
  std::map<std::string, Tensor, std::less<>> tensors_;
  friend class GgufParser;
};

}  // namespace g4
