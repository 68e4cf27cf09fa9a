// tests/workerd/link_model_test.cc: the host-device link model (workerd/device/link_model.h) alone and inside
// CpuDevice, on a simulated clock: a batch completes exactly when max(now, link_free) + latency + bytes / bandwidth
// says, not a nanosecond earlier; directions are independent; dependencies start after arrival; device-to-device
// copies and failures are not delayed; off by default. No assertion depends on wall-clock timing.
#include <gtest/gtest.h>

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "workerd/device/cpu_device.h"
#include "workerd/device/link_model.h"

namespace dhs {
namespace {

const absl::Time kT0 = absl::UnixEpoch() + absl::Seconds(1000);

LinkModelFlags Flags(std::string model, std::optional<double> h2d = std::nullopt,
                     std::optional<double> d2h = std::nullopt, std::optional<double> latency = std::nullopt) {
  LinkModelFlags f;
  f.model = std::move(model);
  f.host_to_device_gb_per_s = h2d;
  f.device_to_host_gb_per_s = d2h;
  f.latency_us = latency;
  return f;
}

// 1 GB/s = 1 byte per ns: b bytes take b ns; latency 2 µs.
LinkModelConfig OneGbPerS() { return LinkModelConfig{true, 1.0, 1.0, 2.0}; }

TEST(LinkModel, ScheduleSerializesEachDirection) {
  LinkModel m(OneGbPerS());
  // 1000 bytes at t0: t0 + 2000 ns + 1000 ns.
  EXPECT_EQ(m.Schedule(LinkDirection::kHostToDevice, 1000, kT0), kT0 + absl::Nanoseconds(3000));
  // 500 bytes asked at t0 + 1 µs waits for the link (free at t0 + 3 µs): t0 + 3000 + 2000 + 500 ns.
  EXPECT_EQ(m.Schedule(LinkDirection::kHostToDevice, 500, kT0 + absl::Microseconds(1)),
            kT0 + absl::Nanoseconds(5500));
  // The other direction is its own link: 1000 bytes at t0 + 1 µs: t0 + 1000 + 2000 + 1000 ns.
  EXPECT_EQ(m.Schedule(LinkDirection::kDeviceToHost, 1000, kT0 + absl::Microseconds(1)),
            kT0 + absl::Nanoseconds(4000));
  // An idle link starts at `now`: 0 bytes at t0 + 100 µs cost the latency only.
  EXPECT_EQ(m.Schedule(LinkDirection::kHostToDevice, 0, kT0 + absl::Microseconds(100)),
            kT0 + absl::Nanoseconds(102000));
}

TEST(LinkModel, PerDirectionBandwidth) {
  // H2D 4 GB/s, D2H 2 GB/s, no latency: 8000 bytes take 2000 ns and 4000 ns.
  LinkModel m(LinkModelConfig{true, 4.0, 2.0, 0.0});
  EXPECT_EQ(m.TransferTime(LinkDirection::kHostToDevice, 8000), absl::Nanoseconds(2000));
  EXPECT_EQ(m.TransferTime(LinkDirection::kDeviceToHost, 8000), absl::Nanoseconds(4000));
  // pcie5 defaults: 55 GB/s, 5 µs: 1,100,000 bytes take 5000 + 20000 ns.
  LinkModel p(*ResolveLinkModel(Flags("pcie5")));
  EXPECT_EQ(p.TransferTime(LinkDirection::kHostToDevice, 1100000), absl::Nanoseconds(25000));
}

TEST(LinkModel, FlagsResolveAndRoundTrip) {
  auto off = ResolveLinkModel(LinkModelFlags{});
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->enabled);
  EXPECT_TRUE(LinkModelArgs(*off).empty());
  auto pcie = ResolveLinkModel(Flags("pcie5"));
  ASSERT_TRUE(pcie.ok());
  EXPECT_TRUE(pcie->enabled);
  EXPECT_EQ(pcie->host_to_device_gb_per_s, 55.0);
  EXPECT_EQ(pcie->device_to_host_gb_per_s, 55.0);
  EXPECT_EQ(pcie->latency_us, 5.0);
  auto custom = ResolveLinkModel(Flags("pcie5", 12.5, 0.1, 0.0));
  ASSERT_TRUE(custom.ok());
  EXPECT_EQ(custom->host_to_device_gb_per_s, 12.5);
  EXPECT_EQ(custom->device_to_host_gb_per_s, 0.1);
  EXPECT_EQ(custom->latency_us, 0.0);
  // The workerd arguments dhs-replay passes reproduce the config exactly.
  const std::vector<std::string> args = LinkModelArgs(*custom);
  ASSERT_EQ(args.size(), 8u);
  EXPECT_EQ(args[0], "--link-model");
  EXPECT_EQ(args[1], "pcie5");
  EXPECT_EQ(args[2], "--link-h2d-gb-per-s");
  EXPECT_EQ(std::stod(args[3]), 12.5);
  EXPECT_EQ(args[4], "--link-d2h-gb-per-s");
  EXPECT_EQ(std::stod(args[5]), 0.1);
  EXPECT_EQ(args[6], "--link-latency-us");
  EXPECT_EQ(std::stod(args[7]), 0.0);

  struct Bad {
    LinkModelFlags flags;
    const char* option;
  };
  const Bad bad[] = {
      {Flags("pcie4"), "--link-model"},
      {Flags("off", 10.0), "--link-model pcie5"},
      {Flags("off", std::nullopt, std::nullopt, 1.0), "--link-model pcie5"},
      {Flags("pcie5", 0.0), "--link-h2d-gb-per-s"},
      {Flags("pcie5", std::nullopt, -1.0), "--link-d2h-gb-per-s"},
      {Flags("pcie5", std::nullopt, std::nullopt, -0.5), "--link-latency-us"},
      {Flags("pcie5", std::nullopt, std::nullopt, std::numeric_limits<double>::infinity()), "--link-latency-us"},
  };
  for (const Bad& b : bad) {
    auto c = ResolveLinkModel(b.flags);
    ASSERT_FALSE(c.ok()) << b.option;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(b.option), std::string::npos) << c.status();
  }
}

class LinkedDevice : public ::testing::Test {
 protected:
  LinkedDevice() : clock_(kT0), d_(OneGbPerS(), &clock_) { pool_ = *d_.AllocatePool(1 << 16); }

  CopyEvent H2D(uint64_t offset, std::vector<uint8_t>& src, std::span<const CopyEvent> after = {}) {
    HostToDeviceCopy op{DeviceRange{pool_, static_cast<Location>(offset), src.size()}, src.data()};
    return d_.CopyHostToDevice({&op, 1}, after);
  }
  CopyEvent D2H(std::vector<uint8_t>& dst, uint64_t offset) {
    DeviceToHostCopy op{dst.data(), DeviceRange{pool_, static_cast<Location>(offset), dst.size()}};
    return d_.CopyDeviceToHost({&op, 1}, {});
  }

  FakeLinkClock clock_;
  CpuDevice d_;
  PoolId pool_ = 0;
};

TEST_F(LinkedDevice, CompletesExactlyWhenTheModelSays) {
  std::vector<uint8_t> a(1000, 7);
  CopyEvent e = H2D(0, a);
  d_.WaitIdle();  // the copy thread moved the bytes at t0
  // The bytes are there at once; the event is not done before t0 + 3 µs.
  EXPECT_EQ(d_.HostVisible(pool_, 999)[0], 7);
  EXPECT_FALSE(e.Done());
  EXPECT_EQ(e.Status().code(), absl::StatusCode::kUnavailable);
  clock_.Set(kT0 + absl::Nanoseconds(2999));
  EXPECT_FALSE(e.Done());
  clock_.Set(kT0 + absl::Nanoseconds(3000));
  EXPECT_TRUE(e.Done());
  EXPECT_TRUE(e.Status().ok());
}

TEST_F(LinkedDevice, WaitSleepsUntilDelivery) {
  std::vector<uint8_t> a(1000, 7), b(1000, 8);
  CopyEvent e1 = H2D(0, a);
  CopyEvent e2 = H2D(4096, b);  // queued behind e1 on the same link: t0 + 3000 + 2000 + 1000 ns
  d_.WaitIdle();
  ASSERT_TRUE(e2.Wait().ok());  // the simulated clock moves to the delivery time
  EXPECT_EQ(clock_.Now(), kT0 + absl::Nanoseconds(6000));
  EXPECT_TRUE(e1.Done());
  ASSERT_TRUE(e1.Wait().ok());  // already delivered: no move
  EXPECT_EQ(clock_.Now(), kT0 + absl::Nanoseconds(6000));
}

TEST_F(LinkedDevice, DirectionsAreIndependentAndDeviceToDeviceIsNotDelayed) {
  std::vector<uint8_t> a(1000, 7), back(2000, 0);
  CopyEvent h2d = H2D(0, a);   // t0 + 3 µs
  CopyEvent d2h = D2H(back, 8192);  // its own link: t0 + 2000 + 2000 ns
  DeviceToDeviceCopy dd{DeviceRange{pool_, 16384, 1000}, DeviceRange{pool_, 0, 1000}};
  CopyEvent d2d = d_.CopyDeviceToDevice({&dd, 1}, {});
  d_.WaitIdle();
  EXPECT_TRUE(d2d.Done());
  clock_.Set(kT0 + absl::Nanoseconds(3999));
  EXPECT_TRUE(h2d.Done());
  EXPECT_FALSE(d2h.Done());
  clock_.Set(kT0 + absl::Nanoseconds(4000));
  EXPECT_TRUE(d2h.Done());
}

TEST_F(LinkedDevice, DependentCopyStartsWhenItsDependencyArrived) {
  std::vector<uint8_t> a(1000, 7), b(500, 9);
  CopyEvent first = H2D(0, a);                    // t0 + 3000 ns
  CopyEvent second = H2D(4096, b, {&first, 1});   // runs only once `first` arrived
  d_.WaitIdle();                                  // `second` is not runnable yet
  EXPECT_EQ(d_.HostVisible(pool_, 4096)[0], 0);   // not copied before its dependency arrived
  clock_.Set(kT0 + absl::Nanoseconds(3000));
  d_.WaitIdle();                                  // now it runs, at t0 + 3 µs: + 2000 + 500 ns
  EXPECT_EQ(d_.HostVisible(pool_, 4096)[0], 9);
  clock_.Set(kT0 + absl::Nanoseconds(5499));
  EXPECT_FALSE(second.Done());
  clock_.Set(kT0 + absl::Nanoseconds(5500));
  EXPECT_TRUE(second.Done());
}

TEST_F(LinkedDevice, FailuresAreNotDelayed) {
  d_.SetCopyHook([](const CopyInfo& i) { return i.id == 1 ? CopyFate::kFail : CopyFate::kRun; });
  std::vector<uint8_t> a(1000, 7), b(1000, 8);
  CopyEvent failed = H2D(0, a);
  EXPECT_TRUE(failed.Failed());
  CopyEvent dependent = H2D(4096, b, {&failed, 1});
  d_.WaitIdle();
  EXPECT_TRUE(dependent.Failed());  // at t0: a failed batch moves nothing over the link
  EXPECT_EQ(clock_.Now(), kT0);
}

TEST(LinkModelOff, DefaultDeviceDoesNotDelay) {
  FakeLinkClock clock(kT0);
  CpuDevice d(LinkModelConfig{}, &clock);  // disabled: the clock is never consulted
  EXPECT_FALSE(d.link_model().enabled);
  PoolId p = *d.AllocatePool(4096);
  std::vector<uint8_t> a(1000, 7);
  HostToDeviceCopy op{DeviceRange{p, 0, 1000}, a.data()};
  CopyEvent e = d.CopyHostToDevice({&op, 1}, {});
  d.WaitIdle();
  EXPECT_TRUE(e.Done());
  EXPECT_EQ(clock.Now(), kT0);
  CpuDevice plain;
  EXPECT_FALSE(plain.link_model().enabled);
}

}  // namespace
}  // namespace dhs
