#include "tools/node/node_config.h"

#include <algorithm>
#include <cctype>
#include <span>
#include <limits>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/transport.h"
#include "memd/memd_flags.h"       // kMemdFlags: memd's flags, one list
#include "workerd/worker_flags.h"  // kWorkerFlags: workerd's flags, one list
#include "toml++/toml.h"

namespace dhs::node {
namespace {

constexpr uint64_t kI64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// One key of a table: how it is read and which daemon flag takes it ("" = a key of dhs-node itself). The daemons'
// keys are their own lists (memd/memd_flags.h, workerd/worker_flags.h); dhs-node's [node] and [supervise] are here.
using KeySpec = DaemonFlag;

const KeySpec kNodeKeys[] = {
    {"run_dir", "", KeySpec::kString},
    {"memd_path", "", KeySpec::kString},
    {"workerd_path", "", KeySpec::kString},
};

const KeySpec kSuperviseKeys[] = {
    {"backoff_initial_ms", "", KeySpec::kUint, 1, 3600000},
    {"backoff_max_ms", "", KeySpec::kUint, 1, 86400000},
    {"backoff_reset_ms", "", KeySpec::kUint, 0, 86400000},
    {"max_restarts", "", KeySpec::kUint, 0, 1000000},
    {"restart_window_s", "", KeySpec::kUint, 1, 86400 * 365},
    {"stop_grace_ms", "", KeySpec::kUint, 1, 3600000},
    {"start_timeout_ms", "", KeySpec::kUint, 1, 86400000},
    {"probe_interval_ms", "", KeySpec::kUint, 1, 60000},
    {"restart_workers_with_memd", "", KeySpec::kBool},
    {"liveness_probe_ms", "", KeySpec::kUint, 100, 60000},
    {"memd_liveness_timeout_ms", "", KeySpec::kUint, 0, 3600000},
    {"worker_liveness_timeout_ms", "", KeySpec::kUint, 0, 3600000},  // issue 22: worker liveness
};

absl::Status KeyError(absl::string_view path, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", problem));
}

std::string TypeName(const toml::node& v) {
  switch (v.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    default: return "a date or time";
  }
}

absl::StatusOr<uint64_t> ReadNumber(const KeySpec& spec, const toml::node& v, absl::string_view path) {
  uint64_t n = 0;
  if (const auto* i = v.as_integer()) {
    if (i->get() < 0) return KeyError(path, absl::StrCat("must not be negative, got ", i->get()));
    n = static_cast<uint64_t>(i->get());
  } else if (const auto* s = v.as_string(); s != nullptr && spec.kind == KeySpec::kSize) {
    absl::StatusOr<uint64_t> size = ParseByteSize(std::string_view(s->get()));
    if (!size.ok()) return KeyError(path, size.status().message());
    n = *size;
  } else {
    const char* expected = spec.kind == KeySpec::kSize ? "an integer or a size string" : "an integer";
    return KeyError(path, absl::StrCat("expected ", expected, ", got ", TypeName(v)));
  }
  const uint64_t max = std::min(spec.max, kI64);  // a TOML integer is an int64
  if (n < spec.min || n > max) return KeyError(path, absl::StrFormat("%d is out of range [%d, %d]", n, spec.min, max));
  return n;
}

// The value of `v` for `spec` as the daemon's flag takes it.
absl::StatusOr<std::string> ReadValue(const KeySpec& spec, const toml::node& v, absl::string_view path) {
  switch (spec.kind) {
    case KeySpec::kUint:
    case KeySpec::kSize: {
      absl::StatusOr<uint64_t> n = ReadNumber(spec, v, path);
      if (!n.ok()) return n.status();
      return absl::StrCat(*n);
    }
    case KeySpec::kFraction: {
      double x = 0;
      if (const auto* f = v.as_floating_point()) {
        x = f->get();
      } else if (const auto* i = v.as_integer()) {
        x = static_cast<double>(i->get());
      } else {
        return KeyError(path, absl::StrCat("expected a number in [0, 1], got ", TypeName(v)));
      }
      if (!(x >= 0.0 && x <= 1.0)) return KeyError(path, absl::StrFormat("%g is out of range [0, 1]", x));
      return absl::StrFormat("%.17g", x);
    }
    case KeySpec::kBool:
      if (!v.is_boolean()) return KeyError(path, absl::StrCat("expected a boolean, got ", TypeName(v)));
      return std::string(v.as_boolean()->get() ? "true" : "false");
    case KeySpec::kString:
    case KeySpec::kChoice:
      break;
  }
  const auto* s = v.as_string();
  if (s == nullptr) return KeyError(path, absl::StrCat("expected a string, got ", TypeName(v)));
  const std::string& text = s->get();
  if (spec.kind == KeySpec::kString) {
    if (text.empty()) return KeyError(path, "must not be empty");
    if (text.find('\0') != std::string::npos) return KeyError(path, "must not contain a NUL byte");
    return text;
  }
  const std::vector<std::string> choices = spec.choices();
  if (std::find(choices.begin(), choices.end(), text) != choices.end()) return text;
  return KeyError(path, absl::StrFormat("'%s' is not one of %s", text, absl::StrJoin(choices, ", ")));
}

// Every key of `table` (named `path`) against `specs`; `extra` keys (handled by the caller) are skipped.
absl::StatusOr<Settings> ReadTable(const toml::table& table, absl::string_view path, std::span<const KeySpec> specs,
                                   std::initializer_list<absl::string_view> extra = {}) {
  Settings out;
  for (auto&& [key, value] : table) {
    const absl::string_view name(key.str().data(), key.str().size());
    const std::string key_path = absl::StrCat(path, ".", name);
    if (std::find(extra.begin(), extra.end(), name) != extra.end()) continue;
    const KeySpec* spec = nullptr;
    for (const KeySpec& s : specs) {
      if (name == absl::string_view(s.key.data(), s.key.size())) spec = &s;
    }
    if (spec == nullptr) return KeyError(key_path, "unknown key");
    absl::StatusOr<std::string> v = ReadValue(*spec, value, key_path);
    if (!v.ok()) return v.status();
    out[std::string(name)] = *std::move(v);
  }
  return out;
}

const toml::table* TableAt(const toml::table& root, absl::string_view name, absl::Status& error) {
  const toml::node* n = root.get(std::string_view(name.data(), name.size()));
  if (n == nullptr) return nullptr;
  if (!n->is_table()) error = KeyError(name, absl::StrCat("expected a table, got ", TypeName(*n)));
  return n->as_table();
}

absl::Status ReadNode(const toml::table& root, NodeConfig& c) {
  absl::Status error;
  const toml::table* t = TableAt(root, "node", error);
  if (!error.ok()) return error;
  if (t == nullptr) return KeyError("node.run_dir", "missing (the run directory of memd and the workers)");
  absl::StatusOr<Settings> s = ReadTable(*t, "node", kNodeKeys);
  if (!s.ok()) return s.status();
  if (!s->contains("run_dir")) return KeyError("node.run_dir", "missing (the run directory of memd and the workers)");
  c.run_dir = (*s)["run_dir"];
  if (s->contains("memd_path")) c.memd_path = (*s)["memd_path"];
  if (s->contains("workerd_path")) c.workerd_path = (*s)["workerd_path"];
  return absl::OkStatus();
}

absl::Status ReadMemd(const toml::table& root, NodeConfig& c) {
  absl::Status error;
  const toml::table* t = TableAt(root, "memd", error);
  if (!error.ok()) return error;
  if (t == nullptr) return KeyError("memd.host_pool_bytes", "missing (give memd.host_pool_bytes or host_pool_pages)");
  absl::StatusOr<Settings> s = ReadTable(*t, "memd", memd::kMemdFlags);
  if (!s.ok()) return s.status();
  const bool bytes = s->contains("host_pool_bytes"), pages = s->contains("host_pool_pages");
  if (bytes && pages) return KeyError("memd.host_pool_pages", "excludes memd.host_pool_bytes (give one of them)");
  if (!bytes && !pages) {
    return KeyError("memd.host_pool_bytes", "missing (give memd.host_pool_bytes or host_pool_pages)");
  }
  if (auto it = s->find("page_bytes"); it != s->end() && std::stoull(it->second) % 64 != 0) {
    return KeyError("memd.page_bytes", absl::StrCat("must be a multiple of 64, got ", it->second));
  }
  // Issue 24: the host tier's own keys mean nothing without it (memd refuses them too).
  const auto sharing = s->find("prefix_sharing");
  if (sharing == s->end() || sharing->second != "on") {
    for (const char* key : {"prefix_eviction", "prefix_tenant_quota_pages"}) {
      if (s->contains(key)) return KeyError(absl::StrCat("memd.", key), "needs memd.prefix_sharing = \"on\"");
    }
    if (auto it = s->find("kv_events"); it != s->end() && it->second == "on") {
      return KeyError("memd.kv_events", "needs memd.prefix_sharing = \"on\"");
    }
    // Issue 26: the cluster tier shares the host tier's pages.
    if (auto it = s->find("cluster_store"); it != s->end() && !it->second.empty()) {
      return KeyError("memd.cluster_store", "needs memd.prefix_sharing = \"on\"");
    }
  }
  c.memd = *std::move(s);
  return absl::OkStatus();
}

absl::Status ReadWorker(const toml::node& node, size_t index, NodeConfig& c, std::map<GpuId, size_t>& seen) {
  const std::string path = absl::StrCat("worker[", index, "]");
  const toml::table* t = node.as_table();
  if (t == nullptr) return KeyError(path, absl::StrCat("expected a table, got ", TypeName(node)));
  absl::StatusOr<Settings> s = ReadTable(*t, path, kWorkerFlags, {"extra_args"});
  if (!s.ok()) return s.status();
  WorkerEntry w;
  if (!s->contains("gpu")) return KeyError(path + ".gpu", "missing (the GPU this worker serves)");
  w.gpu = static_cast<GpuId>(std::stoul((*s)["gpu"]));
  s->erase("gpu");
  if (s->contains("weights") && s->contains("preset")) {
    return KeyError(path + ".preset", "excludes weights (a worker loads a weights file or a preset)");
  }
  if (auto [it, fresh] = seen.emplace(w.gpu, index); !fresh) {
    return KeyError(path + ".gpu", absl::StrFormat("GPU %d is already configured by worker[%d]", w.gpu, it->second));
  }
  if (const toml::node* extra = t->get("extra_args")) {
    const toml::array* a = extra->as_array();
    if (a == nullptr) return KeyError(path + ".extra_args", absl::StrCat("expected an array, got ", TypeName(*extra)));
    for (size_t i = 0; i < a->size(); ++i) {
      const auto* str = a->get(i)->as_string();
      const std::string item_path = absl::StrCat(path, ".extra_args[", i, "]");
      if (str == nullptr) return KeyError(item_path, absl::StrCat("expected a string, got ", TypeName(*a->get(i))));
      if (str->get().find('\0') != std::string::npos) return KeyError(item_path, "must not contain a NUL byte");
      w.extra_args.push_back(str->get());
    }
  }
  w.settings = *std::move(s);
  c.workers.push_back(std::move(w));
  return absl::OkStatus();
}

absl::Status ReadWorkers(const toml::table& root, NodeConfig& c) {
  const toml::node* n = root.get("worker");
  if (n == nullptr) return KeyError("worker", "missing (one [[worker]] table per GPU)");
  const toml::array* a = n->as_array();
  if (a == nullptr) {
    return KeyError("worker", absl::StrCat("expected an array of tables ([[worker]]), got ", TypeName(*n)));
  }
  if (a->empty()) return KeyError("worker", "missing (one [[worker]] table per GPU)");
  std::map<GpuId, size_t> seen;
  for (size_t i = 0; i < a->size(); ++i) {
    if (absl::Status s = ReadWorker(*a->get(i), i, c, seen); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ReadSupervise(const toml::table& root, NodeConfig& c) {
  absl::Status error;
  const toml::table* t = TableAt(root, "supervise", error);
  if (!error.ok() || t == nullptr) return error;
  absl::StatusOr<Settings> s = ReadTable(*t, "supervise", kSuperviseKeys);
  if (!s.ok()) return s.status();
  SupervisorPolicy& p = c.supervise;
  auto num = [&](const char* key, auto& field, int64_t scale = 1) {
    if (auto it = s->find(key); it != s->end()) {
      field = static_cast<std::decay_t<decltype(field)>>(std::stoll(it->second) * scale);
    }
  };
  num("backoff_initial_ms", p.backoff_initial_ms);
  num("backoff_max_ms", p.backoff_max_ms);
  num("backoff_reset_ms", p.backoff_reset_ms);
  num("max_restarts", p.max_restarts);
  num("restart_window_s", p.restart_window_ms, 1000);
  num("stop_grace_ms", p.stop_grace_ms);
  num("start_timeout_ms", p.start_timeout_ms);
  num("probe_interval_ms", p.probe_interval_ms);
  num("liveness_probe_ms", p.liveness_probe_ms);
  num("memd_liveness_timeout_ms", p.memd_liveness_timeout_ms);
  num("worker_liveness_timeout_ms", p.worker_liveness_timeout_ms);
  if (auto it = s->find("restart_workers_with_memd"); it != s->end()) {
    p.restart_workers_with_memd = it->second == "true";
  }
  if (p.backoff_max_ms < p.backoff_initial_ms) {
    return KeyError("supervise.backoff_max_ms", absl::StrFormat("%d is below supervise.backoff_initial_ms (%d)",
                                                                p.backoff_max_ms, p.backoff_initial_ms));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(std::string_view text_in) {
  const absl::string_view text(text_in.data(), text_in.size());
  const absl::string_view t = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < t.size() && absl::ascii_isdigit(static_cast<unsigned char>(t[digits]))) ++digits;
  uint64_t n = 0;
  if (digits == 0 || !absl::SimpleAtoi(t.substr(0, digits), &n)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a size (digits, then K/M/G/T or KiB..TiB)"));
  }
  if (digits < t.size() && (t[digits] == '.' || t[digits] == ',')) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "': a size is a whole number (e.g. \"1536MiB\" for 1.5 GiB)"));
  }
  std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(t.substr(digits)));
  if (unit.size() == 2 && unit[1] == 'b') unit.pop_back();  // "KB" = "K"
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"", 1}, {"b", 1}, {"k", 1000}, {"m", 1000000}, {"g", 1000000000}, {"t", 1000000000000},
      {"kib", 1ull << 10}, {"mib", 1ull << 20}, {"gib", 1ull << 30}, {"tib", 1ull << 40}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    if (n > std::numeric_limits<uint64_t>::max() / scale) {
      return absl::InvalidArgumentError(absl::StrCat("'", text, "' is beyond 2^64-1 bytes"));
    }
    return n * scale;
  }
  return absl::InvalidArgumentError(absl::StrCat("'", text, "': unknown unit (K, M, G, T, KiB, MiB, GiB, TiB)"));
}

absl::StatusOr<NodeConfig> ParseNodeConfig(std::string_view toml_text) {
  toml::table root;
  try {
    root = toml::parse(toml_text);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    return absl::InvalidArgumentError(
        absl::StrFormat("line %d, column %d: %s", where.line, where.column, std::string(e.description())));
  }
  for (auto&& [key, value] : root) {
    const absl::string_view name(key.str().data(), key.str().size());
    if (name != "node" && name != "memd" && name != "worker" && name != "supervise") {
      return KeyError(name, "unknown table (node, memd, worker, supervise)");
    }
  }
  NodeConfig c;
  for (auto read : {ReadNode, ReadMemd, ReadWorkers, ReadSupervise}) {
    if (absl::Status s = read(root, c); !s.ok()) return s;
  }
  for (const WorkerEntry& w : c.workers) {
    if (absl::Status s = CheckSocketPaths(c.run_dir, w.gpu); !s.ok()) return KeyError("node.run_dir", s.message());
  }
  return c;
}

std::vector<std::string> MemdArgs(const NodeConfig& config, uint64_t page_bytes) {
  std::vector<std::string> args = {"--run-dir", config.run_dir};
  if (!config.memd.contains("page_bytes")) args.insert(args.end(), {"--page-bytes", absl::StrCat(page_bytes)});
  for (const KeySpec& spec : memd::kMemdFlags) {
    if (auto it = config.memd.find(std::string(spec.key)); it != config.memd.end()) {
      args.insert(args.end(), {std::string(spec.flag), it->second});
    }
  }
  return args;
}

std::vector<std::string> WorkerArgs(const NodeConfig& config, size_t index) {
  const WorkerEntry& w = config.workers.at(index);
  std::vector<std::string> args = {"--run-dir", config.run_dir, "--gpu", absl::StrCat(w.gpu)};
  for (const KeySpec& spec : kWorkerFlags) {
    if (auto it = w.settings.find(std::string(spec.key)); it != w.settings.end()) {
      args.insert(args.end(), {std::string(spec.flag), it->second});
    }
  }
  args.insert(args.end(), w.extra_args.begin(), w.extra_args.end());
  return args;
}

}  // namespace dhs::node
