// tests/workerd/resolver_profile.cc: a fixed-work driver of the fused resolver for instruction counts (callgrind);
// prints nothing about time. Usage: resolver_profile <rows per step> <steps>. Every step is all misses (B = k, as
// BM_HostRecoveryVsMemcpy in resolver_bench.cc): Plan + host recovery of every selected row + wait, on CpuDevice.
// Divide the inclusive counts of FusedResolver::Resolve (and CpuDevice::CopyLoop, when copies run on its thread) by
// the number of steps. Example:
//   valgrind --tool=callgrind resolver_profile 2048 200 && callgrind_annotate --inclusive=yes callgrind.out.*
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "workerd/device/cpu_device.h"
#include "workerd/kv/layout.h"
#include "workerd/kv/request_kv.h"
#include "workerd/kv/resolver.h"

int main(int argc, char** argv) {
  using namespace dhs;
  const uint32_t k = argc > 1 ? static_cast<uint32_t>(std::atoi(argv[1])) : 2048;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 100;
  constexpr uint32_t kP = 64, kPages = 64;
  constexpr uint64_t kRowBytes = 576;
  KvConfig c;
  c.row_bytes = {kRowBytes};
  c.groups = {{0}};
  c.page_rows = kP;
  c.hot_rows = k;
  c.k = k;
  c.tail_rows = kP;
  c.slots = 1;
  c.optional_pages = 1;
  const KvLayout layout = *KvLayout::Create(c);
  CpuDevice device;
  const PoolId pool = *device.AllocatePool(layout.pool_bytes());
  std::vector<uint8_t> host(uint64_t{kPages} * layout.page_bytes());
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 131 + 7);
  FusedResolver resolver(ResolverEnv{&layout, &device, pool, host, {}});
  const Position region = Position{kPages} * kP;
  RequestKv kv;
  kv.id = 1;
  kv.appended = {region + kP};
  kv.tail_write.assign(1, std::vector<CopyEvent>(kP));
  kv.pages.resize(kPages + 1);
  for (uint32_t p = 0; p < kPages; ++p) {
    kv.pages[p].host_page = p;
    kv.pages[p].host = HostCopy::kWritten;
  }
  const std::vector<SourceId> sources = {0};
  std::vector<Position> sel(k);
  std::vector<Location> out(k);
  Position next = 0;
  for (int i = 0; i < steps; ++i) {
    for (auto& t : sel) t = (next++) % region;
    ResolveQuery q{&kv, sel, out};
    if (const absl::Status s = resolver.Resolve(0, sources, {&q, 1}); !s.ok()) {
      std::fprintf(stderr, "resolve failed: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  const Census& cs = resolver.census(0);
  std::printf("steps %d rows %u host %llu\n", steps, k, static_cast<unsigned long long>(cs.host));
  return cs.host == uint64_t{k} * steps ? 0 : 1;
}
