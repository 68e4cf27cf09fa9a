// tests/workerd/resolver_plan_scenario.h: random resolver inputs shared by the host test of the shared plan
// (resolver_plan_test.cc) and the GPU tests (tests/gpu/): a KV layout, one request per slot with its history pages
// (some in the ready map, most with a host copy), a host pool of bytes from a hash, and selections that mix repeated
// rows (hot hits), fresh rows (host recovery), tail / ready rows (direct) and -1 padding. Host pages carry index-key
// regions after the payload (KvConfig.key_bytes, docs/architecture.md "Host pages"), so a host read at the GPU
// page's stride instead of the host page's would fetch other bytes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "workerd/kv/layout.h"
#include "workerd/kv/request_kv.h"

namespace dhs::test {

struct PlanScenarioParams {
  std::vector<uint64_t> row_bytes = {576, 40, 100};       // bytes per row, by source
  std::vector<std::vector<SourceId>> groups = {{0, 1}, {2}};
  uint32_t page_rows = 8, tail_rows = 16, hot_rows = 48, k = 24, slots = 4, optional_pages = 16;
  int64_t min_history = 40, max_history = 600;             // rows appended per request
  double ready_share = 0.3;                                // pages in the ready map
  double repeat_share = 0.5;                               // share of a selection taken from the previous one
  uint32_t padding_max = 3;                                // -1 entries at the end of a selection
  std::vector<uint64_t> key_bytes = {128, 72};             // index key bytes per position, by indexer (host pages)
};

inline uint64_t ScenarioMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

struct PlanScenario {
  PlanScenarioParams params;
  KvConfig config;
  std::unique_ptr<KvLayout> layout;
  std::vector<RequestKv> kvs;                 // one per slot, kvs[i].slot == i
  std::vector<std::vector<int64_t>> host_pages;  // by request: host page of each history page
  std::vector<uint8_t> host_pool;
  std::mt19937_64 rng;
  std::vector<std::vector<std::vector<Position>>> previous;  // [group][request]

  PlanScenario(uint64_t seed, const PlanScenarioParams& p) : params(p), rng(seed) {
    config.row_bytes = p.row_bytes;
    config.groups = p.groups;
    config.page_rows = p.page_rows;
    config.hot_rows = p.hot_rows;
    config.k = p.k;
    config.tail_rows = p.tail_rows;
    config.slots = p.slots;
    config.optional_pages = p.optional_pages;
    config.key_bytes = p.key_bytes;
    layout = std::make_unique<KvLayout>(*KvLayout::Create(config));
    uint64_t next_host_page = 0;
    for (uint32_t i = 0; i < p.slots; ++i) {
      RequestKv kv;
      kv.id = 100 + i;
      kv.slot = i;
      const int64_t n = std::uniform_int_distribution<int64_t>(p.min_history, p.max_history)(rng);
      kv.appended.resize(p.row_bytes.size());
      for (auto& a : kv.appended) a = n - std::uniform_int_distribution<int64_t>(0, 2)(rng);
      kv.tail_write.assign(p.row_bytes.size(), std::vector<CopyEvent>(p.tail_rows));
      const size_t pages = static_cast<size_t>((n + p.page_rows - 1) / p.page_rows);
      kv.GrowPages(pages);
      std::vector<int64_t> hp(pages, -1);
      for (uint32_t pg = 0; pg < pages; ++pg) {
        const bool ready = std::bernoulli_distribution(p.ready_share)(rng);
        if (ready) {
          kv.PlaceGpuCopy(pg, GpuCopy::kReady, std::uniform_int_distribution<int64_t>(0, p.optional_pages - 1)(rng));
        }
        // Every page has a host copy, except some ready pages (their rows always resolve directly).
        if (!ready || std::bernoulli_distribution(0.5)(rng)) {
          hp[pg] = static_cast<int64_t>(next_host_page++);
          kv.PlaceHostCopy(pg, HostCopy::kWritten, hp[pg]);
        }
      }
      kvs.push_back(std::move(kv));
      host_pages.push_back(std::move(hp));
    }
    host_pool.resize(next_host_page * layout->host_page_bytes());
    for (size_t i = 0; i < host_pool.size(); ++i) host_pool[i] = static_cast<uint8_t>(ScenarioMix(seed * 977 + i) >> 24);
    previous.assign(config.groups.size(), std::vector<std::vector<Position>>(p.slots));
  }

  // The group's selectable length of request i.
  Position Length(uint32_t group, uint32_t i) const { return kvs[i].Length(config.groups[group]); }

  // Next selections of group `group`, one per request: distinct positions, repeated ones first taken from the
  // previous selection, then fresh ones, then -1 padding.
  std::vector<std::vector<Position>> NextSelections(uint32_t group) {
    std::vector<std::vector<Position>> out(kvs.size());
    for (uint32_t i = 0; i < kvs.size(); ++i) {
      const Position n = Length(group, i);
      const uint32_t pad = std::uniform_int_distribution<uint32_t>(0, params.padding_max)(rng);
      const uint32_t want = params.k - std::min(pad, params.k);
      std::set<Position> seen;
      std::vector<Position> sel;
      for (Position t : previous[group][i]) {
        if (sel.size() >= want) break;
        if (t >= 0 && std::bernoulli_distribution(params.repeat_share)(rng) && seen.insert(t).second) sel.push_back(t);
      }
      while (sel.size() < want && static_cast<Position>(seen.size()) < n) {
        const Position t = std::uniform_int_distribution<Position>(0, n - 1)(rng);
        if (seen.insert(t).second) sel.push_back(t);
      }
      std::shuffle(sel.begin(), sel.end(), rng);
      sel.resize(params.k, kNoPosition);
      previous[group][i] = sel;
      out[i] = std::move(sel);
    }
    return out;
  }

  // The original bytes of row (request i, source s, position t), from the host pool (nullptr without a host copy).
  const uint8_t* HostRow(uint32_t i, SourceId s, Position t) const {
    const int64_t hp = host_pages[i][static_cast<size_t>(t / config.page_rows)];
    if (hp < 0) return nullptr;
    return host_pool.data() + static_cast<uint64_t>(hp) * layout->host_page_bytes() +
           layout->InPage(s, static_cast<uint32_t>(t % config.page_rows));
  }

  // Whether `loc` is a hot-cache row of (slot, s).
  bool IsHotRow(uint32_t slot, SourceId s, Location loc) const {
    const Location first = layout->HotRow(slot, s, 0);
    const uint64_t rb = layout->row_bytes(s);
    return loc >= first && loc < first + static_cast<Location>(config.hot_rows * rb) &&
           (loc - first) % static_cast<Location>(rb) == 0;
  }
};

}  // namespace dhs::test
