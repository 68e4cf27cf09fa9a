// tests/tools/session_turn_client.cc: one request with an explicit prompt and a session, for the sessions-across-nodes
// process test (issue 26, cluster_session_turns_test.py): the test builds a next turn's prompt from the previous
// turn's prompt and output tokens, which dhs-replay's trace prompts cannot express.
//
// Usage: session_turn_client ENDPOINT SESSION MAX_NEW BLOCK_TOKENS PROMPT_FILE OUT_JSON
//   ENDPOINT     the worker's socket (ipc://RUN_DIR/worker-0.sock)
//   SESSION      SubmitRequest.session (0: none)
//   MAX_NEW      tokens to generate (greedy)
//   BLOCK_TOKENS SubmitRequest.prefix_block_tokens (the worker derives the prefix chain of the prompt's complete
//                blocks from its tokens; 0: no chain)
//   PROMPT_FILE  the prompt's bytes (byte-level tokens)
//   OUT_JSON     written at the end: {"tokens": [...], "logits_digests": [...], "error": "..."}
// Exit 0 when the request finished without error, 1 otherwise, 2 on bad arguments.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/numbers.h"
#include "nlohmann/json.hpp"
#include "tools/replay/zmq_node_client.h"

int main(int argc, char** argv) {
  using dhs::replay::ZmqNodeClient;
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s ENDPOINT SESSION MAX_NEW BLOCK_TOKENS PROMPT_FILE OUT_JSON\n", argv[0]);
    return 2;
  }
  uint64_t session = 0;
  int64_t max_new = 0, block = 0;
  if (!absl::SimpleAtoi(argv[2], &session) || !absl::SimpleAtoi(argv[3], &max_new) ||
      !absl::SimpleAtoi(argv[4], &block) || max_new < 1 || block < 0) {
    std::fprintf(stderr, "bad SESSION / MAX_NEW / BLOCK_TOKENS\n");
    return 2;
  }
  std::ifstream in(argv[5], std::ios::binary);
  std::string prompt((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) {
    std::fprintf(stderr, "cannot read %s\n", argv[5]);
    return 2;
  }
  if (prompt.empty()) {
    std::fprintf(stderr, "empty prompt\n");
    return 2;
  }
  dhs::replay::ZmqNodeClientOptions options;
  options.worker_endpoint = argv[1];
  if (session != 0) options.session_of = {static_cast<int64_t>(session) - 1};  // trace index 0 (RequestSession)
  auto client = ZmqNodeClient::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  dhs::replay::SubmitRequest req;
  req.request = 1;
  req.prompt.trace_index = 0;
  req.prompt.input_tokens = static_cast<int64_t>(prompt.size());
  req.prompt.block_tokens = block;
  req.prompt.tokens = prompt;
  req.max_new_tokens = max_new;
  nlohmann::json out{{"tokens", nlohmann::json::array()}, {"logits_digests", nlohmann::json::array()},
                     {"error", ""}};
  bool done = false;
  if (absl::Status s = (*client)->Submit(req); !s.ok()) {
    out["error"] = s.ToString();
    done = true;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (!done && std::chrono::steady_clock::now() < deadline) {
    auto events = (*client)->Poll(200);
    if (!events.ok()) {
      out["error"] = events.status().ToString();
      break;
    }
    for (const dhs::replay::TokenEvent& e : *events) {
      for (int32_t t : e.tokens) out["tokens"].push_back(t);
      for (uint64_t d : e.logits_digests) out["logits_digests"].push_back(d);
      if (!e.error.empty()) out["error"] = e.error;
      done = done || e.finished || !e.error.empty();
    }
  }
  if (!done && out["error"] == "") out["error"] = "timed out";
  std::ofstream(argv[6]) << out.dump() << "\n";
  return out["error"] == "" ? 0 : 1;
}
