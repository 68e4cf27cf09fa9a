// tools/planner/workerd_presets.cc: see workerd_presets.h.
#include "tools/planner/workerd_presets.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/protocol.h"
#include "workerd/geometry.h"
#include "workerd/model/config.h"

namespace dhs::planner {

std::vector<std::string> WorkerdPresetNames() {
  std::vector<std::string> names;
  for (const std::string& m : model::PresetNames()) names.push_back(std::string(kWorkerdPresetPrefix) + m);
  return names;
}

absl::StatusOr<Topology> WorkerdPreset(std::string_view name) {
  const auto unknown = [&] {
    return absl::NotFoundError(absl::StrCat("unknown preset '", std::string(name),
                                            "' (known: ", absl::StrJoin(WorkerdPresetNames(), ", "), ")"));
  };
  if (!name.starts_with(kWorkerdPresetPrefix)) return unknown();
  absl::StatusOr<model::ModelConfig> model = model::PresetConfig(name.substr(kWorkerdPresetPrefix.size()));
  if (!model.ok()) return unknown();
  const WorkerConfig config;  // workerd's defaults (workerd --help)
  absl::StatusOr<WorkerGeometry> geometry = ComputeGeometry(*model, config);
  if (!geometry.ok()) return geometry.status();
  const absl::StatusOr<wire::HelloT> hello = MakeHello(*model, config, *geometry, "planner");
  if (!hello.ok()) return hello.status();
  return TopologyFromWorker(WorkerShapeOf(*hello), std::string(name));
}

}  // namespace dhs::planner
