// memd/record_wire.cc: see record_wire.h.
#include "memd/record_wire.h"

#include "absl/strings/str_format.h"

namespace dhs::memd {

std::unique_ptr<wire::RequestRecordT> ToWireRecord(RequestId id, const RequestRecord& r) {
  auto w = std::make_unique<wire::RequestRecordT>();
  w->request = id;
  w->client_request = r.client_request;
  w->client = r.client;
  w->prompt = r.prompt;
  w->hash_ids = r.hash_ids;
  w->input_tokens = r.input_tokens;
  w->prefix_block_tokens = r.prefix_block_tokens;
  w->max_new_tokens = r.max_new_tokens;
  w->temperature = r.temperature;
  w->top_p = r.top_p;
  w->seed = r.seed;
  // Issue 25: the tokens in the field of their kind.
  w->token_kind = r.token_kind == TokenKind::kEngineIds ? wire::TokenKind::EngineIds : wire::TokenKind::Bytes;
  if (r.token_kind == TokenKind::kEngineIds) {
    w->token_ids = r.tokens;
    w->prompt_ids = r.prompt_ids;
  } else {
    w->tokens.assign(r.tokens.begin(), r.tokens.end());  // each <= 255 (RequestRecordStore::Open, Commit)
  }
  w->logits_digests = r.digests;
  w->tenant = r.tenant;
  w->session = r.session;  // issue 26
  w->chain_block_ids = r.chain_ids;  // issue 24
  w->chain_block_digests = r.chain_digests;
  w->chain_block_tokens = r.chain_block_tokens;
  w->chain_page_rows = r.chain_page_rows;
  return w;
}

absl::StatusOr<RequestRecord> FromWireRecord(const wire::RequestRecordT& w, GpuId gpu) {
  if (w.token_kind != wire::TokenKind::Bytes && w.token_kind != wire::TokenKind::EngineIds) {
    return absl::InvalidArgumentError(absl::StrFormat("request %d: token_kind %d is not a TokenKind", w.request,
                                                      static_cast<int>(w.token_kind)));
  }
  const bool ids = w.token_kind == wire::TokenKind::EngineIds;
  if (ids ? !w.tokens.empty() : !w.token_ids.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("request %d: a %s record carries the other kind's tokens",
                                                      w.request, ids ? "EngineIds" : "Bytes"));
  }
  RequestRecord r;
  r.token_kind = ids ? TokenKind::kEngineIds : TokenKind::kBytes;
  r.prompt_ids = w.prompt_ids;
  r.client_request = w.client_request;
  r.client = w.client;
  r.gpu = gpu;
  r.prompt = w.prompt;
  r.hash_ids = w.hash_ids;
  r.input_tokens = w.input_tokens;
  r.prefix_block_tokens = w.prefix_block_tokens;
  r.max_new_tokens = w.max_new_tokens;
  r.temperature = w.temperature;
  r.top_p = w.top_p;
  r.seed = w.seed;
  r.tokens = ids ? w.token_ids : WidenTokens(w.tokens);
  r.digests = w.logits_digests;
  r.tenant = w.tenant;
  r.session = w.session;  // issue 26
  r.chain_ids = w.chain_block_ids;  // issue 24
  r.chain_digests = w.chain_block_digests;
  r.chain_block_tokens = w.chain_block_tokens;
  r.chain_page_rows = w.chain_page_rows;
  return r;
}

absl::StatusOr<std::pair<TokenKind, std::vector<uint32_t>>> CommittedTokensOf(const wire::CommittedTokensT& e) {
  if (!e.tokens.empty() && !e.token_ids.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("request %d: a TokensCommitted entry with both tokens and "
                                                      "token_ids", e.request));
  }
  if (!e.token_ids.empty()) return std::make_pair(TokenKind::kEngineIds, e.token_ids);
  return std::make_pair(TokenKind::kBytes, WidenTokens(e.tokens));
}

std::vector<uint32_t> WidenTokens(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

}  // namespace dhs::memd
