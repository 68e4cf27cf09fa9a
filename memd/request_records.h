// memd/request_records.h: the requests' records kept by memd so that a restarted worker can resume them (issue 11,
// "Resume from host KV"; docs/protocol.md "Request records").
//
// A record is what a worker needs to run a request again from nothing: its input (the SubmitRequest's prompt bytes and
// prepared-prefix reference), sampling settings (temperature, top_p, seed), max_new, the client's request id, and the
// tokens committed so far with their logits digests. The worker opens it with the AdmitRequest, appends each step's
// tokens with one TokensCommitted message (before the step's TokenChunks go to the clients) and it is released with
// the request (Complete, or an admission that was refused). Interrupted requests keep theirs: the GPU's next worker
// reads them (HelloReply.interrupted_records) to resume them.
//
// Like the decision core it makes no I/O: events in (Open / Commit / Release), answers out; sizes are bounded
// (RecordLimits) and every refused event changes nothing.
//
// Thread-safety: none; memd's event loop owns it.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "common/types.h"

namespace dhs::memd {

struct RequestRecord {
  RequestId client_request = 0;        // the client's SubmitRequest.request
  uint64_t client = 0;                 // the client's identity (SubmitRequest.client; 0 = none): a resume is found by
                                       // (client, client_request)
  GpuId gpu = 0;
  std::vector<uint8_t> prompt;         // SubmitRequest.prompt, tokens
  std::vector<uint64_t> hash_ids;      // SubmitRequest.hash_ids (prepared prefix), block ids
  uint32_t input_tokens = 0;           // SubmitRequest.input_tokens, tokens
  uint32_t prefix_block_tokens = 0;    // tokens per hash_ids block
  uint32_t max_new_tokens = 0;         // tokens
  float temperature = 0;               // 0 = greedy
  float top_p = 1;
  uint64_t seed = 0;                   // sampling seed (token t is drawn at (seed, client_request, t))
  std::vector<uint8_t> tokens;         // committed tokens, in order (token t at index t)
  std::vector<uint64_t> digests;       // logits digest of tokens[t] (same length)

  // Bytes the record holds (the bounded quantity): prompt + 8 * hash_ids + 9 * tokens.
  uint64_t bytes() const { return prompt.size() + 8 * hash_ids.size() + 9 * tokens.size(); }
};

struct RecordLimits {
  uint64_t max_record_bytes = uint64_t{4} << 20;   // one record at most (RequestRecord::bytes), bytes
  uint64_t max_total_bytes = uint64_t{48} << 20;   // all records of one GPU at most, bytes (a HelloReply carries
                                                   // those of its interrupted requests: under kMaxMessageBytes)
};

class RequestRecordStore {
 public:
  explicit RequestRecordStore(RecordLimits limits = {}) : limits_(limits) {}

  // Opens `request`'s record: committed tokens are empty for a new request; a resumed one (re-admitted under a new id
  // by the GPU's next worker) brings those of its interrupted record. Errors: ALREADY_EXISTS (the id has one),
  // INVALID_ARGUMENT (max_new_tokens 0; digests' length differs from the tokens'; more tokens than max_new_tokens),
  // RESOURCE_EXHAUSTED (the record over max_record_bytes, or its GPU's
  // records would pass max_total_bytes; the message names the limit).
  absl::Status Open(RequestId request, RequestRecord record);
  // Appends tokens committed[from ..] of `request`: `from` must equal the tokens already committed, or be below it
  // with the overlap equal (a resent commit is accepted, nothing changes twice). Errors: NOT_FOUND, INVALID_ARGUMENT
  // (digests' length differs; a gap: from > committed; an overlap that differs; more than max_new_tokens),
  // RESOURCE_EXHAUSTED (the limits, as Open).
  absl::Status Commit(RequestId request, uint32_t from, const std::vector<uint8_t>& tokens,
                      const std::vector<uint64_t>& digests);
  // Forgets `request`'s record; false when it had none.
  bool Release(RequestId request);

  const RequestRecord* Find(RequestId request) const;
  size_t size() const { return records_.size(); }
  uint64_t total_bytes(GpuId gpu) const;
  const RecordLimits& limits() const { return limits_; }

 private:
  absl::Status CheckRoom(GpuId gpu, uint64_t old_bytes, uint64_t new_bytes) const;

  RecordLimits limits_;
  std::map<RequestId, RequestRecord> records_;
  std::map<GpuId, uint64_t> gpu_bytes_;
};

}  // namespace dhs::memd
