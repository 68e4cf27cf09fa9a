// In-process tests of the transport: run directory rules, RouterServer binding rules, and the
// Server dispatch loop answering every bad message with the right ErrorReply while it keeps
// serving (a good message after each bad one gets a good reply). One thread drives both ends:
// each step waits on the socket with a bounded timeout, never on a sleep.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/protocol.h"
#include "common/status.h"
#include "common/transport.h"
#include "tests/common/test_util.h"

namespace dhs {
namespace {

using std::chrono::milliseconds;
using wire::ErrorCode;

constexpr milliseconds kWait{5000};

TEST(MakeRunDir, CreatesWithMode0700AndChecksAnExistingOne) {
  testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  struct stat st {};
  ASSERT_EQ(::stat(dir.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_TRUE(MakeRunDir(dir.path()).ok());  // existing, private: accepted
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  EXPECT_EQ(MakeRunDir(dir.path()).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(::chmod(dir.path().c_str(), 0700), 0);
  EXPECT_EQ(MakeRunDir("").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeRunDir(dir.path() + "/missing/child").code(), absl::StatusCode::kNotFound);
}

// Every socket a node creates must fit sun_path (107 bytes + NUL); memd checks the longest worker socket
// (worker-65535.sock), a worker its own. The error names the path, its length and the longest run directory.
TEST(CheckSocketPaths, EverySocketOfTheNodeMustFitSunPath) {
  EXPECT_TRUE(CheckSocketPaths("/tmp/dhs-0").ok());
  const std::string fits_all(89, 'd');   // 89 + "/worker-65535.sock" (18) = 107
  EXPECT_TRUE(CheckSocketPaths(fits_all).ok());
  const absl::Status s = CheckSocketPaths(fits_all + "d");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find(fits_all + "d/worker-65535.sock is 108 bytes"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("at most 89 bytes"), std::string::npos) << s;
  const std::string dir95(95, 'd');  // memd.sock fits (105), worker-0.sock does not (109)
  EXPECT_TRUE(CheckSocketPaths(std::string(93, 'd'), 0).ok());
  const absl::Status w = CheckSocketPaths(dir95, 0);
  EXPECT_EQ(w.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(w.message()).find("worker-0.sock is 109 bytes"), std::string::npos) << w;
  EXPECT_FALSE(CheckSocketPaths(std::string(98, 'd'), 0).ok());  // memd.sock: 108
}

// Before a ZeroMQ connect (which retries silently): no socket, a path component that is no directory, a file that is
// no socket, a socket this user may not reach (as root: checked in the process tests, which run a child as nobody).
TEST(CheckSocketAccess, NamesWhyASocketCannotBeReached) {
  testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  EXPECT_EQ(CheckSocketAccess(dir.path(), "memd").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(CheckSocketAccess("/etc/passwd", "memd").code(), absl::StatusCode::kFailedPrecondition);
  { std::ofstream(dir.path() + "/plain.sock") << "x"; }
  EXPECT_EQ(CheckSocketAccess(dir.path(), "plain").code(), absl::StatusCode::kFailedPrecondition);
  {  // a stale socket: bound, then its process gone without unlinking it (a SIGKILLed server)
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string stale = dir.path() + "/stale.sock";
    std::memcpy(addr.sun_path, stale.c_str(), stale.size() + 1);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    ::close(fd);
  }
  const absl::Status stale = CheckSocketAccess(dir.path(), "stale");
  EXPECT_EQ(stale.code(), absl::StatusCode::kUnavailable) << stale;
  EXPECT_EQ(std::string(stale.message()).rfind("nothing listens on", 0), 0u) << stale;
  auto server = RouterServer::Bind(dir.path(), "memd");
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(CheckSocketAccess(dir.path(), "memd").ok());
  if (::geteuid() != 0) {
    ASSERT_EQ(::chmod(dir.path().c_str(), 0), 0);
    const absl::Status s = CheckSocketAccess(dir.path(), "memd");
    ::chmod(dir.path().c_str(), 0700);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_EQ(std::string(s.message()).rfind("permission denied", 0), 0u) << s;
  }
}

TEST(RouterServer, RefusesALiveServerReplacesAStaleSocketRemovesOnClose) {
  testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  const std::string path = dir.path() + "/memd.sock";
  {
    auto first = RouterServer::Bind(dir.path(), "memd");
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ((*first)->endpoint(), "ipc://" + path);
    EXPECT_TRUE(std::filesystem::exists(path));
    auto second = RouterServer::Bind(dir.path(), "memd");
    EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  }
  EXPECT_FALSE(std::filesystem::exists(path));  // removed on close

  // A stale socket file: bound, then closed without unlink (as after a SIGKILL).
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);
  ASSERT_TRUE(std::filesystem::exists(path));
  auto third = RouterServer::Bind(dir.path(), "memd");
  EXPECT_TRUE(third.ok()) << third.status();

  EXPECT_EQ(RouterServer::Bind(dir.path(), "a/b").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RouterServer::Bind(dir.path(), std::string(120, 'x')).status().code(),
            absl::StatusCode::kInvalidArgument);
}

std::string GoodHeartbeat(uint64_t seq) {
  wire::HeartbeatT hb;
  hb.sender_time_ns = 7;
  return EncodeHeartbeat(hb, seq, "worker/0");
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(MakeRunDir(dir_.path()).ok());
    auto router = RouterServer::Bind(dir_.path(), "memd");
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = std::move(*router);
    server_ = std::make_unique<Server>(router_.get(), "memd");
    server_->On(wire::Body::Heartbeat, [](const Message& m, std::string_view) -> absl::StatusOr<std::string> {
      absl::StatusOr<wire::HeartbeatT> hb = ReadHeartbeat(m);
      if (!hb.ok()) return hb.status();
      wire::HeartbeatAckT ack;
      ack.sender_time_ns = hb->sender_time_ns;
      ack.receiver_time_ns = hb->sender_time_ns + 1;
      return EncodeHeartbeatAck(ack, m.sequence, "memd");
    });
    server_->On(wire::Body::Complete, [](const Message& m, std::string_view) -> absl::StatusOr<std::string> {
      absl::StatusOr<wire::CompleteT> c = ReadComplete(m);
      if (!c.ok()) return c.status();
      return absl::NotFoundError("no request " + std::to_string(c->request));
    });
    auto client = DealerClient::Connect(router_->endpoint(), {.identity = "worker/0"});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }

  // Sends `bytes`, lets the server serve it, returns the decoded reply bytes.
  std::string Exchange(std::string_view bytes) {
    EXPECT_TRUE(client_->Send(bytes).ok());
    absl::StatusOr<bool> served = server_->ServeOnce(kWait);
    EXPECT_TRUE(served.ok() && *served);
    absl::StatusOr<std::string> reply = client_->Receive(kWait);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? *reply : std::string();
  }

  // Expects an ErrorReply with `code` answering `seq`.
  void ExpectError(std::string_view bytes, ErrorCode code, uint64_t seq) {
    const std::string reply = Exchange(bytes);
    absl::StatusOr<Message> m = DecodeEnvelope(reply);
    ASSERT_TRUE(m.ok()) << m.status();
    absl::StatusOr<wire::ErrorReplyT> err = ReadErrorReply(*m);
    ASSERT_TRUE(err.ok()) << err.status();
    EXPECT_EQ(err->code, code) << wire::EnumNameErrorCode(err->code) << ": " << err->message;
    EXPECT_EQ(err->answering_sequence, seq);
    EXPECT_EQ(m->sender, "memd");
  }

  // A good heartbeat gets a good HeartbeatAck.
  void ExpectServing(uint64_t seq) {
    wire::HeartbeatT hb;
    hb.sender_time_ns = 1000 + seq;
    const std::string reply = Exchange(EncodeHeartbeat(hb, seq, "worker/0"));
    absl::StatusOr<Message> m = DecodeEnvelope(reply);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->sequence, seq);
    absl::StatusOr<wire::HeartbeatAckT> ack = ReadHeartbeatAck(*m);
    ASSERT_TRUE(ack.ok()) << ack.status();
    EXPECT_EQ(ack->sender_time_ns, 1000 + seq);
    EXPECT_EQ(ack->receiver_time_ns, 1001 + seq);
  }

  testing::ScopedRunDir dir_;
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<DealerClient> client_;
};

TEST_F(ServerTest, EveryBadMessageGetsItsErrorAndTheServerKeepsServing) {
  ExpectServing(1);

  ExpectError("", ErrorCode::INVALID_MESSAGE, 0);  // empty
  ExpectServing(2);

  const std::string good = GoodHeartbeat(3);
  ExpectError(std::string_view(good.data(), good.size() / 2), ErrorCode::INVALID_MESSAGE, 0);  // truncated
  ExpectServing(4);

  std::string corrupt = GoodHeartbeat(5);
  const uint32_t offset = static_cast<uint32_t>(corrupt.size()) + 1000;
  std::memcpy(corrupt.data(), &offset, sizeof(offset));
  ExpectError(corrupt, ErrorCode::INVALID_MESSAGE, 0);  // root offset outside the buffer
  ExpectServing(6);

  std::string oversized(kMaxMessageBytes + 1, '\0');  // > 64 MiB
  std::memcpy(oversized.data(), good.data(), good.size());
  // Still a verifiable envelope (zeros after it), so the error answers its sequence.
  ExpectError(oversized, ErrorCode::INVALID_MESSAGE, 3);
  ExpectServing(7);

  ExpectError(internal::EncodeRawEnvelope(kProtocolVersion + 1, static_cast<uint8_t>(wire::Body::Heartbeat), 8, "w"),
              ErrorCode::VERSION_MISMATCH, 8);
  ExpectServing(9);

  ExpectError(internal::EncodeRawEnvelope(kProtocolVersion, 250, 10, "w"), ErrorCode::UNKNOWN_MESSAGE, 10);
  ExpectServing(11);

  wire::HelloT hello;  // known type, no handler registered
  ExpectError(EncodeHello(hello, 12, "worker/0"), ErrorCode::UNKNOWN_MESSAGE, 12);
  ExpectServing(13);

  wire::CompleteT complete;  // handler fails: its code travels back
  complete.request = 44;
  ExpectError(EncodeComplete(complete, 14, "worker/0"), ErrorCode::NOT_FOUND, 14);
  ExpectServing(15);
}

TEST_F(ServerTest, ConfiguredMaxMessageSize) {
  const size_t heartbeat_bytes = GoodHeartbeat(4).size();
  server_->set_max_message_bytes(heartbeat_bytes + 8);
  wire::IntrospectReplyT big;
  big.document = std::string(heartbeat_bytes, 'x');
  ExpectError(EncodeIntrospectReply(big, 3, "w"), ErrorCode::INVALID_MESSAGE, 3);
  ExpectServing(4);  // a heartbeat still fits
}

TEST_F(ServerTest, ClientSeesTheConnectionAndReplyToAGonePeerFails) {
  EXPECT_TRUE(client_->WaitPeerConnected(true, kWait));
  ExpectServing(1);
  EXPECT_EQ(router_->Reply("no-such-peer", GoodHeartbeat(2)).code(), absl::StatusCode::kUnavailable);
  absl::StatusOr<bool> idle = server_->ServeOnce(milliseconds(0));
  ASSERT_TRUE(idle.ok());
  EXPECT_FALSE(*idle);
  EXPECT_EQ(client_->Receive(milliseconds(0)).status().code(), absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace dhs
