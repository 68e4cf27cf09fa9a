// tests/workerd/worker_memd_process_test.cc: the real `memd` and `workerd` executables over ipc:// in a private run
// directory, one request per mode (resident, hisparse, adaptive): the client's tokens and logits digests equal the
// model run alone, the worker's log holds no error from the conversation, both processes exit 0 on SIGTERM.
// Processes are started with posix_spawn (fork + exec at once; their stderr goes to files in the run directory, printed
// on failure) and killed by pid at teardown.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/protocol.h"
#include "common/transport.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/workerd/worker_test_util.h"

namespace dhs::test {
namespace {

using dhs::testing::ChildProcess;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class RealMemd : public ::testing::TestWithParam<std::string> {};

TEST_P(RealMemd, WorkerServesOneRequestPerMode) {
  const char* memd_bin = std::getenv("MEMD");
  const char* workerd_bin = std::getenv("WORKERD");
  ASSERT_NE(workerd_bin, nullptr);
  if (memd_bin == nullptr || !std::filesystem::exists(memd_bin)) GTEST_SKIP() << "no memd executable";
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  constexpr uint32_t kPageRows = 16;
  auto model = MakePresetModel("glm5-like", 3);
  const uint64_t page_bytes = uint64_t{kPageRows} * model->config().row_bytes() * model->config().n_sources();
  const std::string memd_log = dir.path() + "/memd.log", worker_log = dir.path() + "/workerd.log";
  ChildProcess memd({memd_bin, "--run-dir", dir.path(), "--page-bytes", std::to_string(page_bytes), "--host-pool-pages",
              "64", "--log-level", "warn"},
             memd_log);
  ASSERT_TRUE(memd.ok());
  ChildProcess worker({workerd_bin, "--run-dir", dir.path(), "--gpu", "0", "--mode", GetParam(), "--preset", "glm5-like",
                "--seed", "3", "--page-rows", std::to_string(kPageRows), "--tail-rows", "32", "--slots", "2",
                "--hbm-budget", std::to_string(40 * page_bytes), "--log-level", "warn"},
               worker_log);
  ASSERT_TRUE(worker.ok());
  auto client = DealerClient::Connect(IpcEndpoint(dir.path(), "worker-0"));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->WaitPeerConnected(true, std::chrono::milliseconds(10000)))
      << "workerd did not come up\nmemd: " << ReadFile(memd_log) << "\nworkerd: " << ReadFile(worker_log);

  const std::vector<uint8_t> prompt = Prompt(70, 4);
  const uint32_t max_new = 7;
  wire::SubmitRequestT s;
  s.request = 1001;
  s.prompt = prompt;
  s.max_new_tokens = max_new;
  ASSERT_TRUE((*client)->Send(EncodeSubmitRequest(s, 1, "replay")).ok());
  Generated got;
  bool finished = false;
  std::string error;
  for (int i = 0; i < 3000 && !finished; ++i) {
    auto r = (*client)->Receive(std::chrono::milliseconds(5));
    if (!r.ok()) {
      if (worker.Exited() || memd.Exited()) break;
      continue;
    }
    auto m = DecodeEnvelope(*r);
    ASSERT_TRUE(m.ok());
    if (m->type == wire::Body::SubmitAccepted) continue;
    if (m->type == wire::Body::ErrorReply) {
      error = ReadErrorReply(*m)->message;
      break;
    }
    ASSERT_EQ(m->type, wire::Body::TokenChunk);
    auto chunk = ReadTokenChunk(*m);
    if (chunk->error != wire::ErrorCode::OK) error = chunk->error_message;
    for (uint8_t t : chunk->tokens) got.tokens.push_back(t);
    for (uint64_t d : chunk->logits_digests) got.digests.push_back(d);
    finished = chunk->finished;
  }
  const std::string logs = "\nmemd log:\n" + ReadFile(memd_log) + "\nworkerd log:\n" + ReadFile(worker_log);
  ASSERT_TRUE(finished) << "no finished chunk" << logs;
  EXPECT_EQ(error, "") << logs;
  const Generated want = Oracle(*model, std::vector<model::Token>(prompt.begin(), prompt.end()), max_new);
  EXPECT_EQ(got.tokens, want.tokens) << logs;
  EXPECT_EQ(got.digests, want.digests);
  // What the worker did with memd's grant: adaptive keeps imported pages on GPU, hisparse backs every page up.
  ASSERT_TRUE((*client)->Send(EncodeWorkerStatsQuery(wire::WorkerStatsQueryT(), 2, "replay")).ok());
  auto reply = (*client)->Receive(std::chrono::milliseconds(5000));
  ASSERT_TRUE(reply.ok()) << reply.status();
  auto rm = DecodeEnvelope(*reply);
  ASSERT_TRUE(rm.ok());
  auto stats = ReadWorkerStatsReply(*rm);
  ASSERT_TRUE(stats.ok()) << stats.status();
  const uint64_t complete = (prompt.size() + max_new - 1) / kPageRows;  // 76 rows -> 4 pages
  std::printf("mode %s: pages kept %llu, backed up %llu, census direct %llu hot %llu host %llu\n", GetParam().c_str(),
              static_cast<unsigned long long>(stats->pages_kept), static_cast<unsigned long long>(stats->pages_backed_up),
              static_cast<unsigned long long>(stats->census_direct), static_cast<unsigned long long>(stats->census_hot),
              static_cast<unsigned long long>(stats->census_host));
  if (GetParam() == "adaptive") {
    EXPECT_GT(stats->pages_kept, 0u);
    EXPECT_EQ(stats->pages_kept + stats->pages_backed_up, complete);
  } else if (GetParam() == "hisparse") {
    EXPECT_EQ(stats->pages_kept, 0u);
    EXPECT_EQ(stats->pages_backed_up, complete);
  }
  EXPECT_EQ(worker.Terminate(), 0) << logs;
  EXPECT_EQ(memd.Terminate(), 0) << logs;
  const std::string wlog = ReadFile(worker_log);
  EXPECT_EQ(wlog.find("[error]"), std::string::npos) << logs;
  EXPECT_EQ(wlog.find("answered message"), std::string::npos) << logs;  // memd refused one of our messages
}

INSTANTIATE_TEST_SUITE_P(Modes, RealMemd, ::testing::Values("resident", "hisparse", "adaptive"));

}  // namespace
}  // namespace dhs::test
