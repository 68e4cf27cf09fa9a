// tests/gpu/cuda_device_test.cc: CudaDevice keeps the Device contract of the CPU backend (tests/workerd/
// cpu_device_test.cc): zero-filled pools, copies that round-trip bytes, out-of-range ranges failing INVALID_ARGUMENT,
// injected failures UNAVAILABLE with no byte written, held batches, dependencies (a failed one fails the batch),
// reader fences (host-ended and event-ended), the pinned mapped host pool. Exits 77 (skipped) without a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

#include "tests/gpu/gpu_util.h"
#include "workerd/device/cuda_check.h"

namespace dhs {
namespace {

std::unique_ptr<CudaDevice> Make(bool managed = false) {
  auto d = CudaDevice::Create(CudaDeviceOptions{0, managed});
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

std::vector<uint8_t> ReadBack(CudaDevice& d, PoolId pool, Location off, uint64_t n) {
  std::vector<uint8_t> v(n, 0xEE);
  DeviceToHostCopy op{v.data(), DeviceRange{pool, off, n}};
  EXPECT_TRUE(d.CopyDeviceToHost({&op, 1}, {}).Wait().ok());
  return v;
}

TEST(CudaDevice, PoolsAreZeroFilledAndCopiesRoundTrip) {
  auto d = Make();
  const PoolId a = *d->AllocatePool(1 << 20), b = *d->AllocatePool(4096);
  EXPECT_EQ(d->PoolBytes(a), 1u << 20);
  EXPECT_EQ(d->PoolBytes(7), 0u);
  EXPECT_EQ(ReadBack(*d, a, 1000, 64), std::vector<uint8_t>(64, 0));
  const auto src = Pattern(300, 3);
  HostToDeviceCopy h2d{DeviceRange{a, 5000, 300}, src.data()};
  const CopyEvent e1 = d->CopyHostToDevice({&h2d, 1}, {});
  DeviceToDeviceCopy d2d{DeviceRange{b, 100, 300}, DeviceRange{a, 5000, 300}};
  const CopyEvent e2 = d->CopyDeviceToDevice({&d2d, 1}, {&e1, 1});  // after the H2D, on another stream
  ASSERT_TRUE(e2.Wait().ok());
  EXPECT_TRUE(e1.Done());
  EXPECT_EQ(ReadBack(*d, b, 100, 300), src);
  EXPECT_EQ(d->HostVisible(a, 0), nullptr);  // plain device memory
  EXPECT_NE(d->DevicePointer(a, 0), nullptr);
  EXPECT_EQ(d->DevicePointer(a, (1 << 20) + 1), nullptr);
}

TEST(CudaDevice, ManagedPoolsAreHostVisible) {
  auto d = Make(/*managed=*/true);
  const PoolId a = *d->AllocatePool(4096);
  const auto src = Pattern(64, 9);
  HostToDeviceCopy op{DeviceRange{a, 128, 64}, src.data()};
  ASSERT_TRUE(d->CopyHostToDevice({&op, 1}, {}).Wait().ok());
  const uint8_t* p = d->HostVisible(a, 128);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(std::vector<uint8_t>(p, p + 64), src);
}

TEST(CudaDevice, ErrorsHaveTheCpuBackendsCodes) {
  auto d = Make();
  const PoolId a = *d->AllocatePool(4096);
  const auto src = Pattern(64, 1);
  HostToDeviceCopy bad{DeviceRange{a, 4090, 64}, src.data()};
  const CopyEvent e = d->CopyHostToDevice({&bad, 1}, {});
  EXPECT_TRUE(e.Failed());
  EXPECT_EQ(e.Status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d->AllocatePool(uint64_t{1} << 52).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaStatus(cudaErrorMemoryAllocation, "x").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaStatus(cudaErrorInvalidValue, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaStatus(cudaErrorLaunchFailure, "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(CudaStatus(cudaSuccess, "x").ok());
}

TEST(CudaDevice, HookFailsHoldsAndDependenciesPropagate) {
  auto d = Make();
  const PoolId a = *d->AllocatePool(4096);
  const auto src = Pattern(64, 5);
  d->SetCopyHook([](const CopyInfo& info) { return info.id == 1 ? CopyFate::kFail : info.id == 2 ? CopyFate::kHold : CopyFate::kRun; });
  HostToDeviceCopy op1{DeviceRange{a, 0, 64}, src.data()};
  const CopyEvent failed = d->CopyHostToDevice({&op1, 1}, {});
  EXPECT_EQ(failed.Wait().code(), absl::StatusCode::kUnavailable);
  HostToDeviceCopy op2{DeviceRange{a, 64, 64}, src.data()};
  const CopyEvent held = d->CopyHostToDevice({&op2, 1}, {});
  HostToDeviceCopy op3{DeviceRange{a, 128, 64}, src.data()};
  const CopyEvent after_failed = d->CopyHostToDevice({&op3, 1}, {&failed, 1});
  EXPECT_EQ(after_failed.Wait().code(), absl::StatusCode::kUnavailable);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(held.Done());
  EXPECT_EQ(d->HeldCopies(), std::vector<uint64_t>{2});
  d->SetCopyHook(nullptr);
  // No byte of the failed batches was written; the held one has not run yet.
  EXPECT_EQ(ReadBack(*d, a, 0, 192), std::vector<uint8_t>(192, 0));
  d->ReleaseHeld(2);
  ASSERT_TRUE(held.Wait().ok());
  EXPECT_EQ(ReadBack(*d, a, 64, 64), src);
  EXPECT_EQ(d->CopiesIssued(), 5u);  // 3 + 2 read-backs
}

TEST(CudaDevice, ReaderFences) {
  auto d = Make();
  const PoolId a = *d->AllocatePool(4096);
  const DeviceRange r{a, 0, 256};
  const ReaderId x = d->BeginReaders({&r, 1});
  EXPECT_TRUE(d->ReadersBusy(DeviceRange{a, 255, 1}));
  EXPECT_FALSE(d->ReadersBusy(DeviceRange{a, 256, 10}));
  const CopyEvent fence = d->ReadersFence(DeviceRange{a, 100, 4});
  EXPECT_TRUE(d->ReadersFence(DeviceRange{a, 1000, 4}).Done());
  const auto src = Pattern(4, 2);
  HostToDeviceCopy op{DeviceRange{a, 100, 4}, src.data()};
  const CopyEvent write = d->CopyHostToDevice({&op, 1}, {&fence, 1});
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(fence.Done());
  EXPECT_FALSE(write.Done());  // nothing reuses the range before its readers ended
  // The reader ends when the work on the compute stream so far completes: hold that stream with a host callback.
  std::atomic<bool> go{false};
  cudaStream_t s = d->compute_stream();
  ASSERT_EQ(cudaLaunchHostFunc(s, [](void* p) { while (!static_cast<std::atomic<bool>*>(p)->load()) {} }, &go),
            cudaSuccess);
  ASSERT_TRUE(d->EndReadersAfter(x, s).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(fence.Done());
  go = true;
  ASSERT_TRUE(write.Wait().ok());
  EXPECT_TRUE(fence.Done());
  EXPECT_FALSE(d->ReadersBusy(r));
  EXPECT_EQ(ReadBack(*d, a, 100, 4), src);
}

TEST(CudaDevice, HostPoolIsPinnedAndMapped) {
  auto d = Make();
  std::vector<uint8_t> host = Pattern(1 << 16, 4);
  absl::StatusOr<uint8_t*> dev = d->RegisterHostPool(std::span<uint8_t>(host));
  ASSERT_TRUE(dev.ok()) << dev.status();
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, host.data()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  EXPECT_EQ(d->RegisterHostPool(std::span<uint8_t>(host)).status().code(), absl::StatusCode::kInvalidArgument);
  // The mapped address reads the host bytes from the device.
  const PoolId a = *d->AllocatePool(1 << 16);
  ASSERT_EQ(cudaMemcpy(d->DevicePointer(a, 0), *dev, 1 << 16, cudaMemcpyDeviceToDevice), cudaSuccess);
  EXPECT_EQ(ReadBack(*d, a, 0, 1 << 16), host);
  EXPECT_TRUE(d->UnregisterHostPool(std::span<uint8_t>(host)).ok());
}

}  // namespace
}  // namespace dhs

int main(int argc, char** argv) {
  dhs::gpu::ExitUnlessGpu("cuda_device_test");
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
