// memd/request_records.cc: see request_records.h.
#include "memd/request_records.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"

namespace dhs::memd {

absl::Status RequestRecordStore::CheckRoom(GpuId gpu, uint64_t old_bytes, uint64_t new_bytes) const {
  if (new_bytes > limits_.max_record_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "request record of %d bytes exceeds the per-record limit of %d bytes", new_bytes, limits_.max_record_bytes));
  }
  const uint64_t total = total_bytes(gpu) - old_bytes + new_bytes;
  if (total > limits_.max_total_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "request records of GPU %d would hold %d bytes, over the limit of %d bytes", gpu, total,
        limits_.max_total_bytes));
  }
  return absl::OkStatus();
}

namespace {
// The largest token of `kind`: 255 for Bytes (the built-in model's vocabulary); any 32-bit value for EngineIds (the
// bits of dhs.h's int32 tokens).
uint32_t MaxToken(TokenKind kind) { return kind == TokenKind::kEngineIds ? 0xffffffffu : 0xffu; }

absl::Status CheckTokens(RequestId request, TokenKind kind, const std::vector<uint32_t>& tokens,
                         const char* what) {
  if (kind != TokenKind::kBytes && kind != TokenKind::kEngineIds) {
    return absl::InvalidArgumentError(absl::StrFormat("request %d: token kind %d is not a TokenKind", request,
                                                      static_cast<int>(kind)));
  }
  const auto above = std::find_if(tokens.begin(), tokens.end(), [&](uint32_t t) { return t > MaxToken(kind); });
  if (above != tokens.end()) {
    return absl::InvalidArgumentError(absl::StrFormat("request %d: %s token %d is beyond its kind's %d", request, what,
                                                      *above, MaxToken(kind)));
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status RequestRecordStore::Open(RequestId request, RequestRecord record) {
  if (records_.contains(request)) {
    return absl::AlreadyExistsError(absl::StrFormat("request %d already has a record", request));
  }
  if (record.max_new_tokens == 0) {
    return absl::InvalidArgumentError(absl::StrFormat("request %d: record with max_new_tokens 0", request));
  }
  if (record.tokens.size() != record.digests.size() || record.tokens.size() > record.max_new_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "request %d: record with %d committed tokens, %d logits digests, max_new_tokens %d", request,
        record.tokens.size(), record.digests.size(), record.max_new_tokens));
  }
  if (absl::Status s = CheckTokens(request, record.token_kind, record.tokens, "committed"); !s.ok()) return s;
  if (absl::Status s = CheckTokens(request, record.token_kind, record.prompt_ids, "prompt"); !s.ok()) return s;
  if (record.token_kind == TokenKind::kBytes ? !record.prompt_ids.empty() : !record.prompt.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "request %d: a %s record with a prompt of the other kind", request,
        record.token_kind == TokenKind::kBytes ? "Bytes" : "EngineIds"));
  }
  if (absl::Status s = CheckRoom(record.gpu, 0, record.bytes()); !s.ok()) {
    return absl::Status(s.code(), absl::StrFormat("request %d: %s", request, s.message()));
  }
  gpu_bytes_[record.gpu] += record.bytes();
  records_.emplace(request, std::move(record));
  return absl::OkStatus();
}

absl::Status RequestRecordStore::Commit(RequestId request, uint32_t from, TokenKind kind,
                                        const std::vector<uint32_t>& tokens,
                                        const std::vector<uint64_t>& digests) {
  auto it = records_.find(request);
  if (it == records_.end()) return absl::NotFoundError(absl::StrFormat("request %d has no record", request));
  RequestRecord& r = it->second;
  if (digests.size() != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("request %d: %d tokens but %d logits digests", request,
                                                      tokens.size(), digests.size()));
  }
  if (!tokens.empty() && kind != r.token_kind) {
    return absl::InvalidArgumentError(absl::StrFormat("request %d: %s tokens for a %s record", request,
                                                      kind == TokenKind::kBytes ? "Bytes" : "EngineIds",
                                                      r.token_kind == TokenKind::kBytes ? "Bytes" : "EngineIds"));
  }
  if (absl::Status s = CheckTokens(request, r.token_kind, tokens, "committed"); !s.ok()) return s;
  const size_t have = r.tokens.size();
  if (from > have) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "request %d: tokens from %d committed, but only %d are (a commit was lost)", request, from, have));
  }
  const size_t overlap = std::min(have - from, tokens.size());
  if (!std::equal(tokens.begin(), tokens.begin() + overlap, r.tokens.begin() + from) ||
      !std::equal(digests.begin(), digests.begin() + overlap, r.digests.begin() + from)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("request %d: tokens from %d differ from those committed before", request, from));
  }
  const size_t added = tokens.size() - overlap;
  if (have + added > r.max_new_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat("request %d: %d tokens committed, over max_new_tokens %d",
                                                      request, have + added, r.max_new_tokens));
  }
  const uint64_t old_bytes = r.bytes();
  if (absl::Status s = CheckRoom(r.gpu, old_bytes, old_bytes + r.bytes_per_token() * added); !s.ok()) {
    return absl::Status(s.code(), absl::StrFormat("request %d: %s", request, s.message()));
  }
  r.tokens.insert(r.tokens.end(), tokens.begin() + overlap, tokens.end());
  r.digests.insert(r.digests.end(), digests.begin() + overlap, digests.end());
  gpu_bytes_[r.gpu] += r.bytes_per_token() * added;
  return absl::OkStatus();
}

bool RequestRecordStore::Release(RequestId request) {
  auto it = records_.find(request);
  if (it == records_.end()) return false;
  gpu_bytes_[it->second.gpu] -= it->second.bytes();
  records_.erase(it);
  return true;
}

absl::StatusOr<size_t> RequestRecordStore::KeepFinished(RequestId request) {
  auto it = records_.find(request);
  if (it == records_.end()) return absl::NotFoundError(absl::StrFormat("request %d has no record", request));
  if (it->second.tokens.size() < it->second.max_new_tokens) {
    return absl::FailedPreconditionError(absl::StrFormat("request %d: %d of its %d tokens committed: not finished",
                                                         request, it->second.tokens.size(),
                                                         it->second.max_new_tokens));
  }
  RequestRecord record = std::move(it->second);
  gpu_bytes_[record.gpu] -= record.bytes();
  records_.erase(it);
  record.prompt.clear();
  record.prompt.shrink_to_fit();
  record.prompt_ids = {};
  record.hash_ids.clear();
  record.hash_ids.shrink_to_fit();
  record.tenant.clear();
  record.tenant.shrink_to_fit();
  record.chain_ids = {};
  record.chain_digests = {};
  if (record.bytes() > limits_.max_finished_bytes) return 1;  // over the bound alone: the older ones stay
  Finished& f = finished_[record.gpu];
  f.bytes += record.bytes();
  f.records.emplace_back(request, std::move(record));
  size_t dropped = 0;
  while (f.records.size() > limits_.max_finished_records || f.bytes > limits_.max_finished_bytes) {
    f.bytes -= f.records.front().second.bytes();
    f.records.pop_front();
    ++dropped;
  }
  return dropped;
}

std::vector<std::pair<RequestId, RequestRecord>> RequestRecordStore::FinishedRecords(GpuId gpu) const {
  auto it = finished_.find(gpu);
  if (it == finished_.end()) return {};
  return {it->second.records.begin(), it->second.records.end()};
}

size_t RequestRecordStore::finished(GpuId gpu) const {
  auto it = finished_.find(gpu);
  return it == finished_.end() ? 0 : it->second.records.size();
}

const RequestRecord* RequestRecordStore::Find(RequestId request) const {
  auto it = records_.find(request);
  return it == records_.end() ? nullptr : &it->second;
}

uint64_t RequestRecordStore::total_bytes(GpuId gpu) const {
  auto it = gpu_bytes_.find(gpu);
  return it == gpu_bytes_.end() ? 0 : it->second;
}

}  // namespace dhs::memd
