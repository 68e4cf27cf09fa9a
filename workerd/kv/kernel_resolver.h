// workerd/kv/kernel_resolver.h: the fused resolver run as the device kernel (resolver_kernel.h) behind the device
// seam (issue 23): a Resolver whose plan and gather (resolver_plan.h) run on the device's compute side
// (DeviceCompute, workerd/device/device.h), so serving resolves on the GPU when the CUDA backend is selected.
// HierarchicalKvAccess::Create takes it for ResolverKind::kFused when the device has a compute side and a plan runner
// is set (SetDevicePlanRunner: workerd does it when built with CUDA); CpuDevice has none, so the CPU backend keeps
// FusedResolver.
//
// Memory: the hot caches (B slots per request slot and group: row, recency, step stamp, clock, as HotSlotsStorage)
// live in memory the host and the device share (DeviceCompute::AllocateShared); so do each Resolve's arguments: the
// queries, their selections and outputs, a copy of each request's hot index (ready_page, host_ready, host_page by
// history page: O(pages) bytes per query and step), scratch and results. The kernel reads host rows through the
// mapped host pool (DeviceCompute::MappedHostAddress) and writes them into the KV pool (DeviceCompute::PoolAddress).
//
// A Resolve, after Validate: (1) host-page integrity: the page of every selected row that is neither in the tail nor
// in the ready map is verified (env.verify_host_page) before the launch (a superset of the rows recovered: a hot hit's
// page too); (2) the selected tail rows' writes are waited, and the readers of each query's hot region (every source
// of the group) are waited for, so no victim slot is written under a reader; (3) the queries run in launches that
// hold each request slot at most once (the kernel's precondition), in batch order, all with one step number (a slot
// protected by an earlier query of the batch stays protected); (4) the results are read back after Synchronize.
// Locations, census and hot-cache state are those of the shared plan (equal to ReferenceResolver's:
// tests/workerd/kernel_resolver_test.cc). Errors: Resolver's. On any error every output is -1 and the census is
// untouched; an error before the launch (validation, integrity, a failed tail write) changes no hot cache; a planning
// error (INTERNAL, RESOURCE_EXHAUSTED) invalidates every hot slot the batch claimed for a miss (the bytes were
// gathered, but Resolver's contract treats them as not resolved); hits touched stay touched.
//
// Thread-safety: none; driven by the worker thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "workerd/device/device.h"
#include "workerd/kv/resolver.h"
#include "workerd/kv/resolver_plan.h"

namespace dhs {

// Runs plan::PlanAndGather for queries[0 .. n) on `compute`'s queue, without waiting (the caller synchronizes):
// every pointer is a device address (shared memory, the KV pool, the mapped host pool); scratch holds n * stride
// bytes; results[i] is overwritten. Errors: the launch's (UNAVAILABLE, INVALID_ARGUMENT).
using PlanRunner = std::function<absl::Status(DeviceCompute& compute, const plan::Geometry& g,
                                              const plan::Query* queries, uint32_t n, uint64_t step, void* scratch,
                                              uint64_t stride, plan::QueryResult* results, const uint8_t* host_pool,
                                              uint8_t* pool)>;

// The process's device plan runner (the CUDA kernel: plan::CudaPlanRunner(), resolver_kernel.h), empty by default.
// Set once at start, before any HierarchicalKvAccess is created.
void SetDevicePlanRunner(PlanRunner runner);
const PlanRunner& DevicePlanRunner();

class KernelResolver final : public Resolver {
 public:
  // `compute` (not owned) is env.device's compute side. Errors: INVALID_ARGUMENT (no compute side, no runner, a host
  // pool not mapped for the device), RESOURCE_EXHAUSTED (shared memory).
  static absl::StatusOr<std::unique_ptr<KernelResolver>> Create(const ResolverEnv& env, DeviceCompute* compute,
                                                                PlanRunner runner);
  ~KernelResolver() override;

  void ResetSlot(SlotIndex slot) override;
  absl::Status Resolve(uint32_t group, std::span<const SourceId> sources, std::span<ResolveQuery> batch) override;
  Position HotPosition(SlotIndex slot, uint32_t group, uint32_t h) const override;
  bool HotHolds(SlotIndex slot, uint32_t group, Position t) const override;
  // Launches of the last Resolve (one per set of queries with distinct request slots); for tests.
  uint32_t last_launches() const { return last_launches_; }

 private:
  struct Shared;  // one AllocateShared block (kernel_resolver.cc)
  KernelResolver(const ResolverEnv& env, DeviceCompute* compute, PlanRunner runner);
  // The hot cache of (group, slot) in shared memory: group g's block holds pos, last_use, stamp [slots * B] and
  // clock [slots].
  plan::HotSlots View(uint32_t group, SlotIndex slot) const;
  // Resolve's steps (see the top of this file).
  absl::Status Prepare(uint32_t group, std::span<const SourceId> sources, std::span<ResolveQuery> batch);
  absl::Status Stage(uint32_t group, std::span<const SourceId> sources, std::span<ResolveQuery> batch);
  plan::Query StageQuery(uint32_t group, const ResolveQuery& rq, uint64_t ns,
                         const std::function<uint8_t*(uint64_t)>& take) const;
  absl::Status Launch(uint32_t group, size_t n);
  void InvalidateClaimed(uint32_t group);
  absl::Status Collect(uint32_t group, std::span<ResolveQuery> batch);
  // The arena of Resolve's arguments, at least `bytes` (grown by half again when too small).
  absl::StatusOr<uint8_t*> Arena(uint64_t bytes);

  DeviceCompute* compute_;
  PlanRunner runner_;
  uint32_t groups_;
  uint32_t hot_rows_;
  std::vector<std::unique_ptr<Shared>> caches_;  // by group (View)
  std::unique_ptr<Shared> arena_;
  uint8_t* pool_base_ = nullptr;        // device address of the KV pool
  const uint8_t* host_base_ = nullptr;  // device address of the host pool
  uint64_t step_ = 0;
  uint32_t last_launches_ = 0;
  // The last Resolve's arguments in the arena (Stage), in launch order: order_[a] = the batch index of arena query a;
  // launch L runs arena queries [launch_end_[L - 1], launch_end_[L]).
  plan::Geometry geometry_;
  plan::Query* queries_ = nullptr;
  plan::QueryResult* results_ = nullptr;
  uint8_t* scratch_ = nullptr;
  uint64_t stride_ = 0;
  std::vector<uint32_t> order_;
  std::vector<size_t> launch_end_;
  // Launch's snapshot: the request slots of the batch and the rows of their hot slots (B per slot) before the launch.
  std::vector<SlotIndex> before_slots_;
  std::vector<int64_t> pos_before_;
};

}  // namespace dhs
