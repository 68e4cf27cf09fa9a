// tests/workerd/geometry_test.cc: the geometry rules (issue 22, workerd/geometry.h ValidateGeometry): a table of
// combinations of B, k, T, p, prefill chunk, block width and slots, each accepted or refused at start with its formula
// and numbers; the default prefill chunk fits the tail; and the tail rule checked against the KV store itself: a step
// of C rows starting r rows into a page is served exactly when C <= T - r, so C <= T - p + 1 is what every start
// position allows.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/workerd/kv_test_util.h"
#include "workerd/geometry.h"
#include "workerd/model/config.h"

namespace dhs::test {
namespace {

model::ModelConfig Preset(const std::string& name, int top_k = 0) {
  absl::StatusOr<model::ModelConfig> c = model::PresetConfig(name);
  EXPECT_TRUE(c.ok()) << c.status();
  if (top_k > 0) c->top_k = top_k;
  return *c;
}

struct Row {
  std::string what;
  std::string preset;
  int top_k = 0;  // 0: the preset's
  WorkerMode mode = WorkerMode::kAdaptive;
  uint32_t hot_rows = 0, tail_rows = 0, page_rows = 64, prefill_chunk = 0, slots = 8;
  spec::SpeculateMode speculate = spec::SpeculateMode::kOff;
  int64_t block = 4;
  uint32_t staging_arenas = 4;
  // Accepted: the prefill chunk and widest round expected (computed by hand from the formulas of the brief / issue).
  // Refused: every substring must be in the message (the rule's formula with its numbers).
  bool ok = true;
  uint32_t want_chunk = 0, want_max_block = 0;
  std::vector<std::string> message = {};
};

std::vector<Row> Table() {
  using M = WorkerMode;
  using S = spec::SpeculateMode;
  std::vector<Row> t;
  // dsv4flash-like: k = 16, w = 4 (span 20), 3 sources. Defaults: B = max(64, 80) = 80, T = 2p = 128: C = min(80 / 20,
  // 65) = 4.
  t.push_back({.what = "defaults", .preset = "dsv4flash-like", .want_chunk = 4, .want_max_block = 4});
  // The case: --hot-rows 2000 gave C = 2000 / 20 = 100 > 65 rows of tail room; now the default is 65.
  t.push_back({.what = "issue 22: B = 2000, default chunk", .preset = "dsv4flash-like", .hot_rows = 2000,
               .want_chunk = 65, .want_max_block = 65});
  t.push_back({.what = "issue 22: B = 4096, hisparse", .preset = "dsv4flash-like", .mode = M::kHisparse,
               .hot_rows = 4096, .want_chunk = 65, .want_max_block = 65});
  t.push_back({.what = "issue 22: the old default given explicitly", .preset = "dsv4flash-like", .hot_rows = 2000,
               .prefill_chunk = 100, .ok = false, .message = {"prefill chunk C = 100 > T - p + 1 = 128 - 64 + 1 = 65",
                                                               "--prefill-chunk", "--tail-rows"}});
  t.push_back({.what = "chunk at the tail's bound", .preset = "dsv4flash-like", .hot_rows = 2000,
               .prefill_chunk = 65, .want_chunk = 65, .want_max_block = 65});
  t.push_back({.what = "a larger tail admits a larger chunk", .preset = "dsv4flash-like", .hot_rows = 4096,
               .tail_rows = 256, .prefill_chunk = 193, .want_chunk = 193, .want_max_block = 193});
  t.push_back({.what = "... but not one row more", .preset = "dsv4flash-like", .hot_rows = 4096, .tail_rows = 256,
               .prefill_chunk = 194, .ok = false, .message = {"C = 194 > T - p + 1 = 256 - 64 + 1 = 193"}});
  // Resident mode keeps every row on GPU: no tail reuse, no hot cache; an explicit chunk is not bounded by them.
  t.push_back({.what = "resident: explicit chunk beyond the tail", .preset = "dsv4flash-like", .mode = M::kResident,
               .hot_rows = 2000, .prefill_chunk = 100, .want_chunk = 100, .want_max_block = 65});
  t.push_back({.what = "resident: default chunk as the other modes", .preset = "dsv4flash-like",
               .mode = M::kResident, .hot_rows = 2000, .want_chunk = 65, .want_max_block = 65});
  // The hot cache rule: C (k + w) <= B.
  t.push_back({.what = "chunk beyond the hot cache", .preset = "dsv4flash-like", .hot_rows = 200, .prefill_chunk = 11,
               .ok = false, .message = {"prefill chunk C = 11 x (k + window) = 11 x 20 = 220 > hot rows B = 200"}});
  t.push_back({.what = "chunk filling the hot cache", .preset = "dsv4flash-like", .hot_rows = 200, .prefill_chunk = 10,
               .want_chunk = 10, .want_max_block = 10});
  t.push_back({.what = "B below one selection", .preset = "dsv4flash-like", .mode = M::kHisparse, .hot_rows = 19,
               .ok = false, .message = {"hot rows B = 19 < k + window = 16 + 4 = 20"}});
  // The seed's shape (brief §8 glm5-like: B = 4096, k = 2048, tail one page of 64): C = min(4096 / 2048, 64 - 64 + 1)
  // = 1; a round of speculation is one query wide too.
  t.push_back({.what = "seed glm5-like: B 4096, k 2048, T 64", .preset = "glm5-like", .top_k = 2048,
               .hot_rows = 4096, .tail_rows = 64, .want_chunk = 1, .want_max_block = 1});
  t.push_back({.what = "seed glm5-like: chunk 2 overflows a one-page tail", .preset = "glm5-like", .top_k = 2048,
               .hot_rows = 4096, .tail_rows = 64, .prefill_chunk = 2, .ok = false,
               .message = {"prefill chunk C = 2 > T - p + 1 = 64 - 64 + 1 = 1"}});
  t.push_back({.what = "seed glm5-like, T = 2p: chunk 2 = B / k", .preset = "glm5-like", .top_k = 2048,
               .hot_rows = 4096, .tail_rows = 128, .want_chunk = 2, .want_max_block = 2});
  t.push_back({.what = "seed glm5-like, T = 2p: chunk 3 exceeds B", .preset = "glm5-like", .top_k = 2048,
               .hot_rows = 4096, .tail_rows = 128, .prefill_chunk = 3, .ok = false,
               .message = {"C = 3 x (k + window) = 3 x 2048 = 6144 > hot rows B = 4096"}});
  t.push_back({.what = "dsv4flash-like at k 2048, B 4096, T 64", .preset = "dsv4flash-like", .top_k = 2048,
               .mode = M::kHisparse, .hot_rows = 4096, .tail_rows = 64, .want_chunk = 1, .want_max_block = 1});
  // Page rows and tails.
  t.push_back({.what = "tail not a multiple of p", .preset = "dsv4flash-like", .tail_rows = 96, .ok = false,
               .message = {"tail rows T = 96 is not a positive multiple of page rows p = 64"}});
  t.push_back({.what = "p = 0", .preset = "dsv4flash-like", .page_rows = 0, .ok = false,
               .message = {"page rows p must be > 0"}});
  t.push_back({.what = "small pages: T = 2p = 32", .preset = "dsv4flash-like", .hot_rows = 4096, .page_rows = 16,
               .want_chunk = 17, .want_max_block = 17});
  t.push_back({.what = "no slots", .preset = "dsv4flash-like", .slots = 0, .ok = false,
               .message = {"request slots N must be > 0"}});
  // Speculation: K_max against the widest round, T - p + 1 with staging arenas, else also B / (k + w).
  t.push_back({.what = "speculation with staging: K_max = T - p + 1", .preset = "dsv4flash-like",
               .speculate = S::kSynthetic, .block = 65, .want_chunk = 4, .want_max_block = 65});
  t.push_back({.what = "speculation with staging: K_max beyond the tail", .preset = "dsv4flash-like",
               .speculate = S::kSynthetic, .block = 66, .ok = false,
               .message = {"--block 66 outside [1, 65]", "K_r <= T - p + 1"}});
  t.push_back({.what = "speculation without staging: K_max beyond B / (k + w)", .preset = "dsv4flash-like",
               .speculate = S::kSynthetic, .block = 5, .staging_arenas = 0, .ok = false,
               .message = {"--block 5 outside [1, 4]", "K_r * (k + w)"}});
  t.push_back({.what = "speculation, seed shape with staging: a one-page tail allows K_max = 1 only",
               .preset = "glm5-like", .top_k = 2048, .hot_rows = 4096, .tail_rows = 64, .speculate = S::kSynthetic,
               .block = 2, .ok = false, .message = {"--block 2 outside [1, 1]"}});
  t.push_back({.what = "speculation, seed shape, tail 2 pages: K_max = 8 as glm5-like's drafter",
               .preset = "glm5-like", .top_k = 2048, .hot_rows = 4096, .tail_rows = 128, .slots = 2,
               .speculate = S::kSynthetic, .block = 8, .want_chunk = 2, .want_max_block = 8});
  return t;
}

TEST(GeometryRules, EveryCombinationIsAcceptedOrRefusedWithItsFormula) {
  for (const Row& row : Table()) {
    SCOPED_TRACE(row.what);
    const model::ModelConfig model = Preset(row.preset, row.top_k);
    WorkerConfig c;
    c.mode = row.mode;
    c.hot_rows = row.hot_rows;
    c.tail_rows = row.tail_rows;
    c.page_rows = row.page_rows;
    c.prefill_chunk = row.prefill_chunk;
    c.slots = row.slots;
    c.hbm_budget_bytes = uint64_t{1} << 30;
    c.speculation.mode = row.speculate;
    c.speculation.block = row.block;
    c.staging_arenas = row.staging_arenas;
    absl::StatusOr<WorkerGeometry> g = ComputeGeometry(model, c);
    if (!row.ok) {
      ASSERT_FALSE(g.ok()) << "accepted with chunk " << g->prefill_chunk;
      EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
      for (const std::string& part : row.message) {
        EXPECT_NE(g.status().message().find(part), std::string_view::npos)
            << "'" << part << "' not in: " << g.status().message();
      }
      continue;
    }
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->prefill_chunk, row.want_chunk);
    EXPECT_EQ(g->max_block, row.want_max_block);
    // ComputeGeometry's result passes the one check again (what it returns is what was validated).
    EXPECT_TRUE(ValidateGeometry(model, c, *g).ok());
  }
}

// Every default geometry (B, T automatic or given, any p) gets a prefill chunk within both rules, in every mode.
TEST(GeometryRules, TheDefaultChunkFitsTheTailAndTheHotCache) {
  for (const std::string preset : {"dsv4flash-like", "glm5-like", "bench-wide"}) {
    for (int top_k : {0, 512, 2048}) {
      const model::ModelConfig model = Preset(preset, top_k);
      const uint32_t span = static_cast<uint32_t>(model.top_k + model.local_window);
      for (uint32_t p : {1u, 16u, 64u, 128u}) {
        for (uint32_t tail_pages : {0u, 1u, 2u, 4u}) {
          for (uint32_t b : {0u, span, 2000u, 4096u, 16384u}) {
            for (WorkerMode mode : {WorkerMode::kResident, WorkerMode::kHisparse, WorkerMode::kAdaptive}) {
              WorkerConfig c;
              c.mode = mode;
              c.page_rows = p;
              c.tail_rows = tail_pages * p;
              c.hot_rows = b;
              c.hbm_budget_bytes = uint64_t{4} << 30;
              SCOPED_TRACE(absl::StrCat(preset, " k ", model.top_k, " p ", p, " T ", c.tail_rows, " B ", b, " ",
                                        std::string(WorkerModeName(mode))));
              absl::StatusOr<WorkerGeometry> g = ComputeGeometry(model, c);
              if (mode != WorkerMode::kResident && b != 0 && b < span) {
                EXPECT_FALSE(g.ok());  // B below one selection: refused whatever the chunk
                continue;
              }
              ASSERT_TRUE(g.ok()) << g.status();
              const uint32_t t = g->tail_rows;
              EXPECT_EQ(t, tail_pages == 0 ? 2 * p : tail_pages * p);
              EXPECT_GE(g->prefill_chunk, 1u);
              EXPECT_LE(g->prefill_chunk, t - p + 1);
              if (g->hot_rows >= span) {
                EXPECT_LE(uint64_t{g->prefill_chunk} * span, g->hot_rows);
              }
              // The largest such chunk: one more row breaks a rule.
              EXPECT_TRUE(g->prefill_chunk == t - p + 1 || (g->prefill_chunk + 1) * span > g->hot_rows);
            }
          }
        }
      }
    }
  }
}

// The tail rule against the KV store (HierarchicalKvAccess on the CPU device, backups to a host pool): with rows
// appended up to r rows into page a on every source, one step appends C rows source by source (as Model::AppendRows
// does, layer by layer). Row a p + r + C - 1 reuses the tail slot of row a p + r + C - 1 - T, which has a host copy
// only if its page ended before the step, so the step is served exactly when C <= T - r: at every start position
// when C <= T - p + 1, and not at r = p - 1 when C = T - p + 2.
TEST(GeometryRules, TheTailRuleIsExactOnTheKvStore) {
  for (uint32_t tail_pages : {1u, 2u, 3u}) {
    const uint32_t p = 8, t = tail_pages * p;
    KvConfig c;
    c.row_bytes = {16, 24};  // two sources: a page is complete (and backed up) once both hold all its rows
    c.groups = {{0}, {1}};
    c.page_rows = p;
    c.hot_rows = 8;
    c.k = 4;
    c.tail_rows = t;
    c.slots = 1;
    c.optional_pages = 1;
    for (uint32_t r = 0; r < p; ++r) {
      for (uint32_t chunk : {t - r, t - r + 1}) {
        SCOPED_TRACE(absl::StrCat("T ", t, " r ", r, " C ", chunk));
        Harness h(c, 64);
        const RequestId id = 1;
        const Position fed = Position{2} * p + r;  // a few pages in, r rows into the page
        for (Position pos = 0; pos < fed; ++pos) ASSERT_TRUE(h.AppendAll(id, pos).ok());
        absl::Status step;
        for (SourceId s = 0; s < 2 && step.ok(); ++s) {
          for (Position pos = fed; pos < fed + chunk && step.ok(); ++pos) {
            step = h.kv->Append(id, s, pos, OriginalRow(id, s, pos, c.row_bytes[s]));
          }
        }
        if (chunk <= t - r) {
          EXPECT_TRUE(step.ok()) << step;
        } else {
          ASSERT_FALSE(step.ok());
          EXPECT_EQ(step.code(), absl::StatusCode::kResourceExhausted);
          EXPECT_NE(step.message().find("has no host copy yet"), std::string_view::npos) << step;
        }
      }
    }
  }
}

}  // namespace
}  // namespace dhs::test
