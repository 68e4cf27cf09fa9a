// libdhs/kv_port.cc: see kv_port.h.
#include "libdhs/kv_port.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dhs::lib {

KvPort::KvPort(PortStore* store) : store_(store) {
  const KvConfig& c = store_->config();
  groups_ = c.groups;
  group_of_.resize(c.row_bytes.size());
  for (uint32_t g = 0; g < groups_.size(); ++g) {
    for (SourceId s : groups_[g]) group_of_[s] = g;
  }
}

Position KvPort::Fewest(RequestId request) const {
  Position n = INT64_MAX;
  for (SourceId s = 0; s < sources(); ++s) n = std::min(n, Rows(request, s));
  return n;
}

Position KvPort::Most(RequestId request) const {
  Position n = 0;
  for (SourceId s = 0; s < sources(); ++s) n = std::max(n, Rows(request, s));
  return n;
}

absl::Status KvPort::CheckHeldRoom(RequestId request, Position first, uint32_t count) const {
  const Position held_from = store_->HoldFrom(request);
  if (held_from < 0 || !store_->bounded_tail()) return absl::OkStatus();
  // A round's unverified rows complete no page until the commit, so the tail must hold them with the partial page
  // before them (workerd's K_max <= T - p + 1 rule, geometry.h): row t reuses the tail slot of row t - T, which
  // must lie in a page below the held one. Found by fuzz/libdhs_fuzz.cc (the KV store indexed a page it never grew).
  const KvConfig& c = store_->config();
  const Position limit = held_from / c.page_rows * c.page_rows + c.tail_rows;
  if (first + count > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request ", request, ": held rows from ", held_from, " up to position ", first + count - 1,
        " do not fit the tail (positions below ", limit, " while the round is held: T = ", c.tail_rows,
        " rows); commit the round first"));
  }
  return absl::OkStatus();
}

absl::Status KvPort::AppendSource(RequestId request, SourceId source, Position first, uint32_t count,
                                  std::span<const uint8_t> rows, uint64_t max_rows) {
  if (source >= sources()) {
    return absl::InvalidArgumentError(absl::StrCat("source ", source, " out of range (", sources(), " sources)"));
  }
  const uint64_t row_bytes = store_->config().row_bytes[source];
  const Position held = Rows(request, source);
  if (first != held) {
    return absl::OutOfRangeError(absl::StrCat("request ", request, ": append of source ", source, " at position ",
                                              first, ", but it holds ", held, " rows (the next must be ", held, ")"));
  }
  if (max_rows > 0 && static_cast<uint64_t>(first) + count > max_rows) {
    return absl::OutOfRangeError(absl::StrCat("request ", request, ": positions ", first, " .. ",
                                              first + int64_t{count} - 1, " beyond its max_rows ", max_rows));
  }
  if (count == 0 || rows.size() != row_bytes * count) {
    return absl::InvalidArgumentError(absl::StrCat("rows: ", rows.size(), " bytes for ", count, " positions of one "
                                                   "source; need ", row_bytes * count, " (positions x row_bytes)"));
  }
  if (absl::Status s = CheckHeldRoom(request, first, count); !s.ok()) return s;
  // One run per page, as far as the tail lets this source run ahead (HierarchicalKvAccess::AppendRun: a row whose
  // tail slot still holds a page not complete and backed up is refused, the rows before it stay appended).
  const Position p = store_->config().page_rows;
  for (Position t = first, last = first + count; t < last;) {
    const Position end = std::min(last, (t / p + 1) * p);
    if (store_->host_writes_paused() && !store_->TailHasRoom(request, source, end - t)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "request ", request, ": memd is away and the tail has no room for source ", source, "'s positions ", t,
          " .. ", end - 1, " without a host write",
          t > first ? absl::StrCat(" (", first, " .. ", t - 1, " were appended)") : "",
          "; poll and retry once memd is back"));
    }
    const absl::Status st = store_->kv().AppendRun(request, source, t, static_cast<uint32_t>(end - t),
                                           rows.subspan((t - first) * row_bytes, (end - t) * row_bytes));
    if (!st.ok()) {
      const Position after = Rows(request, source);
      counters_.rows_appended += static_cast<uint64_t>(after - t);
      std::string hint;  // the tail is full because this source runs ahead: a poll does not help (review finding)
      if (st.code() == absl::StatusCode::kResourceExhausted && Fewest(request) < t) {
        SourceId behind = 0;
        for (SourceId s = 0; s < sources(); ++s) behind = Rows(request, s) < Rows(request, behind) ? s : behind;
        hint = absl::StrCat("; source ", behind, " holds only ", Rows(request, behind), " rows: a page gets its host "
                            "copy once every source holds it, so append the other sources first");
      }
      return after == first ? absl::Status(st.code(), absl::StrCat(st.message(), hint))
                            : absl::Status(st.code(), absl::StrCat(st.message(), " (source ", source, " positions ",
                                                                   first, " .. ", after - 1, " were appended)", hint));
    }
    counters_.rows_appended += static_cast<uint64_t>(end - t);
    t = end;
  }
  return absl::OkStatus();
}

absl::Status KvPort::AppendKeys(RequestId request, uint32_t indexer, Position first, uint32_t count,
                                std::span<const uint8_t> keys) {
  const KvConfig& c = store_->config();
  if (indexer >= c.key_bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("indexer ", indexer, " out of range (", c.key_bytes.size(),
                                                   " indexers)"));
  }
  const uint64_t key_bytes = c.key_bytes[indexer];
  if (count == 0 || keys.size() != key_bytes * count) {
    return absl::InvalidArgumentError(absl::StrCat("keys: ", keys.size(), " bytes for ", count, " positions; need ",
                                                   key_bytes * count, " (positions x index_key_bytes)"));
  }
  if (first < 0 || Position{count} > Most(request) - first) {  // no overflow near INT64_MAX (review finding)
    return absl::OutOfRangeError(absl::StrCat("request ", request, ": keys of positions ", first, " .. ",
                                              first + int64_t{count} - 1, " go beyond the ", Most(request),
                                              " rows its sources hold (keys follow their rows)"));
  }
  std::vector<float> k(keys.size() / sizeof(float));
  std::memcpy(k.data(), keys.data(), keys.size());
  // A page whose host copy a poll confirmed refuses them (FAILED_PRECONDITION), nothing written.
  if (absl::Status s = store_->kv().StoreIndexKeys(request, indexer, first, k); !s.ok()) return s;
  counters_.keys_stored += count;
  return absl::OkStatus();
}

absl::Status KvPort::Resolve(std::span<const SourceId> sources, std::span<Query> queries) {
  // The sources: exactly one group's, each once, in any order (the resolver plans a group's batch once and fills
  // the group's shared hot-cache slots for every source of it).
  if (sources.empty()) return absl::InvalidArgumentError("a resolve names no source");
  for (SourceId s : sources) {
    if (s >= this->sources()) {
      return absl::InvalidArgumentError(absl::StrCat("source ", s, " out of range (", this->sources(), " sources)"));
    }
  }
  const uint32_t group = group_of_[sources[0]];
  if (sources.size() != groups_[group].size() ||
      !std::is_permutation(sources.begin(), sources.end(), groups_[group].begin())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sources [", absl::StrJoin(sources, ", "), "] are not one group's: source ", sources[0], " is in group ",
        group, ", whose sources are [", absl::StrJoin(groups_[group], ", "), "]; a resolve names every source of "
        "one group once"));
  }
  const uint32_t k = store_->config().k;
  auto unread = unread_.find(group);
  for (size_t i = 0; i < queries.size(); ++i) {
    const Query& q = queries[i];
    if (q.selection.size() > k) {
      return absl::InvalidArgumentError(absl::StrCat("query ", i, ": selection of ", q.selection.size(),
                                                     " positions is longer than k = ", k));
    }
    if (q.rows_out.size() != q.selection.size() * sources.size()) {
      return absl::InvalidArgumentError(absl::StrCat("query ", i, ": locations hold ", q.rows_out.size(),
                                                     " entries for ", q.selection.size(), " positions of ",
                                                     sources.size(), " sources"));
    }
    if (unread != unread_.end() && unread->second.contains(q.request)) {
      // Found by the libFuzzer run of fuzz/libdhs_fuzz.cc (fuzz/findings/libdhs/timeout-5d954c15...): the resolve
      // waited on the readers fence of an earlier resolve's rows in the same slot, which only ReadersDone ends.
      return absl::FailedPreconditionError(absl::StrCat(
          "query ", i, ": request ", q.request, " was resolved on source ", sources[0], "'s group since its last "
          "dhs_readers_done; call dhs_readers_done for that source first (rows read may be replaced)"));
    }
    Position held = INT64_MAX;  // the rows every named source holds
    for (SourceId s : sources) held = std::min(held, Rows(q.request, s));
    for (size_t j = 0; j < q.selection.size(); ++j) {
      const Position t = q.selection[j];
      if (t < -1) {  // out of range as a negative append position is
        return absl::OutOfRangeError(absl::StrCat("query ", i, ": position ", t, " at ", j,
                                                  " is negative (-1 alone is padding)"));
      }
      if (t >= held) {
        return absl::OutOfRangeError(absl::StrCat("query ", i, ": position ", t, " at ", j, " is beyond request ",
                                                  q.request, "'s history of ", held, " rows",
                                                  sources.size() > 1 ? " (on every source named)" : ""));
      }
    }
  }
  std::vector<KvQuery> batch(queries.size());
  for (size_t i = 0; i < queries.size(); ++i) {
    batch[i] = KvQuery{queries[i].request, queries[i].selection, queries[i].rows_out, queries[i].at};
  }
  if (absl::Status s = store_->kv().Fetch(sources, batch); !s.ok()) return s;
  for (const Query& q : queries) unread_[group].insert(q.request);
  counters_.queries_resolved += queries.size();
  ++counters_.resolves;
  return absl::OkStatus();
}

absl::Status KvPort::ReadersDone(std::span<const SourceId> sources) {
  for (SourceId s : sources) {
    if (s >= this->sources()) {
      return absl::InvalidArgumentError(absl::StrCat("source ", s, " out of range (", this->sources(), " sources)"));
    }
  }
  store_->kv().ReadersDone(sources);  // ends every group named
  for (SourceId s : sources) unread_.erase(group_of_[s]);
  return absl::OkStatus();
}

std::vector<SourceId> KvPort::UnreadGroupsOf(RequestId request) const {
  std::vector<SourceId> out;
  for (const auto& [group, requests] : unread_) {
    if (requests.contains(request)) out.push_back(groups_[group][0]);
  }
  return out;
}

void KvPort::EndAllReaders() {
  std::vector<SourceId> read;
  for (const auto& [group, requests] : unread_) read.push_back(groups_[group][0]);
  store_->kv().ReadersDone(read);
  unread_.clear();
}

namespace {
std::vector<uint32_t> PagesOf(std::span<const HostBackedPage> backed) {
  std::vector<uint32_t> pages;
  for (const HostBackedPage& h : backed) pages.push_back(h.page);
  return pages;
}
std::vector<uint64_t> ChecksumsOf(std::span<const HostBackedPage> backed) {
  std::vector<uint64_t> sums;
  for (const HostBackedPage& h : backed) sums.push_back(h.checksum);
  return sums;
}
}  // namespace

absl::StatusOr<std::vector<HostBackedPage>> KvPort::VerifyHostPages(RequestId request,
                                                                    std::vector<HostBackedPage> backed) {
  if (backed.empty()) return backed;
  absl::StatusOr<std::vector<uint32_t>> bad = store_->CheckHostCopies(request, PagesOf(backed), ChecksumsOf(backed));
  if (!bad.ok()) return bad.status();
  counters_.pages_verified += backed.size() - bad->size();
  counters_.pages_mismatched += bad->size();
  std::erase_if(backed, [&](const HostBackedPage& h) {
    return std::find(bad->begin(), bad->end(), h.page) != bad->end();
  });
  return backed;
}

absl::Status KvPort::MakeHostReady(RequestId request, std::span<const HostBackedPage> backed) {
  return store_->ImportHostPages(request, PagesOf(backed), ChecksumsOf(backed));
}

absl::StatusOr<KvPort::GrantedHostPages> KvPort::TakeGrantedHostPages(RequestId request,
                                                                     std::vector<HostBackedPage> granted) {
  GrantedHostPages out;
  if (granted.empty()) return out;
  const size_t listed = granted.size();
  absl::StatusOr<std::vector<HostBackedPage>> good = VerifyHostPages(request, std::move(granted));
  if (!good.ok()) return good.status();
  out.pages = *std::move(good);
  out.mismatched = listed - out.pages.size();
  if (absl::Status s = MakeHostReady(request, out.pages); !s.ok()) return s;
  return out;
}

absl::Status KvPort::ImportRows(RequestId request, uint32_t first, uint32_t count,
                                std::vector<std::vector<float>>& keys_out) {
  if (count == 0) return absl::InvalidArgumentError(absl::StrCat("request ", request, ": an import of 0 pages"));
  // Every source at first * p rows and each page host-ready: the store's checks (ImportHostRows).
  if (absl::Status s = store_->ImportHostRows(request, first, count, keys_out); !s.ok()) return s;
  counters_.pages_imported += count;
  return absl::OkStatus();
}

absl::Status KvPort::Hold(RequestId request, Position from, uint64_t max_rows) {
  const Position most = Most(request);
  if (from < most || (max_rows > 0 && static_cast<uint64_t>(from) > max_rows)) {
    return absl::OutOfRangeError(absl::StrCat("hold from ", from, ": must be in [appended rows ", most,
                                              max_rows > 0 ? absl::StrCat(", max_rows ", max_rows) : ", ...",
                                              "]"));
  }
  if (absl::Status s = store_->kv().HoldUnverified(request, from); !s.ok()) return s;
  ++counters_.holds;
  return absl::OkStatus();
}

absl::Status KvPort::Commit(RequestId request, Position length) {
  const Position held_from = store_->HoldFrom(request);
  if (held_from < 0) return absl::FailedPreconditionError(absl::StrCat("request ", request, " holds no rows"));
  const Position fewest = Fewest(request);
  if (length < held_from || length > fewest) {
    return absl::OutOfRangeError(absl::StrCat("commit length ", length, ": must be in [held from ", held_from,
                                              ", rows every source holds ", fewest, "]"));
  }
  if (absl::Status s = store_->kv().CommitVerified(request, length); !s.ok()) return s;
  ++counters_.commits;
  return absl::OkStatus();
}

absl::Status PortKvAccess::Append(RequestId request, SourceId source, Position position,
                                  std::span<const uint8_t> row) {
  return port_->AppendSource(request, source, position, 1, row);
}

absl::Status PortKvAccess::AppendRun(RequestId request, SourceId source, Position first, uint32_t count,
                                     std::span<const uint8_t> rows) {
  return port_->AppendSource(request, source, first, count, rows);
}

absl::Status PortKvAccess::StoreIndexKeys(RequestId request, uint32_t indexer, Position first,
                                          std::span<const float> keys) {
  const KvConfig& c = *config_;
  if (c.key_bytes.empty()) return absl::OkStatus();  // no key regions (KvAccess: the store ignores them)
  if (indexer >= c.key_bytes.size() || (keys.size() * sizeof(float)) % c.key_bytes[indexer] != 0) {
    return kv_->StoreIndexKeys(request, indexer, first, keys);  // the store's INVALID_ARGUMENT
  }
  const auto count = static_cast<uint32_t>(keys.size() * sizeof(float) / c.key_bytes[indexer]);
  if (count == 0) return absl::OkStatus();
  return port_->AppendKeys(request, indexer, first, count,
                           std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(keys.data()),
                                                    keys.size() * sizeof(float)));
}

absl::Status PortKvAccess::Fetch(std::span<const SourceId> sources, std::span<KvQuery> batch) {
  std::vector<KvPort::Query> queries(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    queries[i] = KvPort::Query{batch[i].request, batch[i].selection, batch[i].rows_out, batch[i].at};
  }
  return port_->Resolve(sources, queries);
}

void PortKvAccess::ReadersDone(std::span<const SourceId> sources) {
  // KvAccess::ReadersDone cannot fail; the model names only its own sources.
  if (absl::Status s = port_->ReadersDone(sources); !s.ok()) kv_->ReadersDone(sources);
}

}  // namespace dhs::lib
