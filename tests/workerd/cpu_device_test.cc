// tests/workerd/cpu_device_test.cc: CpuDevice copies, dependencies, held/failed copies and reader fences.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "workerd/device/cpu_device.h"

namespace dhs {
namespace {

TEST(CpuDevice, CopiesRoundTripAndOutOfRangeFails) {
  CpuDevice d;
  PoolId p = *d.AllocatePool(64);
  std::vector<uint8_t> src(16), back(16, 0);
  std::iota(src.begin(), src.end(), uint8_t{1});
  HostToDeviceCopy h2d{DeviceRange{p, 8, 16}, src.data()};
  ASSERT_TRUE(d.CopyHostToDevice({&h2d, 1}, {}).Wait().ok());
  DeviceToHostCopy d2h{back.data(), DeviceRange{p, 8, 16}};
  ASSERT_TRUE(d.CopyDeviceToHost({&d2h, 1}, {}).Wait().ok());
  EXPECT_EQ(back, src);
  HostToDeviceCopy bad{DeviceRange{p, 60, 16}, src.data()};
  EXPECT_EQ(d.CopyHostToDevice({&bad, 1}, {}).Wait().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuDevice, HeldCopyBlocksOnlyItsDependents) {
  CpuDevice d;
  PoolId p = *d.AllocatePool(64);
  d.SetCopyHook([](const CopyInfo& i) { return i.id == 1 ? CopyFate::kHold : CopyFate::kRun; });
  std::vector<uint8_t> a(8, 7), b(8, 9), out(8, 0);
  HostToDeviceCopy w{DeviceRange{p, 0, 8}, a.data()};
  CopyEvent write = d.CopyHostToDevice({&w, 1}, {});
  DeviceToHostCopy r{out.data(), DeviceRange{p, 0, 8}};
  CopyEvent read = d.CopyDeviceToHost({&r, 1}, {&write, 1});
  HostToDeviceCopy other{DeviceRange{p, 32, 8}, b.data()};
  ASSERT_TRUE(d.CopyHostToDevice({&other, 1}, {}).Wait().ok());  // independent copy not blocked
  d.WaitIdle();
  EXPECT_FALSE(write.Done());
  EXPECT_FALSE(read.Done());
  EXPECT_EQ(out, std::vector<uint8_t>(8, 0));
  d.ReleaseHeld(1);
  ASSERT_TRUE(read.Wait().ok());
  EXPECT_EQ(out, a);
}

TEST(CpuDevice, FailedCopyWritesNothingAndFailsDependents) {
  CpuDevice d;
  PoolId p = *d.AllocatePool(16);
  d.SetCopyHook([](const CopyInfo& i) { return i.id == 1 ? CopyFate::kFail : CopyFate::kRun; });
  std::vector<uint8_t> a(8, 5), out(8, 1);
  HostToDeviceCopy w{DeviceRange{p, 0, 8}, a.data()};
  CopyEvent write = d.CopyHostToDevice({&w, 1}, {});
  EXPECT_TRUE(write.Failed());
  EXPECT_EQ(d.HostVisible(p, 0)[0], 0);
  DeviceToHostCopy r{out.data(), DeviceRange{p, 0, 8}};
  EXPECT_FALSE(d.CopyDeviceToHost({&r, 1}, {&write, 1}).Wait().ok());
  EXPECT_EQ(out, std::vector<uint8_t>(8, 1));
}

TEST(CpuDevice, ReaderFenceCompletesWhenOverlappingReadersEnd) {
  CpuDevice d;
  PoolId p = *d.AllocatePool(64);
  DeviceRange r1{p, 0, 16}, r2{p, 32, 16};
  ReaderId a = d.BeginReaders({&r1, 1});
  ReaderId b = d.BeginReaders({&r2, 1});
  EXPECT_TRUE(d.ReadersBusy(DeviceRange{p, 15, 1}));
  EXPECT_FALSE(d.ReadersBusy(DeviceRange{p, 16, 16}));
  CopyEvent f = d.ReadersFence(DeviceRange{p, 8, 32});  // overlaps both
  d.EndReaders(a);
  EXPECT_FALSE(f.Done());
  d.EndReaders(b);
  EXPECT_TRUE(f.Done());
  EXPECT_TRUE(d.ReadersFence(r1).Done());
}

}  // namespace
}  // namespace dhs

namespace dhs {
namespace {

// The fast path (cpu_device.h) keeps one serial engine in the copy thread's order: a batch whose dependency is pending
// is queued; a later ready batch to the same bytes runs at once (dependency order, as before), and once the dependency
// completes the queued batch runs after it, so its bytes are the final ones.
TEST(CpuDevice, ReadyBatchRunsOnIssueAndQueuedDependentsStillRunInDependencyOrder) {
  CpuDevice d;
  PoolId p = *d.AllocatePool(64);
  d.SetCopyHook([](const CopyInfo& i) { return i.id == 1 ? CopyFate::kHold : CopyFate::kRun; });
  std::vector<uint8_t> a(8, 1), b(8, 2), c(8, 3), out(8, 0);
  HostToDeviceCopy wa{DeviceRange{p, 32, 8}, a.data()};
  CopyEvent held = d.CopyHostToDevice({&wa, 1}, {});  // id 1, held
  HostToDeviceCopy wb{DeviceRange{p, 0, 8}, b.data()};
  CopyEvent after_held = d.CopyHostToDevice({&wb, 1}, {&held, 1});  // id 2, waits for 1
  HostToDeviceCopy wc{DeviceRange{p, 0, 8}, c.data()};
  CopyEvent ready = d.CopyHostToDevice({&wc, 1}, {});  // id 3, ready
  ASSERT_TRUE(ready.Wait().ok());
  EXPECT_FALSE(after_held.Done());
  d.ReleaseAllHeld();
  ASSERT_TRUE(after_held.Wait().ok());
  DeviceToHostCopy r{out.data(), DeviceRange{p, 0, 8}};
  ASSERT_TRUE(d.CopyDeviceToHost({&r, 1}, {}).Wait().ok());
  EXPECT_EQ(out, b);  // 3 ran first, 2 after its dependency
  EXPECT_EQ(d.CopiesIssued(), 4u);
}

// Over the inline limit (or with the fast path off) a batch goes to the copy thread; results are the same.
TEST(CpuDevice, BatchesOverTheInlineLimitRunOnTheCopyThread) {
  for (uint64_t limit : {uint64_t{0}, uint64_t{8}, CpuDevice::kDefaultInlineLimit}) {
    CpuDevice d;
    d.SetInlineLimit(limit);
    PoolId p = *d.AllocatePool(64);
    std::vector<uint8_t> a(16), back(16, 0);
    std::iota(a.begin(), a.end(), uint8_t{3});
    HostToDeviceCopy w{DeviceRange{p, 0, 16}, a.data()};
    CopyEvent e = d.CopyHostToDevice({&w, 1}, {});
    ASSERT_TRUE(e.Wait().ok());
    DeviceToHostCopy r{back.data(), DeviceRange{p, 0, 16}};
    ASSERT_TRUE(d.CopyDeviceToHost({&r, 1}, {}).Wait().ok());
    EXPECT_EQ(back, a) << "limit " << limit;
  }
}

// A ready batch with a failed dependency fails on the fast path as on the copy thread: nothing written.
TEST(CpuDevice, ReadyBatchWithFailedDependencyFailsAndWritesNothing) {
  CpuDevice d;
  PoolId p = *d.AllocatePool(16);
  d.SetCopyHook([](const CopyInfo& i) { return i.id == 1 ? CopyFate::kFail : CopyFate::kRun; });
  std::vector<uint8_t> a(8, 5), out(8, 9);
  HostToDeviceCopy w{DeviceRange{p, 0, 8}, a.data()};
  CopyEvent failed = d.CopyHostToDevice({&w, 1}, {});
  CopyEvent dep = d.CopyHostToDevice({&w, 1}, {&failed, 1});
  EXPECT_EQ(dep.Wait().code(), absl::StatusCode::kUnavailable);
  DeviceToHostCopy r{out.data(), DeviceRange{p, 0, 8}};
  ASSERT_TRUE(d.CopyDeviceToHost({&r, 1}, {}).Wait().ok());
  EXPECT_EQ(out, std::vector<uint8_t>(8, 0));
}

}  // namespace
}  // namespace dhs

// ---- the asynchronous mode (issue 28) ----
namespace dhs {
namespace {

AsyncDeviceConfig Async(uint64_t seed, uint32_t copy_max = 4, uint32_t reader_min = 4, uint32_t reader_max = 32) {
  AsyncDeviceConfig c;
  c.enabled = true;
  c.seed = seed;
  c.copy_steps_max = copy_max;
  c.reader_steps_min = reader_min;
  c.reader_steps_max = reader_max;
  c.stuck_after = absl::Milliseconds(200);
  return c;
}

TEST(CpuDeviceAsync, ACopyMovesItsBytesOnlyWhenItCompletesSomeStepsAfterItsIssue) {
  CpuDevice d(Async(1, /*copy_max=*/1));  // exactly one step after the step that found it runnable
  PoolId p = *d.AllocatePool(32);
  std::vector<uint8_t> src(8, 9);
  HostToDeviceCopy w{DeviceRange{p, 0, 8}, src.data()};
  CopyEvent e = d.CopyHostToDevice({&w, 1}, {});
  EXPECT_EQ(d.HostVisible(p, 0)[0], 0) << "bytes moved inside the call that issued the copy";
  EXPECT_EQ(d.AsyncSteps(), 1u);
  EXPECT_TRUE(e.Done());  // this poll is step 2: the copy's due step
  EXPECT_EQ(d.HostVisible(p, 0)[0], 9);
  // A source changed before the copy runs is read as it is then (a GPU copy reads its source when it runs).
  std::vector<uint8_t> late(8, 1);
  HostToDeviceCopy w2{DeviceRange{p, 8, 8}, late.data()};
  CopyEvent e2 = d.CopyHostToDevice({&w2, 1}, {});
  late.assign(8, 2);
  ASSERT_TRUE(e2.Wait().ok());
  EXPECT_EQ(d.HostVisible(p, 8)[7], 2);
  EXPECT_TRUE(d.ReadHazards().ok());
}

// The step at which each of 12 copies completes, polling them in issue order.
std::vector<uint64_t> CompletionSteps(uint64_t seed) {
  CpuDevice d(Async(seed, /*copy_max=*/8));
  PoolId p = *d.AllocatePool(256);
  std::vector<uint8_t> src(16, 3);
  std::vector<CopyEvent> events;
  for (int i = 0; i < 12; ++i) {
    HostToDeviceCopy w{DeviceRange{p, i * 16, 16}, src.data()};
    events.push_back(d.CopyHostToDevice({&w, 1}, {}));
    EXPECT_EQ(d.HostVisible(p, i * 16)[0], 0) << "copy " << i << " moved its bytes inside the call that issued it";
  }
  std::vector<uint64_t> at(events.size(), 0);
  for (size_t done = 0; done < events.size();) {
    for (size_t i = 0; i < events.size(); ++i) {
      if (at[i] == 0 && events[i].Done()) {
        at[i] = d.AsyncSteps();
        ++done;
      }
    }
  }
  return at;
}

TEST(CpuDeviceAsync, TheScheduleIsAFunctionOfTheSeedAndTheCalls) {
  const std::vector<uint64_t> a = CompletionSteps(5);
  EXPECT_EQ(a, CompletionSteps(5));
  EXPECT_NE(a, CompletionSteps(6));
}

TEST(CpuDeviceAsync, AReaderEndsStepsAfterEndReadersAndItsFenceThen) {
  CpuDevice d(Async(2, 4, /*reader_min=*/3, /*reader_max=*/3));
  PoolId p = *d.AllocatePool(64);
  DeviceRange r{p, 0, 16};
  ReaderId id = d.BeginReaders({&r, 1});  // step 1
  CopyEvent fence = d.ReadersFence(r);
  d.EndReaders(id);  // step 2: really ends at step 5
  EXPECT_TRUE(d.ReadersBusy(r));
  EXPECT_FALSE(fence.Done());  // step 3
  EXPECT_FALSE(fence.Done());  // step 4
  EXPECT_TRUE(fence.Done());   // step 5
  EXPECT_FALSE(d.ReadersBusy(r));
}

TEST(CpuDeviceAsync, AWriteThatDoesNotWaitForTheReadersFenceIsAReadHazard) {
  CpuDevice d(Async(3, 2, 8, 8));
  PoolId p = *d.AllocatePool(64);
  std::vector<uint8_t> src(16, 4);
  DeviceRange r{p, 16, 16};
  ReaderId id = d.BeginReaders({&r, 1});
  d.EndReaders(id);
  // Ordered write: waits for the fence, no hazard.
  CopyEvent fence = d.ReadersFence(r);
  HostToDeviceCopy w{DeviceRange{p, 16, 16}, src.data()};
  ASSERT_TRUE(d.CopyHostToDevice({&w, 1}, {&fence, 1}).Wait().ok());
  EXPECT_TRUE(d.ReadHazards().ok());
  // Unordered write into a range still read: recorded, naming the copy and the reader.
  ReaderId id2 = d.BeginReaders({&r, 1});
  d.EndReaders(id2);
  HostToDeviceCopy w2{DeviceRange{p, 24, 4}, src.data()};
  CopyEvent bad = d.CopyHostToDevice({&w2, 1}, {});
  ASSERT_TRUE(bad.Wait().ok());
  absl::Status h = d.ReadHazards();
  EXPECT_EQ(h.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(h.message().find("wrote pool 0 bytes [24, 28)"), std::string::npos) << h;
  EXPECT_NE(h.message().find("reader 2"), std::string::npos) << h;
  EXPECT_NE(h.message().find("foreign bytes"), std::string::npos) << h;
}

TEST(CpuDeviceAsync, ARangeFreedWhileReadIsPoisonedAndReported) {
  CpuDevice d(Async(4, 2, 8, 8));
  PoolId p = *d.AllocatePool(64);
  std::vector<uint8_t> src(64, 7);
  HostToDeviceCopy w{DeviceRange{p, 0, 64}, src.data()};
  ASSERT_TRUE(d.CopyHostToDevice({&w, 1}, {}).Wait().ok());
  d.Freed(DeviceRange{p, 0, 16});  // nobody reads it: poisoned (a stale mapping reads 0xDB), no hazard
  EXPECT_EQ(d.HostVisible(p, 0)[0], kPoisonByte);
  EXPECT_EQ(d.HostVisible(p, 16)[0], 7);
  EXPECT_TRUE(d.ReadHazards().ok());
  DeviceRange r{p, 32, 16};
  d.EndReaders(d.BeginReaders({&r, 1}));  // ended by its owner, still reading for 8 steps
  d.Freed(DeviceRange{p, 32, 32});
  for (int i = 32; i < 64; ++i) EXPECT_EQ(d.HostVisible(p, i)[0], kPoisonByte);
  EXPECT_EQ(d.HostVisible(p, 31)[0], 7);
  absl::Status h = d.ReadHazards();
  EXPECT_EQ(h.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(h.message().find("freed at step"), std::string::npos) << h;
  EXPECT_NE(h.message().find("ended by its owner at step"), std::string::npos) << h;
}

TEST(CpuDeviceAsync, AWaitThatCannotEndFailsNamingTheReadersItWaitsFor) {
  CpuDevice d(Async(5));
  PoolId p = *d.AllocatePool(64);
  std::vector<uint8_t> src(16, 1);
  DeviceRange r{p, 0, 16};
  ReaderId id = d.BeginReaders({&r, 1});  // never ended while we wait: the wait cannot end
  CopyEvent fence = d.ReadersFence(r);
  HostToDeviceCopy w{r, src.data()};
  CopyEvent copy = d.CopyHostToDevice({&w, 1}, {&fence, 1});
  absl::Status s = copy.Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("waits for the fence of reader 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("not ended by its owner"), std::string::npos) << s;
  d.EndReaders(id);
  EXPECT_TRUE(copy.Wait().ok());
  EXPECT_EQ(d.HostVisible(p, 0)[0], 1);
  EXPECT_TRUE(d.ReadHazards().ok());
}

TEST(CpuDeviceAsync, TheSynchronousDefaultNeitherPoisonsNorReports) {
  CpuDevice d;
  PoolId p = *d.AllocatePool(16);
  DeviceRange r{p, 0, 16};
  ReaderId id = d.BeginReaders({&r, 1});
  d.Freed(r);
  EXPECT_EQ(d.HostVisible(p, 0)[0], 0);
  EXPECT_TRUE(d.ReadHazards().ok());
  d.EndReaders(id);
  EXPECT_FALSE(d.ReadersBusy(r));  // ends inside the call
}

}  // namespace
}  // namespace dhs
