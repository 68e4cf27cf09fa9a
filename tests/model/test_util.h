// tests/model/test_util.h: helpers shared by the model tests: an in-memory model from a preset and a seed, and a
// KvAccess wrapper that counts calls and checks the reader protocol.
#pragma once

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "workerd/model/model.h"
#include "workerd/model/resident_kv_access.h"
#include "workerd/model/weights.h"

namespace dhs::model::testing {

inline std::unique_ptr<Model> MakeModel(const ModelConfig& config, uint64_t seed = 1) {
  auto writer = GenerateWeights(config, seed);
  EXPECT_TRUE(writer.ok()) << writer.status();
  auto file = SafetensorsFile::Parse(writer->Serialize());
  EXPECT_TRUE(file.ok()) << file.status();
  auto model = Model::FromSafetensors(*file);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(*model);
}

inline std::unique_ptr<Model> MakePreset(const std::string& preset, uint64_t seed = 1) {
  auto config = PresetConfig(preset);
  EXPECT_TRUE(config.ok()) << config.status();
  return MakeModel(*config, seed);
}

// Deterministic pseudo-text tokens.
inline std::vector<Token> Tokens(size_t n, uint32_t salt) {
  std::vector<Token> t(n);
  uint32_t x = salt * 2654435761u + 12345u;
  for (auto& v : t) {
    x = x * 1103515245u + 12345u;
    v = static_cast<Token>((x >> 16) & 0xff);
  }
  return t;
}

// Forwards to a ResidentKvAccess; records every Fetch (its source list and number of queries) and checks that no
// source is fetched again while readers of an earlier Fetch over it are still outstanding.
class CountingKvAccess : public KvAccess {
 public:
  explicit CountingKvAccess(KvAccess& inner) : inner_(inner) {}
  absl::Status Append(RequestId r, SourceId s, Position p, std::span<const uint8_t> row) override {
    appends++;
    return inner_.Append(r, s, p, row);
  }
  absl::Status Fetch(std::span<const SourceId> sources, std::span<KvQuery> batch) override {
    fetches.emplace_back(sources.begin(), sources.end());
    fetch_queries.push_back(batch.size());
    for (SourceId s : sources) {
      if (outstanding.contains(s)) protocol_errors++;
    }
    if (fail_fetch_number >= 0 && static_cast<int>(fetches.size()) - 1 == fail_fetch_number) {
      return absl::UnavailableError("injected copy failure");  // nothing resolved: no readers to finish
    }
    absl::Status st = inner_.Fetch(sources, batch);
    if (st.ok()) outstanding.insert(sources.begin(), sources.end());
    return st;
  }
  void ReadersDone(std::span<const SourceId> sources) override {
    for (SourceId s : sources) {
      if (!outstanding.erase(s)) protocol_errors++;
    }
    inner_.ReadersDone(sources);
  }
  void Release(RequestId r) override { inner_.Release(r); }

  KvAccess& inner_;
  int appends = 0;
  int protocol_errors = 0;
  int fail_fetch_number = -1;  // >= 0: that Fetch call (0-based) fails
  std::vector<std::vector<SourceId>> fetches;
  std::vector<size_t> fetch_queries;
  std::set<SourceId> outstanding;
};

}  // namespace dhs::model::testing
