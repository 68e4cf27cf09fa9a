// dhs-gen-weights: writes the built-in model's weights for a preset from a seed (safetensors; brief §11).
//   dhs-gen-weights --preset NAME --seed N --out FILE
// Deterministic: the same preset and seed give the same bytes. Exit status 0 on success, 1 on an error (printed).
#include <cstdint>
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "workerd/model/config.h"
#include "workerd/model/weights.h"

int main(int argc, char** argv) {
  CLI::App app{"Write the built-in model's seeded weights as a safetensors file"};
  std::string preset;
  uint64_t seed = 0;
  std::string out;
  app.add_option("--preset", preset, "model preset: dsv4flash-like | glm5-like | bench-wide")->required();
  app.add_option("--seed", seed, "random seed")->required();
  app.add_option("--out", out, "output file")->required();
  CLI11_PARSE(app, argc, argv);

  auto config = dhs::model::PresetConfig(preset);
  if (!config.ok()) {
    std::cerr << "dhs-gen-weights: " << config.status().message() << "\n";
    return 1;
  }
  auto writer = dhs::model::GenerateWeights(*config, seed);
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
