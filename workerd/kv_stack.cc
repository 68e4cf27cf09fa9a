// workerd/kv_stack.cc: see kv_stack.h.
#include "workerd/kv_stack.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace dhs {

namespace {
// Resident mode's store as KvPort sees it: every row stays (no tail bound, host writes never pause), no host tier.
class ResidentPortStore final : public lib::PortStore {
 public:
  ResidentPortStore(model::ResidentKvAccess* kv, KvConfig shape) : kv_(kv), shape_(std::move(shape)) {}
  KvAccess& kv() override { return *kv_; }
  const KvConfig& config() const override { return shape_; }
  Position AppendedRows(RequestId request, SourceId source) const override {
    return kv_->appended_rows(request, source);
  }
  Position HoldFrom(RequestId request) const override { return kv_->held_from(request); }
  bool bounded_tail() const override { return false; }
  bool host_writes_paused() const override { return false; }
  bool TailHasRoom(RequestId, SourceId, Position) const override { return true; }
  absl::StatusOr<std::vector<uint32_t>> CheckHostCopies(RequestId request, std::span<const uint32_t>,
                                                        std::span<const uint64_t>) override {
    return NoHostTier(request);
  }
  absl::Status ImportHostPages(RequestId request, std::span<const uint32_t>, std::span<const uint64_t>) override {
    return NoHostTier(request);
  }
  absl::Status ImportHostRows(RequestId request, uint32_t, uint32_t, std::vector<std::vector<float>>&) override {
    return NoHostTier(request);
  }

 private:
  static absl::Status NoHostTier(RequestId request) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", request, ": resident mode has no host tier (no host-backed page to import)"));
  }
  model::ResidentKvAccess* kv_;
  KvConfig shape_;
};
}  // namespace

absl::StatusOr<std::unique_ptr<KvStack>> KvStack::Hierarchical(const KvConfig& kv, Device* device,
                                                               std::span<uint8_t> host_pool, MemdLink* memd,
                                                               const KvStackConfig& config) {
  std::unique_ptr<KvStack> s(new KvStack());
  HostPoolAccess host{host_pool, nullptr, nullptr};  // host pages come from memd's grants only
  absl::StatusOr<std::unique_ptr<HierarchicalKvAccess>> hier =
      HierarchicalKvAccess::Create(kv, device, host, ResolverKind::kFused);
  if (!hier.ok()) return hier.status();
  s->hier_ = hier->get();
  s->kv_ = *std::move(hier);
  s->port_store_ = std::make_unique<lib::HierarchicalPortStore>(s->hier_);
  ResidencyAgentConfig agent{config.gpu, config.slots, config.adaptive, /*host_tier=*/true};
  s->memd_ = memd;
  s->agent_ = std::make_unique<ResidencyAgent>(agent, s->hier_, memd);
  return s;
}

std::unique_ptr<KvStack> KvStack::Resident(std::unique_ptr<model::ResidentKvAccess> kv, const KvConfig& shape,
                                           MemdLink* memd, const KvStackConfig& config) {
  std::unique_ptr<KvStack> s(new KvStack());
  s->port_store_ = std::make_unique<ResidentPortStore>(kv.get(), shape);
  s->kv_ = std::move(kv);
  s->no_residency_ = std::make_unique<NoKvResidency>(s->kv_.get());
  ResidencyAgentConfig agent{config.gpu, config.slots, /*keep_optional=*/false, /*host_tier=*/false};
  s->memd_ = memd;
  s->agent_ = std::make_unique<ResidencyAgent>(agent, s->no_residency_.get(), memd);
  return s;
}

KvStack::~KvStack() = default;

void KvStack::SetOrderHooks(std::function<bool()> hold,
                            std::function<void(const wire::ReclaimOrderT&)> carried_out) {
  hold_ = std::move(hold);
  carried_out_ = std::move(carried_out);
}

void KvStack::Order(MemdOrder order) {
  // A Retire never waits: memd sends it after this worker's ReadersDone of its reclaim, whose pages were withdrawn
  // before it (no reader since can reach them), and carrying it out waits for no copy. Held behind other orders, it
  // would let an answer handled meanwhile (a grant that gives one of its pages to another request) act before it
  // (review finding: the late Retire then frees a page the new request maps).
  if (!std::holds_alternative<wire::RetireT>(order) && (!held_.empty() || (hold_ && hold_()))) {
    held_.push_back(std::move(order));
    return;
  }
  CarryOut(order);
}

void KvStack::CarryOutHeld() {
  // memd died (the transport saw it: kLost, before the owner took the loss): its held orders are not acted on; the
  // owner's EnterAway drops them (review finding: readers ended before the poll that entered away, and the dead
  // memd's reclaim was carried out, its backups written to the dead memd's host targets).
  if (memd_ != nullptr && memd_->session().away()) return;
  while (!held_.empty() && !(hold_ && hold_())) {
    MemdOrder order = std::move(held_.front());
    held_.pop_front();
    CarryOut(order);
  }
}

void KvStack::CarryOut(MemdOrder& order) {
  if (auto* m = std::get_if<wire::ReclaimOrderT>(&order)) {
    if (carried_out_) carried_out_(*m);
    agent_->OnReclaimOrder(*m);
  } else if (auto* m = std::get_if<wire::RetireT>(&order)) {
    agent_->OnRetire(*m);
  } else if (auto* m = std::get_if<wire::PopulateOrderT>(&order)) {
    agent_->OnPopulateOrder(*m);
  }
}

void KvStack::EnterAway() {
  held_.clear();  // the dead memd's orders not carried out yet: nothing of them is acted on
  agent_->EnterAway();
  if (hier_ != nullptr) hier_->PauseHostWrites();
}

void KvStack::ReturnFromAway(const std::set<RequestId>& adopted) {
  agent_->ReturnFromAway(adopted);
  if (hier_ == nullptr) return;
  if (absl::Status s = hier_->ResumeHostWrites(); !s.ok()) spdlog::error("worker: deferred backups: {}", s.ToString());
}

}  // namespace dhs
