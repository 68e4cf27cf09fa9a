#include "workerd/model/resident_kv_access.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dhs::model {

ResidentKvAccess::ResidentKvAccess(std::vector<size_t> row_bytes, size_t arena_bytes, size_t page_rows,
                                   std::span<uint8_t> memory)
    : row_bytes_(std::move(row_bytes)), page_rows_(std::max<size_t>(page_rows, 1)) {
  size_t widest = 1;
  for (size_t b : row_bytes_) widest = std::max(widest, b);
  page_bytes_ = page_rows_ * widest;
  if (!memory.empty()) arena_bytes = std::min(arena_bytes, memory.size());
  total_pages_ = arena_bytes / page_bytes_;
  if (!memory.empty()) {
    arena_ = memory.data();
  } else {
    // Not zero-filled: a page is written before it is read, and untouched pages of a large arena cost no memory.
    owned_.reset(new uint8_t[std::max<size_t>(total_pages_ * page_bytes_, 1)]);
    arena_ = owned_.get();
  }
  for (size_t p = total_pages_; p > 0; --p) free_pages_.push_back(static_cast<uint32_t>(p - 1));
}

std::unique_ptr<ResidentKvAccess> ResidentKvAccess::ForModel(const ModelConfig& config, size_t arena_bytes,
                                                             size_t page_rows) {
  return std::make_unique<ResidentKvAccess>(std::vector<size_t>(config.n_sources(), config.row_bytes()), arena_bytes,
                                            page_rows);
}

const uint8_t* ResidentKvAccess::RowAt(const Stream& stream, SourceId source, Position position) const {
  const size_t p = static_cast<size_t>(position);
  return arena_ + stream.pages[p / page_rows_] * page_bytes_ + (p % page_rows_) * row_bytes_[source];
}

absl::Status ResidentKvAccess::Append(RequestId request, SourceId source, Position position,
                                      std::span<const uint8_t> row) {
  if (source >= row_bytes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("resident kv: unknown source ", source));
  }
  if (row.size() != row_bytes_[source]) {
    return absl::InvalidArgumentError(absl::StrCat("resident kv: row of ", row.size(), " bytes for source ", source,
                                                   ", expected ", row_bytes_[source]));
  }
  auto& streams = streams_[request];
  if (streams.empty()) streams.resize(row_bytes_.size());
  Stream& stream = streams[source];
  if (position != stream.rows) {
    return absl::InvalidArgumentError(absl::StrCat("resident kv: request ", request, " source ", source,
                                                   " appends position ", position, ", expected ", stream.rows));
  }
  if (static_cast<size_t>(position) % page_rows_ == 0) {
    if (free_pages_.empty()) {
      return absl::ResourceExhaustedError(absl::StrCat("resident kv: arena full (", total_pages_, " pages)"));
    }
    stream.pages.push_back(free_pages_.back());
    free_pages_.pop_back();
  }
  std::memcpy(const_cast<uint8_t*>(RowAt(stream, source, position)), row.data(), row.size());
  stream.rows++;
  return absl::OkStatus();
}

absl::Status ResidentKvAccess::Fetch(std::span<const SourceId> sources, std::span<KvQuery> batch) {
  for (SourceId s : sources) {
    if (s >= row_bytes_.size()) return absl::InvalidArgumentError(absl::StrCat("resident kv: unknown source ", s));
  }
  for (const KvQuery& q : batch) {
    if (q.rows_out.size() != sources.size() * q.selection.size()) {
      return absl::InvalidArgumentError(absl::StrCat("resident kv: request ", q.request, ": rows_out holds ",
                                                     q.rows_out.size(), " entries, expected ",
                                                     sources.size() * q.selection.size()));
    }
    auto it = streams_.find(q.request);
    for (Position p : q.selection) {
      if (p == kNoPosition) continue;
      for (SourceId s : sources) {
        const Position have = it == streams_.end() ? 0 : it->second[s].rows;
        if (p < 0 || p >= have) {
          return absl::InvalidArgumentError(absl::StrCat("resident kv: request ", q.request, " source ", s,
                                                         " selects position ", p, " of ", have, " appended"));
        }
      }
    }
  }
  for (KvQuery& q : batch) {
    const size_t k = q.selection.size();
    const std::vector<Stream>* streams = nullptr;
    if (auto it = streams_.find(q.request); it != streams_.end()) streams = &it->second;
    for (size_t si = 0; si < sources.size(); ++si) {
      for (size_t j = 0; j < k; ++j) {
        const Position p = q.selection[j];
        q.rows_out[si * k + j] = p == kNoPosition ? nullptr : RowAt((*streams)[sources[si]], sources[si], p);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ResidentKvAccess::HoldUnverified(RequestId request, Position from) {
  auto it = streams_.find(request);
  if (it == streams_.end()) return absl::NotFoundError(absl::StrCat("resident kv: unknown request ", request));
  for (const Stream& s : it->second) {
    if (from < s.rows) {
      return absl::InvalidArgumentError(absl::StrCat("resident kv: request ", request, " holds from ", from,
                                                     " below its ", s.rows, " appended rows"));
    }
  }
  if (auto held = held_.find(request); held != held_.end()) {  // one round at a time (KvAccess), as every store
    return absl::FailedPreconditionError(absl::StrCat("resident kv: request ", request, " holds a round from ",
                                                      held->second, " already; commit it before the next hold"));
  }
  held_[request] = from;
  return absl::OkStatus();
}

absl::Status ResidentKvAccess::CommitVerified(RequestId request, Position length) {
  auto it = streams_.find(request);
  if (it == streams_.end()) return absl::NotFoundError(absl::StrCat("resident kv: unknown request ", request));
  auto held = held_.find(request);
  if (held == held_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("resident kv: request ", request, " commits without a hold"));
  }
  for (const Stream& s : it->second) {
    if (length < held->second || length > s.rows) {
      return absl::InvalidArgumentError(absl::StrCat("resident kv: request ", request, " commits ", length,
                                                     " rows, outside [", held->second, ", ", s.rows, "]"));
    }
  }
  for (Stream& s : it->second) {
    s.rows = length;
    const size_t pages = (static_cast<size_t>(length) + page_rows_ - 1) / page_rows_;
    while (s.pages.size() > pages) {
      free_pages_.push_back(s.pages.back());
      s.pages.pop_back();
    }
  }
  held_.erase(held);
  return absl::OkStatus();
}

void ResidentKvAccess::Release(RequestId request) {
  held_.erase(request);
  auto it = streams_.find(request);
  if (it == streams_.end()) return;
  for (const Stream& s : it->second) free_pages_.insert(free_pages_.end(), s.pages.rbegin(), s.pages.rend());
  streams_.erase(it);
}

Position ResidentKvAccess::appended_rows(RequestId request, SourceId source) const {
  auto it = streams_.find(request);
  if (it == streams_.end() || source >= it->second.size()) return 0;
  return it->second[source].rows;
}

}  // namespace dhs::model
