// Read-only memory-mapped file (RAII). Weights are used in place from the mapping, or from an
// anonymous copy at the same addresses in 2 MiB pages (ReadIntoMemory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/status.h"

namespace g4 {

class MappedFile {
 public:
  // Maps `path` read-only, at an address that is a multiple of 2 MiB. Errors: OpenFailure's if it
  // cannot be opened, DataLoss if it cannot be stat'ed or mapped, InvalidArgument if it is not a
  // regular file (a directory, a FIFO: opened without waiting for a writer). An empty file maps to
  // data()==nullptr, size()==0. With the mapping (no ReadIntoMemory), truncating the file while
  // its pages are in use is a SIGBUS, as with any mapped file (llama.cpp's --mmap too).
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
  // clipped; pages copied by ReadIntoMemory are kept (they have no file behind them). Never fails
  // (madvise errors are ignored).
  void ReleasePages(size_t offset, size_t length) const;

  // Replaces the mapping of bytes [offset rounded down to a page, size()) with an anonymous,
  // read-only copy of the same bytes at the same addresses (data() and every pointer into it stay
  // valid), asking the kernel for transparent huge pages (madvise MADV_HUGEPAGE; 2 MiB on x86 and
  // on Arm with 4 KiB pages). Why: decode reads every weight once per token, and on 4 KiB file
  // pages each 4 KiB costs a TLB miss (under a hypervisor, a two-level page walk) that the
  // hardware prefetchers stop at. Full-size E2B Q4_0 decode, 2 threads, Zen 4 VM, 8 alternating
  // runs: 18.9-19.5 -> 22.5-22.9 tokens/s (docs/PERFORMANCE.md, "weights in 2 MiB pages"; a
  // fresh user's run measured 5-7%: this VM's decode swings with its memory bandwidth). The
  // resident set is the same as a mapping whose pages were all touched; the page cache keeps its
  // own copy only while the kernel has no better use for it, and each process holds its own copy.
  // Reads the file with pread (the copy is resident when this returns).
  // Errors: DataLoss if the memory cannot be mapped or the file read fails or comes up short (the
  // range is then unusable: drop this MappedFile). A later call with a smaller offset copies only
  // the bytes before the earlier copy; no-op when nothing new is asked for (offset in or past the
  // first copied page). `on_read(n)`, when given, is called after each read of n bytes (64 MiB at
  // most), n summing to BytesToCopy(offset): for a progress display.
  Status ReadIntoMemory(size_t offset, const std::function<void(size_t)>& on_read = {});
  // The bytes ReadIntoMemory(offset) would read now (0 when it has nothing new to copy).
  size_t BytesToCopy(size_t offset) const;
  // Lets `rewrite` change the bytes [offset, offset + length) in place, where they are the
  // anonymous copy of ReadIntoMemory (offset >= in_memory_from()): their pages are made writable
  // for the call and read-only again after it. false, calling nothing, for bytes still mapped
  // from the file (writing those would give each page a private copy) or out of range.
  bool Rewrite(size_t offset, size_t length, const std::function<void(uint8_t*)>& rewrite);
  // Bytes from `in_memory_from()` to size() are an anonymous copy (ReadIntoMemory); size() if none.
  size_t in_memory_from() const { return in_memory_from_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t map_bytes_ = 0;        // the mapping's length (size_ rounded up to 2 MiB)
  size_t in_memory_from_ = 0;   // see in_memory_from()
  int fd_ = -1;                 // kept open for ReadIntoMemory
  std::string path_;
};

// Reads a whole (small) text file. Errors: OpenFailure's when it cannot be opened;
// InvalidArgument for anything but a regular file (a directory, a FIFO).
StatusOr<std::string> ReadTextFile(const std::string& path);

// The error for a file that open(2) refused with errno `err`, naming the path and strerror(err):
// NotFound when it is not there (ENOENT, ENOTDIR, ENAMETOOLONG, ELOOP), ResourceExhausted when
// the process or system is out of file descriptors or memory (EMFILE, ENFILE, ENOMEM),
// FailedPrecondition otherwise (EACCES and EPERM: it exists but may not be read).
Status OpenFailure(const std::string& path, int err);

}  // namespace g4
