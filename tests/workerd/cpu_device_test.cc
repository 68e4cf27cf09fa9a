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
