// fuzz/make_seeds.cc: writes the safetensors seeds of fuzz/corpus/safetensors/ (a tiny valid model of each layer
// kind, built by GenerateWeights on a small custom config). Not part of the build; run by hand when the weights
// layout changes:
//   g++ -std=c++20 -I. -Ibuild fuzz/make_seeds.cc build/workerd/model/libdhs_model.a $(pkg-config --libs absl_status ...)
// (tools/fuzz.sh does not need it: the seeds are committed).
#include <cstdio>
#include <string>

#include "workerd/model/config.h"
#include "workerd/model/weights.h"

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "fuzz/corpus/safetensors";
  using dhs::model::LayerKind;
  struct Seed {
    const char* name;
    std::vector<dhs::model::LayerSpec> layers;
  };
  const Seed seeds[] = {
      {"seed-tiny-write-reuse-reindex", {{LayerKind::kWrite, 0}, {LayerKind::kReuse, 0}, {LayerKind::kReindex, 0}}},
      {"seed-tiny-producer-follower", {{LayerKind::kProducer, 0}, {LayerKind::kFollower, 1}}},
  };
  for (const Seed& s : seeds) {
    dhs::model::ModelConfig c;
    c.d_model = 8;
    c.d_ff = 8;
    c.n_heads = 1;
    c.d_c = 4;
    c.d_r = 2;
    c.idx_heads = 1;
    c.idx_dim = 4;
    c.top_k = 2;
    c.local_window = 1;
    c.layers = s.layers;
    if (auto st = c.Validate(); !st.ok()) {
      std::fprintf(stderr, "%s: %s\n", s.name, st.ToString().c_str());
      return 1;
    }
    auto w = dhs::model::GenerateWeights(c, 1);
    if (!w.ok()) {
      std::fprintf(stderr, "%s: %s\n", s.name, w.status().ToString().c_str());
      return 1;
    }
    if (auto st = w->WriteFile(dir + "/" + s.name); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
  }
  return 0;
}
