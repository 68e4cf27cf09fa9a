// memd/memd_flags.h: THE list of memd's flags a configuration sets (common/daemon_flag.h): memd's CLI11 set-up
// (memd/main.cc, AddDaemonFlag) and dhs-node's [memd] table (tools/node/node_config.cc) both read it. The order is
// dhs-node's: it passes the flags given in this order (after --run-dir).
//
// Not here: --run-dir (dhs-node sets it), --unreadable-segment-age-s, --replace-host-pool, --check-config. memd adds
// its own checks to four of these: --page-bytes (a positive multiple of 64, as dhs-node checks), --host-pool-bytes
// (a size with a unit), --host-pool-pages (with --host-pool-bytes: at least one page, fewer than 2^32) and
// --populate-pages-per-attempt (at least 1); the ranges below are the ones dhs-node checks for them.
//
// Thread-safety: constants.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/daemon_flag.h"
#include "memd/prefix_pages.h"     // kPrefixEvictionPolicyNames (issue 24)
#include "memd/reclaim_policy.h"  // ReclaimPolicyNames: memd's reclaim policy owns them

namespace dhs::memd {

// --log-level: spdlog's levels memd takes.
inline std::vector<std::string> MemdLogLevels() { return {"trace", "debug", "info", "warn", "error"}; }
// --prefix-sharing (issue 24): off (the default: every host page one request's, as before) or on.
inline std::vector<std::string> PrefixSharingModes() { return {"off", "on"}; }
// --prefix-eviction: memd/prefix_pages.h's policies (kPrefixEvictionPolicyNames), the one list.
inline std::vector<std::string> PrefixEvictionPolicyNames() {
  return {std::begin(kPrefixEvictionPolicyNames), std::end(kPrefixEvictionPolicyNames)};
}

inline constexpr DaemonFlag kMemdFlags[] = {
    {"page_bytes", "--page-bytes", DaemonFlag::kSize, 64, INT64_MAX},
    {"host_pool_bytes", "--host-pool-bytes", DaemonFlag::kSize, 1, INT64_MAX},
    {"host_pool_pages", "--host-pool-pages", DaemonFlag::kUint, 1, UINT32_MAX},
    {"reserve_pages", "--reserve-pages", DaemonFlag::kUint, 0, UINT32_MAX},
    {"reclaim_policy", "--reclaim-policy", DaemonFlag::kChoice, 0, 0, ReclaimPolicyNames},
    {"populate_pages_per_attempt", "--populate-pages-per-attempt", DaemonFlag::kUint, 1, UINT32_MAX},
    {"metrics_address", "--metrics-address", DaemonFlag::kString},
    {"worker_timeout_ms", "--worker-timeout-ms", DaemonFlag::kUint, 100, 86400000},
    {"adopt_grace_ms", "--adopt-grace-ms", DaemonFlag::kUint, 0, 600000},
    {"log_level", "--log-level", DaemonFlag::kChoice, 0, 0, MemdLogLevels},
    // Issue 24, the content-addressed host tier (memd/prefix_pages.h): off by default.
    {"prefix_sharing", "--prefix-sharing", DaemonFlag::kChoice, 0, 0, PrefixSharingModes},
    {"prefix_eviction", "--prefix-eviction", DaemonFlag::kChoice, 0, 0, PrefixEvictionPolicyNames},
    {"prefix_tenant_quota_pages", "--prefix-tenant-quota-pages", DaemonFlag::kUint, 0, UINT32_MAX},
    // Issue 24, the KV event stream (memd/kv_events.h): off by default; needs prefix_sharing on.
    {"kv_events", "--kv-events", DaemonFlag::kChoice, 0, 0, PrefixSharingModes},
    {"kv_events_hwm", "--kv-events-hwm", DaemonFlag::kUint, 1, 100000000},
    // Issue 26, the cluster tier (docs/cluster_tier.md): off by default (empty); needs prefix_sharing on.
    {"cluster_store", "--cluster-store", DaemonFlag::kString},
    {"cluster_lookup_timeout_ms", "--cluster-lookup-timeout-ms", DaemonFlag::kUint, 1, 10000},
};

}  // namespace dhs::memd
