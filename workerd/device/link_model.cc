// workerd/device/link_model.cc: see link_model.h.
#include "workerd/device/link_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dhs {
namespace {

class RealClock final : public LinkClock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  void SleepUntil(absl::Time t) const override {
    // Issue 27: a modelled copy completes microseconds after it starts (5 us of latency per batch). A sleep that
    // short costs a scheduler wake-up, up to a timer tick (4 ms) on a loaded machine: the hierarchical modes' waits
    // for host recoveries came out 100-1000 times their modelled time, the worker off the CPU. A GPU's stream
    // synchronisation spins; so does the last kSpin before t here (reading the clock); a longer wait sleeps first.
    constexpr absl::Duration kSpin = absl::Microseconds(500);
    const absl::Duration left = t - absl::Now();
    if (left > kSpin) absl::SleepFor(left - kSpin);
    while (absl::Now() < t) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }
};

// Round-trips a double exactly (17 significant digits).
std::string Number(double v) { return absl::StrFormat("%.17g", v); }

}  // namespace

const LinkClock* RealLinkClock() {
  static const RealClock* clock = new RealClock();
  return clock;
}

absl::Time FakeLinkClock::Now() const {
  absl::MutexLock l(&mu_);
  return now_;
}

void FakeLinkClock::SleepUntil(absl::Time t) const {
  absl::MutexLock l(&mu_);
  now_ = std::max(now_, t);
}

void FakeLinkClock::Advance(absl::Duration d) {
  absl::MutexLock l(&mu_);
  now_ += d;
}

void FakeLinkClock::Set(absl::Time t) {
  absl::MutexLock l(&mu_);
  now_ = t;
}

absl::StatusOr<LinkModelConfig> ResolveLinkModel(const LinkModelFlags& f) {
  LinkModelConfig c;
  if (f.model == "off") {
    if (f.host_to_device_gb_per_s || f.device_to_host_gb_per_s || f.latency_us) {
      return absl::InvalidArgumentError(
          "--link-h2d-gb-per-s, --link-d2h-gb-per-s and --link-latency-us need --link-model pcie5");
    }
    return c;
  }
  if (f.model != "pcie5") {
    return absl::InvalidArgumentError(absl::StrCat("--link-model must be off or pcie5, got '", f.model, "'"));
  }
  c.enabled = true;
  c.host_to_device_gb_per_s = f.host_to_device_gb_per_s.value_or(kPcie5GbPerS);
  c.device_to_host_gb_per_s = f.device_to_host_gb_per_s.value_or(kPcie5GbPerS);
  c.latency_us = f.latency_us.value_or(kPcie5LatencyUs);
  if (!(std::isfinite(c.host_to_device_gb_per_s) && c.host_to_device_gb_per_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--link-h2d-gb-per-s must be a finite number > 0, got ", c.host_to_device_gb_per_s));
  }
  if (!(std::isfinite(c.device_to_host_gb_per_s) && c.device_to_host_gb_per_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--link-d2h-gb-per-s must be a finite number > 0, got ", c.device_to_host_gb_per_s));
  }
  if (!(std::isfinite(c.latency_us) && c.latency_us >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--link-latency-us must be a finite number >= 0, got ", c.latency_us));
  }
  return c;
}

std::vector<std::string> LinkModelArgs(const LinkModelConfig& c) {
  if (!c.enabled) return {};
  return {"--link-model",        "pcie5",
          "--link-h2d-gb-per-s", Number(c.host_to_device_gb_per_s),
          "--link-d2h-gb-per-s", Number(c.device_to_host_gb_per_s),
          "--link-latency-us",   Number(c.latency_us)};
}

LinkModel::LinkModel(const LinkModelConfig& config) : config_(config) {}

absl::Duration LinkModel::TransferTime(LinkDirection d, uint64_t bytes) const {
  const double gb_per_s =
      d == LinkDirection::kHostToDevice ? config_.host_to_device_gb_per_s : config_.device_to_host_gb_per_s;
  // GB/s = bytes per ns, so bytes / gb_per_s is in ns.
  return absl::Nanoseconds(config_.latency_us * 1000.0) + absl::Nanoseconds(static_cast<double>(bytes) / gb_per_s);
}

absl::Time LinkModel::Schedule(LinkDirection d, uint64_t bytes, absl::Time now) {
  absl::Time& free = free_[static_cast<int>(d)];
  free = std::max(now, free) + TransferTime(d, bytes);
  return free;
}

}  // namespace dhs
