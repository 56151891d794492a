// safetensors checkpoints: one file, or a sharded set listed by model.safetensors.index.json.
//
// Format (https://github.com/huggingface/safetensors, "Format" section): 8-byte little-endian
// header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, optional
// "__metadata__": {str: str}}, then the data; offsets are relative to the byte after the header.
// Files are mmap'd; tensors are views into the mapping (no copies).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "tensor/tensor.h"

namespace g4 {

class SafetensorsStore : public TensorStore {
 public:
  // Opens one .safetensors file. Errors (each message names the file, and the tensor where one is
  // involved): NotFound (missing file), DataLoss (file shorter than 8 bytes or than its header,
  // header not valid JSON, data_offsets past the end of the file or overlapping another tensor's,
  // byte count != numel * dtype size), Unimplemented (dtype other than F32/F16/BF16/I32/I64).
  static StatusOr<std::unique_ptr<SafetensorsStore>> OpenFile(const std::string& path);

  // Opens a checkpoint directory: `model.safetensors.index.json` (its "weight_map" lists the
  // shards) if present, else `model.safetensors`. Errors as OpenFile, plus NotFound when neither
  // exists or a shard named by the index is missing, DataLoss when the index is malformed or a
  // tensor the index lists is not in the shard it names.
  static StatusOr<std::unique_ptr<SafetensorsStore>> OpenDirectory(const std::string& dir);

  const Tensor* Find(std::string_view name) const override;
  std::vector<std::string> Names() const override;
  // Copies every file's tensor data (the bytes after its header) into anonymous memory in 2 MiB
  // pages at the same addresses (MappedFile::ReadIntoMemory; every Tensor stays valid). Errors:
  // DataLoss naming the file. on_read(n) after each read of n bytes, n summing to
  // DataBytesToCopy().
  Status ReadDataIntoMemory(const std::function<void(size_t)>& on_read = {});
  size_t DataBytesToCopy() const;
  // The "__metadata__" entries of all files merged (later files win).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  Status AddFile(const std::string& path);
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<size_t> data_offsets_;  // per file: where its tensor data starts (8 + header length)
  std::map<std::string, Tensor, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace g4
