// workerd/speculation/speculation_config.h: the worker's speculation options (brief §6 "Proposal modes"; issue 13), shared
// by workerd and dhs-replay: --speculate off|fixed|confidence|synthetic, --block K, --block-schedule,
// --spec-confidence, --spec-corruption, --drafter-weights FILE.
//
// Modes: off (plain decoding, the default); fixed (the drafter proposes K_r - 1 tokens); confidence (the drafter's
// prefix above a confidence threshold, ConfidencePrefix); synthetic (FOR BENCHMARKS ONLY: SyntheticProposer, the
// target's own greedy continuation corrupted with probability --spec-corruption). fixed and confidence need the
// drafter's weights (--drafter-weights FILE, made by dhs-gen-weights --drafter; workerd/speculation/drafter.h).
// Thread-safety: pure functions and plain values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dhs::spec {

enum class SpeculateMode { kOff, kFixed, kConfidence, kSynthetic };
std::string_view SpeculateModeName(SpeculateMode mode);
// "off" | "fixed" | "confidence" | "synthetic"; else INVALID_ARGUMENT naming the choices.
absl::StatusOr<SpeculateMode> ParseSpeculateMode(std::string_view name);

// --block-schedule's value that chooses the width online (OnlineBlockWidth: measured acceptance, step time, load).
inline constexpr std::string_view kOnlineSchedule = "online";

struct SpeculationConfig {
  SpeculateMode mode = SpeculateMode::kOff;
  int64_t block = 4;           // K_max: queries per round, anchor included (1 = no speculation), >= 1
  std::string schedule;        // BlockWidthSchedule text ("1:8,33:6,128:4"); empty = `block` at every load;
                               // "online" (kOnlineSchedule) = OnlineBlockWidth (online_block_width.h), up to `block`
  double confidence = 0.5;     // confidence mode's threshold, in [0, 1]
  double corruption = 0.0;     // synthetic mode: probability a proposal is corrupted, in [0, 1]
  std::string drafter_weights;  // fixed / confidence: the drafter's safetensors file (its d_model pairing checked at
                                // the worker's start)
};

// Checks the options against the worker's KV geometry. `max_block`: the widest round the KV serves
// (workerd/geometry.h WorkerGeometry::max_block: the tail must hold a page plus a block; without staging arenas,
// `staging` false, the union of the K_r queries' selections must also fit the hot cache). Errors: INVALID_ARGUMENT
// (block < 1, block or a schedule width above max_block, with the numbers and the limit that applies; a bad schedule;
// confidence or corruption outside [0, 1]; fixed / confidence without --drafter-weights).
absl::Status CheckSpeculation(const SpeculationConfig& config, int64_t max_block, bool staging = false);

}  // namespace dhs::spec
