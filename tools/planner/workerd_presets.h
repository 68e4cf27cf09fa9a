// tools/planner/workerd_presets.h: workerd's own model shapes as planner presets (issue 14; docs/planner.md,
// "workerd presets"): `dhsctl plan --preset workerd:glm5-like` plans the small-scale model workerd runs under that name,
// without a running node.
//
// Derived, not re-typed: the model is workerd's PresetConfig (workerd/model/config.h), the sizes workerd's
// ComputeGeometry under a default WorkerConfig (adaptive, p = 64, N = 8, B and T automatic, speculation off), the shape
// the Hello a worker of that configuration would send (MakeHello -> WorkerShapeOf), and the topology the one a live
// plan builds from it (TopologyFromWorker). So a plan of `workerd:NAME` equals `plan --live` against a workerd started
// with `--preset NAME` and default sizes.
//
// Thread-safety: pure functions (ComputeGeometry reads no file with speculation off).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/planner/planner.h"

namespace dhs::planner {

inline constexpr std::string_view kWorkerdPresetPrefix = "workerd:";

// "workerd:" + each of workerd's model presets (model::PresetNames(): dsv4flash-like, glm5-like, bench-wide).
std::vector<std::string> WorkerdPresetNames();

// The topology of `name` ("workerd:MODEL"). Errors: NOT_FOUND naming the preset and the known names;
// ComputeGeometry's errors (none for the built-in models at the default config).
absl::StatusOr<Topology> WorkerdPreset(std::string_view name);

}  // namespace dhs::planner
