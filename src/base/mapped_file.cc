#include "base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <sstream>

namespace g4 {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;

// A failed mmap: out of memory or address space (ENOMEM: an address-space limit such as
// `ulimit -v`, or the kernel's overcommit limit; EAGAIN: locked-memory limits) is
// RESOURCE_EXHAUSTED, not the DATA_LOSS of a damaged file (found by a fresh user: `ulimit -v
// 350000; gemma4rt serve` said DATA_LOSS, which sends a user to check the file); other errors stay
// DATA_LOSS (the file cannot be read as mapped memory).
Status MapFailure(const std::string& what, int err) {
  std::string m = what + ": " + std::strerror(err);
  if (err == ENOMEM || err == EAGAIN) return ResourceExhausted(m + " (out of memory or address space)");
  return DataLoss(std::move(m));
}
}  // namespace

StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO (or another special file) must not wait for a writer; anything
  // but a regular file is refused below, and reads of regular files ignore the flag.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return OpenFailure(path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return DataLoss("cannot stat " + path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(path + " is not a regular file");
  }
  std::unique_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  f->in_memory_from_ = f->size_;
  if (f->size_ > 0) {
    // Reserve 2 MiB more than needed, then map the file at the first 2 MiB boundary inside, so
    // that ReadIntoMemory's copy can be backed by huge pages from the first aligned byte.
    f->map_bytes_ = (f->size_ + kHugePage - 1) / kHugePage * kHugePage;
    void* r = ::mmap(nullptr, f->map_bytes_ + kHugePage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) {
      ::close(fd);
      return MapFailure("cannot reserve address space for " + path, errno);
    }
    const uintptr_t base = reinterpret_cast<uintptr_t>(r);
    const uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage;
    if (aligned > base) ::munmap(r, aligned - base);
    const uintptr_t end = base + f->map_bytes_ + kHugePage;
    if (end > aligned + f->map_bytes_) ::munmap(reinterpret_cast<void*>(aligned + f->map_bytes_), end - (aligned + f->map_bytes_));
    // The file over the start of the reservation (the rest up to map_bytes_ stays reserved,
    // PROT_NONE, so that no other mapping lands there and munmap(map_bytes_) releases it all).
    void* p = ::mmap(reinterpret_cast<void*>(aligned), f->size_, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::munmap(reinterpret_cast<void*>(aligned), f->map_bytes_);
      ::close(fd);
      return MapFailure("cannot mmap " + path, err);
    }
    f->data_ = static_cast<const uint8_t*>(p);
  }
  f->fd_ = fd;
  return f;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), map_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

size_t MappedFile::BytesToCopy(size_t offset) const {
  if (data_ == nullptr || offset >= in_memory_from_) return 0;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return in_memory_from_ - offset / page * page;
}

Status MappedFile::ReadIntoMemory(size_t offset, const std::function<void(size_t)>& on_read) {
  // in_memory_from_ <= size_ is size_ or a page boundary, so offset < in_memory_from_ puts the
  // page that holds `offset` before it.
  if (data_ == nullptr || offset >= in_memory_from_) return OkStatus();
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  // From the page that holds `offset` (its bytes before `offset` are copied too: the same bytes),
  // so that nothing at or after `offset` is still read from the file.
  const size_t from = offset / page * page;
  // Up to what an earlier call copied (a page boundary), else the end of the file's last page.
  const size_t want = in_memory_from_ - from;
  const size_t len = (want + page - 1) / page * page;
  uint8_t* dst = const_cast<uint8_t*>(data_) + from;
  // MAP_FIXED replaces the file pages of the range in one step; the bytes before `from` stay
  // mapped from the file.
  void* p = ::mmap(dst, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  if (p == MAP_FAILED) return MapFailure("cannot map memory for " + path_, errno);
  in_memory_from_ = from;
  ::madvise(dst, len, MADV_HUGEPAGE);  // a hint: without THP the copy is in 4 KiB pages
  size_t done = 0;
  while (done < want) {
    const ssize_t n = ::pread(fd_, dst + done, std::min<size_t>(want - done, size_t{64} << 20), static_cast<off_t>(from + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return DataLoss("cannot read " + path_ + " at byte " + std::to_string(from + done) + ": " +
                      (n < 0 ? std::strerror(errno) : "the file is shorter than when it was opened"));
    }
    done += static_cast<size_t>(n);
    if (on_read) on_read(static_cast<size_t>(n));
  }
  ::mprotect(dst, len, PROT_READ);
  return OkStatus();
}

bool MappedFile::Rewrite(size_t offset, size_t length, const std::function<void(uint8_t*)>& rewrite) {
  if (data_ == nullptr || offset < in_memory_from_ || offset > size_ || length > size_ - offset) return false;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  uint8_t* p = const_cast<uint8_t*>(data_) + offset;
  // The protection changes over whole 2 MiB spans (clipped to the copy), so that no huge page of
  // the copy is split into 4 KiB pages by a range boundary inside it (a tensor's edge): on the
  // Gemma 3 270M as Q4_0, page-aligned ranges left 54 of ~56 MiB of packed weights in 4 KiB
  // pages. The neighbours made writable for the call are not written.
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t copy_begin = reinterpret_cast<uintptr_t>(data_) + in_memory_from_;
  const uintptr_t copy_end = (reinterpret_cast<uintptr_t>(data_) + size_ + page - 1) / page * page;
  const uintptr_t begin = std::max(copy_begin, reinterpret_cast<uintptr_t>(p) / kHuge * kHuge);
  const uintptr_t end = std::min(copy_end, (reinterpret_cast<uintptr_t>(p) + length + kHuge - 1) / kHuge * kHuge);
  void* range = reinterpret_cast<void*>(begin);
  if (::mprotect(range, end - begin, PROT_READ | PROT_WRITE) != 0) return false;
  rewrite(p);
  ::mprotect(range, end - begin, PROT_READ);
  return true;
}

void MappedFile::ReleasePages(size_t offset, size_t length) const {
  if (data_ == nullptr || offset >= in_memory_from_) return;
  length = std::min(length, in_memory_from_ - offset);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data_) + offset + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data_) + offset + length) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

Status OpenFailure(const std::string& path, int err) {
  std::string m = "cannot open " + path + ": " + std::strerror(err);
  switch (err) {
    case ENOENT:
    case ENOTDIR:
    case ENAMETOOLONG:
    case ELOOP: return NotFound(std::move(m));
    case EMFILE:
    case ENFILE:
    case ENOMEM: return ResourceExhausted(std::move(m));
    default: return FailedPrecondition(std::move(m));
  }
}

StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    return InvalidArgument(path + " is not a regular file");  // a FIFO would block, a directory read as empty
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) return OpenFailure(path, errno != 0 ? errno : ENOENT);  // libstdc++ opens with fopen: errno is open(2)'s
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace g4
