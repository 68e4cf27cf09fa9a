// tools/replay/host_ledger.h: the bookkeeping behind dhs-replay's host_rows_lost (issue 11): the digest of every host
// page memd recorded as holding a confirmed host copy, keyed by the request's client id and history page (a resumed
// request has a new node id and may get new host pages, so neither of those is a key), and the pages whose bytes
// later changed or that vanished. Pure bookkeeping: the process part (tools/replay/supervised_node.cc) reads memd's
// `request N` views and digests the mapped host pool.
//
// - Observe: a confirmed host copy seen while the node runs. The first digest of (client, page) is recorded; a later
//   one that differs is a changed page (a resumed request's rows recomputed or imported into other bytes).
// - CheckAfterFault: after the worker died (memd fenced its GPU) or memd restarted, `present` lists the confirmed host
//   copies memd holds now for the requests in `clients`; every recorded page of those clients must be there with the
//   same digest, else it vanished (or changed).
// - Forget: the request ended; its pages leave the ledger (memd frees them).
// Each page is counted lost at most once.
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
  RequestId client = 0;  // the client's request id
  uint32_t page = 0;     // history page
  uint64_t digest = 0;   // of the host page's bytes
};

class HostLedger {
 public:
  void Observe(const HostCopySeen& seen);
  void CheckAfterFault(const std::set<RequestId>& clients, const std::vector<HostCopySeen>& present);
  void Forget(RequestId client);
  // Clients with a recorded page.
  std::set<RequestId> clients() const;

  uint64_t pages_recorded() const { return digests_.size(); }
  uint64_t pages_checked() const { return checked_; }  // comparisons made (Observe of a known page, CheckAfterFault)
  uint64_t pages_changed() const { return changed_; }
  uint64_t pages_vanished() const { return vanished_; }
  uint64_t pages_lost() const { return changed_ + vanished_; }

 private:
  void Lose(std::pair<RequestId, uint32_t> key, bool vanished);
  std::map<std::pair<RequestId, uint32_t>, uint64_t> digests_;
  std::set<std::pair<RequestId, uint32_t>> lost_;
  uint64_t checked_ = 0, changed_ = 0, vanished_ = 0;
};

}  // namespace dhs::replay
