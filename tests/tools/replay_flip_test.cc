// tests/tools/replay_flip_test.cc: the replay's exactness verdict (CompareOutputs, the function behind
// `dhs-replay --check-exact`) cannot pass vacuously. The same requests are served in-process by a Worker (fake memd
// with seeded reclaim and populate orders, tests/workerd/worker_test_util.h) in resident mode (the reference) and in
// adaptive mode under a small GPU budget; each run's streamed tokens and logits digests become a DriverResult, as the
// replay's driver records them, and go through CompareOutputs:
//   - unflipped: adaptive equals resident (and the hierarchy really recovered rows from host);
//   - one bit of one logit the model produced (Model::SetLogitsHookForTest, before the worker digests and samples it)
//     flipped in one run: a mismatch naming that request and token, on the digest alone (the token is unchanged);
//   - one byte of one KV row fetched from host (a host->device recovery copy into the request's hot cache, made by
//     a test Device that wraps the CPU device) corrupted in one run: a mismatch naming that request.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/workerd/worker_test_util.h"
#include "tools/replay/driver.h"
#include "tools/replay/report.h"
#include "workerd/device/cpu_device.h"

namespace dhs::test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A Device that forwards to a CpuDevice and, once armed, corrupts one byte of the first host->device copy op whose
// destination is a hot-cache row of `slot` (a host recovery of that request's selected row): the op's source row is
// copied, one byte changed, and the copy made from the changed bytes. Everything else is forwarded unchanged.
class CorruptingDevice final : public Device {
 public:
  void Arm(const KvLayout* layout, SlotIndex slot) {
    layout_ = layout;
    slot_ = slot;
    armed_ = true;
  }
  int corrupted() const { return corrupted_; }
  uint64_t corrupted_offset() const { return corrupted_offset_; }

  absl::StatusOr<PoolId> AllocatePool(uint64_t bytes) override { return cpu_.AllocatePool(bytes); }
  uint64_t PoolBytes(PoolId pool) const override { return cpu_.PoolBytes(pool); }
  CopyEvent CopyHostToDevice(std::span<const HostToDeviceCopy> ops, std::span<const CopyEvent> after) override {
    if (!armed_) return cpu_.CopyHostToDevice(ops, after);
    std::vector<HostToDeviceCopy> changed(ops.begin(), ops.end());
    for (HostToDeviceCopy& op : changed) {
      if (!InHotRows(op.dst)) continue;
      std::vector<uint8_t>& row = kept_.emplace_back(op.src, op.src + op.dst.bytes);
      // The first float of clearly non-zero magnitude: flip the lowest bit of its exponent (byte 2, bit 7 of a
      // little-endian float32), which doubles or halves it; a row of d_c + d_r floats (model/config.h).
      size_t at = 0;
      for (size_t f = 0; f + 4 <= row.size(); f += 4) {
        float v;
        std::memcpy(&v, row.data() + f, 4);
        if (std::fabs(v) > 1e-2f) {
          at = f;
          break;
        }
      }
      row[at + 2] ^= 0x80;
      op.src = row.data();
      corrupted_offset_ = static_cast<uint64_t>(op.dst.offset) + at + 2;
      ++corrupted_;
      armed_ = false;
      break;
    }
    return cpu_.CopyHostToDevice(changed, after);
  }
  CopyEvent CopyDeviceToHost(std::span<const DeviceToHostCopy> ops, std::span<const CopyEvent> after) override {
    return cpu_.CopyDeviceToHost(ops, after);
  }
  CopyEvent CopyDeviceToDevice(std::span<const DeviceToDeviceCopy> ops, std::span<const CopyEvent> after) override {
    return cpu_.CopyDeviceToDevice(ops, after);
  }
  ReaderId BeginReaders(std::span<const DeviceRange> ranges) override { return cpu_.BeginReaders(ranges); }
  void EndReaders(ReaderId reader) override { cpu_.EndReaders(reader); }
  bool ReadersBusy(const DeviceRange& range) const override { return cpu_.ReadersBusy(range); }
  CopyEvent ReadersFence(const DeviceRange& range) override { return cpu_.ReadersFence(range); }
  uint8_t* HostVisible(PoolId pool, Location offset) override { return cpu_.HostVisible(pool, offset); }

 private:
  bool InHotRows(const DeviceRange& dst) const {
    const KvConfig& c = layout_->config();
    for (SourceId s = 0; s < layout_->num_sources(); ++s) {
      if (dst.offset >= layout_->HotRow(slot_, s, 0) && dst.offset < layout_->HotRow(slot_, s, c.hot_rows)) return true;
    }
    return false;
  }

  CpuDevice cpu_;
  const KvLayout* layout_ = nullptr;
  SlotIndex slot_ = 0;
  bool armed_ = false;
  int corrupted_ = 0;
  uint64_t corrupted_offset_ = 0;
  std::deque<std::vector<uint8_t>> kept_;  // sources of corrupted copies: alive until the device is destroyed
};

struct Spec {
  RequestId id;
  std::vector<uint8_t> prompt;
  uint32_t max_new;
  int submit_at;
};

// Greedy requests of several lengths (above k, so rows leave the tail and come back from host), continuous batching.
std::vector<Spec> Requests() {
  return {{1, Prompt(37, 3), 14, 0}, {2, Prompt(64, 4), 16, 0}, {3, Prompt(83, 5), 14, 3}, {4, Prompt(48, 2), 18, 6}};
}

enum class Flip { kNone, kLogitBit, kKvByte };

struct FlipRun {
  replay::DriverResult result;
  uint64_t host_rows = 0;    // census: selected rows recovered from host
  int flipped = 0;           // flips made (0 or 1)
  int64_t flipped_token = -1;  // kLogitBit: the index of the token whose logits were changed
};

// The run as dhs-replay's driver would record it: one RequestTiming per request, in trace order.
replay::DriverResult ToDriverResult(const RecordingSink& sink, const std::vector<Spec>& specs) {
  replay::DriverResult r;
  for (size_t i = 0; i < specs.size(); ++i) {
    replay::RequestTiming t;
    t.trace_index = static_cast<int64_t>(i);
    t.request = specs[i].id;
    auto out = sink.out.find(specs[i].id);
    if (out != sink.out.end()) {
      t.output.assign(out->second.tokens.begin(), out->second.tokens.end());
      t.logits_digests = out->second.digests;
      t.tokens = static_cast<int64_t>(t.output.size());
    }
    auto err = sink.errors.find(specs[i].id);
    if (err != sink.errors.end()) t.error = err->second;
    t.finished = sink.finished.contains(specs[i].id) && t.error.empty();
    r.requests.push_back(std::move(t));
  }
  return r;
}

constexpr RequestId kTarget = 2;  // the request whose run gets the flip
// A flip is armed once the target has streamed this many tokens (it is decoding). The KV corruption then waits for
// the target's next host recovery, which may come a few tokens later.
constexpr size_t kArmLogitAfterTokens = 5;
constexpr size_t kArmKvAfterTokens = 1;

void Serve(model::Model& m, WorkerMode mode, Flip flip, uint64_t seed, FlipRun& run) {
  WorkerConfig c;
  c.mode = mode;
  c.page_rows = 16;
  c.tail_rows = 32;
  c.slots = 4;
  c.hot_rows = static_cast<uint32_t>(m.config().top_k + m.config().local_window);  // B = k: many host recoveries
  auto g = ComputeGeometry(m.config(), c);
  ASSERT_TRUE(g.ok()) << g.status();
  constexpr uint32_t kBudgetPages = 10;
  c.hbm_budget_bytes = mode == WorkerMode::kResident ? uint64_t{64} << 20 : kBudgetPages * g->page_bytes;
  CorruptingDevice device;
  RecordingSink sink;
  FakeMemd memd(mode == WorkerMode::kResident ? 4096 : kBudgetPages, g->host_page_bytes, c.page_rows, 512, seed,
                /*chaos=*/mode != WorkerMode::kResident, c.slots);
  auto w = Worker::Create(&m, &device, c, &memd, &sink);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::vector<Spec> specs = Requests();
  bool armed = false;
  for (int it = 0; it < 20000 && sink.finished.size() < specs.size(); ++it) {
    for (const Spec& s : specs) {
      if (s.submit_at != it) continue;
      wire::SubmitRequestT sub;
      sub.request = s.id;
      sub.prompt = s.prompt;
      sub.max_new_tokens = s.max_new;
      ASSERT_TRUE((*w)->Submit(sub, ClientRef{"c", s.id}).ok());
    }
    memd.Pump(**w);
    const size_t streamed = sink.out.contains(kTarget) ? sink.out[kTarget].tokens.size() : 0;
    const size_t arm_after = flip == Flip::kKvByte ? kArmKvAfterTokens : kArmLogitAfterTokens;
    if (!armed && flip != Flip::kNone && streamed >= arm_after) {
      armed = true;
      if (flip == Flip::kLogitBit) {
        // The target's next Step is a decode step (one token, emitted): flip the lowest mantissa bit of its smallest
        // logit, so the sampled (argmax) token stays the same and only the logits' bits differ.
        m.SetLogitsHookForTest([&run, streamed](std::span<const model::StepInput> batch,
                                                std::span<model::StepOutput> out) {
          for (size_t b = 0; b < batch.size(); ++b) {
            if (run.flipped > 0 || batch[b].session->request() != kTarget) continue;
            std::span<float> last = std::span<float>(out[b].logits).last(model::kVocab);
            float* lowest = &*std::min_element(last.begin(), last.end());
            if (lowest == &*std::max_element(last.begin(), last.end())) continue;
            uint32_t bits;
            std::memcpy(&bits, lowest, 4);
            bits ^= 1u;
            std::memcpy(lowest, &bits, 4);
            run.flipped = 1;
            run.flipped_token = static_cast<int64_t>(streamed);
          }
        });
      } else {
        const RequestKv* kv = (*w)->hierarchical()->Find(kTarget);
        ASSERT_NE(kv, nullptr);
        device.Arm(&(*w)->hierarchical()->layout(), kv->slot);
      }
    }
    auto more = (*w)->Iterate();
    ASSERT_TRUE(more.ok()) << more.status();
  }
  m.SetLogitsHookForTest(nullptr);
  ASSERT_EQ(sink.finished.size(), specs.size()) << "not every request finished";
  if (flip == Flip::kKvByte) run.flipped = device.corrupted();
  run.host_rows = (*w)->stats().census.host;
  run.result = ToDriverResult(sink, specs);
}

class ReplayFlip : public ::testing::TestWithParam<std::string> {};

TEST_P(ReplayFlip, CompareOutputsReportsOneFlippedLogitBitAndOneCorruptedKvByte) {
  auto m = MakePresetModel(GetParam());
  constexpr uint64_t kSeed = 1;
  std::printf("preset %s, fake memd order seed %llu\n", GetParam().c_str(), static_cast<unsigned long long>(kSeed));
  FlipRun resident, adaptive, logit, kv;
  Serve(*m, WorkerMode::kResident, Flip::kNone, kSeed, resident);
  Serve(*m, WorkerMode::kAdaptive, Flip::kNone, kSeed, adaptive);
  Serve(*m, WorkerMode::kAdaptive, Flip::kLogitBit, kSeed, logit);
  Serve(*m, WorkerMode::kAdaptive, Flip::kKvByte, kSeed, kv);
  if (HasFatalFailure()) return;

  // Unflipped: the replay's verdict is a match, and it had something to compare.
  const replay::ExactnessVerdict same = replay::CompareOutputs(adaptive.result, resident.result);
  EXPECT_TRUE(same.match) << same.reason;
  EXPECT_GT(adaptive.host_rows, 0u) << "the adaptive run never recovered a row from host";
  for (const replay::RequestTiming& t : adaptive.result.requests) {
    EXPECT_EQ(t.logits_digests.size(), t.output.size());
    EXPECT_GT(t.output.size(), kArmLogitAfterTokens);
  }

  // One logit bit: same tokens, one digest differs, at the flipped token of the target request.
  ASSERT_EQ(logit.flipped, 1) << "the logit hook never saw the target request's decode step";
  for (size_t i = 0; i < logit.result.requests.size(); ++i) {
    EXPECT_EQ(logit.result.requests[i].output, resident.result.requests[i].output) << "request index " << i;
  }
  const replay::ExactnessVerdict bit = replay::CompareOutputs(logit.result, resident.result);
  EXPECT_FALSE(bit.match);
  EXPECT_THAT(bit.reason, StartsWith("request 2 (trace row 1): token " + std::to_string(logit.flipped_token) +
                                     " has logits digest "))
      << bit.reason;
  std::printf("logit bit flipped at token %lld of request %llu: %s\n", static_cast<long long>(logit.flipped_token),
              static_cast<unsigned long long>(kTarget), bit.reason.c_str());
  // Only that one digest differs.
  int differing = 0;
  for (size_t i = 0; i < logit.result.requests.size(); ++i) {
    const auto& a = logit.result.requests[i].logits_digests;
    const auto& b = resident.result.requests[i].logits_digests;
    ASSERT_EQ(a.size(), b.size());
    for (size_t t = 0; t < a.size(); ++t) differing += a[t] != b[t];
  }
  EXPECT_EQ(differing, 1);
  // The report of such a run says so.
  const replay::ReplayReport report = replay::BuildReport(logit.result, replay::RunSettings{}, bit.match);
  EXPECT_EQ(report.exact_match, std::optional<bool>(false));
  EXPECT_THAT(replay::FormatSummary(report), HasSubstr("exact match NO"));

  // One byte of one row recovered from host into the target's hot cache: the target's outputs differ from there on.
  ASSERT_EQ(kv.flipped, 1) << "no host recovery of the target request after it started decoding";
  const replay::ExactnessVerdict byte = replay::CompareOutputs(kv.result, resident.result);
  EXPECT_FALSE(byte.match);
  EXPECT_THAT(byte.reason, StartsWith("request 2 (trace row 1): token ")) << byte.reason;
  EXPECT_THAT(byte.reason, HasSubstr(" has logits digest ")) << byte.reason;  // the first difference: a digest
  std::printf("KV byte corrupted: %s\n", byte.reason.c_str());
  // Hot caches are per request slot: the other requests still match the reference.
  for (size_t i = 0; i < kv.result.requests.size(); ++i) {
    if (kv.result.requests[i].request == kTarget) continue;
    EXPECT_EQ(kv.result.requests[i].output, resident.result.requests[i].output);
    EXPECT_EQ(kv.result.requests[i].logits_digests, resident.result.requests[i].logits_digests);
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, ReplayFlip, ::testing::Values("dsv4flash-like", "glm5-like"));

}  // namespace
}  // namespace dhs::test
