// Two real processes over ipc://: this test (DealerClient) and the echo server helper
// (RouterServer + Server, started with posix_spawn, so no fork of a threaded process). The server
// is SIGKILLed mid-conversation; the client notices the loss through its socket monitor, a
// request fails with DEADLINE_EXCEEDED, a new server binds over the stale socket file, and the
// client reconnects and continues. Children are SIGKILLed and reaped at teardown.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "common/protocol.h"
#include "common/status.h"
#include "common/transport.h"
#include "tests/common/test_util.h"

extern char** environ;

namespace dhs {
namespace {

using std::chrono::milliseconds;

constexpr int kReadyTimeoutMs = 10000;

// Starts the echo server; returns its pid once it reported that it is bound, or -1.
pid_t StartEchoServer(const std::string& run_dir, const std::string& name) {
  const char* binary = std::getenv("DHS_ECHO_SERVER");
  if (binary == nullptr) return -1;
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 3);
  std::vector<std::string> args = {binary, run_dir, name, "3"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, binary, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  const int ready = rc == 0 ? testing::ReadByte(fds[0], kReadyTimeoutMs) : -1;
  ::close(fds[0]);
  if (ready != 'r') {
    if (rc == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    return -1;
  }
  return pid;
}

void KillAndReap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

class TransportProcessTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (pid_t pid : children_) {
      if (::kill(pid, SIGKILL) == 0) ::waitpid(pid, nullptr, 0);
    }
  }
  pid_t Start() {
    const pid_t pid = StartEchoServer(dir_.path(), "memd");
    if (pid > 0) children_.push_back(pid);
    return pid;
  }
  testing::ScopedRunDir dir_;
  std::vector<pid_t> children_;
};

// One heartbeat request; expects the ack to echo `seq` and come from server `pid`.
void ExpectAck(DealerClient& client, uint64_t seq, pid_t pid) {
  wire::HeartbeatT hb;
  hb.sender_time_ns = seq * 10;
  absl::StatusOr<std::string> reply = client.Request(EncodeHeartbeat(hb, seq, "worker/0"), milliseconds(5000));
  ASSERT_TRUE(reply.ok()) << reply.status();
  absl::StatusOr<Message> m = DecodeEnvelope(*reply);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->sequence, seq);
  EXPECT_EQ(m->sender, "echo");
  absl::StatusOr<wire::HeartbeatAckT> ack = ReadHeartbeatAck(*m);
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_EQ(ack->sender_time_ns, seq * 10);
  EXPECT_EQ(ack->receiver_time_ns, static_cast<uint64_t>(pid));
}

TEST_F(TransportProcessTest, ServerKilledAndRestartedMidConversation) {
  ASSERT_NE(std::getenv("DHS_ECHO_SERVER"), nullptr) << "set by meson";
  ASSERT_TRUE(MakeRunDir(dir_.path()).ok());
  const pid_t first = Start();
  ASSERT_GT(first, 0);

  auto client = DealerClient::Connect(IpcEndpoint(dir_.path(), "memd"), {.identity = "worker/0"});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->WaitPeerConnected(true, milliseconds(5000)));
  for (uint64_t seq = 1; seq <= 5; ++seq) ExpectAck(**client, seq, first);

  // A bad message across processes gets its ErrorReply; the server goes on.
  absl::StatusOr<std::string> reply = (*client)->Request("garbage!", milliseconds(5000));
  ASSERT_TRUE(reply.ok()) << reply.status();
  absl::StatusOr<Message> err = DecodeEnvelope(*reply);
  ASSERT_TRUE(err.ok());
  EXPECT_EQ(ToWireError(ReadErrorStatus(*err)), wire::ErrorCode::INVALID_MESSAGE);
  ExpectAck(**client, 6, first);

  // Kill the server mid-conversation: the monitor reports the loss, a request times out.
  KillAndReap(first);
  EXPECT_TRUE((*client)->WaitPeerConnected(false, milliseconds(5000)));
  EXPECT_FALSE((*client)->peer_connected());
  wire::HeartbeatT hb;
  hb.sender_time_ns = 70;
  EXPECT_EQ((*client)->Request(EncodeHeartbeat(hb, 7, "worker/0"), milliseconds(200)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(std::filesystem::exists(dir_.path() + "/memd.sock"));  // stale file left by the kill

  // Restart on the same endpoint: the client reconnects by itself and the conversation continues.
  const pid_t second = Start();
  ASSERT_GT(second, 0);
  ASSERT_NE(second, first);
  EXPECT_TRUE((*client)->WaitPeerConnected(true, milliseconds(5000)));
  for (uint64_t seq = 8; seq <= 12; ++seq) ExpectAck(**client, seq, second);

  KillAndReap(second);
}

TEST_F(TransportProcessTest, SecondServerOnALiveEndpointIsRefused) {
  ASSERT_TRUE(MakeRunDir(dir_.path()).ok());
  const pid_t first = Start();
  ASSERT_GT(first, 0);
  EXPECT_EQ(RouterServer::Bind(dir_.path(), "memd").status().code(), absl::StatusCode::kAlreadyExists);
  auto client = DealerClient::Connect(IpcEndpoint(dir_.path(), "memd"));
  ASSERT_TRUE(client.ok());
  ExpectAck(**client, 1, first);  // the live server was not displaced
  KillAndReap(first);
}

}  // namespace
}  // namespace dhs
