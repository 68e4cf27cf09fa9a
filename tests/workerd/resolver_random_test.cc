// tests/workerd/resolver_random_test.cc: the fused resolver against ReferenceResolver (brief §5) on random batches:
// histories, tails, ready-map pages and host copies that change between steps, hot caches warmed by earlier steps,
// several requests per batch, several queries of one request selecting overlapping rows (one union per request and
// step), -1 padding, followers in either order, unions of more than B missing rows (RESOURCE_EXHAUSTED),
// rows with no copy (INTERNAL) in any query of a batch, failed recovery copies (UNAVAILABLE: every copy, or only those
// into one request's hot region of one source, so that other copies of the batch land) in batches of several queries,
// and a position repeated in one query (INVALID_ARGUMENT).
//
// Each step both resolvers get the same batch over the same RequestKv records; each has its own device pool (same
// layout), filled by the test with the original rows (tail ring and ready pages; host pages in one shared host pool).
// Checked every step, from values the test computes itself:
//   - the error code, predicted from the batch: the first query (in batch order) that selects a row with neither a
//     ready page nor a host copy gives INTERNAL, or whose request's union of non-direct rows so far exceeds B gives
//     RESOURCE_EXHAUSTED; otherwise OK (UNAVAILABLE only when the step's recovery copies were made to fail);
//   - on success: every output location holds the original row's bytes; tail rows and ready rows sit at the layout's
//     TailRow / PageRow; other rows in the request's own hot region of that source; one position, one location
//     within a request's union; the census delta (direct, hot + host, scans skipped, bytes recovered) as counted by
//     the test; and the fused locations and census equal the reference's;
//   - on failure: the census of both resolvers is unchanged (nothing of the batch counts as resolved), every output
//     entry is -1. The hot-cache state after a failure (the targeted slots invalidated, resolver.h) is checked by
//     every later step, whose locations and census must still equal the reference's;
//   - after every step, ok or failed (exactness, brief §7): both resolvers map every hot slot to the same row, and
//     every slot mapped to row t holds t's original bytes for every source of the group.
// Seeds are printed; the run is deterministic. RESOLVER_TRACE=1 in the environment prints every batch and its outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "tests/workerd/kv_test_util.h"
#include "workerd/device/cpu_device.h"
#include "workerd/kv/layout.h"
#include "workerd/kv/request_kv.h"
#include "workerd/kv/resolver.h"

namespace dhs {
namespace {

using test::OriginalRow;

constexpr uint32_t kMaxPages = 24;  // history pages per request slot (positions < kMaxPages * p)

enum PageState : uint8_t { kFresh = 0, kHost = 1, kReady = 2, kBoth = 3, kNeither = 4 };

// One resolver with its own device and pool.
struct Side {
  Side(const KvLayout& layout, std::span<uint8_t> host, bool fused) {
    pool = *device.AllocatePool(layout.pool_bytes());
    const ResolverEnv env{&layout, &device, pool, host, {}};
    if (fused) {
      resolver = std::make_unique<FusedResolver>(env);
    } else {
      resolver = std::make_unique<ReferenceResolver>(env);
    }
  }
  uint8_t* At(Location offset) { return device.HostVisible(pool, offset); }
  CpuDevice device;
  PoolId pool = 0;
  std::unique_ptr<Resolver> resolver;
};

struct Req {
  RequestKv kv;
  Position n = 0;                // rows appended (every source)
  std::vector<PageState> state;  // by history page
  std::vector<Position> recent;  // positions selected lately (to make hot-cache hits likely)
};

class RandomResolver : public ::testing::TestWithParam<uint64_t> {};

TEST_P(RandomResolver, FusedEqualsReferenceAndFailuresRollBack) {
  const uint64_t seed = GetParam();
  std::printf("resolver random test seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  auto coin = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  auto below = [&](uint64_t n) { return rng() % n; };

  KvConfig c;
  c.row_bytes = {16, 24, 8};
  c.groups = {{0, 1}, {2}};  // a producer with two followers; a single source
  c.page_rows = 4;
  c.k = 3 + static_cast<uint32_t>(below(3));             // 3..5
  c.hot_rows = c.k + static_cast<uint32_t>(below(4));    // B in k..k+3
  c.tail_rows = 8;
  c.slots = 3;
  c.optional_pages = c.slots * kMaxPages;  // device page of (slot, page j) = slot * kMaxPages + j
  const KvLayout layout = *KvLayout::Create(c);
  const uint32_t p = c.page_rows, T = c.tail_rows, B = c.hot_rows, k = c.k;
  std::printf("  k %u, B %u\n", k, B);
  std::vector<uint8_t> host(size_t{c.slots} * kMaxPages * layout.page_bytes());
  Side fused(layout, host, true), ref(layout, host, false);
  Side* sides[] = {&fused, &ref};

  std::vector<Req> reqs(c.slots);
  RequestId next_id = 1;
  auto admit = [&](SlotIndex slot) {
    Req& r = reqs[slot];
    r = Req{};
    r.kv.id = next_id++;
    r.kv.slot = slot;
    r.kv.appended.assign(layout.num_sources(), 0);
    r.kv.tail_write.assign(layout.num_sources(), std::vector<CopyEvent>(T));
    for (Side* s : sides) s->resolver->ResetSlot(slot);
  };
  auto host_page = [&](const Req& r, uint32_t j) { return r.kv.slot * kMaxPages + j; };
  auto write_page = [&](Req& r, uint32_t j, bool to_host) {  // the original rows of page j
    for (SourceId s = 0; s < layout.num_sources(); ++s) {
      for (uint32_t i = 0; i < p; ++i) {
        const auto row = OriginalRow(r.kv.id, s, Position{j} * p + i, layout.row_bytes(s));
        if (to_host) {
          std::memcpy(host.data() + uint64_t{host_page(r, j)} * layout.page_bytes() + layout.InPage(s, i), row.data(),
                      row.size());
        } else {
          for (Side* side : sides) {
            std::memcpy(side->At(layout.PageRow(host_page(r, j), s, i)), row.data(), row.size());
          }
        }
      }
    }
  };
  auto set_state = [&](Req& r, uint32_t j, PageState st) {
    r.state[j] = st;
    const bool h = st == kHost || st == kBoth, d = st == kReady || st == kBoth;
    if (h && !r.kv.pages[j].HostReady()) write_page(r, j, true);
    if (d && !r.kv.pages[j].Ready()) write_page(r, j, false);
    r.kv.PlaceHostCopy(j, h ? HostCopy::kWritten : HostCopy::kNone, h ? host_page(r, j) : -1);
    r.kv.PlaceGpuCopy(j, d ? GpuCopy::kReady : GpuCopy::kNone, d ? host_page(r, j) : -1);
  };
  auto append = [&](Req& r, Position rows) {
    rows = std::min<Position>(rows, Position{kMaxPages} * p - r.n);
    for (Position t = r.n; t < r.n + rows; ++t) {
      for (SourceId s = 0; s < layout.num_sources(); ++s) {
        const auto row = OriginalRow(r.kv.id, s, t, layout.row_bytes(s));
        for (Side* side : sides) std::memcpy(side->At(layout.TailRow(r.kv.slot, s, t)), row.data(), row.size());
      }
    }
    r.n += rows;
    std::fill(r.kv.appended.begin(), r.kv.appended.end(), r.n);
    const size_t pages = static_cast<size_t>((r.n + p - 1) / p);
    r.kv.GrowPages(pages);
    r.state.resize(pages, kFresh);
    for (uint32_t j = 0; j < pages; ++j) {  // a page with a row out of the tail gets its copies now
      if (r.state[j] != kFresh || Position{j} * p >= r.n - T) continue;
      const uint64_t d = below(100);
      set_state(r, j, d < 60 ? kHost : d < 75 ? kBoth : d < 92 ? kReady : kNeither);
    }
  };
  auto direct = [&](const Req& r, Position t) {
    return t >= r.n - T || r.state[static_cast<size_t>(t / p)] == kReady || r.state[static_cast<size_t>(t / p)] == kBoth;
  };
  auto backed = [&](const Req& r, Position t) { return direct(r, t) || r.state[static_cast<size_t>(t / p)] == kHost; };

  for (SlotIndex s = 0; s < c.slots; ++s) {
    admit(s);
    append(reqs[s], 1 + static_cast<Position>(below(30)));
  }

  std::map<absl::StatusCode, int> outcomes;
  int multi_query_unions = 0, multi_query_unavailable = 0, hits = 0, recoveries = 0;
  for (int step = 0; step < 1500; ++step) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " step " << step);
    // --- the state changes between steps
    for (Req& r : reqs) {
      if (coin(0.3)) append(r, static_cast<Position>(below(7)));
      if (coin(0.15) && !r.state.empty()) {  // populate or withdraw a page of the history (rows stay backed)
        const uint32_t j = static_cast<uint32_t>(below(r.state.size()));
        if (r.state[j] == kHost) set_state(r, j, kBoth);
        else if (r.state[j] == kBoth) set_state(r, j, kHost);
      }
    }
    if (coin(0.02)) {  // a request ends; a new one is admitted into its slot
      const SlotIndex s = static_cast<SlotIndex>(below(c.slots));
      admit(s);
      append(reqs[s], 1 + static_cast<Position>(below(40)));
    }

    // --- the batch
    const uint32_t g = static_cast<uint32_t>(below(2));
    std::vector<SourceId> sources = c.groups[g];
    // Always the whole group (in either order): the hot cache is per group, so a slot filled for a subset of its
    // sources would be a hit with stale bytes for the others; Validate rejects subsets
    // (ResolverContract.PartialGroupIsInvalid).
    if (g == 0 && coin(0.3)) sources = {1, 0};
    const bool wide = coin(0.12);         // many distinct host rows: unions beyond B
    const bool unbacked = coin(0.04);     // one row with no copy at all
    const bool fail_copies = coin(0.06);  // recovery copies of this step fail: all, or only those of one region
    const bool fail_one_region = coin(0.5);
    const SlotIndex fail_slot = static_cast<SlotIndex>(below(c.slots));
    const SourceId fail_source = c.groups[g][below(c.groups[g].size())];
    const bool repeat = coin(0.02);  // a position twice in one query
    const size_t queries = wide ? 2 + below(3) : 1 + below(4);
    const SlotIndex wide_slot = static_cast<SlotIndex>(below(c.slots));  // wide: every query of this request
    std::vector<std::vector<Position>> sel(queries);
    std::vector<SlotIndex> slot_of(queries);
    std::map<SlotIndex, size_t> last_query;  // slot -> its previous query in this batch
    for (size_t qi = 0; qi < queries; ++qi) {
      const SlotIndex s = wide ? wide_slot : static_cast<SlotIndex>(below(c.slots));
      slot_of[qi] = s;
      Req& r = reqs[s];
      std::vector<Position> cand, spare, host_only;
      for (Position t = 0; t < r.n; ++t) {
        (backed(r, t) ? cand : spare).push_back(t);
        if (backed(r, t) && !direct(r, t)) host_only.push_back(t);
      }
      if (wide && host_only.size() >= k) cand = host_only;  // rows that need a hot slot
      std::vector<Position>& q = sel[qi];
      auto prev = last_query.find(s);
      // Distinct positions within one query, as a top-k selection has (-1 entries aside); see
      // FusedResolverKnownIssue.DuplicateEntryOfOneQuery for why.
      auto put = [&](uint32_t j, Position t) {
        if (std::find(q.begin(), q.end(), t) == q.end()) q[j] = t;
      };
      if (prev != last_query.end() && !wide) {  // overlap with this request's previous query of the batch
        q = sel[prev->second];
        const size_t change = 1 + below(k);
        for (size_t e = 0; e < change; ++e) put(static_cast<uint32_t>(below(k)), cand[below(cand.size())]);
        ++multi_query_unions;
      } else {
        q.assign(k, kNoPosition);
        for (uint32_t j = 0; j < k; ++j) {
          if (coin(0.12)) continue;  // -1 padding
          Position t = cand[below(cand.size())];
          if (!wide && !r.recent.empty() && coin(0.5)) {
            t = r.recent[below(r.recent.size())];
            if (!backed(r, t)) t = cand[below(cand.size())];  // it left the tail into a page with no copy
          }
          put(j, t);
        }
      }
      // In any query: an INTERNAL error after earlier queries of the batch claimed hot slots must invalidate those
      // claims (ResolverFailure.InternalAfterEarlierClaimsLeavesNoClaim).
      if (unbacked && !spare.empty() && coin(0.5)) put(static_cast<uint32_t>(below(k)), spare[below(spare.size())]);
      last_query[s] = qi;
      for (Position t : q) {
        if (t >= 0 && backed(r, t) && r.recent.size() < 3 * B) r.recent.push_back(t);
      }
      if (r.recent.size() >= 3 * B || coin(0.05)) r.recent.clear();
    }
    if (repeat) {  // entry j2 of one query repeats its entry j1
      std::vector<Position>& q = sel[below(queries)];
      const size_t j1 = below(k), j2 = (j1 + 1 + below(k - 1)) % k;
      if (q[j1] >= 0) q[j2] = q[j1];
    }

    // --- the expected outcome, from the test's own page states
    absl::StatusCode want = absl::StatusCode::kOk;
    Census want_delta;
    for (const auto& q : sel) {
      for (size_t j = 0; j < q.size(); ++j) {
        if (q[j] >= 0 && std::find(q.begin() + static_cast<std::ptrdiff_t>(j) + 1, q.end(), q[j]) != q.end()) {
          want = absl::StatusCode::kInvalidArgument;
        }
      }
    }
    if (want == absl::StatusCode::kOk) {
      std::map<SlotIndex, std::set<Position>> unions;
      for (size_t qi = 0; qi < queries && want == absl::StatusCode::kOk; ++qi) {
        const Req& r = reqs[slot_of[qi]];
        bool any_miss = false;
        for (Position t : sel[qi]) {
          if (t < 0) continue;
          if (!backed(r, t)) want = absl::StatusCode::kInternal;
          if (direct(r, t)) {
            ++want_delta.direct;
          } else {
            any_miss = true;
          }
        }
        if (want != absl::StatusCode::kOk) break;
        if (!any_miss) ++want_delta.scans_skipped;
        for (Position t : sel[qi]) {
          if (t >= 0 && !direct(r, t)) unions[slot_of[qi]].insert(t);
        }
        if (unions[slot_of[qi]].size() > B) want = absl::StatusCode::kResourceExhausted;
      }
    }

    // --- resolve on both sides
    std::vector<std::vector<Location>> out_f(queries), out_r(queries);
    std::vector<ResolveQuery> batch_f, batch_r;
    for (size_t qi = 0; qi < queries; ++qi) {
      out_f[qi].assign(sources.size() * k, -7);
      out_r[qi].assign(sources.size() * k, -7);
    }
    for (size_t qi = 0; qi < queries; ++qi) {
      batch_f.push_back(ResolveQuery{&reqs[slot_of[qi]].kv, sel[qi], out_f[qi]});
      batch_r.push_back(ResolveQuery{&reqs[slot_of[qi]].kv, sel[qi], out_r[qi]});
    }
    const Census before_f[2] = {fused.resolver->census(0), fused.resolver->census(1)};
    const Census before_r[2] = {ref.resolver->census(0), ref.resolver->census(1)};
    if (fail_copies) {
      // All recovery copies, or those into the hot region of one (request slot, source): then the batches of the
      // other sources (fused) or the copies of earlier rows (reference) land before the failure.
      const Location lo = layout.HotRow(fail_slot, fail_source, 0), hi = layout.HotRow(fail_slot, fail_source, B);
      for (Side* s : sides) {
        s->device.SetCopyHook([=](const CopyInfo& i) {
          if (i.kind != CopyKind::kHostToDevice) return CopyFate::kRun;
          if (!fail_one_region) return CopyFate::kFail;
          for (const DeviceRange& r : i.device) {
            if (static_cast<Location>(r.offset) >= lo && static_cast<Location>(r.offset) < hi) return CopyFate::kFail;
          }
          return CopyFate::kRun;
        });
      }
    }
    if (std::getenv("RESOLVER_TRACE") != nullptr) {
      std::printf("step %d group %u fail_copies %d:", step, g, fail_copies);
      for (size_t qi = 0; qi < queries; ++qi) {
        std::printf(" [slot %u n %lld:", slot_of[qi], static_cast<long long>(reqs[slot_of[qi]].n));
        for (Position t : sel[qi]) {
          std::printf(" %lld%s", static_cast<long long>(t), t < 0 ? "" : direct(reqs[slot_of[qi]], t) ? "d" : "h");
        }
        std::printf("]");
      }
      std::printf("\n");
    }
    const absl::Status sf = fused.resolver->Resolve(g, sources, batch_f);
    const absl::Status sr = ref.resolver->Resolve(g, sources, batch_r);
    for (Side* s : sides) s->device.SetCopyHook(nullptr);
    if (std::getenv("RESOLVER_TRACE") != nullptr) {
      std::printf("  -> %s / %s\n", sf.ToString().c_str(), sr.ToString().c_str());
      for (size_t qi = 0; qi < queries; ++qi) {
        std::printf("  q%zu f:", qi);
        for (Location l : out_f[qi]) std::printf(" %lld", static_cast<long long>(l));
        std::printf(" r:");
        for (Location l : out_r[qi]) std::printf(" %lld", static_cast<long long>(l));
        std::printf("\n");
      }
    }
    ASSERT_EQ(sf.code(), sr.code()) << "fused: " << sf << "; reference: " << sr;
    ++outcomes[sf.code()];
    multi_query_unavailable += sf.code() == absl::StatusCode::kUnavailable && queries > 1;
    if (fail_copies && want == absl::StatusCode::kOk && sf.code() == absl::StatusCode::kUnavailable) {
      want = absl::StatusCode::kUnavailable;  // some row was recovered from host, and its copy failed
    }
    ASSERT_EQ(sf.code(), want) << sf;
    // Exactness of the hot caches, after every step (ok or failed): the same rows in both resolvers, and every slot
    // mapped to a row holds that row's original bytes, for every source of the group.
    for (SlotIndex slot = 0; slot < c.slots; ++slot) {
      for (uint32_t gg = 0; gg < 2; ++gg) {
        for (uint32_t h = 0; h < B; ++h) {
          const Position t = fused.resolver->HotPosition(slot, gg, h);
          ASSERT_EQ(t, ref.resolver->HotPosition(slot, gg, h)) << "slot " << slot << " group " << gg << " hot " << h;
          if (t == kNoPosition) continue;
          for (SourceId s : c.groups[gg]) {
            const auto want_row = OriginalRow(reqs[slot].kv.id, s, t, layout.row_bytes(s));
            for (Side* side : sides) {
              ASSERT_EQ(0, std::memcmp(side->At(layout.HotRow(slot, s, h)), want_row.data(), want_row.size()))
                  << (side == &fused ? "fused" : "reference") << ": slot " << slot << " source " << s << " hot "
                  << h << " mapped to row " << t << " holds other bytes";
            }
          }
        }
      }
    }
    if (!sf.ok()) {  // nothing of the batch counts as resolved
      for (uint32_t gg = 0; gg < 2; ++gg) {
        ASSERT_EQ(fused.resolver->census(gg), before_f[gg]) << "group " << gg;
        ASSERT_EQ(ref.resolver->census(gg), before_r[gg]) << "group " << gg;
      }
      for (size_t qi = 0; qi < queries; ++qi) {
        ASSERT_EQ(out_f[qi], std::vector<Location>(out_f[qi].size(), kNoLocation)) << "fused, query " << qi;
        ASSERT_EQ(out_r[qi], std::vector<Location>(out_r[qi].size(), kNoLocation)) << "reference, query " << qi;
      }
      continue;
    }

    // --- success: locations, bytes, union consistency, census
    for (size_t qi = 0; qi < queries; ++qi) {
      ASSERT_EQ(out_f[qi], out_r[qi]) << "query " << qi;
    }
    std::map<std::pair<SlotIndex, Position>, std::vector<Location>> where;  // (slot, t) -> location per source index
    for (size_t qi = 0; qi < queries; ++qi) {
      const Req& r = reqs[slot_of[qi]];
      for (size_t si = 0; si < sources.size(); ++si) {
        const SourceId s = sources[si];
        for (uint32_t j = 0; j < k; ++j) {
          const Position t = sel[qi][j];
          const Location loc = out_f[qi][si * k + j];
          if (t < 0) {
            ASSERT_EQ(loc, kNoLocation);
            continue;
          }
          const auto want_row = OriginalRow(r.kv.id, s, t, layout.row_bytes(s));
          ASSERT_EQ(0, std::memcmp(fused.At(loc), want_row.data(), want_row.size()))
              << "fused: query " << qi << " source " << s << " position " << t;
          ASSERT_EQ(0, std::memcmp(ref.At(loc), want_row.data(), want_row.size()))
              << "reference: query " << qi << " source " << s << " position " << t;
          const PageState st = r.state[static_cast<size_t>(t / p)];
          if (t >= r.n - T) {
            ASSERT_EQ(loc, layout.TailRow(r.kv.slot, s, t));
          } else if (st == kReady || st == kBoth) {
            ASSERT_EQ(loc, layout.PageRow(host_page(r, static_cast<uint32_t>(t / p)), s, static_cast<uint32_t>(t % p)));
          } else {
            const Location lo = layout.HotRow(r.kv.slot, s, 0);
            ASSERT_GE(loc, lo);
            ASSERT_LT(loc, layout.HotRow(r.kv.slot, s, B));
            ASSERT_EQ((loc - lo) % static_cast<Location>(layout.row_bytes(s)), 0);
          }
          auto& w = where[{r.kv.slot, t}];
          w.resize(sources.size(), kNoLocation);
          if (w[si] == kNoLocation) w[si] = loc;
          ASSERT_EQ(w[si], loc) << "position " << t << " of one request at two locations in one step";
        }
      }
    }
    // Distinct positions of one request never share a hot row.
    std::map<std::pair<SlotIndex, Location>, Position> owner;
    for (const auto& [key, locs] : where) {
      for (Location loc : locs) {
        if (loc == kNoLocation) continue;
        auto [it, inserted] = owner.try_emplace({key.first, loc}, key.second);
        ASSERT_TRUE(inserted || it->second == key.second) << "positions " << it->second << " and " << key.second;
      }
    }
    uint64_t sum_row_bytes = 0;
    for (SourceId s : sources) sum_row_bytes += layout.row_bytes(s);
    uint64_t selected = 0;
    for (const auto& q : sel) selected += static_cast<uint64_t>(std::count_if(q.begin(), q.end(), [](Position t) { return t >= 0; }));
    const Census& af = fused.resolver->census(g);
    const Census& bf = before_f[g];
    ASSERT_EQ(af.direct - bf.direct, want_delta.direct);
    ASSERT_EQ(af.scans_skipped - bf.scans_skipped, want_delta.scans_skipped);
    ASSERT_EQ((af.direct - bf.direct) + (af.hot - bf.hot) + (af.host - bf.host), selected);
    ASSERT_EQ(af.bytes_recovered - bf.bytes_recovered, (af.host - bf.host) * sum_row_bytes);
    ASSERT_EQ(fused.resolver->census(1 - g), before_f[1 - g]);
    for (uint32_t gg = 0; gg < 2; ++gg) ASSERT_EQ(fused.resolver->census(gg), ref.resolver->census(gg));
    hits += static_cast<int>(af.hot - bf.hot);
    recoveries += static_cast<int>(af.host - bf.host);
  }
  std::printf("  outcomes: ok %d, resource exhausted %d, internal %d, unavailable %d (multi-query %d), invalid "
              "argument %d; multi-query unions %d, hot hits %d, host recoveries %d\n",
              outcomes[absl::StatusCode::kOk], outcomes[absl::StatusCode::kResourceExhausted],
              outcomes[absl::StatusCode::kInternal], outcomes[absl::StatusCode::kUnavailable], multi_query_unavailable,
              outcomes[absl::StatusCode::kInvalidArgument], multi_query_unions, hits, recoveries);
  // The schedule exercised every path.
  EXPECT_GT(outcomes[absl::StatusCode::kOk], 500);
  EXPECT_GT(outcomes[absl::StatusCode::kResourceExhausted], 5);
  EXPECT_GT(outcomes[absl::StatusCode::kInternal], 2);
  EXPECT_GT(outcomes[absl::StatusCode::kUnavailable], 2);
  EXPECT_GT(multi_query_unavailable, 1);
  EXPECT_GT(outcomes[absl::StatusCode::kInvalidArgument], 2);
  EXPECT_GT(multi_query_unions, 100);
  EXPECT_GT(hits, 100);
  EXPECT_GT(recoveries, 100);
}

// Issues of FusedResolver found by the randomized test above (fixed), kept here as small deterministic cases, and
// the contract decisions of resolver.h they led to.
//
// A one-source group (8-byte rows), p = 4, T = 8, B = k = 3; each request has 16 rows: pages 0 and 1 leave the tail.
struct SmallKv {
  SmallKv() : layout(*KvLayout::Create(Config())), host(8 * layout.page_bytes()), side(layout, host, true),
              ref(layout, host, false) {}
  static KvConfig Config() {
    KvConfig c;
    c.row_bytes = {8};
    c.groups = {{0}};
    c.page_rows = 4;
    c.hot_rows = 3;
    c.k = 3;
    c.tail_rows = 8;
    c.slots = 2;
    c.optional_pages = 1;
    return c;
  }
  // Request `id` in `slot` with 16 rows; page 0 backed up on host page `slot` * 2 (original rows), page 1 backed up
  // only when `page1_backed`.
  RequestKv Make(RequestId id, SlotIndex slot, bool page1_backed) {
    RequestKv kv;
    kv.id = id;
    kv.slot = slot;
    kv.appended = {16};
    kv.tail_write.assign(1, std::vector<CopyEvent>(8));
    kv.GrowPages(4);
    for (uint32_t j = 0; j < (page1_backed ? 2u : 1u); ++j) {
      kv.PlaceHostCopy(j, HostCopy::kWritten, slot * 2 + j);
      for (uint32_t i = 0; i < 4; ++i) {
        const auto row = OriginalRow(id, 0, Position{j} * 4 + i, 8);
        std::memcpy(host.data() + (slot * 2 + j) * layout.page_bytes() + layout.InPage(0, i), row.data(), 8);
      }
    }
    return kv;
  }
  KvLayout layout;
  std::vector<uint8_t> host;
  Side side, ref;
};

// An INTERNAL error (a selected row with no copy) in a later query of a batch must leave nothing of the batch
// resolved, like RESOURCE_EXHAUSTED and copy failures: the hot slots that earlier queries claimed are invalidated
// (resolver.h). FusedResolver::Plan used to return NoCopy without invalidating plan->assigned, so the slot claimed
// for row 1 of request 1 kept row 1 in its index although its bytes were never copied: the next step counted it a hot
// hit and returned the slot's stale bytes. ReferenceResolver invalidates them.
TEST(ResolverFailure, InternalAfterEarlierClaimsLeavesNoClaim) {
  SmallKv f;
  RequestKv a = f.Make(1, 0, true), b = f.Make(2, 1, false);
  const std::vector<SourceId> src = {0};
  std::vector<Position> sel_a = {1, -1, -1}, sel_b = {5, -1, -1};  // row 5 of request 2: page 1, no copy
  std::vector<Location> out_a(3), out_b(3);
  std::vector<ResolveQuery> batch = {{&a, sel_a, out_a}, {&b, sel_b, out_b}};
  for (Side* s : {&f.side, &f.ref}) {
    ASSERT_EQ(s->resolver->Resolve(0, src, batch).code(), absl::StatusCode::kInternal);
    ResolveQuery again{&a, sel_a, out_a};
    ASSERT_TRUE(s->resolver->Resolve(0, src, {&again, 1}).ok());
    const auto want = OriginalRow(1, 0, 1, 8);
    EXPECT_EQ(0, std::memcmp(s->At(out_a[0]), want.data(), 8)) << (s == &f.side ? "fused" : "reference");
    EXPECT_EQ(s->resolver->census(0).host, 1u) << "row 1 must be recovered from host, not found hot";
  }
}

// Every error leaves every output entry of the batch -1 (resolver.h), whether it comes from validation, planning
// (INTERNAL, RESOURCE_EXHAUSTED) or a copy: the fused resolver used to leave its output untouched on a planning error
// while the reference filled it with -1. Outputs start at -7 here.
TEST(ResolverFailure, EveryErrorClearsEveryOutput) {
  SmallKv f;
  RequestKv a = f.Make(1, 0, true), b = f.Make(2, 1, false);
  const std::vector<SourceId> src = {0};
  struct Case {
    const char* name;
    std::vector<Position> sel_a, sel_b;
    absl::StatusCode want;
  };
  const Case cases[] = {
      {"internal", {1, 12, -1}, {12, 5, -1}, absl::StatusCode::kInternal},         // b's row 5: no copy
      {"exhausted", {1, 12, -1}, {0, 1, 2}, absl::StatusCode::kResourceExhausted},  // a's union 0..3 > B = 3
      {"invalid", {1, 12, -1}, {16, -1, -1}, absl::StatusCode::kInvalidArgument},   // b has 16 rows
  };
  for (const Case& cs : cases) {
    for (Side* s : {&f.side, &f.ref}) {
      std::vector<Location> out_a(3, -7), out_b(3, -7);
      std::vector<ResolveQuery> batch = {{&a, cs.sel_a, out_a}, {&b, cs.sel_b, out_b}};
      const std::vector<Position> sel_a2 = {3, -1, -1};
      if (cs.want == absl::StatusCode::kResourceExhausted) {
        batch[1] = ResolveQuery{&a, cs.sel_b, out_b};
        batch.push_back(ResolveQuery{&a, sel_a2, out_a});  // out_a written twice: both must end -1
      }
      const Census before = s->resolver->census(0);
      EXPECT_EQ(s->resolver->Resolve(0, src, batch).code(), cs.want) << cs.name;
      const char* who = s == &f.side ? "fused" : "reference";
      EXPECT_EQ(out_a, std::vector<Location>(3, kNoLocation)) << cs.name << " " << who;
      EXPECT_EQ(out_b, std::vector<Location>(3, kNoLocation)) << cs.name << " " << who;
      EXPECT_EQ(s->resolver->census(0), before) << cs.name << " " << who;
    }
  }
  // A failed copy (already so before this change).
  for (Side* s : {&f.side, &f.ref}) {
    std::vector<Position> sel = {2, 12, -1};
    std::vector<Location> out(3, -7);
    ResolveQuery q{&a, sel, out};
    s->device.SetCopyHook([](const CopyInfo& i) {
      return i.kind == CopyKind::kHostToDevice ? CopyFate::kFail : CopyFate::kRun;
    });
    EXPECT_EQ(s->resolver->Resolve(0, src, {&q, 1}).code(), absl::StatusCode::kUnavailable);
    s->device.SetCopyHook(nullptr);
    EXPECT_EQ(out, std::vector<Location>(3, kNoLocation));
  }
}

// A position repeated in one query is INVALID_ARGUMENT in both resolvers (resolver.h), before any state changes. It
// used to be accepted with different LRU effects: the reference touched the slot again for the repeated miss (most
// recent), FusedResolver's Claim returned the slot without touching it; same census, but later victims (locations)
// differed, against resolver.h's "same locations and census for the same inputs". Top-k selections hold distinct
// positions, so rejecting costs the worker nothing. -1 padding may repeat; several queries of one request may share
// rows.
TEST(ResolverContract, PositionRepeatedInOneQueryIsInvalid) {
  SmallKv f;
  RequestKv a = f.Make(1, 0, true);
  RequestKv a_ref = f.Make(1, 0, true);
  const std::vector<SourceId> src = {0};
  std::vector<Location> out_f(3), out_r(3);
  auto both = [&](std::vector<Position> sel, absl::StatusCode want) {
    std::fill(out_f.begin(), out_f.end(), -7);
    std::fill(out_r.begin(), out_r.end(), -7);
    ResolveQuery qf{&a, sel, out_f}, qr{&a_ref, sel, out_r};
    EXPECT_EQ(f.side.resolver->Resolve(0, src, {&qf, 1}).code(), want) << "fused " << sel[0] << sel[1] << sel[2];
    EXPECT_EQ(f.ref.resolver->Resolve(0, src, {&qr, 1}).code(), want) << "reference " << sel[0] << sel[1] << sel[2];
    EXPECT_EQ(out_f, out_r) << "selection " << sel[0] << ", " << sel[1] << ", " << sel[2];
    EXPECT_EQ(f.side.resolver->census(0), f.ref.resolver->census(0));
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument, kOk = absl::StatusCode::kOk;
  both({0, 1, 0}, kInvalid);  // a repeated miss (the case that diverged)
  EXPECT_EQ(out_f, std::vector<Location>(3, kNoLocation));
  EXPECT_EQ(f.side.resolver->census(0), Census{});
  both({12, 12, -1}, kInvalid);  // a repeated tail row
  both({0, -1, -1}, kOk);        // row 0 into slot 0; -1 repeats
  both({0, 0, 1}, kInvalid);     // a repeated hit
  both({1, -1, -1}, kOk);        // row 1 into slot 1
  both({2, -1, -1}, kOk);        // row 2 into the empty slot 2
  both({3, -1, -1}, kOk);        // the victim: row 0 (slot 0), least recent: nothing above touched it again
  EXPECT_EQ(out_f[0], f.layout.HotRow(0, 0, 0));
  // Two queries of one request selecting the same row: one union, one slot.
  std::vector<Position> s1 = {0, 2, -1}, s2 = {0, -1, -1};
  std::vector<Location> o1(3), o2(3);
  std::vector<ResolveQuery> batch = {{&a, s1, o1}, {&a, s2, o2}};
  ASSERT_TRUE(f.side.resolver->Resolve(0, src, batch).ok());
  EXPECT_EQ(o1[0], o2[0]);
}

// Request 1 with n rows of one source (tail of 4 rows), every one of its `pages` pages backed up on the host page of
// the same index: every row not in the tail is a host recovery until it is cached.
RequestKv HostBackedRequest(Position n, uint32_t pages) {
  RequestKv kv;
  kv.id = 1;
  kv.appended = {n};
  kv.tail_write.assign(1, std::vector<CopyEvent>(4));
  kv.GrowPages(pages);
  for (uint32_t p = 0; p < pages; ++p) {
    kv.PlaceHostCopy(p, HostCopy::kWritten, p);
  }
  return kv;
}

// The duplicate check has two forms (Resolver::CheckDistinct): a bitmap when the request has at most 64 positions per
// selected row, a hash table otherwise. Both reject a repeated position wherever it sits (first and last entry,
// positions 64 apart, i.e. the same bit of neighbouring bitmap words) and accept distinct ones, for a short request
// (n = 16 <= 64 k) and a long one (n = 1024 > 64 k), in both resolvers.
TEST(ResolverContract, RepeatedPositionIsFoundInShortAndLongRequests) {
  KvConfig c = SmallKv::Config();  // B = k = 3, p = 4
  c.tail_rows = 4;
  const KvLayout layout = *KvLayout::Create(c);
  for (const Position n : {Position{16}, Position{1024}}) {
    ASSERT_EQ(n <= 64 * 3, n == 16);  // the two forms
    const uint32_t pages = static_cast<uint32_t>((n + 3) / 4);
    std::vector<uint8_t> host(uint64_t{pages} * layout.host_page_bytes());
    Side fused(layout, host, true), ref(layout, host, false);
    RequestKv kv = HostBackedRequest(n, pages);
    const std::vector<SourceId> src = {0};
    for (Side* side : {&fused, &ref}) {
      const char* who = side == &fused ? "fused" : "reference";
      auto code = [&](std::vector<Position> sel) {
        std::vector<Location> out(3, -7);
        ResolveQuery q{&kv, sel, out};
        return side->resolver->Resolve(0, src, {&q, 1}).code();
      };
      const Position last = n - 5;  // the last row before the tail
      EXPECT_EQ(code({last, 1, last}), absl::StatusCode::kInvalidArgument) << who << " n=" << n;
      EXPECT_EQ(code({0, -1, 0}), absl::StatusCode::kInvalidArgument) << who << " n=" << n;
      EXPECT_EQ(code({-1, 2, -1}), absl::StatusCode::kOk) << who << " n=" << n;  // -1 padding may repeat
      EXPECT_EQ(code({1, 1 + 4, 1 + 8}), absl::StatusCode::kOk) << who << " n=" << n;
      if (n > 64 + 1) {
        EXPECT_EQ(code({1, 1 + 64, -1}), absl::StatusCode::kOk) << who << " n=" << n;  // same bit, next word
        EXPECT_EQ(code({1 + 64, 3, 1 + 64}), absl::StatusCode::kInvalidArgument) << who << " n=" << n;
      }
    }
  }
}

// The two forms of the duplicate check meet at n = 64 k: n = 192 (k = 3) takes the bitmap (the last word's top bit
// is position 191), n = 193 the hash table. In both, and in both resolvers: the top positions are accepted and found
// repeated, a selection of padding only (-1 three times) and an empty selection (k = 0, no output) resolve to nothing,
// and fused and reference give the same locations.
TEST(ResolverContract, DuplicateCheckAtTheBitmapBoundaryAndDegenerateSelections) {
  KvConfig c = SmallKv::Config();  // B = k = 3, p = 4
  c.tail_rows = 4;
  const KvLayout layout = *KvLayout::Create(c);
  for (const Position n : {Position{64 * 3}, Position{64 * 3 + 1}}) {
    const uint32_t pages = static_cast<uint32_t>((n + 3) / 4);
    std::vector<uint8_t> host(uint64_t{pages} * layout.host_page_bytes());
    Side fused(layout, host, true), ref(layout, host, false);
    RequestKv kv = HostBackedRequest(n, pages);
    const std::vector<SourceId> src = {0};
    std::vector<std::vector<Location>> outs[2];
    for (Side* side : {&fused, &ref}) {
      const char* who = side == &fused ? "fused" : "reference";
      auto resolve = [&](std::vector<Position> sel) {
        std::vector<Location> out(sel.size(), -7);
        ResolveQuery q{&kv, sel, out};
        const absl::StatusCode code = side->resolver->Resolve(0, src, {&q, 1}).code();
        outs[side == &fused ? 0 : 1].push_back(out);
        return code;
      };
      EXPECT_EQ(resolve({191, 127, 63}), absl::StatusCode::kOk) << who << " n=" << n;  // bit 63 of each word
      EXPECT_EQ(resolve({191, 0, 191}), absl::StatusCode::kInvalidArgument) << who << " n=" << n;
      EXPECT_EQ(resolve({n - 1, 191, -1}), n == 192 ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kOk)
          << who << " n=" << n;
      EXPECT_EQ(resolve({-1, -1, -1}), absl::StatusCode::kOk) << who << " n=" << n;
      EXPECT_EQ(resolve({}), absl::StatusCode::kOk) << who << " n=" << n;
      EXPECT_EQ(resolve({n}), absl::StatusCode::kInvalidArgument) << who << " n=" << n;  // beyond the rows
      EXPECT_EQ(resolve({-2}), absl::StatusCode::kInvalidArgument) << who << " n=" << n;
    }
    EXPECT_EQ(outs[0], outs[1]) << "n=" << n;
    EXPECT_EQ(outs[0][3], (std::vector<Location>(3, kNoLocation))) << "n=" << n;  // padding resolves to nothing
  }
}

// Resolve takes the whole group (each source once, any order), else INVALID_ARGUMENT (resolver.h): the hot cache of
// a request is shared by the group's sources, so a slot filled for source 0 alone used to be a hit with stale bytes
// (zeros here) for source 1 in the next whole-group step.
TEST(ResolverContract, PartialGroupIsInvalid) {
  KvConfig c;
  c.row_bytes = {8, 16};
  c.groups = {{0, 1}};
  c.page_rows = 4;
  c.hot_rows = 3;
  c.k = 3;
  c.tail_rows = 8;
  c.slots = 1;
  c.optional_pages = 1;
  const KvLayout layout = *KvLayout::Create(c);
  std::vector<uint8_t> host(2 * layout.page_bytes());
  Side fused(layout, host, true), ref(layout, host, false);
  RequestKv kv;
  kv.id = 1;
  kv.appended = {16, 16};
  kv.tail_write.assign(2, std::vector<CopyEvent>(8));
  kv.GrowPages(4);
  kv.PlaceHostCopy(0, HostCopy::kWritten, 0);
  for (SourceId s = 0; s < 2; ++s) {
    for (uint32_t i = 0; i < 4; ++i) {
      const auto row = OriginalRow(1, s, i, layout.row_bytes(s));
      std::memcpy(host.data() + layout.InPage(s, i), row.data(), row.size());
    }
  }
  std::vector<Position> sel = {1, -1, -1};
  for (Side* side : {&fused, &ref}) {
    const char* who = side == &fused ? "fused" : "reference";
    for (const std::vector<SourceId>& src : {std::vector<SourceId>{0}, std::vector<SourceId>{1},
                                             std::vector<SourceId>{0, 0}, std::vector<SourceId>{1, 1, 0}}) {
      std::vector<Location> out(src.size() * 3, -7);
      ResolveQuery q{&kv, sel, out};
      EXPECT_EQ(side->resolver->Resolve(0, src, {&q, 1}).code(), absl::StatusCode::kInvalidArgument)
          << who << ", " << src.size() << " sources";
      EXPECT_EQ(out, std::vector<Location>(out.size(), kNoLocation)) << who;
    }
    const std::vector<SourceId> src = {1, 0};  // whole, either order
    std::vector<Location> out(6);
    ResolveQuery q{&kv, sel, out};
    ASSERT_TRUE(side->resolver->Resolve(0, src, {&q, 1}).ok()) << who;
    for (size_t si = 0; si < 2; ++si) {
      const auto want = OriginalRow(1, src[si], 1, layout.row_bytes(src[si]));
      EXPECT_EQ(0, std::memcmp(side->At(out[si * 3]), want.data(), want.size())) << who << " source " << src[si];
    }
  }
}

// A tail row whose write failed is not there: resolving it fails the batch in both resolvers (UNAVAILABLE, outputs
// -1, nothing counted). The fused resolver used to skip a tail write that was already done, failed or not, and
// returned the row's location (bytes never written); the reference waited it and failed.
TEST(ResolverFailure, FailedTailWriteFailsTheBatch) {
  SmallKv f;
  const std::vector<SourceId> src = {0};
  for (Side* s : {&f.side, &f.ref}) {
    const char* who = s == &f.side ? "fused" : "reference";
    RequestKv a = f.Make(1, 0, true);
    s->device.SetCopyHook([](const CopyInfo&) { return CopyFate::kFail; });
    const uint8_t row[8] = {};
    const HostToDeviceCopy op{DeviceRange{s->pool, f.layout.TailRow(0, 0, 12), 8}, row};
    a.tail_write[0][12 % 8] = s->device.CopyHostToDevice({&op, 1}, {});  // the write of row 12, failed
    s->device.SetCopyHook(nullptr);
    ASSERT_TRUE(a.tail_write[0][12 % 8].Failed());
    std::vector<Position> sel = {12, 1, -1};
    std::vector<Location> out(3, -7);
    ResolveQuery q{&a, sel, out};
    EXPECT_EQ(s->resolver->Resolve(0, src, {&q, 1}).code(), absl::StatusCode::kUnavailable) << who;
    EXPECT_EQ(out, std::vector<Location>(3, kNoLocation)) << who;
    EXPECT_EQ(s->resolver->census(0), Census{}) << who;
    EXPECT_EQ(s->resolver->HotPosition(0, 0, 0), kNoPosition) << who << ": row 1's claim is invalidated";
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomResolver, ::testing::Range<uint64_t>(1, 9));

}  // namespace
}  // namespace dhs
