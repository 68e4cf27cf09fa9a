// workerd/kv/layout.cc: see layout.h.
#include "workerd/kv/layout.h"

#include "absl/strings/str_cat.h"

namespace dhs {

absl::StatusOr<KvLayout> KvLayout::Create(const KvConfig& c) {
  const size_t n = c.row_bytes.size();
  if (n == 0) return absl::InvalidArgumentError("KvConfig: no sources");
  if (c.page_rows == 0) return absl::InvalidArgumentError("KvConfig: page_rows (p) must be > 0");
  if (c.k == 0) return absl::InvalidArgumentError("KvConfig: k must be > 0");
  if (c.hot_rows < c.k) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvConfig: hot cache B = ", c.hot_rows, " rows is smaller than k = ", c.k, " (brief §5 needs B >= k)"));
  }
  if (c.tail_rows == 0 || c.tail_rows % c.page_rows != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvConfig: tail_rows = ", c.tail_rows, " must be a positive multiple of p = ", c.page_rows));
  }
  if (c.slots == 0) return absl::InvalidArgumentError("KvConfig: slots must be > 0");
  KvLayout l;
  l.config_ = c;
  l.group_of_.assign(n, UINT32_MAX);
  for (uint32_t g = 0; g < c.groups.size(); ++g) {
    if (c.groups[g].empty()) return absl::InvalidArgumentError(absl::StrCat("KvConfig: group ", g, " is empty"));
    for (SourceId s : c.groups[g]) {
      if (s >= n) return absl::InvalidArgumentError(absl::StrCat("KvConfig: group ", g, " names unknown source ", s));
      if (l.group_of_[s] != UINT32_MAX) {
        return absl::InvalidArgumentError(absl::StrCat("KvConfig: source ", s, " is in two groups"));
      }
      l.group_of_[s] = g;
    }
  }
  for (size_t s = 0; s < n; ++s) {
    if (l.group_of_[s] == UINT32_MAX) return absl::InvalidArgumentError(absl::StrCat("KvConfig: source ", s, " has no group"));
    if (c.row_bytes[s] == 0) return absl::InvalidArgumentError(absl::StrCat("KvConfig: source ", s, " has 0 row bytes"));
  }
  uint64_t slot = 0, page = 0;
  for (size_t s = 0; s < n; ++s) {
    l.slot_src_.push_back(slot);
    l.page_src_.push_back(page);
    slot += (uint64_t{c.hot_rows} + c.tail_rows) * c.row_bytes[s];
    page += c.row_bytes[s];
  }
  uint64_t keys = 0;
  for (size_t i = 0; i < c.key_bytes.size(); ++i) {
    if (c.key_bytes[i] == 0) return absl::InvalidArgumentError(absl::StrCat("KvConfig: indexer ", i, " has 0 key bytes"));
    l.key_src_.push_back(keys);
    keys += c.key_bytes[i];
  }
  l.slot_bytes_ = slot;
  l.page_bytes_ = page * c.page_rows;
  l.host_page_bytes_ = (page + keys) * c.page_rows;
  l.pages_base_ = slot * c.slots;
  return l;
}

}  // namespace dhs
