// workerd/token_ledger.h: which generated tokens go to memd's records next, and what memd holds (issue 11's records;
// issue 25: the one core of workerd's Worker and libdhs's EmbeddedWorker, which each wrote it before).
//
// memd keeps each request's record (AdmitRequest.record) and appends the tokens of each TokensCommitted it journals;
// one TokensCommitted is in flight at a time (MemdClient). Per request the book keeps TokenCounts::committed (the
// tokens memd's record holds: acknowledged, or carried by its AdmitRequest or a re-Hello's report) and
// TokenCounts::refused (memd refused this request's tokens alone: its later tokens are not sent; the reason stays).
// The ledger keeps the message in flight and the probe queue: memd refuses a message of several entries with one
// ErrorReply that does not say whose entry was bad ("k of n entries refused"; it applied the valid ones:
// Daemon::OnTokensCommitted), so after such a refusal each request of that message goes alone until it is
// acknowledged or refused alone. Nothing is lost on a refusal: an entry starts at `committed` and memd takes an equal
// resend of what it has (RequestRecordStore::Commit). A re-Hello whose report memd adopted clears a refusal (the
// report carried every token: MemdAway::Return, EmbeddedWorker::Return).
//
// Events in: Sent, Acked, Refused, Lost (memd went away: the message in flight is never answered; the re-Hello's
// report carries every token). Decisions out: Next (the entries of the next message). Reads and writes the book's
// TokenCounts; the tokens themselves are the caller's. No sockets, no clocks. Invariants: CheckInvariants.
//
// Thread-safety: none; the worker thread drives it.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "common/types.h"
#include "workerd/request_book.h"

namespace dhs {

class TokenLedger {
 public:
  // Tokens [from, to) of `request` (to > from).
  struct Entry {
    RequestId request = 0;
    size_t from = 0, to = 0;
    bool operator==(const Entry&) const = default;
  };
  // `total(id)`: the tokens request `id` has generated (>= its committed count).
  using TotalFn = std::function<size_t(RequestId)>;

  // The entries of the next TokensCommitted: each active request of `book` (RequestPhase::kActive) whose record is
  // behind (committed < total) and not refused, in node-id order, from its committed count to its total; while
  // probing, the probe queue's first request alone (requests no longer behind leave the queue first). Empty when a
  // message is in flight.
  std::vector<Entry> Next(const RequestBook& book, const TotalFn& total);
  // The message of `entries` (Next's) was queued to memd: it is in flight.
  void Sent(std::vector<Entry> entries);
  // memd acknowledged the message in flight: each entry's request (still in the book) holds `to` tokens in memd's
  // record. Returns the tokens newly acknowledged. No-op (0) when none is in flight.
  size_t Acked(RequestBook& book);
  // memd refused the message in flight with `why`. A message of one entry: that request's record stops at its
  // committed count (TokenCounts::refused = why); returns its id. Several: each of its requests goes again alone
  // (probe); returns nullopt.
  std::optional<RequestId> Refused(RequestBook& book, const absl::Status& why);
  // memd went away: the message in flight is never answered and nothing is probed (the re-Hello's report carries
  // every token; MemdAway / EmbeddedWorker set committed for the adopted requests).
  void Lost();

  bool in_flight() const { return in_flight_.has_value(); }
  const std::deque<RequestId>& probe() const { return probe_; }

  // INTERNAL naming the broken invariant, else OK: the message in flight is non-empty, each entry has from < to and a
  // distinct request, of one request while probing; the probe queue holds distinct ids. O(entries + probe).
  absl::Status CheckInvariants() const;

 private:
  std::optional<std::vector<Entry>> in_flight_;
  std::deque<RequestId> probe_;
};

}  // namespace dhs
