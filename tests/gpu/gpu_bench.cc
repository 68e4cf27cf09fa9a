// tests/gpu/gpu_bench.cc: figures of the CUDA backend (issue 15 "GPU check"). Prints one JSON object (to the file
// named by argv[1], else stdout); asserts nothing about time. Exits 77 (skipped) without a GPU.
//
// 1. resolver: time of one fused-resolver kernel launch (cudaEvent elapsed, median of the timed steps) against the
//    optional-history size (rows per request) and the batch (queries, one block each), at a fixed composition of
//    every step: half of k from the ready map (direct, random over the whole history), a quarter the previous step's
//    misses (hot hits), a quarter fresh rows of host-only pages (host recovery from the mapped pinned host pool).
//    Shapes: glm5-like follower group (brief §8: k = 2048, B = 4096, p = 64, d_KV = 576, 4 follower sources) and
//    dsv4flash-like (k = 512, B = 1024, d_KV = 288, one source). Host pages alias onto a bounded pinned host pool.
// 2. recovery: host-recovery bandwidth. (a) the resolver kernel on all-miss steps (every selected row recovered),
//    bytes_recovered / kernel time; (b) a plain kernel reading the same number of bytes of mapped pinned memory;
//    (c) cudaMemcpyAsync of the same bytes from the pinned host pool (contiguous). Ratios a/c and b/c, and each
//    against the PCIe 5.0 x16 limit (64 GB/s per direction, before protocol overhead).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "tests/gpu/gpu_util.h"

namespace dhs::gpu {
cudaError_t LaunchMappedCopy(const void* src, void* dst, uint64_t bytes, uint32_t blocks, cudaStream_t stream);
}

namespace dhs {
namespace {

using gpu::DevArray;
constexpr double kPcie5x16GBps = 64.0;

struct Shape {
  const char* name;
  uint32_t k, b, p, sources;
  uint64_t row_bytes;
};

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    cudaEventCreate(&a);
    cudaEventCreate(&b);
  }
  ~Timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One request template shared by every query of the batch (same history, its own hot cache): even pages ready
// (aliased onto the device pages), odd pages host-only (aliased onto the host pool's pages).
struct Setup {
  KvConfig config;
  std::unique_ptr<KvLayout> layout;
  RequestKv kv;
  std::vector<int64_t> host_pages;
  uint32_t host_pool_pages = 256;
};

std::unique_ptr<Setup> MakeSetup(const Shape& s, uint32_t batch, int64_t history) {
  auto st = std::make_unique<Setup>();
  KvConfig& c = st->config;
  c.row_bytes.assign(s.sources, s.row_bytes);
  c.groups = {{}};
  for (SourceId i = 0; i < s.sources; ++i) c.groups[0].push_back(i);
  c.page_rows = s.p;
  c.tail_rows = s.p;
  c.hot_rows = s.b;
  c.k = s.k;
  c.slots = batch;
  c.optional_pages = 64;
  st->layout = std::make_unique<KvLayout>(*KvLayout::Create(c));
  RequestKv& kv = st->kv;
  kv.appended.assign(s.sources, history);
  kv.tail_write.assign(s.sources, std::vector<CopyEvent>(c.tail_rows));
  const size_t pages = static_cast<size_t>((history + s.p - 1) / s.p);
  kv.GrowPages(pages);
  st->host_pages.assign(pages, -1);
  for (uint32_t pg = 0; pg < pages; ++pg) {
    if (pg % 2 == 0) {
      kv.PlaceGpuCopy(pg, GpuCopy::kReady, pg / 2 % c.optional_pages);
    } else {
      st->host_pages[pg] = pg / 2 % st->host_pool_pages;
      kv.PlaceHostCopy(pg, HostCopy::kWritten, st->host_pages[pg]);
    }
  }
  return st;
}

// Selections for `batch` queries: mix = fraction (direct, hot, host); `prev` holds each query's previous misses.
std::vector<std::vector<Position>> Selections(const Shape& s, int64_t history, uint32_t batch, double direct_share,
                                              double hot_share, std::vector<std::vector<Position>>& prev,
                                              std::mt19937_64& rng) {
  const int64_t hist = history - s.p;  // below the tail
  const int64_t pages = hist / s.p;
  std::vector<std::vector<Position>> out(batch);
  for (uint32_t i = 0; i < batch; ++i) {
    std::vector<Position> sel;
    std::vector<Position> misses;
    std::unordered_set<Position> seen;
    const uint32_t n_direct = static_cast<uint32_t>(s.k * direct_share);
    const uint32_t n_hot = std::min<uint32_t>(static_cast<uint32_t>(s.k * hot_share), prev[i].size());
    auto pick = [&](bool ready) {
      for (;;) {
        int64_t pg = std::uniform_int_distribution<int64_t>(0, pages - 1)(rng);
        pg = ready ? pg & ~int64_t{1} : (pg | 1);
        if (pg >= pages) continue;
        const Position t = pg * s.p + std::uniform_int_distribution<int64_t>(0, s.p - 1)(rng);
        if (seen.insert(t).second) return t;
      }
    };
    for (uint32_t j = 0; j < n_direct; ++j) sel.push_back(pick(true));
    for (uint32_t j = 0; j < n_hot; ++j) {
      if (seen.insert(prev[i][j]).second) sel.push_back(prev[i][j]);
    }
    while (sel.size() < s.k) {
      const Position t = pick(false);
      sel.push_back(t);
      misses.push_back(t);
    }
    std::shuffle(sel.begin(), sel.end(), rng);
    prev[i] = std::move(misses);
    out[i] = std::move(sel);
  }
  return out;
}

struct RunFigures {
  double median_us = 0;
  uint64_t direct = 0, hot = 0, host = 0, bytes = 0;  // per step, summed over the batch (last timed step)
};

// Runs warmup + timed steps of the kernel; returns the median kernel time.
RunFigures RunResolver(CudaDevice& d, const Shape& s, uint32_t batch, int64_t history, double direct_share,
                       double hot_share, int steps) {
  auto st = MakeSetup(s, batch, history);
  const KvLayout& l = *st->layout;
  const auto& gs = st->config.groups[0];
  std::vector<uint8_t> host_pool(st->host_pool_pages * l.page_bytes());
  for (size_t i = 0; i < host_pool.size(); ++i) host_pool[i] = static_cast<uint8_t>(i * 131);
  uint8_t* host_dev = *d.RegisterHostPool(std::span<uint8_t>(host_pool));
  DevArray<uint8_t> pool(l.pool_bytes());
  plan::GeometryStorage geo(l, gs);
  gpu::DeviceGeometry dgeo(geo);
  plan::HotSlotsStorage caches(batch, s.b);
  gpu::DeviceHotSlots dcaches(caches);
  gpu::DeviceRequest dreq(st->kv, st->host_pages);
  const std::vector<const gpu::DeviceRequest*> reqs(batch, &dreq);  // every query reads the same hot index
  std::vector<std::vector<Position>> prev(batch);
  std::mt19937_64 rng(7);
  Timer t;
  std::vector<double> us;
  RunFigures f;
  const int warmup = 3;
  for (int step = 1; step <= warmup + steps; ++step) {
    auto sel = Selections(s, history, batch, direct_share, hot_share, prev, rng);
    std::vector<std::vector<Location>> out(batch, std::vector<Location>(size_t{s.sources} * s.k));
    std::vector<plan::Query> queries;
    for (uint32_t i = 0; i < batch; ++i) {
      plan::Query q = plan::MakeQuery(st->kv, gs, st->config.tail_rows, st->host_pages, sel[i], out[i],
                                      caches.View(i));
      q.slot = i;  // its own request slot and hot cache
      queries.push_back(q);
    }
    gpu::DeviceBatch b(geo.g, queries, reqs, dcaches);
    cudaStream_t stream = d.compute_stream();
    cudaEventRecord(t.a, stream);
    GPU_CHECK(b.Launch(dgeo.g, step, host_dev, pool.get(), stream));
    cudaEventRecord(t.b, stream);
    GPU_CHECK(cudaEventSynchronize(t.b));
    float ms = 0;
    cudaEventElapsedTime(&ms, t.a, t.b);
    if (step > warmup) us.push_back(ms * 1000.0);
    const auto res = b.results.Download();
    f = RunFigures{};
    for (const auto& r : res) {
      if (r.error != plan::kOk) {
        std::fprintf(stderr, "resolver kernel error %d\n", r.error);
        std::exit(1);
      }
      f.direct += r.direct;
      f.hot += r.hot;
      f.host += r.host;
      f.bytes += r.bytes_recovered;
    }
  }
  f.median_us = Median(us);
  (void)d.UnregisterHostPool(std::span<uint8_t>(host_pool));
  return f;
}

}  // namespace
}  // namespace dhs

int main(int argc, char** argv) {
  using namespace dhs;
  gpu::ExitUnlessGpu("gpu_bench");
  auto dev = CudaDevice::Create();
  if (!dev.ok()) {
    std::fprintf(stderr, "gpu_bench: %s\n", dev.status().ToString().c_str());
    return 1;
  }
  CudaDevice& d = **dev;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::string json = "{\n  \"device\": \"" + std::string(prop.name) + "\",\n  \"sm_count\": " +
                     std::to_string(prop.multiProcessorCount) + ",\n  \"resolver\": [\n";
  const Shape shapes[] = {{"glm5-like", 2048, 4096, 64, 4, 576}, {"dsv4flash-like", 512, 1024, 64, 1, 288}};
  const int64_t histories[] = {16384, 262144, 2097152};
  const uint32_t batches[] = {1, 8, 32, 64};
  bool first = true;
  char buf[512];
  for (const Shape& s : shapes) {
    for (int64_t h : histories) {
      for (uint32_t b : batches) {
        const auto f = RunResolver(d, s, b, h, 0.5, 0.25, 10);
        std::snprintf(buf, sizeof buf,
                      "%s    {\"shape\": \"%s\", \"history_rows\": %lld, \"batch\": %u, \"k\": %u, \"B\": %u, "
                      "\"sources\": %u, \"kernel_us\": %.1f, \"direct\": %llu, \"hot\": %llu, \"host\": %llu, "
                      "\"bytes_recovered\": %llu}",
                      first ? "" : ",\n", s.name, static_cast<long long>(h), b, s.k, s.b, s.sources, f.median_us,
                      static_cast<unsigned long long>(f.direct), static_cast<unsigned long long>(f.hot),
                      static_cast<unsigned long long>(f.host), static_cast<unsigned long long>(f.bytes));
        json += buf;
        first = false;
        std::fprintf(stderr, "resolver %s history %lld batch %u: %.1f us\n", s.name, static_cast<long long>(h), b,
                     f.median_us);
      }
    }
  }
  json += "\n  ],\n  \"recovery\": [\n";
  first = true;
  for (uint32_t b : {4u, 16u, 64u}) {
    const Shape& s = shapes[0];
    // (a) all-miss steps: every selected row (k per query, 4 sources) recovered from the mapped pinned host pool.
    const auto f = RunResolver(d, s, b, 262144, 0.0, 0.0, 10);
    const double resolver_gbps = f.bytes / (f.median_us * 1e3);
    // (b), (c): the same number of bytes, contiguous in pinned host memory.
    const uint64_t bytes = (f.bytes + 15) / 16 * 16;
    std::vector<uint8_t> host(bytes, 1);
    uint8_t* host_dev = *d.RegisterHostPool(std::span<uint8_t>(host));
    DevArray<uint8_t> dst(bytes);
    Timer t;
    cudaStream_t st = d.compute_stream();
    std::vector<double> mapped_us, memcpy_us;
    for (int i = 0; i < 13; ++i) {
      float ms = 0;
      cudaEventRecord(t.a, st);
      GPU_CHECK(gpu::LaunchMappedCopy(host_dev, dst.get(), bytes, b * 8, st));
      cudaEventRecord(t.b, st);
      GPU_CHECK(cudaEventSynchronize(t.b));
      cudaEventElapsedTime(&ms, t.a, t.b);
      if (i >= 3) mapped_us.push_back(ms * 1000.0);
      cudaEventRecord(t.a, st);
      GPU_CHECK(cudaMemcpyAsync(dst.get(), host.data(), bytes, cudaMemcpyHostToDevice, st));
      cudaEventRecord(t.b, st);
      GPU_CHECK(cudaEventSynchronize(t.b));
      cudaEventElapsedTime(&ms, t.a, t.b);
      if (i >= 3) memcpy_us.push_back(ms * 1000.0);
    }
    (void)d.UnregisterHostPool(std::span<uint8_t>(host));
    const double mapped_gbps = bytes / (Median(mapped_us) * 1e3), memcpy_gbps = bytes / (Median(memcpy_us) * 1e3);
    std::snprintf(buf, sizeof buf,
                  "%s    {\"batch\": %u, \"bytes\": %llu, \"resolver_us\": %.1f, \"resolver_GBps\": %.2f, "
                  "\"mapped_read_GBps\": %.2f, \"memcpy_async_GBps\": %.2f, \"resolver_vs_memcpy\": %.3f, "
                  "\"mapped_vs_memcpy\": %.3f, \"resolver_vs_pcie5x16\": %.3f, \"memcpy_vs_pcie5x16\": %.3f}",
                  first ? "" : ",\n", b, static_cast<unsigned long long>(f.bytes), f.median_us, resolver_gbps,
                  mapped_gbps, memcpy_gbps, resolver_gbps / memcpy_gbps, mapped_gbps / memcpy_gbps,
                  resolver_gbps / kPcie5x16GBps, memcpy_gbps / kPcie5x16GBps);
    json += buf;
    first = false;
    std::fprintf(stderr, "recovery batch %u: resolver %.2f GB/s, mapped %.2f GB/s, memcpy %.2f GB/s\n", b,
                 resolver_gbps, mapped_gbps, memcpy_gbps);
  }
  json += "\n  ],\n  \"pcie5x16_GBps\": 64\n}\n";
  FILE* out = argc > 1 ? std::fopen(argv[1], "w") : stdout;
  if (out == nullptr) return 1;
  std::fputs(json.c_str(), out);
  if (out != stdout) std::fclose(out);
  return 0;
}
