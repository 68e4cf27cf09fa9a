// tests/memd/residency_test_util.h: what the tests of memd's decision core share (ResidencyManager driven through
// the events memd's daemon sends): the residency and prefix-sharing fixtures (tests/memd/residency_test.cc,
// prefix_pages_test.cc), the randomized drivers (residency_random_test.cc, prefix_random_test.cc) and the host journal
// they write. Header-only; nothing here decides anything the tests assert.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <variant>
#include <vector>

#include "memd/host_journal.h"
#include "memd/residency_manager.h"

namespace dhs::memd {

// The orders of type T in `orders`, in order.
template <typename T>
std::vector<T> OfType(const std::vector<Order>& orders) {
  std::vector<T> out;
  for (const Order& o : orders) {
    if (const T* t = std::get_if<T>(&o)) out.push_back(*t);
  }
  return out;
}

// Request `id`'s row of a full dump; nullopt when the core does not know it.
inline std::optional<RequestDump> DumpOf(const ResidencyManager& mgr, RequestId id) {
  for (const RequestDump& d : mgr.Dump().requests) {
    if (d.request == id) return d;
  }
  return std::nullopt;
}

// A core on a test clock (now_us_, microseconds; the test moves it) whose events are checked one by one.
class CoreTest : public ::testing::Test {
 protected:
  // A new core with `config` (and `journal`, not owned) and GPU 0 registered with `gpu_pages` pages and `slots`.
  void MakeCore(const ResidencyConfig& config, uint32_t gpu_pages, uint32_t slots = 0,
                HostJournal* journal = nullptr) {
    auto made = ResidencyManager::Create(config, [this] { return now_us_; }, journal);
    ASSERT_TRUE(made.ok()) << made.status();
    mgr_ = std::move(*made);
    ASSERT_TRUE(mgr_->RegisterGpu(0, gpu_pages, slots).ok());
  }
  // Runs an event: checks it succeeded and the invariants hold, moves the clock 10 us, returns the orders it produced.
  std::vector<Order> Do(absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    absl::Status inv = mgr_->CheckInvariants();
    EXPECT_TRUE(inv.ok()) << inv;
    now_us_ += 10;
    return mgr_->DrainOrders();
  }
  // The one GrantOrder among `orders` (a failure when there is not exactly one).
  GrantOrder OneGrant(const std::vector<Order>& orders) {
    auto g = OfType<GrantOrder>(orders);
    EXPECT_EQ(g.size(), 1u);
    return g.empty() ? GrantOrder{} : g[0];
  }

  int64_t now_us_ = 0;
  std::unique_ptr<ResidencyManager> mgr_;
};

// The host journal's region in test memory (in memd: the host pool segment's), formatted for `host_pages` pages.
class JournalMemory {
 public:
  explicit JournalMemory(uint32_t host_pages)
      : host_pages_(host_pages), words_(HostJournal::BytesFor(host_pages) / 8, 0) {
    Attach();
    journal_->Format();
  }
  HostJournal* get() { return journal_.get(); }
  HostJournal* operator->() { return journal_.get(); }
  // The bytes as a dead memd leaves them (the segment keeps them), and a new memd's journal over such bytes (not
  // formatted: what it verifies and adopts).
  std::vector<uint64_t> Snapshot() const { return words_; }
  void Restore(std::vector<uint64_t> words) {
    words_ = std::move(words);
    Attach();
  }

 private:
  void Attach() {
    const std::span<uint8_t> bytes(reinterpret_cast<uint8_t*>(words_.data()), words_.size() * 8);
    journal_ = std::make_unique<HostJournal>(*HostJournal::Attach(bytes, host_pages_));
  }

  uint32_t host_pages_;
  std::vector<uint64_t> words_;  // 8-byte aligned, as the segment's journal region
  std::unique_ptr<HostJournal> journal_;
};

// The randomized tests' seeds (env DHS_SEED: that one; else 1..20) and events per seed (env DHS_EVENTS; else 2000).
inline std::vector<uint64_t> Seeds() {
  if (const char* s = std::getenv("DHS_SEED")) return {std::strtoull(s, nullptr, 10)};
  std::vector<uint64_t> seeds;
  for (uint64_t s = 1; s <= 20; ++s) seeds.push_back(s);
  return seeds;
}
inline int Events() {
  const char* e = std::getenv("DHS_EVENTS");
  return e ? std::atoi(e) : 2000;
}

// The dice of a randomized driver, seeded.
class Dice {
 public:
  explicit Dice(uint64_t seed) : rng_(seed) {}
  uint32_t Pick(uint32_t n) { return std::uniform_int_distribution<uint32_t>(0, n - 1)(rng_); }
  template <typename M>
  typename M::key_type PickKey(const M& m) {
    auto it = m.begin();
    std::advance(it, Pick(static_cast<uint32_t>(m.size())));
    return it->first;
  }

 private:
  std::mt19937_64 rng_;
};

// The interrupted requests of `model` (a map of request id -> model request with `gpu` and `interrupted`) whose GPU is
// up: what a randomized driver's resume picks from.
template <typename Model>
std::vector<RequestId> InterruptedOnLiveGpus(const Model& model, const std::vector<bool>& up) {
  std::vector<RequestId> out;
  for (const auto& [id, m] : model) {
    if (m.interrupted && up[m.gpu]) out.push_back(id);
  }
  return out;
}

}  // namespace dhs::memd
