// Read-only memory-mapped file (RAII). Weights are used in place from the mapping: no copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace g4 {

class MappedFile {
 public:
  // Maps `path` read-only. Errors: NotFound if it cannot be opened, DataLoss if it cannot be
  // stat'ed or mapped. An empty file maps to data()==nullptr, size()==0.
  static StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }  // bytes
  const std::string& path() const { return path_; }

  // Drops the resident pages wholly inside bytes [offset, offset + length) (madvise
  // MADV_DONTNEED): they leave the resident set and are read back from the file on the next
  // access, so the data stays valid. Partial pages at either end are kept. Ranges past the end are
  // clipped. Never fails (madvise errors are ignored).
  void ReleasePages(size_t offset, size_t length) const;

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Reads a whole (small) text file. Errors: NotFound.
StatusOr<std::string> ReadTextFile(const std::string& path);

}  // namespace g4
