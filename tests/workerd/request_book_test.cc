// RequestBook (workerd/request_book.h): the transition table move by move (every move outside it refused, the
// request unchanged), the ids (client id when free, the counter otherwise, never an id ended while waiting), the
// record and submit each way, the detached outputs; then random events against a plain model, the book's invariants
// checked after every event.
#include "workerd/request_book.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <random>
#include <set>

#include "gtest/gtest.h"

namespace dhs {
namespace {

constexpr RequestPhase kPhases[] = {RequestPhase::kUnsent, RequestPhase::kWaiting, RequestPhase::kQueued,
                                    RequestPhase::kGranted, RequestPhase::kActive,  RequestPhase::kPaused,
                                    RequestPhase::kEnding};

bool InTable(RequestPhase from, RequestPhase to) {
  return std::find(std::begin(kRequestTransitions), std::end(kRequestTransitions), std::pair{from, to}) !=
         std::end(kRequestTransitions);
}

wire::SubmitRequestT Submit(RequestId id, uint64_t client = 0) {
  wire::SubmitRequestT s;
  s.request = id;
  s.client = client;
  s.prompt = {1, 2, 3};
  s.max_new_tokens = 4;
  return s;
}

ClientRef Peer(const std::string& peer) { return ClientRef{peer, 7}; }

// The table written out by hand from the header's phase table: 13 moves, everything else refused.
TEST(RequestBook, TheTableHoldsExactlyTheDocumentedMoves) {
  const std::set<std::pair<RequestPhase, RequestPhase>> want = {
      {RequestPhase::kUnsent, RequestPhase::kWaiting},  {RequestPhase::kWaiting, RequestPhase::kQueued},
      {RequestPhase::kWaiting, RequestPhase::kGranted}, {RequestPhase::kQueued, RequestPhase::kGranted},
      {RequestPhase::kGranted, RequestPhase::kActive},  {RequestPhase::kActive, RequestPhase::kPaused},
      {RequestPhase::kPaused, RequestPhase::kActive},   {RequestPhase::kUnsent, RequestPhase::kEnding},
      {RequestPhase::kWaiting, RequestPhase::kEnding},  {RequestPhase::kQueued, RequestPhase::kEnding},
      {RequestPhase::kGranted, RequestPhase::kEnding},  {RequestPhase::kActive, RequestPhase::kEnding},
      {RequestPhase::kPaused, RequestPhase::kEnding}};
  for (RequestPhase from : kPhases) {
    for (RequestPhase to : kPhases) {
      EXPECT_EQ(InTable(from, to), want.contains({from, to}))
          << RequestPhaseName(from) << " -> " << RequestPhaseName(to);
    }
  }
}

TEST(RequestBook, EveryMoveOutsideTheTableIsRefusedAndChangesNothing) {
  for (RequestPhase from : kPhases) {
    for (RequestPhase to : kPhases) {
      RequestLife life;
      life.id = 5;
      life.phase = from;
      life.ended_in = RequestPhase::kQueued;
      absl::Status s = TransitionRequest(life, from, to);
      if (InTable(from, to)) {
        EXPECT_TRUE(s.ok()) << s;
        EXPECT_EQ(life.phase, to);
        // A move to kEnding remembers the phase it left; any other keeps ended_in.
        EXPECT_EQ(life.ended_in, to == RequestPhase::kEnding ? from : RequestPhase::kQueued);
      } else {
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition)
            << RequestPhaseName(from) << " -> " << RequestPhaseName(to);
        EXPECT_EQ(life.phase, from);
        EXPECT_EQ(life.ended_in, RequestPhase::kQueued);
      }
    }
  }
}

TEST(RequestBook, AMoveFromAPhaseTheRequestIsNotInIsRefused) {
  RequestLife life;
  life.phase = RequestPhase::kWaiting;
  absl::Status s = TransitionRequest(life, RequestPhase::kGranted, RequestPhase::kActive);  // allowed move, wrong from
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(life.phase, RequestPhase::kWaiting);
}

TEST(RequestBook, HeldPhasesCountAsBeforeTheirDeferredEnd) {
  EXPECT_TRUE(WaitsForGrant(RequestPhase::kUnsent));
  EXPECT_TRUE(WaitsForGrant(RequestPhase::kWaiting));
  EXPECT_TRUE(WaitsForGrant(RequestPhase::kQueued));
  EXPECT_FALSE(WaitsForGrant(RequestPhase::kGranted));
  EXPECT_TRUE(Steps(RequestPhase::kActive));
  EXPECT_TRUE(Steps(RequestPhase::kPaused));
  EXPECT_FALSE(Steps(RequestPhase::kEnding));
  RequestBook book(0, ResumedOutputLimits{});
  RequestLife* a = *book.Open(Submit(1), Peer("a"), false, 10);
  RequestLife* b = *book.Open(Submit(2), Peer("a"), false, 10);
  ASSERT_TRUE(book.Transition(b->id, RequestPhase::kWaiting, RequestPhase::kGranted).ok());
  ASSERT_TRUE(book.Transition(b->id, RequestPhase::kGranted, RequestPhase::kActive).ok());
  ASSERT_TRUE(book.DeferEnd(a->id, absl::CancelledError("x")).ok());
  ASSERT_TRUE(book.DeferEnd(b->id, absl::UnavailableError("y")).ok());
  ASSERT_TRUE(book.DeferEnd(b->id, absl::InternalError("second")).ok());  // the first end stands
  EXPECT_EQ(b->end_status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(a->held_phase(), RequestPhase::kWaiting);
  EXPECT_EQ(b->held_phase(), RequestPhase::kActive);
  EXPECT_EQ(book.waiting_for_grant(), 1u);
  EXPECT_EQ(book.active(), 1u);
  EXPECT_EQ(book.not_active(), 1u);
  EXPECT_TRUE(book.CheckInvariants().ok()) << book.CheckInvariants();
}

// GPU 3, epoch 2: ids are 3 << 48 | 1 << 24 | n. Client id 5 is free: n = 5. A second peer's 5 is taken: the counter's
// 1. Client id 0 and 2^24 are never n: the counter's 2 and 3.
TEST(RequestBook, NodeIdsAreTheClientIdWhenFreeElseTheCounter) {
  RequestBook book(3, ResumedOutputLimits{});
  book.set_epoch(2);
  const RequestId base = (RequestId{3} << 48) | (RequestId{1} << 24);
  EXPECT_EQ((*book.Open(Submit(5), Peer("a"), false, 10))->id, base | 5);
  EXPECT_EQ((*book.Open(Submit(5), Peer("b"), false, 10))->id, base | 1);
  EXPECT_EQ((*book.Open(Submit(0), Peer("a"), false, 10))->id, base | 2);
  EXPECT_EQ((*book.Open(Submit(RequestId{1} << 24), Peer("a"), false, 10))->id, base | 3);
  // A resume never takes the id it continues: client id 9 is free but avoided.
  EXPECT_EQ(book.OpenResumed(Submit(9), base | 9)->id, base | 4);
  EXPECT_EQ(book.Open(Submit(5), Peer("a"), false, 10).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(book.CheckInvariants().ok()) << book.CheckInvariants();
}

// Request 5 ends while waiting (Complete sent): its id stays out of use, and a grant for it is stale, until memd
// acknowledges the Complete. One closed without a Complete (rejected) frees its id at once.
TEST(RequestBook, AnIdEndedWhileWaitingIsNotReusedUntilTheCompleteIsAcknowledged) {
  RequestBook book(0, ResumedOutputLimits{});
  const RequestId id = (*book.Open(Submit(5), Peer("a"), false, 10))->id;
  book.Close(id, /*completed=*/true);
  EXPECT_TRUE(book.StaleGrant(id));
  EXPECT_NE((*book.Open(Submit(5), Peer("a"), false, 10))->id, id);
  book.OnCompleteAck(id);
  EXPECT_FALSE(book.StaleGrant(id));
  EXPECT_EQ((*book.Open(Submit(5), Peer("b"), false, 10))->id, id);
  book.Close(id, /*completed=*/false);
  EXPECT_FALSE(book.StaleGrant(id));
  // A granted one ended with a Complete is not stale: memd answered its AdmitRequest already.
  RequestLife* g = *book.Open(Submit(6), Peer("a"), false, 10);
  ASSERT_TRUE(book.Transition(g->id, RequestPhase::kWaiting, RequestPhase::kGranted).ok());
  const RequestId gid = g->id;
  book.Close(gid, true);
  EXPECT_FALSE(book.StaleGrant(gid));
  EXPECT_TRUE(book.CheckInvariants().ok()) << book.CheckInvariants();
}

// libdhs's engine requests (OpenDetached, client id 0): ids from the counter, kUnsent while memd is away, no client;
// after a new memd took the re-Hello the unacknowledged ends are forgotten (ForgetUnacknowledged) and their ids free.
TEST(RequestBook, DetachedRequestsAndAReplacedMemd) {
  RequestBook book(1, ResumedOutputLimits{});
  const RequestId base = RequestId{1} << 48;
  RequestLife* a = book.OpenDetached(Submit(0), /*memd_away=*/false);
  RequestLife* b = book.OpenDetached(Submit(0), /*memd_away=*/true);
  EXPECT_EQ(a->id, base | 1);
  EXPECT_EQ(b->id, base | 2);
  EXPECT_EQ(a->phase, RequestPhase::kWaiting);
  EXPECT_EQ(b->phase, RequestPhase::kUnsent);
  EXPECT_FALSE(a->client.has_value());
  const RequestId aid = a->id;
  book.Close(aid, /*completed=*/true);  // ended while waiting: its Complete went
  book.MarkStopping(b->id);
  EXPECT_TRUE(book.StaleGrant(aid));
  EXPECT_EQ(book.unacknowledged_stops(), 1u);
  book.ForgetUnacknowledged();
  EXPECT_FALSE(book.StaleGrant(aid));
  EXPECT_EQ(book.unacknowledged_stops(), 0u);
  EXPECT_EQ(book.NodeRequestId(1), aid) << "its id is free again";
  EXPECT_TRUE(book.CheckInvariants().ok()) << book.CheckInvariants();
}

// memd's answer to an admission, by the request's phase (RequestBook::AnswerTo, the rule workerd and libdhs share):
// it applies to a request waiting (kWaiting) or queued (kQueued); a request granted, active, paused, unsent or ending
// is not waiting for one; an id ended while waiting or by StopAll crossed its Complete until the CompleteAck, and is
// unknown after it, like an id never seen.
TEST(RequestBook, AnAdmissionAnswerAppliesOnlyToARequestWaitingForIt) {
  RequestBook book(0, ResumedOutputLimits{});
  std::map<RequestPhase, RequestId> in;
  for (RequestPhase phase : kPhases) {
    RequestLife* life = book.OpenDetached(Submit(0), /*memd_away=*/phase == RequestPhase::kUnsent);
    in[phase] = life->id;
    const auto walk = [&](std::initializer_list<RequestPhase> path) {
      RequestPhase at = life->phase;
      for (RequestPhase to : path) {
        ASSERT_TRUE(book.Transition(life->id, at, to).ok()) << RequestPhaseName(at) << " -> " << RequestPhaseName(to);
        at = to;
      }
    };
    switch (phase) {
      case RequestPhase::kUnsent: case RequestPhase::kWaiting: break;
      case RequestPhase::kQueued: walk({RequestPhase::kQueued}); break;
      case RequestPhase::kGranted: walk({RequestPhase::kGranted}); break;
      case RequestPhase::kActive: walk({RequestPhase::kGranted, RequestPhase::kActive}); break;
      case RequestPhase::kPaused: walk({RequestPhase::kGranted, RequestPhase::kActive, RequestPhase::kPaused}); break;
      case RequestPhase::kEnding: ASSERT_TRUE(book.DeferEnd(life->id, absl::CancelledError("x")).ok()); break;
    }
    ASSERT_EQ(book.Find(life->id)->phase, phase);
  }
  for (RequestPhase phase : kPhases) {
    const bool waits = phase == RequestPhase::kWaiting || phase == RequestPhase::kQueued;
    EXPECT_EQ(book.AnswerTo(in[phase]), waits ? AdmissionAnswer::kApplies : AdmissionAnswer::kNotWaiting)
        << RequestPhaseName(phase);
  }
  const RequestId ended = in[RequestPhase::kQueued], stopped = in[RequestPhase::kActive];
  book.Close(ended, /*completed=*/true);  // its Complete went while memd may be granting it
  book.MarkStopping(stopped);
  book.Close(stopped, /*completed=*/true);
  EXPECT_EQ(book.AnswerTo(ended), AdmissionAnswer::kCrossedComplete);
  EXPECT_EQ(book.AnswerTo(stopped), AdmissionAnswer::kCrossedComplete);
  book.OnCompleteAck(ended);
  EXPECT_EQ(book.AnswerTo(ended), AdmissionAnswer::kUnknown);
  EXPECT_EQ(book.AnswerTo(in[RequestPhase::kPaused] + 100), AdmissionAnswer::kUnknown);
  EXPECT_TRUE(book.CheckInvariants().ok()) << book.CheckInvariants();
}

TEST(RequestBook, TheSubmitQueueBoundsTheRequestsWaitingForTheirGrant) {
  RequestBook book(0, ResumedOutputLimits{});
  ASSERT_TRUE(book.Open(Submit(1), Peer("a"), false, 2).ok());
  RequestLife* b = *book.Open(Submit(2), Peer("a"), true, 2);
  EXPECT_EQ(b->phase, RequestPhase::kUnsent);  // memd away: its AdmitRequest goes after the re-Hello
  absl::StatusOr<RequestLife*> c = book.Open(Submit(3), Peer("a"), false, 2);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("submit queue full (2)"), std::string::npos);
  ASSERT_TRUE(book.Transition(b->id, RequestPhase::kUnsent, RequestPhase::kWaiting).ok());
  ASSERT_TRUE(book.Transition(b->id, RequestPhase::kWaiting, RequestPhase::kGranted).ok());
  EXPECT_TRUE(book.Open(Submit(3), Peer("a"), false, 2).ok());
}

TEST(RequestBook, GrantedRequestsStartInGrantOrderOnce) {
  RequestBook book(0, ResumedOutputLimits{});
  std::vector<RequestId> ids;
  for (RequestId c = 1; c <= 3; ++c) ids.push_back((*book.Open(Submit(c), Peer("a"), false, 10))->id);
  ASSERT_TRUE(book.Transition(ids[2], RequestPhase::kWaiting, RequestPhase::kGranted).ok());
  ASSERT_TRUE(book.Transition(ids[0], RequestPhase::kWaiting, RequestPhase::kQueued).ok());
  ASSERT_TRUE(book.Transition(ids[0], RequestPhase::kQueued, RequestPhase::kGranted).ok());
  ASSERT_TRUE(book.Transition(ids[1], RequestPhase::kWaiting, RequestPhase::kGranted).ok());
  EXPECT_EQ(book.granted_not_started(), 3u);  // issue 27: the loop does not wait on its sockets while > 0
  book.Close(ids[1], true);  // ended before it started: not started
  EXPECT_EQ(book.granted_not_started(), 2u);
  EXPECT_EQ(book.TakeGranted(), (std::vector<RequestId>{ids[2], ids[0]}));
  EXPECT_EQ(book.granted_not_started(), 0u);
  EXPECT_TRUE(book.TakeGranted().empty());
}

TEST(RequestBook, ADetachedRequestIsFoundByItsKeyUntilAClientAttaches) {
  RequestBook book(0, ResumedOutputLimits{});
  RequestLife* r = book.OpenResumed(Submit(8, 44), 0);
  EXPECT_FALSE(r->client.has_value());
  EXPECT_EQ(book.FindDetached({44, 8}), r);
  EXPECT_EQ(book.FindDetached({45, 8}), nullptr);  // another client's id 8
  EXPECT_EQ(book.FindByClient("p", 8), nullptr);
  ASSERT_TRUE(book.AttachClient(r->id, Peer("p")).ok());
  EXPECT_EQ(book.AttachClient(r->id, Peer("q")).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(book.FindDetached({44, 8}), nullptr);
  EXPECT_EQ(book.FindByClient("p", 8), r);
  EXPECT_EQ(book.IdsOfPeer("p"), (std::vector<RequestId>{r->id}));
  EXPECT_TRUE(book.IdsOfPeer("pp").empty());
  EXPECT_TRUE(book.CheckInvariants().ok()) << book.CheckInvariants();
}

// The record carries every field of the submit; SubmitOfRecord gives that submit back.
TEST(RequestBook, RecordAndSubmitRoundTrip) {
  RequestLife life;
  life.id = 77;
  life.client_id = 12;
  life.submit.request = 12;
  life.submit.client = 99;
  life.submit.prompt = {5, 6};
  life.submit.hash_ids = {3, 4};
  life.submit.input_tokens = 40;
  life.submit.prefix_block_tokens = 16;
  life.submit.max_new_tokens = 9;
  life.submit.temperature = 0.5f;
  life.submit.top_p = 0.75f;
  life.submit.seed = 1234;
  const std::vector<model::Token> tokens = {10, 11};
  const std::vector<uint64_t> digests = {100, 101};
  std::unique_ptr<wire::RequestRecordT> rec = RecordOf(life, tokens, digests);
  EXPECT_EQ(rec->request, 77u);
  EXPECT_EQ(rec->client_request, 12u);
  EXPECT_EQ(rec->tokens, (std::vector<uint8_t>{10, 11}));
  EXPECT_EQ(rec->logits_digests, digests);
  const wire::SubmitRequestT back = SubmitOfRecord(*rec);
  EXPECT_EQ(back.request, 12u);
  EXPECT_EQ(back.client, 99u);
  EXPECT_EQ(back.prompt, life.submit.prompt);
  EXPECT_EQ(back.hash_ids, life.submit.hash_ids);
  EXPECT_EQ(back.input_tokens, 40u);
  EXPECT_EQ(back.prefix_block_tokens, 16u);
  EXPECT_EQ(back.max_new_tokens, 9u);
  EXPECT_EQ(back.temperature, 0.5f);
  EXPECT_EQ(back.top_p, 0.75f);
  EXPECT_EQ(back.seed, 1234u);
}

// Bound of 2 outputs: the third kept drops the oldest (erased from the book); a claimed one is handed out once.
TEST(RequestBook, DetachedOutputsAreKeptUnderTheBoundAndClaimedOnce) {
  ResumedOutputLimits limits;
  limits.max_outputs = 2;
  RequestBook book(0, limits);
  const RequestBook::TimePoint t0{};
  EXPECT_TRUE(book.KeepDetached({1, 1}, DetachedOutput{{1}, {11}, absl::OkStatus()}, t0).empty());
  EXPECT_TRUE(book.KeepDetached({1, 2}, DetachedOutput{{2}, {12}, absl::OkStatus()}, t0).empty());
  std::vector<DroppedOutput> d = book.KeepDetached({1, 3}, DetachedOutput{{3}, {13}, absl::OkStatus()}, t0);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].key, (ResumeKey{1, 1}));
  EXPECT_FALSE(book.ClaimDetached({1, 1}).has_value());
  std::optional<DetachedOutput> out = book.ClaimDetached({1, 2});
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->tokens, (std::vector<model::Token>{2}));
  EXPECT_FALSE(book.ClaimDetached({1, 2}).has_value());
  EXPECT_EQ(book.detached_outputs(), 1u);
  EXPECT_EQ(book.ExpireDetached(t0 + limits.max_age).size(), 1u);
  EXPECT_EQ(book.detached_outputs(), 0u);
  EXPECT_TRUE(book.CheckInvariants().ok()) << book.CheckInvariants();
}

// Random events (submits from a few peers, resumes, memd's answers, starts, pauses, deferred ends, attaches, ends,
// acks, outputs kept and claimed) against a plain model of each request's phase; the book's invariants after every
// event, and: node ids unique among requests in flight, a refused move changes nothing, memd's answer to an admission
// meets what the model says (AnswerTo).
TEST(RequestBook, RandomEventsKeepTheInvariants) {
  for (uint32_t seed = 1; seed <= 30; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    ResumedOutputLimits limits;
    limits.max_outputs = 1 + rng() % 4;
    RequestBook book(static_cast<GpuId>(rng() % 4), limits);
    book.set_epoch(1 + rng() % 3);
    std::map<RequestId, RequestPhase> model;  // id -> phase
    std::set<RequestId> stale;                // ended while waiting, not acknowledged
    RequestBook::TimePoint now{};
    auto pick = [&]() -> RequestId {
      if (model.empty()) return 0;
      auto it = model.begin();
      std::advance(it, rng() % model.size());
      return it->first;
    };
    for (int step = 0; step < 600; ++step) {
      now += std::chrono::milliseconds(rng() % 50);
      const int what = static_cast<int>(rng() % 12);
      const RequestId id = pick();
      const std::string peer = std::string(1, static_cast<char>('a' + rng() % 3));
      if (what == 0) {
        absl::StatusOr<RequestLife*> r = book.Open(Submit(rng() % 8, rng() % 2), Peer(peer), rng() % 4 == 0, 6);
        if (r.ok()) {
          ASSERT_FALSE(model.contains((*r)->id)) << "node id reused in flight";
          ASSERT_FALSE(stale.contains((*r)->id)) << "an id ended while waiting reused";
          model[(*r)->id] = (*r)->phase;
        }
      } else if (what == 1) {
        // A resumed request, or (libdhs) an engine's: detached, kUnsent when memd is away.
        const bool away = rng() % 3 == 0;
        RequestLife* r = book.OpenDetached(Submit(rng() % 8, rng() % 2), away, id);
        ASSERT_NE(r->id, id);
        ASSERT_FALSE(stale.contains(r->id)) << "an id ended while waiting reused";
        ASSERT_EQ(r->phase, away ? RequestPhase::kUnsent : RequestPhase::kWaiting);
        ASSERT_FALSE(model.contains(r->id));
        model[r->id] = r->phase;
      } else if (what <= 6 && id != 0) {
        // Any move at all: the table decides; the model follows the allowed ones only.
        const RequestPhase from = rng() % 4 == 0 ? kPhases[rng() % 7] : model[id];
        const RequestPhase to = kPhases[rng() % 7];
        const absl::Status s = to == RequestPhase::kEnding ? book.DeferEnd(id, absl::UnavailableError("away"))
                                                           : book.Transition(id, from, to);
        const bool allowed = to == RequestPhase::kEnding || (from == model[id] && InTable(from, to));
        ASSERT_EQ(s.ok(), allowed) << RequestPhaseName(from) << " -> " << RequestPhaseName(to) << ": " << s;
        if (allowed) model[id] = to;
        ASSERT_EQ(book.Find(id)->phase, model[id]);
      } else if (what == 7) {
        for (RequestId g : book.TakeGranted()) {
          ASSERT_EQ(model[g], RequestPhase::kGranted);
          ASSERT_TRUE(book.Transition(g, RequestPhase::kGranted, RequestPhase::kActive).ok());
          model[g] = RequestPhase::kActive;
        }
      } else if (what == 8 && id != 0) {
        const bool completed = rng() % 2 == 0;
        const RequestPhase held = book.Find(id)->held_phase();
        if (completed && (held == RequestPhase::kWaiting || held == RequestPhase::kQueued)) stale.insert(id);
        book.Close(id, completed);
        model.erase(id);
        ASSERT_EQ(book.StaleGrant(id), stale.contains(id));
      } else if (what == 9 && !stale.empty() && rng() % 6 == 0) {  // a new memd took the re-Hello
        book.ForgetUnacknowledged();
        for (RequestId gone : stale) ASSERT_FALSE(book.StaleGrant(gone));
        stale.clear();
      } else if (what == 9 && !stale.empty()) {
        const RequestId acked = *stale.begin();
        book.OnCompleteAck(acked);
        stale.erase(acked);
        ASSERT_FALSE(book.StaleGrant(acked));
      } else if (what == 10 && id != 0) {
        RequestLife* r = book.Find(id);
        const bool detached = !r->client.has_value();
        const bool taken = book.FindByClient(peer, r->client_id) != nullptr;
        ASSERT_EQ(book.AttachClient(id, Peer(peer)).ok(), detached && !taken);
        if (detached) {
          ASSERT_EQ(r->client.has_value(), !taken) << "ALREADY_EXISTS must change nothing";
        }
      } else if (what == 11) {
        const ResumeKey key{rng() % 2, rng() % 4};
        if (rng() % 2 == 0) {
          book.KeepDetached(key, DetachedOutput{{1, 2}, {3, 4}, absl::OkStatus()}, now);
        } else if (rng() % 2 == 0) {
          book.ClaimDetached(key);
        } else {
          book.ExpireDetached(now);
        }
      }
      ASSERT_EQ(book.requests().size(), model.size());
      for (const auto& [mid, phase] : model) {
        ASSERT_EQ(book.Find(mid)->phase, phase) << "step " << step;
        const bool waits = phase == RequestPhase::kWaiting || phase == RequestPhase::kQueued;
        ASSERT_EQ(book.AnswerTo(mid), waits ? AdmissionAnswer::kApplies : AdmissionAnswer::kNotWaiting);
      }
      for (RequestId gone : stale) ASSERT_EQ(book.AnswerTo(gone), AdmissionAnswer::kCrossedComplete);
      ASSERT_TRUE(book.CheckInvariants().ok()) << "step " << step << ": " << book.CheckInvariants();
    }
  }
}

}  // namespace
}  // namespace dhs
