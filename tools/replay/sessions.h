// tools/replay/sessions.h: conversation sessions derived from a trace's chained hash ids (issue 26; docs/replay.md
// "Sessions"). Mooncake's hash_ids are chained: equal id at position b means an equal prefix up to block b, and a
// conversation's next turn sends the previous turn's whole context again, so its chain extends the previous one.
//
// Definition (pure, over the whole trace). T = Trace::block_tokens. H_j = request j's hash_ids; its COMPLETE chain
// C_j = H_j[0, min(|H_j|, floor(input_tokens_j / T))) (a partial last block's id changes when the next turn fills
// it, so only complete blocks can be extended). A prefix P is SHARED when the complete chains of the trace continue it
// with two or more different ids (a system prompt every conversation starts with, Mooncake's block 0): sharing it
// does not make two requests one conversation. The parent of request i is the earlier request j < i whose complete
// chain is a proper prefix of H_i (1 <= |C_j| < |H_i|, C_j == H_i[0, |C_j|)) and not shared, with the longest
// |C_j|; among several with that same chain, the latest. Request i then belongs to j's session as turn turn(j) + 1.
// A request without such a parent opens a new session whose id is its own trace index, as turn 0. A trace without
// hash ids (Azure) thus has one session per request. (On the bundled Mooncake slice: 7 next turns in 200 rows, none
// in the first 100; a turn branched twice would make its prefix shared and both branches new sessions.)
//
// Thread-safety: a pure function over values.
#pragma once

#include <cstdint>
#include <vector>

#include "tools/replay/trace.h"

namespace dhs::replay {

struct SessionTurn {
  int64_t session = 0;   // the trace index of the session's first request (turn 0)
  int64_t turn = 0;      // 0 for a new session, parent's turn + 1 otherwise
  int64_t parent = -1;   // trace index (TraceRequest::index) of the previous turn, -1 for a new session
};

// One SessionTurn per request of `trace`, in trace order; session and parent are TraceRequest::index values.
// Cost: O(sum of chain lengths) hash lookups (a 64-bit rolling hash per prefix; a parent is verified id by id).
std::vector<SessionTurn> DeriveSessions(const Trace& trace);

// The number of distinct sessions in `turns`.
int64_t CountSessions(const std::vector<SessionTurn>& turns);

}  // namespace dhs::replay
