// dhs-gen-weights: writes the built-in model's weights for a preset from a seed (safetensors; brief §11), or with
// --drafter the built-in drafter's weights (workerd/spec/drafter_model.h) paired with that preset's d_model.
//   dhs-gen-weights --preset NAME --seed N --out FILE
//   dhs-gen-weights --drafter --preset NAME --seed N --out FILE [--layers L] [--window W] [--k-max K]
// Deterministic: the same arguments give the same bytes. Exit status 0 on success, 1 on an error (printed).
#include <cstdint>
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "workerd/model/config.h"
#include "workerd/model/weights.h"
#include "workerd/spec/drafter_model.h"

int main(int argc, char** argv) {
  CLI::App app{"Write the built-in model's seeded weights as a safetensors file"};
  std::string preset;
  uint64_t seed = 0;
  std::string out;
  app.add_option("--preset", preset, "model preset: dsv4flash-like | glm5-like | bench-wide")->required();
  app.add_option("--seed", seed, "random seed")->required();
  app.add_option("--out", out, "output file")->required();
  bool drafter = false;
  dhs::spec::DrafterConfig dc;
  app.add_flag("--drafter", drafter, "write the drafter's weights (paired with the preset's d_model) instead");
  app.add_option("--layers", dc.n_layers, "drafter layers")->capture_default_str();
  app.add_option("--window", dc.window, "drafter attention window W (positions)")->capture_default_str();
  app.add_option("--k-max", dc.k_max, "drafter K_max (queries per round, anchor included)")->capture_default_str();
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
  if (auto s = writer->WriteFile(out); !s.ok()) {
    std::cerr << "dhs-gen-weights: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
