// workerd/device/link_model.h: an optional model of the host-device link for the CPU backend (issue 14, brief §9).
//
// On the CPU backend a host recovery is a DRAM-to-DRAM memcpy, as cheap as a direct read, so the difference the design
// exists for (adaptive recovers far fewer rows from host than hisparse) cannot show. With a link model, CpuDevice still
// moves the bytes at once, but a host<->device batch's event completes only when the modelled link would have
// delivered it: a batch of `b` bytes issued (dependencies done) at `now` in direction `d` completes at
//
//   max(now, link_free[d]) + latency + b / bandwidth[d]        and link_free[d] becomes that time
//
// so each direction is one serialized link and the two directions are independent (PCIe is full duplex). The latency
// is paid once per batch (one CopyEvent, one DMA submission). Device-to-device copies do not cross the link and are
// not modelled. Off by default; defaults and their sources are in docs/link_model.md.
//
// Thread-safety: LinkModel is not thread-safe (CpuDevice calls it from its copy thread only). LinkClock
// implementations are thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dhs {

struct LinkModelConfig {
  bool enabled = false;                // off: copies complete as soon as the copy thread moved the bytes
  double host_to_device_gb_per_s = 0;  // bandwidth host -> device, GB/s (1e9 bytes per second), > 0 when enabled
  double device_to_host_gb_per_s = 0;  // bandwidth device -> host, GB/s, > 0 when enabled
  double latency_us = 0;               // per batch (one CopyEvent), microseconds, >= 0
};

// The PCIe 5.0 x16 figures (docs/link_model.md): 55 GB/s per direction (achievable; 63 GB/s theoretical), 5 µs.
inline constexpr double kPcie5GbPerS = 55.0;
inline constexpr double kPcie5LatencyUs = 5.0;

// The command-line form shared by workerd and dhs-replay:
//   --link-model off|pcie5  [--link-h2d-gb-per-s X] [--link-d2h-gb-per-s X] [--link-latency-us X]
struct LinkModelFlags {
  std::string model = "off";
  std::optional<double> host_to_device_gb_per_s;
  std::optional<double> device_to_host_gb_per_s;
  std::optional<double> latency_us;
};

// The config of `flags`: "off" (no override allowed) or "pcie5" with the overrides applied.
// Errors: INVALID_ARGUMENT naming the option: an unknown model, an override with "off", a bandwidth not finite and
// > 0, a latency not finite and >= 0.
absl::StatusOr<LinkModelConfig> ResolveLinkModel(const LinkModelFlags& flags);

// The workerd arguments that reproduce `config` exactly (empty when off): what dhs-replay passes to the workerd it
// starts.
std::vector<std::string> LinkModelArgs(const LinkModelConfig& config);

// Time source of the link model. Now() is the current time; SleepUntil(t) returns at or after t.
class LinkClock {
 public:
  virtual ~LinkClock() = default;
  virtual absl::Time Now() const = 0;
  virtual void SleepUntil(absl::Time t) const = 0;
};

// absl::Now() and absl::SleepFor: a wait longer than 500 us sleeps until 500 us before its end, the rest (every wait
// of a few modelled microseconds) spins on the clock (issue 27: a sleep of microseconds costs up to a timer tick on a
// loaded machine). A process-wide instance.
const LinkClock* RealLinkClock();

// A simulated clock for tests: time moves only through Advance / Set, and SleepUntil(t) moves it forward to t
// (a waiter never blocks on simulated time).
class FakeLinkClock final : public LinkClock {
 public:
  explicit FakeLinkClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}
  absl::Time Now() const override;
  void SleepUntil(absl::Time t) const override;
  void Advance(absl::Duration d);
  void Set(absl::Time t);

 private:
  mutable absl::Mutex mu_;
  mutable absl::Time now_;
};

enum class LinkDirection { kHostToDevice = 0, kDeviceToHost = 1 };

// The serialized link of each direction. Schedule is pure arithmetic over `now` (no clock read).
class LinkModel {
 public:
  explicit LinkModel(const LinkModelConfig& config);

  // A batch of `bytes` bytes that may start at `now` in `direction`: returns when it completes (formula above) and
  // books the link until then.
  absl::Time Schedule(LinkDirection direction, uint64_t bytes, absl::Time now);

  // Time to move `bytes` over `direction` once the link is free: latency + bytes / bandwidth.
  absl::Duration TransferTime(LinkDirection direction, uint64_t bytes) const;

 private:
  LinkModelConfig config_;
  absl::Time free_[2] = {absl::InfinitePast(), absl::InfinitePast()};
};

}  // namespace dhs
