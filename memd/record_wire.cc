// memd/record_wire.cc: see record_wire.h.
#include "memd/record_wire.h"

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
  w->tokens = r.tokens;
  w->logits_digests = r.digests;
  w->tenant = r.tenant;
  w->session = r.session;  // issue 26
  w->chain_block_ids = r.chain_ids;  // issue 24
  w->chain_block_digests = r.chain_digests;
  w->chain_block_tokens = r.chain_block_tokens;
  w->chain_page_rows = r.chain_page_rows;
  return w;
}

RequestRecord FromWireRecord(const wire::RequestRecordT& w, GpuId gpu) {
  RequestRecord r;
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
  r.tokens = w.tokens;
  r.digests = w.logits_digests;
  r.tenant = w.tenant;
  r.session = w.session;  // issue 26
  r.chain_ids = w.chain_block_ids;  // issue 24
  r.chain_digests = w.chain_block_digests;
  r.chain_block_tokens = w.chain_block_tokens;
  r.chain_page_rows = w.chain_page_rows;
  return r;
}

}  // namespace dhs::memd
