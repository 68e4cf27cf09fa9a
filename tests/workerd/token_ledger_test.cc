// TokenLedger (workerd/token_ledger.h): hand-written cases (one message in flight, an ack moves the committed counts,
// a refused message of several entries probes each request alone, a request refused alone keeps the reason and is
// not sent again, memd away drops the message in flight), then random events against a model memd (it applies a
// message's valid entries and refuses the message when one entry is of a request it refuses, as memd's
// Daemon::OnTokensCommitted does), the ledger's and the book's invariants checked after every event.
#include "workerd/token_ledger.h"

#include <map>
#include <random>
#include <set>

#include "gtest/gtest.h"

namespace dhs {
namespace {

using Entry = TokenLedger::Entry;

// A book with `n` active requests (ids from the counter: GPU 0, epoch 1).
std::vector<RequestId> ActiveRequests(RequestBook& book, int n) {
  std::vector<RequestId> ids;
  for (int i = 0; i < n; ++i) {
    RequestLife* life = book.OpenDetached(wire::SubmitRequestT{}, false);
    EXPECT_TRUE(book.Transition(life->id, RequestPhase::kWaiting, RequestPhase::kGranted).ok());
    EXPECT_TRUE(book.Transition(life->id, RequestPhase::kGranted, RequestPhase::kActive).ok());
    ids.push_back(life->id);
  }
  return ids;
}

TEST(TokenLedger, OneMessageInFlightAndAcksMoveTheCommittedCounts) {
  RequestBook book(0, ResumedOutputLimits{});
  const std::vector<RequestId> id = ActiveRequests(book, 2);
  std::map<RequestId, size_t> total{{id[0], 3}, {id[1], 0}};
  TokenLedger ledger;
  const auto of = [&](RequestId r) { return total[r]; };
  std::vector<Entry> next = ledger.Next(book, of);
  ASSERT_EQ(next, (std::vector<Entry>{{id[0], 0, 3}}));  // request 1 has nothing
  ledger.Sent(next);
  total[id[1]] = 2;
  EXPECT_TRUE(ledger.Next(book, of).empty()) << "one in flight";
  EXPECT_EQ(ledger.Acked(book), 3u);
  EXPECT_EQ(book.Find(id[0])->tokens.committed, 3u);
  total[id[0]] = 5;
  EXPECT_EQ(ledger.Next(book, of), (std::vector<Entry>{{id[0], 3, 5}, {id[1], 0, 2}}));
  // A request that is not active (ending while memd is away) is not sent.
  ASSERT_TRUE(book.DeferEnd(id[0], absl::OkStatus()).ok());
  EXPECT_EQ(ledger.Next(book, of), (std::vector<Entry>{{id[1], 0, 2}}));
  EXPECT_EQ(ledger.Acked(book), 0u) << "nothing in flight";
}

TEST(TokenLedger, ARefusedMessageProbesEachRequestAloneAndARefusalStaysWithItsRequest) {
  RequestBook book(0, ResumedOutputLimits{});
  const std::vector<RequestId> id = ActiveRequests(book, 3);
  std::map<RequestId, size_t> total{{id[0], 2}, {id[1], 2}, {id[2], 2}};
  const auto of = [&](RequestId r) { return total[r]; };
  TokenLedger ledger;
  ledger.Sent(ledger.Next(book, of));
  EXPECT_EQ(ledger.Refused(book, absl::InvalidArgumentError("bad")), std::nullopt) << "several: whose is unknown";
  EXPECT_EQ(ledger.probe().size(), 3u);
  for (RequestId r : id) EXPECT_TRUE(book.Find(r)->tokens.refused.ok());
  // One per message, in the probe's order.
  EXPECT_EQ(ledger.Next(book, of), (std::vector<Entry>{{id[0], 0, 2}}));
  ledger.Sent(ledger.Next(book, of));
  EXPECT_EQ(ledger.Acked(book), 2u);
  ledger.Sent(ledger.Next(book, of));
  EXPECT_EQ(ledger.Refused(book, absl::ResourceExhaustedError("record bound")), id[1]);
  EXPECT_EQ(book.Find(id[1])->tokens.refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(book.Find(id[1])->tokens.committed, 0u);
  EXPECT_EQ(ledger.Next(book, of), (std::vector<Entry>{{id[2], 0, 2}}));
  ledger.Sent(ledger.Next(book, of));
  ledger.Acked(book);
  EXPECT_TRUE(ledger.probe().empty());
  total[id[1]] = 4;
  total[id[2]] = 3;
  EXPECT_EQ(ledger.Next(book, of), (std::vector<Entry>{{id[2], 2, 3}})) << "request 1 was refused: never again";
  ledger.Sent(ledger.Next(book, of));
  ledger.Lost();  // memd went away: never answered
  EXPECT_FALSE(ledger.in_flight());
  EXPECT_EQ(ledger.Next(book, of), (std::vector<Entry>{{id[2], 2, 3}}));
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

TEST(TokenLedger, RandomEventsAgainstAModelMemdLoseNothingAndNeverClaimMore) {
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    RequestBook book(0, ResumedOutputLimits{});
    TokenLedger ledger;
    std::map<RequestId, size_t> total;      // tokens each request generated
    std::map<RequestId, size_t> memd_has;   // the model memd's record length
    std::set<RequestId> memd_refuses;       // requests whose entries memd refuses
    std::vector<Entry> wire;                // the message memd has not answered
    bool answer_ok = true;
    const auto of = [&](RequestId r) { return total[r]; };
    for (int step = 0; step < 800; ++step) {
      const int what = static_cast<int>(rng() % 8);
      if (what == 0 && book.requests().size() < 6) {
        for (RequestId r : ActiveRequests(book, 1)) total[r] = 0;
      } else if (what == 1 && !total.empty()) {  // a request generates tokens
        auto it = total.begin();
        std::advance(it, rng() % total.size());
        it->second += 1 + rng() % 3;
      } else if (what == 2) {  // the worker sends what the ledger says
        std::vector<Entry> next = ledger.Next(book, of);
        if (ledger.in_flight()) ASSERT_TRUE(next.empty());
        if (!next.empty()) {
          answer_ok = true;
          for (const Entry& e : next) {  // memd: every valid entry applied; one refused refuses the message
            ASSERT_LE(e.from, memd_has[e.request]) << "a gap";
            ASSERT_EQ(e.to, total[e.request]);
            if (memd_refuses.contains(e.request)) {
              answer_ok = false;
              continue;
            }
            memd_has[e.request] = std::max(memd_has[e.request], e.to);
          }
          wire = next;
          ledger.Sent(std::move(next));
        }
      } else if (what == 3 && ledger.in_flight()) {  // memd answers
        if (answer_ok) {
          ledger.Acked(book);
        } else {
          std::optional<RequestId> alone = ledger.Refused(book, absl::InvalidArgumentError("refused"));
          if (alone) ASSERT_TRUE(memd_refuses.contains(*alone)) << "only a request memd refuses is marked refused";
        }
        wire.clear();
      } else if (what == 4 && !total.empty() && rng() % 4 == 0) {  // memd starts refusing one request
        auto it = total.begin();
        std::advance(it, rng() % total.size());
        memd_refuses.insert(it->first);
      } else if (what == 5 && rng() % 10 == 0) {  // memd went away (the report would carry every token: not modelled)
        ledger.Lost();
        wire.clear();
      } else if (what == 6 && !total.empty() && rng() % 3 == 0) {  // a request ends
        auto it = total.begin();
        std::advance(it, rng() % total.size());
        book.Close(it->first, false);
        total.erase(it);
      }
      ASSERT_TRUE(ledger.CheckInvariants().ok()) << ledger.CheckInvariants();
      ASSERT_TRUE(book.CheckInvariants().ok()) << book.CheckInvariants();
      for (const auto& [id, life] : book.requests()) {
        ASSERT_LE(life.tokens.committed, memd_has[id]) << "the ledger claims tokens memd does not have";
        if (!life.tokens.refused.ok()) ASSERT_TRUE(memd_refuses.contains(id));
      }
    }
    // Drain: memd answers until nothing is behind. Every request memd takes has every token; none is lost.
    memd_refuses.clear();  // (refused ones stay refused in the ledger)
    for (int round = 0; round < 200; ++round) {
      if (ledger.in_flight()) {
        if (answer_ok) {
          ledger.Acked(book);
        } else {
          ledger.Refused(book, absl::InvalidArgumentError("refused"));
        }
        continue;
      }
      std::vector<Entry> next = ledger.Next(book, of);
      if (next.empty()) break;
      answer_ok = true;
      for (const Entry& e : next) memd_has[e.request] = std::max(memd_has[e.request], e.to);
      ledger.Sent(std::move(next));
    }
    for (const auto& [id, life] : book.requests()) {
      if (life.tokens.refused.ok()) {
        EXPECT_EQ(life.tokens.committed, total[id]) << "request " << id << " lost tokens";
        EXPECT_EQ(memd_has[id], total[id]);
      }
    }
  }
}

}  // namespace
}  // namespace dhs
