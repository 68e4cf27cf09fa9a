// Host-pool segments across processes: a page written by a forked peer is read by the owner after
// the peer was SIGKILLed, and by a second peer; the segment outlives every mapping until Remove.
// Also: mode 0600, page addressing, bounds, bad arguments, missing and garbage segments, and an
// over-committed /dev/shm failing cleanly at Create. The test process starts no thread, so fork
// is safe.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/host_pool.h"
#include "tests/common/test_util.h"

namespace dhs {
namespace {

constexpr uint64_t kPageBytes = 4096;
constexpr uint64_t kPages = 8;
constexpr PageIndex kPage = 5;

std::string UniqueName(const char* tag) {
  static int counter = 0;
  return "dhs-test-" + std::to_string(::getpid()) + "-" + tag + "-" + std::to_string(counter++);
}

uint8_t Pattern(uint64_t i) { return static_cast<uint8_t>((i * 31 + 7) & 0xff); }

// Removes the segment at scope exit (ignores a missing one).
struct SegmentCleanup {
  std::string name;
  ~SegmentCleanup() { (void)HostPoolSegment::Remove(name); }
};

TEST(HostPool, CreateLayoutModeAndBounds) {
  const std::string name = UniqueName("layout");
  SegmentCleanup cleanup{name};
  auto seg = HostPoolSegment::Create(name, kPageBytes, kPages);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_EQ((*seg)->page_bytes(), kPageBytes);
  EXPECT_EQ((*seg)->pages(), kPages);
  EXPECT_EQ((*seg)->size_bytes(), 4096u + 8u * 4096u);

  struct stat st {};
  ASSERT_EQ(::stat(("/dev/shm/" + name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 4096u + 8u * 4096u);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, 8u * 4096u);  // pages reserved up front

  for (PageIndex p = 0; p < kPages; ++p) {
    absl::StatusOr<uint64_t> offset = (*seg)->PageOffset(p);
    ASSERT_TRUE(offset.ok());
    EXPECT_EQ(*offset, 4096u + p * 4096u);  // header page, then pages in order
    absl::StatusOr<uint8_t*> data = (*seg)->PageData(p);
    ASSERT_TRUE(data.ok());
    EXPECT_EQ(*data, (*seg)->base() + 4096 + p * 4096);
  }
  EXPECT_EQ((*seg)->PageOffset(kPages).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*seg)->PageData(kPages).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*seg)->PageData(0xffffffffu).status().code(), absl::StatusCode::kOutOfRange);

  EXPECT_EQ(HostPoolSegment::Create(name, kPageBytes, kPages).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST(HostPool, BadArguments) {
  const std::string name = UniqueName("args");
  SegmentCleanup cleanup{name};
  EXPECT_EQ(HostPoolSegment::Create(name, 0, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HostPoolSegment::Create(name, 100, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HostPoolSegment::Create(name, 4096, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HostPoolSegment::Create("a/b", 4096, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HostPoolSegment::Create("", 4096, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HostPoolSegment::Create(name, uint64_t{1} << 40, uint64_t{1} << 30).status().code(),
            absl::StatusCode::kInvalidArgument);  // 2^70 bytes overflow a file size
  EXPECT_EQ(HostPoolSegment::Open(name).status().code(), absl::StatusCode::kNotFound);  // none was created
}

TEST(HostPool, OverCommittedShmFailsAtCreate) {
  const std::string name = UniqueName("huge");
  SegmentCleanup cleanup{name};
  // 2^24 pages of 1 MiB = 16 TiB: more than any /dev/shm here; tmpfs refuses the reservation.
  auto seg = HostPoolSegment::Create(name, uint64_t{1} << 20, uint64_t{1} << 24);
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kResourceExhausted) << seg.status();
  EXPECT_EQ(HostPoolSegment::Open(name).status().code(), absl::StatusCode::kNotFound);  // nothing left behind
}

// A segment just above the free space of /dev/shm (but possibly below its total size, where tmpfs's fallocate would
// fill the filesystem page by page before failing) is refused by the free-space check before anything is created;
// the message names the sizes and the fix.
TEST(HostPool, SegmentLargerThanFreeShmFailsBeforeCreating) {
  struct statvfs fs {};
  ASSERT_EQ(::statvfs(kHostPoolShmDir, &fs), 0) << std::strerror(errno);
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  constexpr uint64_t kBigPage = uint64_t{1} << 20;
  // 1 GiB above the free space: a margin against other processes freeing /dev/shm between here and Create.
  const uint64_t pages = free_bytes / kBigPage + 1024;
  ASSERT_LE(pages, uint64_t{UINT32_MAX}) << "a /dev/shm of " << free_bytes << " free bytes is beyond this test";
  const uint64_t size = kHostPoolHeaderBytes + pages * kBigPage;
  ASSERT_GT(size, free_bytes);
  const std::string name = UniqueName("overfree");
  SegmentCleanup cleanup{name};
  auto seg = HostPoolSegment::Create(name, kBigPage, pages);
  ASSERT_EQ(seg.status().code(), absl::StatusCode::kResourceExhausted) << seg.status();
  const std::string message(seg.status().message());
  EXPECT_NE(message.find("needs " + std::to_string(size) + " bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("/dev/shm has only "), std::string::npos) << message;  // the free-space check, not fallocate
  EXPECT_NE(message.find("mount -o remount,size="), std::string::npos) << message;
  EXPECT_EQ(HostPoolSegment::Open(name).status().code(), absl::StatusCode::kNotFound);  // nothing left behind
}

TEST(HostPool, MissingAndGarbageSegments) {
  EXPECT_EQ(HostPoolSegment::Open(UniqueName("missing")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(HostPoolSegment::Remove(UniqueName("missing")).code(), absl::StatusCode::kNotFound);

  for (const size_t size : {size_t{100}, size_t{16384}}) {  // smaller than a header; header-sized junk
    const std::string name = UniqueName("garbage");
    SegmentCleanup cleanup{name};
    const int fd = ::shm_open(("/" + name).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
    std::string junk(size, '\x5a');
    ASSERT_EQ(::write(fd, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
    ::close(fd);
    EXPECT_EQ(HostPoolSegment::Open(name).status().code(), absl::StatusCode::kDataLoss) << "size " << size;
  }

  // A real header whose page count exceeds the object: truncated segment.
  const std::string name = UniqueName("trunc");
  SegmentCleanup cleanup{name};
  ASSERT_TRUE(HostPoolSegment::Create(name, kPageBytes, kPages).ok());
  const int fd = ::shm_open(("/" + name).c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(4096 + 2 * kPageBytes)), 0);
  ::close(fd);
  EXPECT_EQ(HostPoolSegment::Open(name).status().code(), absl::StatusCode::kDataLoss);
}

// Child body: open `name`, check the geometry, fill page kPage with the pattern, report 'w' on
// `report_fd`, then block on `hold_fd` until killed.
[[noreturn]] void WriterChild(const std::string& name, int report_fd, int hold_fd) {
  auto seg = HostPoolSegment::Open(name);
  if (!seg.ok() || (*seg)->pages() != kPages || (*seg)->page_bytes() != kPageBytes) _exit(3);
  auto data = (*seg)->PageData(kPage);
  if (!data.ok()) _exit(4);
  for (uint64_t i = 0; i < kPageBytes; ++i) (*data)[i] = Pattern(i);
  const char w = 'w';
  if (::write(report_fd, &w, 1) != 1) _exit(5);
  char c;
  while (true) (void)!::read(hold_fd, &c, 1);
}

// Child body: open `name` and check the pattern on page kPage; exit 0 when all bytes match.
[[noreturn]] void ReaderChild(const std::string& name) {
  auto seg = HostPoolSegment::Open(name);
  if (!seg.ok()) _exit(3);
  if ((*seg)->PageData(kPages).ok()) _exit(4);
  auto data = (*seg)->PageData(kPage);
  if (!data.ok()) _exit(5);
  for (uint64_t i = 0; i < kPageBytes; ++i) {
    if ((*data)[i] != Pattern(i)) _exit(6);
  }
  _exit(0);
}

TEST(HostPool, DataSurvivesAPeerKillAndIsSeenByAnotherPeer) {
  const std::string name = UniqueName("xproc");
  SegmentCleanup cleanup{name};
  auto owner = HostPoolSegment::Create(name, kPageBytes, kPages);
  ASSERT_TRUE(owner.ok()) << owner.status();
  for (PageIndex p = 0; p < kPages; ++p) std::memset(*(*owner)->PageData(p), 0, kPageBytes);

  int report[2], hold[2];
  ASSERT_EQ(::pipe(report), 0);
  ASSERT_EQ(::pipe(hold), 0);
  const pid_t writer = ::fork();
  ASSERT_GE(writer, 0);
  if (writer == 0) WriterChild(name, report[1], hold[0]);
  ::close(report[1]);
  const int got = testing::ReadByte(report[0], 10000);
  ::kill(writer, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(writer, &status, 0), writer);
  ::close(report[0]);
  ::close(hold[0]);
  ::close(hold[1]);
  ASSERT_EQ(got, 'w') << "writer exit status " << status;
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

  // The owner sees the killed peer's bytes; other pages are untouched.
  const uint8_t* page = *(*owner)->PageData(kPage);
  for (uint64_t i = 0; i < kPageBytes; ++i) ASSERT_EQ(page[i], Pattern(i)) << "byte " << i;
  const uint8_t* other = *(*owner)->PageData(kPage - 1);
  for (uint64_t i = 0; i < kPageBytes; ++i) ASSERT_EQ(other[i], 0) << "byte " << i;

  // The owner unmaps; the segment persists and a second peer reads the same bytes.
  owner->reset();
  const pid_t reader = ::fork();
  ASSERT_GE(reader, 0);
  if (reader == 0) ReaderChild(name);
  ASSERT_EQ(::waitpid(reader, &status, 0), reader);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "reader status " << status;

  ASSERT_TRUE(HostPoolSegment::Remove(name).ok());
  EXPECT_EQ(HostPoolSegment::Open(name).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace dhs
