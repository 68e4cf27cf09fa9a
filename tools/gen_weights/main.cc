// dhs-gen-weights: writes the built-in model's weights for a preset from a seed (safetensors; brief §11), or with
// --drafter the built-in drafter's weights (workerd/speculation/drafter_model.h) paired with that preset's d_model.
//   dhs-gen-weights --preset NAME --seed N --out FILE
//   dhs-gen-weights --drafter --preset NAME --seed N --out FILE [--layers L] [--window W] [--k-max K]
//                   [--distill-texts T --target-seed S]   (output layers fitted on T x 256 tokens sampled from the
//                                                          preset's target of seed S: workerd/speculation/drafter_distill.h)
// Deterministic: the same arguments give the same bytes. Exit status 0 on success, 1 on an error (printed).
#include <cstdint>
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_join.h"
#include "workerd/model/config.h"
#include "workerd/model/weights.h"
#include "workerd/model/model.h"
#include "workerd/speculation/drafter_distill.h"
#include "workerd/speculation/drafter_model.h"

// Replaces the drafter in `writer` by its distilled version (texts of 256 tokens sampled from the target, seed 7).
absl::Status Distill(const dhs::model::ModelConfig& target_config, uint64_t target_seed, int texts,
                     dhs::model::SafetensorsWriter& writer) {
  auto tw = dhs::model::GenerateWeights(target_config, target_seed);
  if (!tw.ok()) return tw.status();
  auto target = dhs::model::Model::FromSafetensors(*dhs::model::SafetensorsFile::Parse(tw->Serialize()));
  if (!target.ok()) return target.status();
  auto drafter = dhs::spec::DrafterModel::FromSafetensors(*dhs::model::SafetensorsFile::Parse(writer.Serialize()));
  if (!drafter.ok()) return drafter.status();
  auto data = dhs::spec::SampleTargetTexts(**target, texts, 256, 7);
  if (!data.ok()) return data.status();
  auto fitted = dhs::spec::DistillOutputLayers(**drafter, **target, *data, {});
  if (!fitted.ok()) return fitted.status();
  writer = (*fitted)->ToSafetensors();
  return absl::OkStatus();
}

int main(int argc, char** argv) {
  CLI::App app{"Write the built-in model's seeded weights as a safetensors file"};
  std::string preset;
  uint64_t seed = 0;
  std::string out;
  app.add_option("--preset", preset, "model preset: " + absl::StrJoin(dhs::model::PresetNames(), " | "))->required();
  app.add_option("--seed", seed, "random seed")->required();
  app.add_option("--out", out, "output file")->required();
  bool drafter = false;
  dhs::spec::DrafterConfig dc;
  app.add_flag("--drafter", drafter, "write the drafter's weights (paired with the preset's d_model) instead");
  app.add_option("--layers", dc.n_layers, "drafter layers")->capture_default_str();
  app.add_option("--window", dc.window, "drafter attention window W (positions)")->capture_default_str();
  app.add_option("--k-max", dc.k_max, "drafter K_max (queries per round, anchor included)")->capture_default_str();
  int distill_texts = 0;
  uint64_t target_seed = 1;
  app.add_option("--distill-texts", distill_texts, "drafter: fit its output layers on this many target texts");
  app.add_option("--target-seed", target_seed, "drafter distillation: seed of the target's weights")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  auto config = dhs::model::PresetConfig(preset);
  if (!config.ok()) {
    std::cerr << "dhs-gen-weights: " << config.status().message() << "\n";
    return 1;
  }
  dc.target_d_model = config->d_model;
  auto writer = drafter ? dhs::spec::GenerateDrafterWeights(dc, seed) : dhs::model::GenerateWeights(*config, seed);
  if (!writer.ok()) {
    std::cerr << "dhs-gen-weights: " << writer.status().message() << "\n";
    return 1;
  }
  if (drafter && distill_texts > 0) {
    absl::Status s = Distill(*config, target_seed, distill_texts, *writer);
    if (!s.ok()) {
      std::cerr << "dhs-gen-weights: " << s.message() << "\n";
      return 1;
    }
  }
  if (auto s = writer->WriteFile(out); !s.ok()) {
    std::cerr << "dhs-gen-weights: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
