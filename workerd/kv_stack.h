// workerd/kv_stack.h: the KV side of one GPU's worker below its serving loop, ONE wiring shared by workerd's Worker
// and libdhs's EmbeddedWorker (issue 25, "workerd uses libdhs", first step): the KV store (HierarchicalKvAccess over
// the device pool and memd's host pool with the fused resolver, or in resident mode a store the caller built), the
// KvResidency memd's orders act on (the hierarchical store itself, or NoKvResidency) and the ResidencyAgent that
// carries those orders out; and, for memd away (issue 11, docs/protocol.md "Re-Hello with a report"), the KV half of
// entering and leaving it: the agent resolves memd's orders locally and host writes pause; at the return the agent
// adopts the reported requests and host writes resume.
//
// memd's orders reach the agent through Order (issue 25: one path for workerd's Worker and libdhs's engines; neither
// sees an order): carried out at once, or held while the owner's readers are outstanding (SetOrderHooks), in arrival
// order, until CarryOutHeld with memd up; EnterAway drops the held ones (the dead memd's orders are not acted on).
//
// Owns: the store, the residency, the agent (destroyed agent first), the held orders. Not the device, the memd link
// or the host pool.
// Thread-safety: none; the owner's thread drives it.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <variant>

#include "absl/status/statusor.h"
#include "common/types.h"
#include "dhs_generated.h"
#include "workerd/device/device.h"
#include "workerd/kv/hierarchical_kv_access.h"
#include "workerd/kv_access.h"
#include "workerd/kv_residency.h"
#include "workerd/model/resident_kv_access.h"
#include "libdhs/kv_port.h"
#include "workerd/memd_link.h"
#include "workerd/residency_agent.h"

namespace dhs {

// The worker facts the agent checks grants against.
struct KvStackConfig {
  GpuId gpu = 0;
  uint32_t slots = 1;     // N: a grant's slot must be below it
  bool adaptive = true;   // optional history pages kept (adaptive mode) or not (hisparse)
};

class KvStack {
 public:
  // Adaptive / hisparse: the hierarchical store over `device`'s pool (HierarchicalKvAccess::Create's errors) and
  // memd's host pool `host_pool` (its pages come from memd's grants only), with the fused resolver; the agent over it.
  // `device` and `memd` must outlive the stack.
  static absl::StatusOr<std::unique_ptr<KvStack>> Hierarchical(const KvConfig& kv, Device* device,
                                                               std::span<uint8_t> host_pool, MemdLink* memd,
                                                               const KvStackConfig& config);
  // Resident mode: `kv` (every row resident; nothing moves: NoKvResidency) and the agent over it (no host tier).
  // `shape`: the worker's KvConfig (row bytes per source, groups, key bytes, page rows, k), what KvPort checks
  // against (its tail and hot-cache sizes are not used).
  static std::unique_ptr<KvStack> Resident(std::unique_ptr<model::ResidentKvAccess> kv, const KvConfig& shape,
                                           MemdLink* memd, const KvStackConfig& config);
  ~KvStack();

  KvAccess& kv() { return *kv_; }
  HierarchicalKvAccess* hierarchical() { return hier_; }  // nullptr in resident mode
  ResidencyAgent* agent() { return agent_.get(); }
  // The store as libdhs's data path sees it (lib::KvPort; issue 25): lib::HierarchicalPortStore, or resident mode's
  // (no tail bound, no host tier: its host imports answer FAILED_PRECONDITION).
  lib::PortStore* port_store() { return port_store_.get(); }

  // One of memd's orders to the KV side (contract §4-§6: ReclaimOrder, Retire, PopulateOrder).
  using MemdOrder = std::variant<wire::ReclaimOrderT, wire::RetireT, wire::PopulateOrderT>;
  // `hold`: whether orders must wait now (libdhs: KvPort::ReadersOutstanding: carrying a reclaim out may wait for a
  // copy that waits for readers only the owner's thread can end; found by the libFuzzer run). `carried_out`: told of
  // each reclaim order when the agent takes it (libdhs's kReclaimed event). Either may be empty (never hold; nobody
  // told). Set once, before the first order.
  void SetOrderHooks(std::function<bool()> hold, std::function<void(const wire::ReclaimOrderT&)> carried_out);
  // memd's `order`: to the agent now (ResidencyAgent::OnReclaimOrder / OnRetire / OnPopulateOrder) unless hold()
  // says so or earlier orders are held; then held, in arrival order. A Retire is never held (it follows this worker's
  // ReadersDone of its reclaim and waits for no copy; held, a grant handled meanwhile could reuse its pages first).
  void Order(MemdOrder order);
  // The held orders carried out in arrival order while hold() says no (the owner calls it when its readers may have
  // ended: each Poll, each loop iteration); nothing while memd is away (the link's MemdSession: the dead memd's
  // orders wait for EnterAway to drop them). O(orders carried out).
  void CarryOutHeld();
  size_t held_orders() const { return held_.size(); }
  // Orders in flight at the agent plus those held (Heartbeat.pending_copies; work the owner's loop still has).
  uint32_t pending_orders() const { return agent_->pending_orders() + static_cast<uint32_t>(held_.size()); }

  // memd died (the caller took the loss: MemdSession::TakeLoss, once per death): the held orders are dropped, memd's
  // orders are resolved here (ResidencyAgent::EnterAway) and host writes pause (a new memd may not adopt a page
  // written now).
  void EnterAway();
  // A memd took the re-Hello: the `adopted` requests' pages go on under it (ResidencyAgent::ReturnFromAway) and host
  // writes resume (the backups deferred while away are issued; a failure to issue them is logged, as before).
  void ReturnFromAway(const std::set<RequestId>& adopted);

 private:
  KvStack() = default;
  void CarryOut(MemdOrder& order);

  std::unique_ptr<KvAccess> kv_;
  HierarchicalKvAccess* hier_ = nullptr;
  std::unique_ptr<KvResidency> no_residency_;  // resident mode's residency (nothing moves)
  std::unique_ptr<lib::PortStore> port_store_;
  MemdLink* memd_ = nullptr;  // its session says whether memd is away (CarryOutHeld)
  std::function<bool()> hold_;
  std::function<void(const wire::ReclaimOrderT&)> carried_out_;
  std::deque<MemdOrder> held_;                 // memd's orders waiting for hold_ to say no, oldest first
  std::unique_ptr<ResidencyAgent> agent_;      // declared last: destroyed first (it refers to the store)
};

}  // namespace dhs
