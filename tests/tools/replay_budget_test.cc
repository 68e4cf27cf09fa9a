// The budgets of the node dhs-replay starts (tools/replay/budget.h): the --check-exact reference fits every session's
// whole context, and the default budget fits the largest request in resident mode. The expected page counts are
// computed here from the model's dimensions and the worker's documented defaults (workerd/README.md, "Geometry"),
// not with RequiredPages, so a second formula in the tool (issue 10) fails these tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "tools/replay/budget.h"
#include "workerd/model/config.h"

namespace dhs::replay {
namespace {

struct Expected {
  uint64_t page_bytes = 0;
  uint64_t resident_pages = 0;  // index keys + the whole context, pages (resident keeps no hot cache or tail)
};

// p = 64, page_bytes = p * sum of d_KV; a resident request declares
// required = ceil(context * L_idx * d_idx / page_bytes) + ceil(context / p): its index keys and whole context, no
// hot cache or tail (resident serving allocates none, brief §8; common/worker_shape.h, issue 27's planner fix).
Expected ExpectedResident(const model::ModelConfig& m, uint64_t context) {
  const uint64_t p = 64;
  Expected e;
  e.page_bytes = p * m.row_bytes() * static_cast<uint64_t>(m.n_sources());
  const uint64_t meta_bytes = context * static_cast<uint64_t>(m.n_indexers()) * m.index_key_bytes();
  e.resident_pages = (meta_bytes + e.page_bytes - 1) / e.page_bytes + (context + p - 1) / p;
  return e;
}

TraceRequest Request(int64_t index, int64_t input, int64_t output) {
  TraceRequest r;
  r.index = index;
  r.input_tokens = input;
  r.output_tokens = output;
  return r;
}

// Row 12 of the bundled Mooncake slice (87169 input + 402 output tokens) at the default length scale, as
// `dhs-replay --trace ONE_ROW --requests 1 --check-exact` replays it. Before the fix the reference budget gave the
// resident run 241 lendable pages where the request needs 243, so `--check-exact` failed on it.
TEST(ReplayBudget, ReferenceFitsALongRequestWhollyResident) {
  auto m = model::PresetConfig("dsv4flash-like");
  ASSERT_TRUE(m.ok()) << m.status();
  ReplayOptions options;
  Trace unscaled;
  unscaled.requests.push_back(Request(11, 87169, 402));
  auto trace = ScaleLengths(unscaled, options.length_scale);
  ASSERT_TRUE(trace.ok()) << trace.status();
  const TraceRequest& r = trace->requests[0];
  const Expected e = ExpectedResident(*m, static_cast<uint64_t>(r.input_tokens + r.output_tokens));
  auto g = ReplayGeometry(options, ReferenceHbmBudget(*trace, options));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->page_bytes, e.page_bytes);
  EXPECT_GE(g->capacity_pages, e.resident_pages);
}

// With more requests than slots, the reference holds the `slots` largest sessions at once.
TEST(ReplayBudget, ReferenceHoldsTheLargestSessionOfEverySlot) {
  auto m = model::PresetConfig("dsv4flash-like");
  ASSERT_TRUE(m.ok()) << m.status();
  ReplayOptions options;
  options.slots = 2;
  Trace trace;
  trace.requests = {Request(0, 1000, 10), Request(1, 87169, 402), Request(2, 30000, 100), Request(3, 500, 5)};
  const uint64_t want =
      ExpectedResident(*m, 87169 + 402).resident_pages + ExpectedResident(*m, 30000 + 100).resident_pages;
  auto g = ReplayGeometry(options, ReferenceHbmBudget(trace, options));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_GE(g->capacity_pages, want);
}

// The default budget never falls below what the largest request needs in resident mode (docs/replay.md).
TEST(ReplayBudget, DefaultFitsTheLargestRequestResident) {
  auto m = model::PresetConfig("dsv4flash-like");
  ASSERT_TRUE(m.ok()) << m.status();
  ReplayOptions options;
  options.slots = 1;
  Trace trace;
  trace.requests = {Request(0, 87169, 402)};
  auto g = ReplayGeometry(options, DefaultHbmBudget(trace, options));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_GE(g->capacity_pages, ExpectedResident(*m, 87169 + 402).resident_pages);
}

}  // namespace
}  // namespace dhs::replay
