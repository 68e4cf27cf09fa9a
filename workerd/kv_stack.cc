// workerd/kv_stack.cc: see kv_stack.h.
#include "workerd/kv_stack.h"

#include <utility>

#include "spdlog/spdlog.h"

namespace dhs {

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
  ResidencyAgentConfig agent{config.gpu, config.slots, config.adaptive, /*host_tier=*/true};
  s->agent_ = std::make_unique<ResidencyAgent>(agent, s->hier_, memd);
  return s;
}

std::unique_ptr<KvStack> KvStack::Resident(std::unique_ptr<KvAccess> kv, MemdLink* memd,
                                           const KvStackConfig& config) {
  std::unique_ptr<KvStack> s(new KvStack());
  s->kv_ = std::move(kv);
  s->no_residency_ = std::make_unique<NoKvResidency>(s->kv_.get());
  ResidencyAgentConfig agent{config.gpu, config.slots, /*keep_optional=*/false, /*host_tier=*/false};
  s->agent_ = std::make_unique<ResidencyAgent>(agent, s->no_residency_.get(), memd);
  return s;
}

KvStack::~KvStack() = default;

void KvStack::EnterAway() {
  agent_->EnterAway();
  if (hier_ != nullptr) hier_->PauseHostWrites();
}

void KvStack::ReturnFromAway(const std::set<RequestId>& adopted) {
  agent_->ReturnFromAway(adopted);
  if (hier_ == nullptr) return;
  if (absl::Status s = hier_->ResumeHostWrites(); !s.ok()) spdlog::error("worker: deferred backups: {}", s.ToString());
}

}  // namespace dhs
