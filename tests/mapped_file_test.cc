// MappedFile: the 2 MiB-aligned mapping and ReadIntoMemory's anonymous copy of the weights (the
// default load, LoadOptions::mmap = false), which must hold the file's bytes at the same
// addresses whatever happens to the file afterwards.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/mapped_file.h"
#include "model/model.h"

namespace g4 {
namespace {

namespace fs = std::filesystem;

uint8_t Pattern(size_t i) { return static_cast<uint8_t>((i * 2654435761u) >> 13); }

std::string WritePatternFile(const std::string& name, size_t n) {
  const std::string path = (fs::path(::testing::TempDir()) / name).string();
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = Pattern(i);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(n));
  return path;
}

// Overwrites n bytes of the file at `offset` with 0xEE.
void Scribble(const std::string& path, size_t offset, size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  const std::vector<uint8_t> junk(n, 0xEE);
  ASSERT_EQ(::pwrite(fd, junk.data(), n, static_cast<off_t>(offset)), static_cast<ssize_t>(n));
  ::close(fd);
}

TEST(MappedFileTest, ReadIntoMemoryKeepsTheBytesAndAddressesAndLeavesTheFileBehind) {
  const size_t n = (size_t{5} << 20) + 12345;  // past two 2 MiB boundaries, a partial last page
  const std::string path = WritePatternFile("g4_mapped_pattern.bin", n);
  auto f = MappedFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const uint8_t* data = (*f)->data();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % (uintptr_t{2} << 20), 0u);
  EXPECT_EQ((*f)->in_memory_from(), n);
  EXPECT_EQ((*f)->BytesToCopy(4097), n - 4096);
  size_t reported = 0;
  ASSERT_TRUE((*f)->ReadIntoMemory(4097, [&](size_t k) { reported += k; }).ok());
  EXPECT_EQ(reported, n - 4096) << "on_read sums to the bytes copied";
  EXPECT_EQ((*f)->BytesToCopy(4097), 0u);
  EXPECT_EQ((*f)->BytesToCopy(0), 4096u);
  EXPECT_EQ((*f)->data(), data);
  EXPECT_EQ((*f)->in_memory_from(), 4096u);  // the page holding the offset is copied whole
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(data[i], Pattern(i)) << i;
  // The copy no longer reads the file: bytes changed on disk after it show only in the part
  // still mapped (a private mapping sees the file's unmodified pages), and nothing from the
  // offset on (the bytes just after it included) is still mapped.
  Scribble(path, 100, 16);
  Scribble(path, 4097, 16);
  Scribble(path, (size_t{3} << 20) + 7, 16);
  EXPECT_EQ(data[100], 0xEE);
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(data[4097 + i], Pattern(4097 + i)) << i;
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(data[(size_t{3} << 20) + 7 + i], Pattern((size_t{3} << 20) + 7 + i)) << i;
  // ReleasePages keeps the copied pages (anonymous pages would come back as zeros).
  (*f)->ReleasePages(0, n);
  for (size_t i = 4096; i < n; ++i) ASSERT_EQ(data[i], Pattern(i)) << i;
  // Offsets in or past the copy, or past the end, change nothing.
  EXPECT_TRUE((*f)->ReadIntoMemory(8000).ok());
  EXPECT_TRUE((*f)->ReadIntoMemory(n + 10).ok());
  EXPECT_EQ((*f)->in_memory_from(), 4096u);
  // A smaller offset copies only the bytes before the copy, as the file now has them.
  ASSERT_TRUE((*f)->ReadIntoMemory(0).ok());
  EXPECT_EQ((*f)->in_memory_from(), 0u);
  EXPECT_EQ(data[100], 0xEE);
  EXPECT_EQ(data[99], Pattern(99));
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(data[(size_t{3} << 20) + 7 + i], Pattern((size_t{3} << 20) + 7 + i)) << i;
  fs::remove(path);
}

// kB of AnonHugePages in /proc/self/smaps over the mappings that overlap [p, p + n); -1 if unreadable.
long HugeKbIn(const uint8_t* p, size_t n) {
  std::ifstream in("/proc/self/smaps");
  if (!in) return -1;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p), hi = lo + n;
  long kb = 0;
  bool inside = false;
  std::string line;
  while (std::getline(in, line)) {
    unsigned long a = 0, b = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &a, &b) == 2 && line.find(':') > line.find(' ')) {
      inside = a < hi && b > lo;
    } else if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      kb += std::stol(line.substr(14));
    }
  }
  return kb;
}

// Rewrite (LoadOptions::pack_q4_0's in-place repacking) changes only bytes of the copy, refuses
// the file mapping and ranges past the end, leaves the file alone, and keeps the copy's 2 MiB
// pages whole (a protection change on a range ending inside one would split it).
TEST(MappedFileTest, RewriteChangesOnlyTheCopyAndKeepsItsHugePages) {
  const size_t n = size_t{8} << 20;
  const std::string path = WritePatternFile("g4_mapped_rewrite.bin", n);
  auto f = MappedFile::Open(path);
  ASSERT_TRUE(f.ok());
  const uint8_t* data = (*f)->data();
  int calls = 0;
  EXPECT_FALSE((*f)->Rewrite(100, 10, [&](uint8_t*) { ++calls; })) << "still the file mapping";
  ASSERT_TRUE((*f)->ReadIntoMemory(0).ok());
  const long huge_before = HugeKbIn(data, n);
  const size_t off = (size_t{3} << 20) + 1000;
  EXPECT_TRUE((*f)->Rewrite(off, 5000, [&](uint8_t* p) {
    ++calls;
    EXPECT_EQ(p, data + off);
    std::memset(p, 0xAB, 5000);
  }));
  EXPECT_FALSE((*f)->Rewrite(n - 10, 11, [&](uint8_t*) { ++calls; })) << "past the end";
  EXPECT_EQ(calls, 1);
  for (size_t i = off - 64; i < off + 5064; ++i) ASSERT_EQ(data[i], i >= off && i < off + 5000 ? 0xAB : Pattern(i)) << i;
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(off));
  char c = 0;
  in.get(c);
  EXPECT_EQ(static_cast<uint8_t>(c), Pattern(off)) << "the file is unchanged";
  if (huge_before <= 0) GTEST_SKIP() << "the copy got no huge pages here (THP off?): split check skipped";
  EXPECT_EQ(HugeKbIn(data, n), huge_before);
  fs::remove(path);
}

TEST(MappedFileTest, ReadIntoMemoryOfAFileTruncatedSinceItOpenedIsDataLossNamingIt) {
  const size_t n = size_t{3} << 20;
  const std::string path = WritePatternFile("g4_mapped_truncated.bin", n);
  auto f = MappedFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  fs::resize_file(path, n / 2);
  const Status st = (*f)->ReadIntoMemory(0);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_NE(st.message().find("g4_mapped_truncated.bin"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("shorter"), std::string::npos) << st.message();
  fs::remove(path);
}

// A file that open(2) refuses: NotFound only when it is not there; the message names the path
// and the reason.
TEST(MappedFileTest, OpenFailuresSayWhetherTheFileIsThereAndWhy) {
  const std::string dir = ::testing::TempDir();
  const std::string missing = (fs::path(dir) / "g4_no_such_file.gguf").string();
  fs::remove(missing);
  auto f = MappedFile::Open(missing);
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound) << f.status().ToString();
  EXPECT_NE(f.status().message().find(missing + ": No such file or directory"), std::string::npos) << f.status().message();
  EXPECT_EQ(ReadTextFile(missing).status().code(), StatusCode::kNotFound);
  // A path through a regular file (ENOTDIR): not there either.
  const std::string file = WritePatternFile("g4_plain_file", 100);
  const std::string through = file + "/config.json";
  EXPECT_EQ(MappedFile::Open(through).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ReadTextFile(through).status().code(), StatusCode::kNotFound);
  // A file that is there but may not be read: not NotFound (root reads it anyway, so only the
  // mapping of errno is checked there).
  const Status denied = OpenFailure("/models/x.gguf", EACCES);
  EXPECT_EQ(denied.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(denied.message(), "cannot open /models/x.gguf: Permission denied");
  EXPECT_EQ(OpenFailure("x", EPERM).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(OpenFailure("x", EMFILE).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(OpenFailure("x", ELOOP).code(), StatusCode::kNotFound);
  if (::geteuid() != 0) {
    ASSERT_EQ(::chmod(file.c_str(), 0), 0);
    EXPECT_EQ(MappedFile::Open(file).status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(ReadTextFile(file).status().code(), StatusCode::kFailedPrecondition);
    ::chmod(file.c_str(), 0600);
  }
  fs::remove(file);
}

// A FIFO (or another special file) is refused at once, never waited on for a writer: by
// MappedFile, by ReadTextFile, and so by every command's -m.
TEST(MappedFileTest, AFifoIsNotARegularFileAndDoesNotBlock) {
  const std::string fifo = (fs::path(::testing::TempDir()) / "g4_mapped_fifo").string();
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto f = MappedFile::Open(fifo);
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << f.status().ToString();
  EXPECT_NE(f.status().message().find("not a regular file"), std::string::npos) << f.status().message();
  auto text = ReadTextFile(fifo);
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument) << text.status().ToString();
  auto model = LoadModel(fifo);
  EXPECT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("g4_mapped_fifo"), std::string::npos) << model.status().message();
  fs::remove(fifo);
}

TEST(MappedFileTest, EmptyFileMapsToNothingAndReadIntoMemoryIsANoOp) {
  const std::string path = WritePatternFile("g4_mapped_empty.bin", 0);
  auto f = MappedFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->data(), nullptr);
  EXPECT_TRUE((*f)->ReadIntoMemory(0).ok());
  fs::remove(path);
}

// Every tensor holds the same bytes whether the weights are copied into memory (the default) or
// used from the mapping (--mmap): a GGUF file (the fetched Gemma 3 270M) and a safetensors
// checkpoint (a golden fixture).
TEST(MappedFileTest, CopiedAndMappedWeightsAreTheSameBytes) {
  const std::string fixture = std::string(GEMMA4RT_TEST_DATA_DIR) + "/golden/gemma4-e2b-tiny";
  for (const std::string& path : {DefaultModelFile(), fixture}) {
    SCOPED_TRACE(path);
    LoadOptions mapped;
    mapped.mmap = true;
    mapped.copy_progress = [](size_t, size_t) { ADD_FAILURE() << "a mapped load copies nothing"; };
    auto a = LoadModel(path, mapped);
    // The copy reports its progress: increasing running totals of one total, ending at it.
    LoadOptions copied;
    std::vector<std::pair<size_t, size_t>> calls;
    copied.copy_progress = [&](size_t done, size_t total) { calls.emplace_back(done, total); };
    auto b = LoadModel(path, copied);
    ASSERT_FALSE(calls.empty());
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].second, calls.back().second);
      if (i > 0) {
        EXPECT_GT(calls[i].first, calls[i - 1].first);
      }
      EXPECT_LE(calls[i].first - (i > 0 ? calls[i - 1].first : 0), size_t{64} << 20) << "reads of 64 MiB at most";
    }
    EXPECT_EQ(calls.back().first, calls.back().second);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    const std::vector<std::string> names = (*a)->store->Names();
    ASSERT_EQ(names, (*b)->store->Names());
    ASSERT_GT(names.size(), 10u);
    for (const std::string& name : names) {
      const Tensor* ta = (*a)->store->Find(name);
      const Tensor* tb = (*b)->store->Find(name);
      ASSERT_NE(ta, nullptr);
      ASSERT_NE(tb, nullptr);
      ASSERT_EQ(ta->nbytes, tb->nbytes) << name;
      ASSERT_EQ(std::memcmp(ta->data, tb->data, ta->nbytes), 0) << name;
    }
  }
}

}  // namespace
}  // namespace g4
