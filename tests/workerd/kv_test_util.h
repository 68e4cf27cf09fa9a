// tests/workerd/kv_test_util.h: original rows from a hash of (request, source, position), a host-page allocator
// over plain memory, a HierarchicalKvAccess harness on a CpuDevice, and a check of the resolver's hot index.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "workerd/device/cpu_device.h"
#include "workerd/kv/hierarchical_kv_access.h"

namespace dhs::test {

// splitmix64: the original row bytes, independent of the code under test.
inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
inline std::vector<uint8_t> OriginalRow(RequestId r, SourceId s, Position t, uint64_t bytes, uint64_t salt = 0) {
  std::vector<uint8_t> row(bytes);
  for (uint64_t i = 0; i < bytes; ++i) row[i] = static_cast<uint8_t>(Mix(r * 1000003 + s * 7919 + t * 31 + i + salt * 0x1234567) >> 17);
  return row;
}

// Whether the resolver's hot index (ready_page, host_ready by page) matches the page record of `kv`, entry by entry.
inline ::testing::AssertionResult IndexInStep(const RequestKv& kv) {
  if (kv.ready_page.size() != kv.pages.size() || kv.host_ready.size() != kv.pages.size()) {
    return ::testing::AssertionFailure() << "hot index covers " << kv.ready_page.size() << "/" << kv.host_ready.size()
                                         << " pages, the record " << kv.pages.size();
  }
  for (size_t j = 0; j < kv.pages.size(); ++j) {
    const KvPage& pg = kv.pages[j];
    const int64_t want = pg.Ready() ? pg.device_page : -1;
    if (kv.ready_page[j] != want || (kv.host_ready[j] != 0) != pg.HostReady()) {
      return ::testing::AssertionFailure() << "request " << kv.id << " page " << j << ": index (" << kv.ready_page[j]
                                           << ", " << int{kv.host_ready[j]} << "), record (" << want << ", "
                                           << pg.HostReady() << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

struct Harness {
  // `async`: the CPU device's mode (issue 28; disabled by default: the synchronous device).
  explicit Harness(const KvConfig& c, uint32_t host_pages, ResolverKind kind = ResolverKind::kFused,
                   const AsyncDeviceConfig& async = {})
      : device(async), layout(*KvLayout::Create(c)), host(host_pages * layout.host_page_bytes()) {
    for (PageIndex p = 0; p < host_pages; ++p) free_pages.insert(p);
    HostPoolAccess h{host, [this]() -> std::optional<PageIndex> {
                       if (free_pages.empty()) return std::nullopt;
                       PageIndex p = *free_pages.begin();
                       free_pages.erase(free_pages.begin());
                       return p;
                     },
                     [this](PageIndex p) { freed.push_back(p); free_pages.insert(p); }};
    kv = *HierarchicalKvAccess::Create(c, &device, h, kind);
  }
  ~Harness() {
    device.ReleaseAllHeld();
    kv.reset();
  }
  absl::Status AppendAll(RequestId r, Position t, uint64_t salt = 0) {
    for (SourceId s = 0; s < layout.num_sources(); ++s) {
      absl::Status st = kv->Append(r, s, t, OriginalRow(r, s, t, layout.row_bytes(s), salt));
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

  CpuDevice device;
  KvLayout layout;
  std::vector<uint8_t> host;
  std::set<PageIndex> free_pages;
  std::vector<PageIndex> freed;
  std::unique_ptr<HierarchicalKvAccess> kv;
};

}  // namespace dhs::test
