// tools/replay/host_ledger.h: the bookkeeping behind dhs-replay's host_rows_lost (issue 11): the digest of every host
// page memd recorded as holding a confirmed host copy, and the pages whose bytes later changed or that vanished. Pure
// bookkeeping: the process part (tools/replay/supervised_node.cc) reads memd's `request N` views and digests the
// mapped host pool.
//
// Two keys: the bytes of history page j of a request are the same in every incarnation of the request (a resumed
// request recomputes or imports them bit-exactly), so digests are kept by (client id, history page); which pages a
// request holds is kept by its node request id (a resumed request has a new one, and may get new host pages).
// - Observe: node `node` (client `client`) holds a confirmed host copy of `page` with `digest`. The first digest of
//   (client, page) is recorded; a later one that differs is a changed page.
// - CheckAfterFault: after the worker died (memd fenced its GPU) or memd restarted, `present` lists the confirmed host
//   copies memd holds now, by client; every page held by a node in `nodes` must be there with its recorded digest,
//   else it vanished (or changed). Pages of an earlier incarnation that a resume let go (memd frees them when the
//   interrupted request ends) are not checked again: the resumed request's copies are compared by Observe.
//   The check is not atomic (a listing, then one view per request): a node whose view could not be read (`unread`:
//   memd answered "not found" or nothing) and that memd no longer lists afterwards (`listed_after`) ended during the
//   check, e.g. a surviving worker's Complete after its re-Hello: it is forgotten, not lost (memd frees a request's
//   pages with it). An unread node still listed is not checked this time (`pages_unchecked`), never counted lost.
// - Forget: the node ended; the pages it held are no longer expected.
// Each (client, page) is counted lost at most once.
// - ObserveCoverage (issue 28): by the steps taken (rows the client saw computed) and the grant, the history pages
//   below the worker's tail window must hold a confirmed host copy or be on GPU (memd's a_r). Pages that hold neither
//   in two samples of a node in a row are unconfirmed: a worker that never confirms its host copies. They are counted
//   apart from lost pages (no byte was seen to change), at most the largest count seen per client. Only a client's
//   first node is checked (a resumed request recomputes pages the client's rows already count).
//
// Thread-safety: none.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "common/types.h"

namespace dhs::replay {

struct HostCopySeen {
  RequestId node = 0;    // memd's (node) request id
  RequestId client = 0;  // the client's request id
  uint32_t page = 0;     // history page
  uint64_t digest = 0;   // of the host page's bytes
};

// One sample of a request's coverage (ObserveCoverage).
struct CoverageSeen {
  RequestId node = 0;
  RequestId client = 0;
  uint32_t due_pages = 0;     // history pages 0 .. due_pages-1 should be covered by now: complete pages (rows
                              // computed / p) less the worker's tail window (ceil(T / p) + 1, a backup in flight)
  uint32_t confirmed_due = 0; // of those, pages memd lists with a confirmed host copy
  uint32_t on_gpu = 0;        // a_r: memd's optional pages of the request (on GPU, no host copy needed yet)
};

class HostLedger {
 public:
  void ObserveCoverage(const CoverageSeen& seen);
  // Pages that should have held a confirmed host copy and did not (ObserveCoverage), summed over clients.
  uint64_t pages_unconfirmed() const;

  void Observe(const HostCopySeen& seen);
  // Returns the (client, page) keys this check counted lost (each once over the ledger's life).
  std::vector<std::pair<RequestId, uint32_t>> CheckAfterFault(const std::set<RequestId>& nodes,
                                                              const std::vector<HostCopySeen>& present,
                                                              const std::set<RequestId>& unread = {},
                                                              const std::set<RequestId>& listed_after = {});
  void Forget(RequestId node);
  std::set<RequestId> nodes() const;  // nodes holding a recorded page

  uint64_t pages_recorded() const { return digests_.size(); }
  uint64_t pages_checked() const { return checked_; }  // comparisons made (Observe of a known page, CheckAfterFault)
  uint64_t pages_changed() const { return changed_; }
  uint64_t pages_vanished() const { return vanished_; }
  uint64_t pages_lost() const { return changed_ + vanished_; }
  uint64_t pages_unchecked() const { return unchecked_; }  // pages of unread nodes still listed, skipped by a check

 private:
  bool Lose(std::pair<RequestId, uint32_t> key, bool vanished);  // false: counted lost before
  std::map<std::pair<RequestId, uint32_t>, uint64_t> digests_;  // (client, page) -> digest
  std::map<RequestId, std::pair<RequestId, std::set<uint32_t>>> held_;  // node -> (client, pages)
  std::set<std::pair<RequestId, uint32_t>> lost_;
  std::map<RequestId, uint32_t> uncovered_last_;     // node -> pages uncovered at its latest sample
  std::map<RequestId, uint32_t> unconfirmed_;        // client -> most pages uncovered in two samples in a row
  std::map<RequestId, RequestId> first_node_;         // client -> its first node (the only one checked)
  uint64_t checked_ = 0, changed_ = 0, vanished_ = 0, unchecked_ = 0;
};

}  // namespace dhs::replay
