// tests/workerd/worker_process_test.cc: the real `workerd` executable as a process, one request in each mode, against
// a stand-in memd in this test (a RouterServer at ipc://<run_dir>/memd.sock that owns a host-pool segment and answers
// Hello / AdmitRequest / Complete / Heartbeat per the conversation contract; the memd daemon did not exist yet) and a
// client DealerClient on worker-0. Checks the Hello, the mapped host pool (HostCopyWritten lists its pages), the
// streamed tokens and digests against the oracle, WorkerStats, and a clean exit on SIGTERM.
// The worker is started with posix_spawn (fork + exec at once), killed by pid at teardown.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "common/host_pool.h"
#include "common/protocol.h"
#include "common/transport.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/workerd/worker_test_util.h"

namespace dhs::test {
namespace {

constexpr uint32_t kPageRows = 16;
constexpr uint32_t kHostPages = 64;

using dhs::testing::ChildProcess;

class WorkerProcess : public ::testing::TestWithParam<std::string> {};

TEST_P(WorkerProcess, ServesOneRequestAgainstMemdOverIpc) {
  const char* bin = std::getenv("WORKERD");
  ASSERT_NE(bin, nullptr) << "WORKERD (the workerd executable) is not set";
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  auto model = MakePresetModel("dsv4flash-like", 5);
  const uint64_t page_bytes = uint64_t{kPageRows} * model->config().row_bytes() * model->config().n_sources();
  // Host pages: the payload rows, then the positions' index keys (brief §8 extension, docs/architecture.md).
  const uint64_t host_page_bytes =
      page_bytes + uint64_t{kPageRows} * model->config().index_key_bytes() * model->config().n_indexers();
  const std::string shm = "dhs-wpt-" + std::to_string(::getpid()) + "-" + GetParam();
  (void)HostPoolSegment::Remove(shm);
  auto segment = HostPoolSegment::Create(shm, host_page_bytes, kHostPages);
  ASSERT_TRUE(segment.ok()) << segment.status();
  auto memd = RouterServer::Bind(dir.path(), "memd");
  ASSERT_TRUE(memd.ok()) << memd.status();

  ChildProcess worker({bin, "--run-dir", dir.path(), "--gpu", "0", "--mode", GetParam(), "--preset", "dsv4flash-like",
                       "--seed", "5", "--page-rows", std::to_string(kPageRows), "--tail-rows", "32", "--slots", "2",
                       "--hbm-budget", std::to_string(16 * page_bytes), "--log-level", "warn"});
  ASSERT_TRUE(worker.ok());
  auto client = DealerClient::Connect(IpcEndpoint(dir.path(), "worker-0"));
  ASSERT_TRUE(client.ok());

  const std::vector<uint8_t> prompt = Prompt(45, 9);
  const uint32_t max_new = 6;
  bool hello = false, submitted = false, finished = false, completed = false;
  uint32_t backed_up_pages = 0;
  size_t committed_tokens = 0;  // TokensCommitted (version 5): one in flight, so the last step's may never go
  Generated got;
  uint32_t next_host = 0, next_gpu = 0;
  for (int it = 0; it < 4000 && !(finished && completed); ++it) {
    auto in = (*memd)->Poll(std::chrono::milliseconds(5));
    ASSERT_TRUE(in.ok());
    if (in->has_value()) {
      const Incoming& msg = **in;
      auto m = DecodeEnvelope(msg.bytes);
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_EQ(m->sender, "worker/0");
      std::string reply;
      switch (m->type) {
        case wire::Body::Hello: {
          auto h = ReadHello(*m);
          EXPECT_EQ(h->capacity_pages, 16u);
          EXPECT_EQ(h->page_rows, kPageRows);
          EXPECT_EQ(h->page_bytes, page_bytes);
          EXPECT_EQ(h->host_page_bytes, host_page_bytes);
          EXPECT_EQ(h->request_slots, 2u);
          EXPECT_EQ(h->sources.size(), static_cast<size_t>(model->config().n_sources()));
          wire::HelloReplyT r;
          r.accepted = true;
          r.worker_epoch = 1;
          auto info = std::make_unique<wire::HostSegmentInfoT>();
          info->name = shm;
          info->size_bytes = (*segment)->size_bytes();
          info->page_bytes = host_page_bytes;
          info->pages = kHostPages;
          r.segments.push_back(std::move(info));
          reply = EncodeHelloReply(r, m->sequence, "memd");
          hello = true;
          break;
        }
        case wire::Body::AdmitRequest: {
          auto a = ReadAdmitRequest(*m);
          EXPECT_EQ(a->history_rows, prompt.size() + max_new);
          EXPECT_EQ(a->complete_pages, GetParam() == "adaptive" ? prompt.size() / kPageRows : 0u);
          wire::AdmitGrantT g;
          g.request = a->request;
          g.slot = 0;  // one request at a time
          for (uint32_t j = 0; j < a->complete_pages && j < 1; ++j) {  // keep one page resident-first
            g.optional_pages.push_back(next_gpu++);
            g.optional_history_pages.push_back(j);
          }
          for (uint64_t j = 0; j * kPageRows < a->history_rows; ++j) g.backup_host_pages.emplace_back(0, next_host++);
          reply = EncodeAdmitGrant(g, m->sequence, "memd");
          break;
        }
        case wire::Body::HostCopyWritten: {
          auto b = ReadHostCopyWritten(*m);
          EXPECT_TRUE(b->ok) << b->message;
          EXPECT_EQ(b->history_pages.size(), b->host_pages.size());
          backed_up_pages += static_cast<uint32_t>(b->history_pages.size());
          break;
        }
        case wire::Body::BackupComplete:
          ADD_FAILURE() << "BackupComplete without a ReclaimOrder (version 3: HostCopyWritten)";
          break;
        case wire::Body::Complete: {
          wire::CompleteAckT ack;
          ack.request = ReadComplete(*m)->request;
          reply = EncodeCompleteAck(ack, m->sequence, "memd");
          completed = true;
          break;
        }
        case wire::Body::TokensCommitted: {  // version 5: the step's tokens, acknowledged as memd does
          auto t = ReadTokensCommitted(*m);
          for (const auto& e : t->entries) committed_tokens += e->tokens.size();
          wire::TokensCommittedAckT ack;
          ack.entries = static_cast<uint32_t>(t->entries.size());
          reply = EncodeTokensCommittedAck(ack, m->sequence, "memd");
          break;
        }
        case wire::Body::Heartbeat: {
          wire::HeartbeatAckT ack;
          ack.sender_time_ns = ReadHeartbeat(*m)->sender_time_ns;
          reply = EncodeHeartbeatAck(ack, m->sequence, "memd");
          break;
        }
        default:
          ADD_FAILURE() << "unexpected " << BodyName(m->type);
      }
      if (!reply.empty()) {
        ASSERT_TRUE((*memd)->Reply(msg.peer, reply).ok());
      }
    }
    if (hello && !submitted && (*client)->peer_connected()) {
      wire::SubmitRequestT s;
      s.request = 77;
      s.prompt = prompt;
      s.max_new_tokens = max_new;
      ASSERT_TRUE((*client)->Send(EncodeSubmitRequest(s, 5, "replay")).ok());
      submitted = true;
    }
    while (submitted) {
      auto r = (*client)->Receive(std::chrono::milliseconds(0));
      if (!r.ok()) break;
      auto m = DecodeEnvelope(*r);
      ASSERT_TRUE(m.ok());
      if (m->type == wire::Body::SubmitAccepted) continue;
      ASSERT_EQ(m->type, wire::Body::TokenChunk) << BodyName(m->type);
      auto chunk = ReadTokenChunk(*m);
      EXPECT_EQ(chunk->error, wire::ErrorCode::OK) << chunk->error_message;
      for (uint8_t t : chunk->tokens) got.tokens.push_back(t);
      for (uint64_t d : chunk->logits_digests) got.digests.push_back(d);
      finished = finished || chunk->finished;
    }
  }
  ASSERT_TRUE(finished);
  ASSERT_TRUE(completed);
  const Generated want = Oracle(*model, std::vector<model::Token>(prompt.begin(), prompt.end()), max_new);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.digests, want.digests);
  // 50 rows appended = 3 complete pages; adaptive keeps page 0 on GPU without a backup.
  const uint32_t complete = (45 + max_new - 1) / kPageRows;
  const uint32_t want_backed = GetParam() == "hisparse" ? complete : GetParam() == "adaptive" ? complete - 1 : 0;
  EXPECT_EQ(backed_up_pages, want_backed);
  EXPECT_GE(committed_tokens, 1u);
  EXPECT_LE(committed_tokens, max_new);

  // Stats over the wire, then a clean exit on SIGTERM.
  ASSERT_TRUE((*client)->Send(EncodeWorkerStatsQuery(wire::WorkerStatsQueryT(), 6, "replay")).ok());
  bool stats = false;
  for (int i = 0; i < 400 && !stats; ++i) {
    (void)(*memd)->Poll(std::chrono::milliseconds(1));  // keep draining heartbeats
    auto r = (*client)->Receive(std::chrono::milliseconds(5));
    if (!r.ok()) continue;
    auto m = DecodeEnvelope(*r);
    ASSERT_TRUE(m.ok());
    ASSERT_EQ(m->type, wire::Body::WorkerStatsReply);
    auto s = ReadWorkerStatsReply(*m);
    EXPECT_EQ(s->mode, GetParam());
    EXPECT_EQ(s->tokens_generated, max_new);
    EXPECT_EQ(s->pages_kept, GetParam() == "adaptive" ? 1u : 0u);
    stats = true;
  }
  EXPECT_TRUE(stats);
  EXPECT_EQ(worker.Terminate(), 0);
  (void)HostPoolSegment::Remove(shm);
}

INSTANTIATE_TEST_SUITE_P(Modes, WorkerProcess, ::testing::Values("resident", "hisparse", "adaptive"));

}  // namespace
}  // namespace dhs::test
