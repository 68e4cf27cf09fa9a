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
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/record_bounds.h"
#include "common/types.h"

namespace dhs::memd {

// Issue 25: the vocabulary of a record's tokens (schemas/dhs.fbs TokenKind; memd/record_wire.h maps the two).
enum class TokenKind : uint8_t {
  kBytes = 0,      // workerd's built-in model: the byte-level vocabulary (prompt, tokens <= 255)
  kEngineIds = 1,  // an engine's token ids through libdhs (prompt_ids; any 32-bit value: an int32's bits)
};

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
  // Issue 25: the tokens' vocabulary: Bytes (workerd's built-in model: `prompt`, tokens <= 255) or
  // EngineIds (an engine through libdhs: `prompt_ids`, 32-bit ids; `prompt` empty). One kind for the record's life.
  TokenKind token_kind = TokenKind::kBytes;
  std::vector<uint32_t> prompt_ids;    // EngineIds: the engine's prompt tokens given at submit
  std::vector<uint32_t> tokens;        // committed tokens, in order (token t at index t), of token_kind
  std::vector<uint64_t> digests;       // logits digest of tokens[t] (same length)
  std::string tenant;                  // SubmitRequest.tenant (issue 24; empty = the default tenant)
  // Issue 24: the prefix chain of its admission (AdmitRequest.prefix_block_ids / _digests / _tokens) and its GPU's
  // page rows, filled by memd: a memd restart gives the adopted request its shared prefix pages back.
  std::vector<uint64_t> chain_ids, chain_digests;
  uint32_t chain_block_tokens = 0, chain_page_rows = 0;
  // Issue 26: SubmitRequest.session (0 = none): the session its finished turn's pages are published under.
  uint64_t session = 0;

  // Bytes the record holds (the bounded quantity): prompt + 4 * prompt_ids + 8 * hash_ids + tenant + 16 * chain
  // blocks + (1 + 8) per Bytes token or (4 + 8) per EngineIds token (its wire and journal size, digest included).
  // common/record_bounds.h's RecordBytes.
  uint64_t bytes() const {
    return RecordBytes({.prompt_bytes = prompt.size(),
                        .prompt_ids = prompt_ids.size(),
                        .hash_ids = hash_ids.size(),
                        .tenant_bytes = tenant.size(),
                        .chain_entries = chain_ids.size() + chain_digests.size(),
                        .tokens = tokens.size(),
                        .engine_ids = token_kind == TokenKind::kEngineIds});
  }
  uint64_t bytes_per_token() const {
    return token_kind == TokenKind::kEngineIds ? kEngineTokenRecordBytes : kByteTokenRecordBytes;
  }
};

struct RecordLimits {
  uint64_t max_record_bytes = kMaxRecordBytes;     // one record at most (RequestRecord::bytes), bytes
  uint64_t max_total_bytes = uint64_t{48} << 20;   // all records of one GPU at most, bytes (a HelloReply carries
                                                   // those of its interrupted requests: under kMaxMessageBytes)
  // Finished records (KeepFinished), per GPU: the latest this many / bytes (RequestRecord::bytes, no input) are kept.
  // With max_total_bytes a HelloReply stays under kMaxMessageBytes (64 MiB).
  size_t max_finished_records = 256;
  uint64_t max_finished_bytes = uint64_t{8} << 20;
};

class RequestRecordStore {
 public:
  explicit RequestRecordStore(RecordLimits limits = {}) : limits_(limits) {}

  // Opens `request`'s record: committed tokens are empty for a new request; a resumed one (re-admitted under a new id
  // by the GPU's next worker) brings those of its interrupted record. Errors: ALREADY_EXISTS (the id has one),
  // INVALID_ARGUMENT (max_new_tokens 0; digests' length differs from the tokens'; more tokens than max_new_tokens; a
  // token out of its kind's range, prompt_ids in a Bytes record or a byte prompt in an EngineIds one),
  // RESOURCE_EXHAUSTED (the record over max_record_bytes, or its GPU's
  // records would pass max_total_bytes; the message names the limit).
  absl::Status Open(RequestId request, RequestRecord record);
  // Appends tokens committed[from ..] of `request`, of vocabulary `kind`: `from` must equal the tokens already
  // committed, or be below it with the overlap equal (a resent commit is accepted, nothing changes twice). Errors:
  // NOT_FOUND, INVALID_ARGUMENT (digests' length differs; a gap: from > committed; an overlap that differs; more than
  // max_new_tokens; tokens of another kind than the record's, or out of its range), RESOURCE_EXHAUSTED (the limits,
  // as Open).
  absl::Status Commit(RequestId request, uint32_t from, TokenKind kind, const std::vector<uint32_t>& tokens,
                      const std::vector<uint64_t>& digests);
  // Forgets `request`'s record; false when it had none.
  bool Release(RequestId request);
  // Lost ends (workerd/README.md "Restart: a finished request's end"): `request` finished with all its tokens; its
  // record leaves the live ones (Find no longer sees it) for its GPU's finished records, without its input (prompt,
  // hash_ids, tenant and chain emptied: only the output is handed on), newest last. The oldest finished records of that GPU beyond
  // max_finished_records / max_finished_bytes are forgotten (a record over max_finished_bytes alone goes at once, the
  // older ones stay); returns how many. Errors (nothing changes): NOT_FOUND (no record), FAILED_PRECONDITION (fewer
  // committed tokens than max_new_tokens).
  absl::StatusOr<size_t> KeepFinished(RequestId request);
  // The finished records of `gpu`, oldest first (node request id, record), copied: they stay until newer ones push
  // them out (a worker that dies again after answering an Attach from one leaves it to the next).
  std::vector<std::pair<RequestId, RequestRecord>> FinishedRecords(GpuId gpu) const;
  size_t finished(GpuId gpu) const;

  const RequestRecord* Find(RequestId request) const;
  size_t size() const { return records_.size(); }
  uint64_t total_bytes(GpuId gpu) const;
  const RecordLimits& limits() const { return limits_; }

 private:
  absl::Status CheckRoom(GpuId gpu, uint64_t old_bytes, uint64_t new_bytes) const;

  RecordLimits limits_;
  std::map<RequestId, RequestRecord> records_;
  std::map<GpuId, uint64_t> gpu_bytes_;
  struct Finished {
    std::deque<std::pair<RequestId, RequestRecord>> records;  // oldest first
    uint64_t bytes = 0;
  };
  std::map<GpuId, Finished> finished_;
};

}  // namespace dhs::memd
