// workerd/model/step_profile.cc: the opt-in step-time split (see step_profile.h).
#include "workerd/model/step_profile.h"

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "absl/strings/str_format.h"

namespace dhs::model {

StepProfile* StepProfile::Get() {
  static StepProfile* const profile = [] {
    const char* v = std::getenv("DHS_STEP_PROFILE");
    return v && *v && std::string_view(v) != "0" ? new StepProfile() : nullptr;  // lives as long as the process
  }();
  return profile;
}

void StepProfile::StepBegin() {
  step_start_ = Clock::now();
  for (int64_t& ns : step_ns_) ns = 0;
  step_outside_ns_ =
      has_last_end_ ? std::chrono::duration_cast<std::chrono::nanoseconds>(step_start_ - last_end_).count() : 0;
}

void StepProfile::StepEnd(int64_t queries, int64_t requests) {
  last_end_ = Clock::now();
  has_last_end_ = true;
  Totals& t = totals_[queries == requests ? 1 : 0];
  t.wall_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(last_end_ - step_start_).count();
  t.outside_ns += step_outside_ns_;
  for (int p = 0; p < static_cast<int>(StepPhase::kCount); ++p) t.phase_ns[p] += step_ns_[p];
  ++t.steps;
  t.queries += queries;
  std::fprintf(stderr, "%s\n%s\n", Line(queries == requests).c_str(), LoopLine().c_str());  // a few µs a step
  std::fflush(stderr);
}

void StepProfile::ImportChunkEnd() {
  ++import_chunks_;
  std::fprintf(stderr, "%s\n", LoopLine().c_str());
  std::fflush(stderr);
}

std::string StepProfile::LoopLine() const {
  auto ms = [&](LoopPhase p) { return static_cast<double>(loop_ns_[static_cast<int>(p)]) / 1e6; };
  return absl::StrFormat(
      "step profile: loop import_chunks %d import_ms %.3f import_append_ms %.3f import_keys_ms %.3f poll_ms %.3f "
      "at_ms %.3f",
      import_chunks_, ms(LoopPhase::kImport), ms(LoopPhase::kImportAppend), ms(LoopPhase::kImportKeys),
      ms(LoopPhase::kPoll),
      static_cast<double>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count()) / 1e6);
}

std::string StepProfile::Line(bool decode) const {
  const Totals& t = totals_[decode ? 1 : 0];
  auto ms = [](int64_t ns) { return static_cast<double>(ns) / 1e6; };
  auto phase = [&](StepPhase p) { return ms(t.phase_ns[static_cast<int>(p)]); };
  int64_t timed = 0;
  for (int64_t ns : t.phase_ns) timed += ns;
  return absl::StrFormat(
      "step profile: %s steps %d queries %d wall_ms %.3f model_ms %.3f index_topk_ms %.3f fetch_ms %.3f "
      "append_ms %.3f release_ms %.3f outside_ms %.3f at_ms %.3f",
      decode ? "decode" : "mixed", t.steps, t.queries, ms(t.wall_ns), ms(t.wall_ns - timed),
      phase(StepPhase::kIndexTopK), phase(StepPhase::kFetch), phase(StepPhase::kAppend), phase(StepPhase::kRelease),
      ms(t.outside_ns), ms(std::chrono::duration_cast<std::chrono::nanoseconds>(last_end_.time_since_epoch()).count()));
}

}  // namespace dhs::model
