// tools/planner/plan_command.cc: see plan_command.h.
#include "tools/planner/plan_command.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_join.h"
#include "tools/planner/planner.h"
#include "tools/planner/workerd_presets.h"

namespace dhs::planner {
namespace {

const CLI::Validator kDecimal(
    [](std::string& v) {
      if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos) {
        return "must be a non-negative integer, got '" + v + "'";
      }
      return std::string();
    },
    "", "INT");

std::vector<std::string> AllPresetNames() {
  std::vector<std::string> names = PresetNames();
  for (std::string& n : WorkerdPresetNames()) names.push_back(std::move(n));
  return names;
}

void PrintError(const std::string& prefix, const absl::Status& status) {
  std::fprintf(stderr, "dhsctl plan%s: %s\n", prefix.c_str(), std::string(status.message()).c_str());
}

}  // namespace

CLI::App* AddPlanSubcommand(CLI::App& app, PlanCommandOptions* o) {
  CLI::App* plan = app.add_subcommand(
      "plan", "capacity plan from a model preset, a description (no memd needed) or the live worker's shape (--live)");
  auto* preset = plan->add_option("--preset", o->preset, "model preset: " + absl::StrJoin(AllPresetNames(), ", "))
                     ->check(CLI::IsMember(AllPresetNames()));
  auto* file = plan->add_option("--file", o->file, "JSON description of the topology (docs/planner.md)");
  preset->excludes(file);
  file->excludes(preset);
  plan->add_option("--context", o->context_tokens, "context length n, tokens (>= 1)")->check(kDecimal)->required();
  plan->add_option("--hot-rows", o->hot_rows, "hot-cache rows B per request and layer (overrides the preset)")->check(kDecimal);
  plan->add_option("--tail-rows", o->tail_rows, "tail rows per request and layer, a multiple of p")->check(kDecimal);
  plan->add_option("--slots", o->slots, "request slots N per GPU (sizes the draft ring and staging per GPU)")->check(kDecimal);
  plan->add_option("--metadata-bytes-per-hot-slot", o->metadata_bytes_per_hot_slot,
                   "GPU metadata per hot slot and index producer, bytes")->check(kDecimal);
  plan->add_option("--hbm-bytes", o->hbm_bytes, "KV budget of one GPU, bytes: sessions per GPU")->check(kDecimal);
  plan->add_option("--host-bytes", o->host_bytes, "host-tier budget of one host, bytes: sessions per host")->check(kDecimal);
  plan->add_option("--miss-rate", o->miss_rate, "share of selected rows recovered from host, in [0, 1]")
      ->capture_default_str();
  plan->add_option("--tpot-base-ms", o->tpot_base_ms, "per-token latency without the drafter, ms (brief §6)");
  plan->add_option("--tpot-spec-ms", o->tpot_spec_ms, "per-token latency with the drafter, ms (brief §6)");
  plan->add_flag("--json", o->json, "print JSON (sizes in bytes) instead of a table");
  plan->add_flag("--live", o->live,
                 "also: what the running memd would admit now, in sessions of this shape (without --preset / --file: "
                 "the shape its worker declared)");
  plan->add_option("--gpu", o->gpu, "with --live: this GPU only (its worker's shape without --preset / --file)")
      ->check(kDecimal);
  return plan;
}

namespace {

// RunPlanCommand's phases. Each returns the command's exit code (plan_command.h) when it fails, else 0: go on.

// --live: memd's state (`status`), fetched and read.
int ReadLiveState(const FetchStatusJson& fetch_status, std::optional<LiveState>& state) {
  absl::StatusOr<std::string> status =
      fetch_status ? fetch_status() : absl::UnavailableError("no connection to memd");
  if (!status.ok()) {
    PrintError(" --live", status.status());
    return absl::IsUnavailable(status.status()) ? 1 : absl::IsDeadlineExceeded(status.status()) ? 3 : 4;
  }
  absl::StatusOr<LiveState> s = LiveStateFromStatusJson(*status);
  if (!s.ok()) {
    PrintError(" --live", s.status());
    return 4;
  }
  state = *std::move(s);
  return 0;
}

// --file: the topology described in the file.
int TopologyFromFile(const std::string& path, Topology& topology) {
  std::ifstream f(path);
  if (!f) {
    std::fprintf(stderr, "dhsctl plan: cannot read --file %s\n", path.c_str());
    return 1;
  }
  std::stringstream text;
  text << f.rdbuf();
  absl::StatusOr<Topology> t = TopologyFromJson(text.str());
  if (!t.ok()) {
    PrintError(" --file " + path, t.status());
    return 2;
  }
  topology = *t;
  return 0;
}

// --preset: a brief-scale preset or a workerd model ("workerd:NAME").
int TopologyFromPreset(const std::string& name, Topology& topology) {
  absl::StatusOr<Topology> t = name.starts_with(kWorkerdPresetPrefix) ? WorkerdPreset(name) : Preset(name);
  if (!t.ok()) {
    PrintError(" --preset", t.status());
    return 2;
  }
  topology = *t;
  return 0;
}

// Why --live found no GPU to take the shape of (GPU `gpu`, or without --gpu any live one), on stderr.
void PrintNoLiveGpu(const LiveState& state, std::optional<uint32_t> gpu) {
  std::string known, fenced;
  for (const LiveGpu& g : state.gpus) known += (known.empty() ? "" : ", ") + std::to_string(g.gpu);
  for (uint32_t g : state.fenced_gpus) fenced += (fenced.empty() ? "" : ", ") + std::to_string(g);
  constexpr const char* kFenced =
      "its worker exited or stopped answering: memd admits nothing there until a worker says Hello again";
  if (gpu && std::find(state.fenced_gpus.begin(), state.fenced_gpus.end(), *gpu) != state.fenced_gpus.end()) {
    std::fprintf(stderr, "dhsctl plan --live: --gpu: GPU %u is fenced (%s; live GPUs: %s)\n", *gpu, kFenced,
                 known.empty() ? "none" : known.c_str());
  } else if (gpu) {
    std::fprintf(stderr, "dhsctl plan --live: --gpu: GPU %u is not registered with memd (live GPUs: %s%s%s)\n",
                 *gpu, known.empty() ? "none" : known.c_str(), fenced.empty() ? "" : "; fenced: ",
                 fenced.c_str());
  } else if (!fenced.empty()) {
    std::fprintf(stderr, "dhsctl plan --live: memd has no live GPU: fenced %s (%s); give --preset or --file to "
                         "plan without one\n", fenced.c_str(), kFenced);
  } else {
    std::fprintf(stderr, "dhsctl plan --live: memd has no GPU registered (no worker said Hello): give --preset or "
                         "--file to plan without one\n");
  }
}

// --live without --preset / --file: the shape the worker of GPU --gpu (default: the first registered one) declared
// in its Hello; `live_options` then counts that GPU only, in its serving mode, and `shape_of_gpu` names it.
int TopologyFromLiveWorker(const LiveState& state, std::optional<uint32_t> want, Topology& topology,
                           LiveOptions& live_options, std::optional<uint32_t>& shape_of_gpu) {
  const LiveGpu* gpu = nullptr;
  for (const LiveGpu& g : state.gpus) {
    if (!want || g.gpu == *want) {
      gpu = &g;
      break;
    }
  }
  if (gpu == nullptr) {
    PrintNoLiveGpu(state, want);
    return 2;
  }
  const WorkerShape shape = gpu->worker.value_or(WorkerShape{});  // none: TopologyFromWorker says so
  absl::StatusOr<Topology> t =
      TopologyFromWorker(shape, "worker of GPU " + std::to_string(gpu->gpu) + " (" + shape.serving_mode + ")");
  if (!t.ok()) {
    std::fprintf(stderr, "dhsctl plan --live: GPU %u: %s\n", gpu->gpu, std::string(t.status().message()).c_str());
    return 2;
  }
  topology = *t;
  shape_of_gpu = gpu->gpu;
  live_options.gpu = gpu->gpu;
  live_options.resident = shape.serving_mode == "resident";
  return 0;
}

// The topology the options name: --file, --preset or (--live alone) the live worker's shape.
int ChooseTopology(const PlanCommandOptions& o, const std::optional<LiveState>& state, Topology& topology,
                   LiveOptions& live_options, std::optional<uint32_t>& shape_of_gpu) {
  if (!o.file.empty()) return TopologyFromFile(o.file, topology);
  if (!o.preset.empty()) return TopologyFromPreset(o.preset, topology);
  if (state) return TopologyFromLiveWorker(*state, o.gpu, topology, live_options, shape_of_gpu);
  std::fprintf(stderr, "dhsctl plan: give --preset NAME, --file DESCRIPTION.json, or --live (the running worker's "
                       "shape)\n");
  return 2;
}

// The planner's input: the topology with the options' overrides, the context, the budgets and the figures.
PlanInput MakePlanInput(const PlanCommandOptions& o, const Topology& topology) {
  PlanInput in;
  in.topology = topology;
  if (o.hot_rows) in.topology.hot_rows = *o.hot_rows;
  if (o.tail_rows) in.topology.tail_rows = *o.tail_rows;
  if (o.slots) in.topology.slots = *o.slots;
  if (o.metadata_bytes_per_hot_slot) in.topology.metadata_bytes_per_hot_slot = *o.metadata_bytes_per_hot_slot;
  in.context_tokens = o.context_tokens;
  in.hbm_bytes = o.hbm_bytes;
  in.host_bytes = o.host_bytes;
  in.miss_rate = o.miss_rate;
  in.tpot_base_ms = o.tpot_base_ms;
  in.tpot_spec_ms = o.tpot_spec_ms;
  return in;
}

// The plan (with the live one under --live) as a table or JSON on stdout.
int PrintPlan(const Plan& plan, const std::optional<LiveState>& state, const LiveOptions& live_options, bool json) {
  std::optional<LivePlan> live;
  if (state) {
    absl::StatusOr<LivePlan> lp = ComputeLive(plan, *state, live_options);
    if (!lp.ok()) {
      if (absl::IsNotFound(lp.status())) {
        std::fprintf(stderr, "dhsctl plan --live: --gpu: %s\n", std::string(lp.status().message()).c_str());
      } else {
        PrintError(" --live", lp.status());
      }
      return 2;
    }
    live = *lp;
  }
  std::string out;
  if (json) {
    nlohmann::json j = PlanToJson(plan);
    if (live) j["live"] = LivePlanToJson(*live);
    out = j.dump(2) + "\n";
  } else {
    out = PlanToTable(plan) + (live ? LivePlanToTable(*live) : std::string());
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int RunPlanCommand(const PlanCommandOptions& o, bool json, const FetchStatusJson& fetch_status) {
  if (o.gpu && !o.live) {
    std::fprintf(stderr, "dhsctl plan: --gpu needs --live\n");
    return 2;
  }
  // memd's state first with --live: without --preset / --file the topology is its worker's.
  std::optional<LiveState> state;
  if (o.live) {
    if (const int code = ReadLiveState(fetch_status, state); code != 0) return code;
  }
  Topology topology;
  LiveOptions live_options;
  std::optional<uint32_t> shape_of_gpu;  // the topology is the shape this GPU's worker declared
  live_options.gpu = o.gpu;
  if (const int code = ChooseTopology(o, state, topology, live_options, shape_of_gpu); code != 0) return code;
  absl::StatusOr<Plan> plan = Compute(MakePlanInput(o, topology));
  if (!plan.ok()) {
    // The field may be one the user never gave: say where the topology came from (`dhsctl status` shows it).
    const std::string from =
        shape_of_gpu ? " (the topology is the shape GPU " + std::to_string(*shape_of_gpu) +
                           "'s worker declared in its Hello, with the options given; `dhsctl status` shows it)"
                     : "";
    std::fprintf(stderr, "dhsctl plan: %s%s\n", std::string(plan.status().message()).c_str(), from.c_str());
    return 2;
  }
  return PrintPlan(*plan, state, live_options, json || o.json);
}

}  // namespace dhs::planner
