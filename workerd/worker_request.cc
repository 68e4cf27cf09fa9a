// workerd/worker_request.cc: see worker_request.h.
#include "workerd/worker_request.h"

#include <utility>

#include "workerd/serving.h"

namespace dhs {

std::vector<model::Token> WorkerRequest::Tokens() const {
  std::vector<model::Token> all = input;
  all.insert(all.end(), out.generated.begin() + out.resumed, out.generated.end());
  return all;
}

std::unique_ptr<WorkerRequest> NewWorkerRequest(RequestLife& life, std::chrono::steady_clock::time_point now) {
  const wire::SubmitRequestT& submit = life.submit;
  auto r = std::make_unique<WorkerRequest>();
  r->id = life.id;
  r->client_id = life.client_id;
  r->life = &life;
  r->input = SubmitInputTokens(submit);
  r->prefix.tokens = static_cast<Position>(SubmitPrefixTokens(submit));
  r->prefix.hash_ids = submit.hash_ids;
  r->prefix.block_tokens = submit.prefix_block_tokens;
  r->prefix.tenant = submit.tenant;
  r->max_new = submit.max_new_tokens;
  r->sampling.greedy = submit.temperature == 0.0f;
  r->sampling.params = model::SamplingParams{submit.temperature, submit.top_p};
  r->sampling.seed = submit.seed;
  r->times.submitted = now;
  return r;
}

wire::CompleteT CompleteOf(const WorkerRequest& r, const absl::Status& error) {
  wire::CompleteT complete;
  if (error.ok() && r.finished() && r.out.digests.size() == r.out.generated.size()) {
    complete.keep_output = true;
    complete.output_from = 0;  // all of them: memd checks the overlap with its record (equal), appends the rest
    for (model::Token t : r.out.generated) complete.output_tokens.push_back(static_cast<uint8_t>(t));
    complete.output_digests = r.out.digests;
  }
  return complete;
}

void EraseRequest(RequestMap& requests, RequestBook& book, RequestMap::iterator it, bool completed) {
  book.Close(it->first, completed);
  requests.erase(it);
}

}  // namespace dhs
