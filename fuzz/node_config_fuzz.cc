// fuzz/node_config_fuzz.cc: libFuzzer target for dhs-node's configuration (tools/node/node_config.h, issue 12
// "Fuzzing"): the input is the TOML text. A configuration that parses must give command lines that hold for every
// worker what the parser promised (unique GPUs, --run-dir first, the GPU flag), and memd's page size is then resolved
// (node_geometry.h, the workers' own geometry code). Any error status is fine; a crash, a sanitizer report or a broken
// promise (__builtin_trap) is not. The same bytes also go to ParseByteSize, which must agree with a reference
// reading for plain digits.
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "tools/node/node_config.h"
#include "tools/node/node_geometry.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

void CheckConfig(const dhs::node::NodeConfig& c) {
  Check(!c.run_dir.empty() && !c.workers.empty());
  std::set<dhs::GpuId> gpus;
  for (size_t i = 0; i < c.workers.size(); ++i) {
    Check(gpus.insert(c.workers[i].gpu).second);  // never a GPU twice
    const std::vector<std::string> args = dhs::node::WorkerArgs(c, i);
    Check(args.size() >= 4 && args[0] == "--run-dir" && args[1] == c.run_dir && args[2] == "--gpu" &&
          args[3] == std::to_string(c.workers[i].gpu));
  }
  Check(c.supervise.backoff_initial_ms >= 1 && c.supervise.backoff_max_ms >= c.supervise.backoff_initial_ms);
  absl::StatusOr<uint64_t> page_bytes = dhs::node::ResolvePageBytes(c);
  if (!page_bytes.ok()) return;
  Check(*page_bytes > 0);
  const std::vector<std::string> memd = dhs::node::MemdArgs(c, *page_bytes);
  Check(memd.size() >= 4 && memd[0] == "--run-dir" && memd[2] == "--page-bytes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<dhs::node::NodeConfig> c = dhs::node::ParseNodeConfig(text);
  if (c.ok()) {
    CheckConfig(*c);
  } else {
    Check(c.status().code() == absl::StatusCode::kInvalidArgument && !c.status().message().empty());
  }
  absl::StatusOr<uint64_t> bytes = dhs::node::ParseByteSize(text);
  if (size > 0 && size <= 19 && text.find_first_not_of("0123456789") == std::string_view::npos) {
    Check(bytes.ok() && *bytes == std::stoull(std::string(text)));  // up to 19 digits fit in 64 bits
  }
  return 0;
}
