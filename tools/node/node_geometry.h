// tools/node/node_geometry.h: memd's page size for a dhs-node configuration, from the workers' own formula
// (ComputeGeometry, workerd/geometry.h), so memd and every worker agree before anything starts.
//
// Thread-safety: pure function.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "tools/node/node_config.h"

namespace dhs::node {

// Bytes per host pool page for `config` (memd --page-bytes): memd.page_bytes when given, else the host page size of
// the workers' model presets (p * (sum of d_KV + sum over indexers of idx_dim * 4): WorkerGeometry.host_page_bytes,
// ComputeGeometry with each worker's mode, page_rows, tail_rows, hot_rows, prefill_chunk, slots and hbm_budget_bytes).
// Every worker with a preset is checked against it. Errors: INVALID_ARGUMENT naming the key: a worker's geometry
// error ("worker[1]: ...", ValidateGeometry's rules with their numbers: dhs-node refuses the node before starting it), a worker's page size differing from memd.page_bytes or from worker[0]'s, a worker with
// `weights` and no memd.page_bytes (its page size is known only once the file is loaded).
absl::StatusOr<uint64_t> ResolvePageBytes(const NodeConfig& config);

}  // namespace dhs::node
