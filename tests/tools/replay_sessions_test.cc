// Sessions derived from chained hash ids (tools/replay/sessions.h, issue 26) on hand-made traces whose sessions are
// known, and on the bundled Mooncake slice (each derived parent really is a proper prefix, the longest one).
#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tools/replay/sessions.h"
#include "tools/replay/trace.h"

namespace dhs::replay {
namespace {

// Every row's last hash block is partial (input = 512 * (|chain| - 1) + 100 tokens), as in Mooncake: its complete
// chain is all but the last id.
Trace Make(const std::vector<std::vector<int64_t>>& chains) {
  Trace t;
  t.block_tokens = 512;
  for (size_t i = 0; i < chains.size(); ++i) {
    TraceRequest r;
    r.index = static_cast<int64_t>(i);
    r.input_tokens = 512 * std::max<int64_t>(0, static_cast<int64_t>(chains[i].size()) - 1) + 100;
    r.output_tokens = 1;
    r.hash_ids = chains[i];
    t.requests.push_back(r);
  }
  return t;
}

std::vector<int64_t> Sessions(const std::vector<SessionTurn>& s) {
  std::vector<int64_t> out;
  for (const auto& t : s) out.push_back(t.session);
  return out;
}
std::vector<int64_t> Turns(const std::vector<SessionTurn>& s) {
  std::vector<int64_t> out;
  for (const auto& t : s) out.push_back(t.turn);
  return out;
}
std::vector<int64_t> Parents(const std::vector<SessionTurn>& s) {
  std::vector<int64_t> out;
  for (const auto& t : s) out.push_back(t.parent);
  return out;
}

// Block 0 is a system prompt every conversation starts with (shared: followed by 1 and by 5). Conversation A:
// rows 0, 2, then two next turns of row 2 (rows 4 and 6). Conversation B: row 1 has only the system block complete, so
// row 3 cannot extend it (a new session); row 5 extends row 3; rows 7 and 8 both continue row 5's complete chain with
// different ids (9, 11), which makes that chain shared, so both fall back to the longest unshared prefix, row 3's.
// Row 9 has no ids, row 10 no complete block.
TEST(ReplaySessionsTest, HandMadeTraceHasTheKnownSessions) {
  const Trace t = Make({{0, 1, 2},           // 0: A turn 0            complete [0,1]
                        {0, 5},              // 1: new                 complete [0]
                        {0, 1, 3, 4},        // 2: A turn 1 (parent 0) complete [0,1,3]
                        {0, 5, 6},           // 3: new ([0] shared)    complete [0,5]
                        {0, 1, 3, 7, 8},     // 4: A turn 2 (parent 2) complete [0,1,3,7]
                        {0, 5, 6, 9},        // 5: B turn 1 (parent 3) complete [0,5,6]
                        {0, 1, 3, 4},        // 6: A turn 2 (parent 2) complete [0,1,3]
                        {0, 5, 6, 9, 10},    // 7: parent 3 ([0,5,6] shared)
                        {0, 5, 6, 11, 12},   // 8: parent 3
                        {},                  // 9: new
                        {42}});              // 10: new
  const auto s = DeriveSessions(t);
  EXPECT_EQ(Sessions(s), (std::vector<int64_t>{0, 1, 0, 3, 0, 3, 0, 3, 3, 9, 10}));
  EXPECT_EQ(Turns(s), (std::vector<int64_t>{0, 0, 1, 0, 2, 1, 2, 1, 1, 0, 0}));
  EXPECT_EQ(Parents(s), (std::vector<int64_t>{-1, -1, 0, -1, 2, 3, 2, 3, 3, -1, -1}));
  EXPECT_EQ(CountSessions(s), 5);
}

// A chain whose blocks are all complete is extended as a whole; an equal chain is not a proper prefix (new session).
TEST(ReplaySessionsTest, CompleteLastBlockAndEqualChains) {
  Trace t = Make({{1, 2}, {1, 2, 3}, {1, 2}});
  t.requests[0].input_tokens = 1024;  // both blocks complete: (1, 2) is row 1's proper prefix
  t.requests[2].input_tokens = 1024;  // equal to row 0's chain: not a proper prefix of itself
  const auto s = DeriveSessions(t);
  EXPECT_EQ(Parents(s), (std::vector<int64_t>{-1, 0, -1}));
  EXPECT_EQ(Sessions(s), (std::vector<int64_t>{0, 0, 2}));
}

// Session and parent ids are TraceRequest::index values (a trace cut by TakeFirst keeps its indices).
TEST(ReplaySessionsTest, IdsAreTraceIndices) {
  Trace t = Make({{3, 5}, {3, 4}});
  t.requests[0].input_tokens = 512;  // complete chain (3)
  t.requests[0].index = 10;
  t.requests[1].index = 11;
  const auto s = DeriveSessions(t);
  EXPECT_EQ(s[1].session, 10);
  EXPECT_EQ(s[1].parent, 10);
}

TEST(ReplaySessionsTest, NoHashIdsIsOneSessionPerRequest) {
  const auto s = DeriveSessions(Make({{}, {}, {}}));
  EXPECT_EQ(Sessions(s), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(CountSessions(s), 3);
}

// The bundled Mooncake slice: the next turns are known (rows 133, 134, 137, 166, 177, 180, 191 extend rows 66, 10, 1,
// 64, 44, 41, 30; found with a brute-force search over the longest common prefixes), checked against an O(n^2)
// brute force of the definition as well.
TEST(ReplaySessionsTest, BundledMooncakeSliceHasItsKnownNextTurns) {
  auto trace = ReadTrace(std::string(DHS_REPLAY_DATA_DIR) + "/mooncake_conversation_head200.jsonl");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const auto s = DeriveSessions(*trace);
  std::vector<std::pair<int64_t, int64_t>> links;
  for (const SessionTurn& t : s) {
    if (t.parent >= 0) links.emplace_back(&t - s.data(), t.parent);
  }
  EXPECT_EQ(links, (std::vector<std::pair<int64_t, int64_t>>{
                       {133, 66}, {134, 10}, {137, 1}, {166, 64}, {177, 44}, {180, 41}, {191, 30}}));
  EXPECT_EQ(CountSessions(s), 193);
  // Brute force: complete chains, shared prefixes, then the longest (latest) unshared proper prefix.
  const auto& r = trace->requests;
  std::vector<std::vector<int64_t>> c;
  for (const auto& q : r) {
    c.emplace_back(q.hash_ids.begin(),
                   q.hash_ids.begin() + std::min<size_t>(q.hash_ids.size(), q.input_tokens / trace->block_tokens));
  }
  auto shared = [&](const std::vector<int64_t>& p) {
    std::set<int64_t> next;
    for (const auto& k : c) {
      if (k.size() > p.size() && std::equal(p.begin(), p.end(), k.begin())) next.insert(k[p.size()]);
    }
    return next.size() >= 2;
  };
  for (size_t i = 0; i < r.size(); ++i) {
    int64_t best = -1;
    size_t best_len = 0;
    for (size_t j = 0; j < i; ++j) {
      const auto& hi = r[i].hash_ids;
      if (c[j].empty() || c[j].size() >= hi.size() || !std::equal(c[j].begin(), c[j].end(), hi.begin())) continue;
      if (c[j].size() >= best_len && !shared(c[j])) {
        best_len = c[j].size();
        best = static_cast<int64_t>(j);
      }
    }
    EXPECT_EQ(s[i].parent, best) << "row " << i;
  }
}

}  // namespace
}  // namespace dhs::replay
